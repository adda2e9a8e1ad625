"""_gpu_inventory: NVML facts from a stand-in binding, the fingerprint, and what changed after a swap."""

from __future__ import annotations

import copy
import importlib.util

import pytest
from conftest import ROOT
from hardware import RTX3090_PAIR, nvml_machine

from ansible_collections.gpubox.inference.plugins.module_utils._gpu_inventory import changes, collect, fingerprint, record


@pytest.fixture
def nvml(tmp_path, monkeypatch):
    """The stand-in pynvml, loaded under its own name so an installed nvidia-ml-py is left alone."""
    spec = importlib.util.spec_from_file_location("fake_pynvml", ROOT / "tests" / "fakes" / "pynvml.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def serve(machine: dict):
        monkeypatch.setenv("GPUBOX_FAKE_NVML", str(nvml_machine(tmp_path / "machine.json", machine)))
        return module

    return serve


def test_collect_reads_every_field(nvml):
    facts = collect(nvml(RTX3090_PAIR))
    assert facts["present"] is True
    assert (facts["driver_version"], facts["cuda_driver_version"], facts["count"]) == ("595.71.05", "13.0", 2)
    first, second = facts["devices"]
    assert first["pci_bus_id"] == "0000:09:00.0"
    assert first["pci_device_id"] == "0x220410de"
    assert first["serial"] is None
    assert first["memory_total_mib"] == 24576
    assert first["compute_capability"] == "8.6"
    assert (second["pcie_gen_current"], second["pcie_gen_max"], second["pcie_width_current"]) == (2, 4, 4)
    assert second["numa_node"] == 1
    assert first["numa_node"] is None
    assert first["p2p"] == {"GPU1": {"read": "NS", "write": "NS", "nvlink": "NS", "atomics": "NS", "pci": "NS"}}
    assert first["topology"] == {"GPU1": "SYS"}
    assert facts["fingerprint"] == fingerprint(facts)


def test_nvml_that_cannot_start_is_reported_not_raised(nvml):
    facts = collect(nvml({**RTX3090_PAIR, "init_error": "Driver Not Loaded"}))
    assert facts == {"present": False, "reason": "NVML could not start: Driver Not Loaded", "count": 0, "devices": []}


def test_driver_without_gpus(nvml):
    facts = collect(nvml({**RTX3090_PAIR, "gpus": [], "p2p": {}, "topology": {}}))
    assert facts["present"] is False
    assert facts["reason"] == "the NVIDIA driver is loaded but reports no GPU"


def _facts(nvml, machine):
    return collect(nvml(machine))


def test_fingerprint_ignores_order_and_link_state_but_not_identity(nvml):
    base = _facts(nvml, RTX3090_PAIR)
    swapped_order = copy.deepcopy(RTX3090_PAIR)
    swapped_order["gpus"].reverse()
    idle = copy.deepcopy(RTX3090_PAIR)
    idle["gpus"][0]["gen"] = [1, 4]
    assert fingerprint(_facts(nvml, swapped_order)) == fingerprint(base)
    assert fingerprint(_facts(nvml, idle)) == fingerprint(base)
    new_driver = {**copy.deepcopy(RTX3090_PAIR), "driver": "600.10"}
    assert fingerprint(_facts(nvml, new_driver)) != fingerprint(base)


def test_changes_name_each_kind_of_swap(nvml):
    before = record(_facts(nvml, RTX3090_PAIR))
    assert changes(None, before) == []
    assert changes(before, before) == []

    replaced = copy.deepcopy(RTX3090_PAIR)
    replaced["gpus"][1].update(
        name="NVIDIA GeForce RTX 4090", uuid="GPU-4090cccc-0000-0000-0000-000000000000", device_id=0x268410DE
    )
    assert changes(before, record(_facts(nvml, replaced))) == [
        "GPU at 0000:41:00.0 replaced: NVIDIA GeForce RTX 3090 (GPU-3090bbbb-0000-0000-0000-000000000000)"
        " -> NVIDIA GeForce RTX 4090 (GPU-4090cccc-0000-0000-0000-000000000000)"
    ]

    moved = copy.deepcopy(RTX3090_PAIR)
    moved["gpus"][1]["bus_id"] = "00000000:42:00.0"
    assert changes(before, record(_facts(nvml, moved))) == [
        "GPU moved slot: NVIDIA GeForce RTX 3090 (GPU-3090bbbb-0000-0000-0000-000000000000) 0000:41:00.0 -> 0000:42:00.0"
    ]

    removed = copy.deepcopy(RTX3090_PAIR)
    del removed["gpus"][1]
    assert changes(before, record(_facts(nvml, {**removed, "p2p": {}, "topology": {}}))) == [
        "GPU removed: NVIDIA GeForce RTX 3090 (GPU-3090bbbb-0000-0000-0000-000000000000) from 0000:41:00.0"
    ]

    added = copy.deepcopy(RTX3090_PAIR)
    added["gpus"].append({**added["gpus"][1], "uuid": "GPU-3090dddd-0000-0000-0000-000000000000", "bus_id": "00000000:61:00.0"})
    added["p2p"] = {f"{a}-{b}": [5] * 5 for a in range(3) for b in range(3) if a != b}
    added["topology"] = {f"{a}-{b}": 50 for a in range(3) for b in range(3) if a != b}
    assert changes(before, record(_facts(nvml, added))) == [
        "GPU added: NVIDIA GeForce RTX 3090 (GPU-3090dddd-0000-0000-0000-000000000000) at 0000:61:00.0"
    ]

    driver = {**copy.deepcopy(RTX3090_PAIR), "driver": "600.10"}
    assert changes(before, record(_facts(nvml, driver))) == ["driver changed: 595.71.05 -> 600.10"]
