"""The drift watch: a reading of the box against the one the last deployment recorded (plugins/module_utils/_drift.py)."""

from __future__ import annotations

import copy

import pytest

from ansible_collections.gpubox.inference.plugins.module_utils import _drift
from ansible_collections.gpubox.inference.plugins.module_utils._words import say


def device(index=0, gen=(4, 4), width=(16, 16), state="P8", uuid=None):
    return {"index": index, "name": "NVIDIA GeForce RTX 3090", "uuid": uuid or f"GPU-{index}",
            "pci_bus_id": ["0000:09:00.0", "0000:41:00.0"][index], "pcie_gen_current": gen[0], "pcie_gen_max": gen[1],
            "pcie_width_current": width[0], "pcie_width_max": width[1], "performance_state": state}  # fmt: skip


GPU = {"fingerprint": "f" * 64, "driver_version": "595.71.05", "devices": [device(0), device(1, gen=(1, 4))]}
CLEAR = {"verdict": "clear", "redirecting": []}
IOMMU = {"mode": "passthrough", "enabled": True}
IMAGE = ["sha256:aaaa"]


def read(gpu=None, acs=None, iommu=None, images=None, now=1000.0) -> dict:
    """A reading of the box as deployed, but for what is given."""
    return _drift.reading(gpu or GPU, acs or CLEAR, iommu or IOMMU, IMAGE if images is None else images, now)


def said(findings) -> list[str]:
    return [say(f["code"], **{k: v for k, v in f.items() if k != "code"}) for f in findings]


def test_the_box_as_deployed_has_no_drift_even_with_an_idle_gpu_at_gen1():
    assert _drift.compare(read(), read(now=5000.0)) == []


def test_a_link_that_trained_down_to_x4_is_a_drift():
    gpu = copy.deepcopy(GPU)
    gpu["devices"][0].update(pcie_width_current=4)
    findings = _drift.compare(read(), read(gpu))
    assert said(findings) == [
        "GPU0 (0000:09:00.0) runs its link at x4, x16 when deployed (it supports x16): reseat the card or check the slot "
        "and riser"
    ]


def test_a_lower_generation_counts_only_under_load():
    gpu = copy.deepcopy(GPU)
    gpu["devices"][1].update(performance_state="P0")
    (finding,) = _drift.compare(read(), read(gpu))
    assert said([finding]) == ["GPU1 (0000:41:00.0) runs its link at Gen1 under load (P0) where it reaches Gen4: downtrained"]


def test_a_bios_that_capped_the_slot_is_a_drift():
    gpu = copy.deepcopy(GPU)
    gpu["devices"][0].update(pcie_gen_max=3, pcie_gen_current=3)
    assert [f["code"] for f in _drift.compare(read(), read(gpu))] == ["drift.link_gen_max"]


def test_acs_turned_back_on_names_the_bridge():
    redirected = {"verdict": "redirected", "redirecting": [{"bdf": "0000:40:01.1", "flags": ["ReqRedir"]}]}
    findings = _drift.compare(read(), read(acs=redirected))
    assert said(findings) == [
        "ACS now redirects peer-to-peer traffic on 0000:40:01.1 (a BIOS update turns it back on): NCCL over P2P may hang; "
        "run site.yml, whose preflight turns P2P off or remediates"
    ]
    # Redirecting when deployed (P2P was turned off then) is no drift.
    assert _drift.compare(read(acs=redirected), read(acs=redirected)) == []


@pytest.mark.parametrize(
    ("change", "code", "words"),
    [
        ({"driver_version": "600.10"}, "drift.driver", "the NVIDIA driver changed from 595.71.05 to 600.10 since the deployment"),
        ({"fingerprint": "e" * 64}, "drift.gpus", "the GPUs are not the ones deployed on (fingerprint ffffffffffff then"),
    ],
)
def test_gpu_and_driver_changes(change, code, words):
    (finding,) = _drift.compare(read(), read({**GPU, **change}))
    assert finding["code"] == code
    assert said([finding])[0].startswith(words)


def test_iommu_and_image_changes():
    findings = _drift.compare(read(), read(iommu={"mode": "translated", "enabled": True}, images=["sha256:bbbb"]))
    assert said(findings) == [
        "the IOMMU mode changed from passthrough to translated since the deployment: run site.yml",
        "vLLM's containers run sha256:bbbb, not the image deployed (sha256:aaaa): run site.yml",
    ]
    # No container running (stopped, or being recreated) is not an image drift.
    assert _drift.compare(read(), read(images=[])) == []


def test_the_metrics_textfile():
    gpu = copy.deepcopy(GPU)
    gpu["devices"][0].update(pcie_width_current=4)
    now = read(gpu, now=1796195882.7)
    text = _drift.metrics(_drift.compare(read(), now), now)
    assert 'gpubox_drift{check="link_width",gpu="0"} 1\n' in text
    assert "gpubox_drift_findings 1\n" in text
    assert "gpubox_drift_last_check_timestamp_seconds 1796195882\n" in text
    assert "gpubox_drift_findings 0\n" in _drift.metrics([], read())


def test_the_baseline_keeps_what_stays_while_nothing_drifts():
    idle, busy = read(now=1.0), read(now=2.0)
    busy["gpus"][1].update(pcie_gen_current=4, performance_state="P0")
    assert _drift.baseline(idle) == _drift.baseline(busy)
    assert "at" not in _drift.baseline(idle)
    gpu = copy.deepcopy(GPU)
    gpu["devices"][0].update(pcie_width_current=8)
    assert _drift.baseline(read(gpu)) != _drift.baseline(idle)
