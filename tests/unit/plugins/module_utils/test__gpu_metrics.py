"""The GPU metrics textfile: NVML's sensors (the stand-in) and Xid errors from kernel log lines (_gpu_metrics.py)."""

from __future__ import annotations

import copy

import pytest
from hardware import RTX3090_PAIR, nvml_machine, stand_in_pynvml

from ansible_collections.gpubox.inference.plugins.module_utils import _gpu_metrics

# Kernel log lines as drivers write them (the NVRM prefix, the bus without its function, the code; newer drivers
# add pid and name), with lines around them that are not Xid errors.
KERNEL_LOG = """\
NVRM: loading NVIDIA UNIX x86_64 Kernel Module  595.71.05
NVRM: Xid (PCI:0000:41:00): 79, pid=2213, name=python3, GPU has fallen off the bus.
NVRM: GPU 0000:41:00.0: GPU has fallen off the bus.
NVRM: Xid (PCI:0000:09:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address
NVRM: Xid (PCI:0000:41:00.0): 31, pid=2213, name=python3, Ch 00000008, intr 10000000. MMU Fault
"""


@pytest.fixture
def nvml(tmp_path, monkeypatch):
    """The stand-in NVML serving the 2x RTX 3090 box; returns (module, machine dict, its file)."""
    machine = copy.deepcopy(RTX3090_PAIR)
    path = nvml_machine(tmp_path / "machine.json", machine)
    monkeypatch.setenv("GPUBOX_FAKE_NVML", str(path))
    return stand_in_pynvml(), machine, path


def test_it_reads_every_sensor_the_stand_in_reports(nvml):
    module, _machine, _path = nvml
    first, second = _gpu_metrics.read(module)
    assert first == {
        "index": 0,
        "name": "NVIDIA GeForce RTX 3090",
        "uuid": "GPU-3090aaaa-0000-0000-0000-000000000000",
        "pci_bus_id": "0000:09:00.0",
        "temperature_c": 41,
        "fan_ratio": 0.3,
        "power_w": 315.0,
        "power_limit_w": 350.0,
        "memory_used_bytes": 22 * 1024**3,
        "memory_total_bytes": 24 * 1024**3,
        "utilization_ratio": 0.0,
        "memory_utilization_ratio": 0.0,
        "pcie_gen_current": 4,
        "pcie_gen_max": 4,
        "pcie_width_current": 16,
        "pcie_width_max": 16,
        "clocks_event_reasons": 1,
    }
    assert (second["pci_bus_id"], second["pcie_width_current"], second["pcie_width_max"]) == ("0000:41:00.0", 4, 16)


def test_a_value_the_gpu_does_not_report_is_left_out_not_made_up(nvml):
    module, machine, path = nvml
    for key in ("temperature_c", "fan_percent", "utilization", "memory_used_bytes", "clocks_event_reasons", "power"):
        del machine["gpus"][1][key]
    nvml_machine(path, machine)
    gpus = _gpu_metrics.read(module)
    assert [gpus[1][key] for key in ("temperature_c", "fan_ratio", "utilization_ratio", "memory_used_bytes",
                                     "clocks_event_reasons", "power_w")] == [None] * 6  # fmt: skip
    text = _gpu_metrics.metrics(gpus, None, 0)
    assert 'gpubox_gpu_temperature_celsius{gpu="0",uuid="GPU-3090aaaa-0000-0000-0000-000000000000"} 41' in text
    assert 'gpubox_gpu_temperature_celsius{gpu="1"' not in text
    assert 'gpubox_gpu_clocks_event_reason{gpu="1"' not in text
    assert 'gpubox_gpu_memory_total_bytes{gpu="1",uuid="GPU-3090bbbb-0000-0000-0000-000000000000"} 25769803776' in text


def test_the_older_throttle_reasons_call_is_read_where_the_newer_one_is_missing(nvml):
    module, _machine, _path = nvml
    module.nvmlDeviceGetCurrentClocksThrottleReasons = module.nvmlDeviceGetCurrentClocksEventReasons
    del module.nvmlDeviceGetCurrentClocksEventReasons
    assert [gpu["clocks_event_reasons"] for gpu in _gpu_metrics.read(module)] == [1, 1]


def test_xid_errors_are_counted_by_bus_with_the_last_code():
    assert _gpu_metrics.xids(KERNEL_LOG) == {"0000:41:00": {"count": 2, "last": 31}, "0000:09:00": {"count": 1, "last": 13}}
    assert _gpu_metrics.xids("NVRM: GPU at PCI:0000:01:00: GPU-1234\n") == {}


def series(text: str) -> dict[str, float]:
    """The textfile's samples, by name and labels, as Prometheus reads them (comments left out)."""
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            samples[key] = float(value)
    return samples


def test_the_textfile_has_each_gpu_its_reasons_and_its_xid_errors(nvml):
    module, _machine, _path = nvml
    text = _gpu_metrics.metrics(_gpu_metrics.read(module), _gpu_metrics.xids(KERNEL_LOG), 1_700_000_000.4)
    samples = series(text)
    one = 'gpu="1",uuid="GPU-3090bbbb-0000-0000-0000-000000000000"'
    assert samples[f"gpubox_gpu_pcie_link_width{{{one}}}"] == 4
    assert samples[f"gpubox_gpu_pcie_link_max_width{{{one}}}"] == 16
    assert samples[f"gpubox_gpu_pcie_link_generation{{{one}}}"] == 2
    assert samples[f"gpubox_gpu_fan_speed_ratio{{{one}}}"] == 0.3
    assert samples[f"gpubox_gpu_power_watts{{{one}}}"] == 315.0
    assert samples[f'gpubox_gpu_clocks_event_reason{{{one},reason="gpu_idle"}}'] == 1
    assert samples[f'gpubox_gpu_clocks_event_reason{{{one},reason="hw_slowdown"}}'] == 0
    assert samples[f"gpubox_gpu_xid_errors{{{one}}}"] == 2
    assert samples[f"gpubox_gpu_xid_last_code{{{one}}}"] == 31
    assert samples['gpubox_gpu_xid_errors{gpu="0",uuid="GPU-3090aaaa-0000-0000-0000-000000000000"}'] == 1
    assert samples[f'gpubox_gpu_info{{{one},name="NVIDIA GeForce RTX 3090",pci_bus_id="0000:41:00.0"}}'] == 1
    assert samples["gpubox_gpu_metrics_last_read_timestamp_seconds"] == 1_700_000_000
    # Every series has its HELP and TYPE once, before its samples, as the textfile collector requires.
    names = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    assert len(names) == len(set(names))
    assert {key.split("{")[0] for key in samples} == set(names)


def test_a_gpu_without_xid_errors_counts_zero_and_an_unreadable_log_writes_no_xid_series(nvml):
    module, _machine, _path = nvml
    gpus = _gpu_metrics.read(module)
    one = 'gpu="1",uuid="GPU-3090bbbb-0000-0000-0000-000000000000"'
    assert series(_gpu_metrics.metrics(gpus, {}, 0))[f"gpubox_gpu_xid_errors{{{one}}}"] == 0
    assert "xid" not in _gpu_metrics.metrics(gpus, None, 0)
    assert "gpubox_gpu_xid_last_code" not in _gpu_metrics.metrics(gpus, {}, 0)
