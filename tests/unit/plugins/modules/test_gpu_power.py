"""gpu_power run as Ansible runs it, on the stand-in NVML, which records every limit set."""

from __future__ import annotations

import copy
import json
import os

import pytest
from conftest import ANSIBLE_ENV, ROOT, run_module
from hardware import RTX3090_PAIR, nvml_machine

FAKES = ROOT / "tests" / "fakes"


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """The stand-in 2x RTX 3090 box; returns the file the stand-in NVML serves and writes back to."""
    path = nvml_machine(tmp_path / "machine.json", copy.deepcopy(RTX3090_PAIR))
    monkeypatch.setitem(ANSIBLE_ENV, "PYTHONPATH", os.pathsep.join([str(FAKES), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setitem(ANSIBLE_ENV, "GPUBOX_FAKE_NVML", str(path))
    return path


def recorded(path) -> list[dict]:
    return json.loads(path.read_text()).get("set", [])


def test_check_mode_predicts_and_sets_nothing(machine):
    result = run_module("gpu_power", {"limit": "290"}, check=True)
    assert result["changed"] is True
    assert [(g["limit_w"], g["target_w"], g["changes"]) for g in result["gpus"]] == [
        (350.0, 290.0, ["power_limit", "persistence"]),
        (350.0, 290.0, ["power_limit", "persistence"]),
    ]
    assert result["diff"]["before"].splitlines()[0] == "GPU0 NVIDIA GeForce RTX 3090: power limit 350.0 W, persistence mode off"
    assert result["diff"]["after"].splitlines()[0] == "GPU0 NVIDIA GeForce RTX 3090: power limit 290.0 W, persistence mode on"
    assert recorded(machine) == []


def test_it_sets_persistence_and_the_limit_then_changes_nothing(machine):
    first = run_module("gpu_power", {"limit": "290W"})
    assert first["changed"] is True
    assert recorded(machine) == [
        {"gpu": 0, "persistence": 1},
        {"gpu": 0, "power_limit_mw": 290000},
        {"gpu": 1, "persistence": 1},
        {"gpu": 1, "power_limit_mw": 290000},
    ]
    again = run_module("gpu_power", {"limit": "290"})
    assert again["changed"] is False
    assert len(recorded(machine)) == 4


def test_a_limit_outside_the_constraints_fails_before_anything_is_set(machine):
    result = run_module("gpu_power", {"limit": "420"})
    assert result["failed"] is True
    assert result["msg"].startswith(
        "gpubox_gpu_power_limit_w='420': 420 W is outside the power limits of GPU0 (NVIDIA GeForce RTX 3090), "
        "100 W to 400 W (NVML)"
    )
    assert recorded(machine) == []


def test_reading_changes_nothing_and_returns_the_energy_counters(machine):
    result = run_module("gpu_power", {"persistence": False})
    assert result["changed"] is False
    assert [g["power_w"] for g in result["gpus"]] == [315.0, 315.0]
    assert all(g["energy_mj"] > 0 for g in result["gpus"])
    assert recorded(machine) == []


def test_without_nvml_it_says_what_is_missing():
    result = run_module("gpu_power", {"limit": "290"})
    # This machine has nvidia-ml-py but no driver: NVML cannot start, and the module says so.
    assert result["failed"] is True
    assert result["msg"].startswith("NVML could not read the GPUs")
