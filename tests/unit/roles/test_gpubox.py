"""The gpubox role's boot program for GPU power, on the stand-in NVML, which records what is set.

The role's systemd unit needs a systemd host (Molecule's box runs it); here the program it starts
runs as the unit would, at "boot": limits back at the cards' defaults, persistence off.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

from conftest import COLLECTIONS, ROOT
from hardware import RTX3090_PAIR, nvml_machine

PROGRAM = ROOT / "roles" / "gpubox" / "files" / "gpubox-gpu-power.py"
FAKES = ROOT / "tests" / "fakes"


def boot(tmp_path, machine: dict, limit, persistence=True) -> tuple[subprocess.CompletedProcess, dict]:
    path = nvml_machine(tmp_path / "machine.json", machine)
    config = tmp_path / "gpu-power.json"
    config.write_text(json.dumps({"limit": limit, "persistence": persistence}))
    env = {**os.environ, "GPUBOX_LIB": str(COLLECTIONS), "GPUBOX_FAKE_NVML": str(path), "PYTHONPATH": str(FAKES)}
    run = subprocess.run([sys.executable, str(PROGRAM), str(config)], capture_output=True, text=True, env=env, check=False)
    return run, json.loads(path.read_text())


def test_at_boot_every_gpu_gets_persistence_and_its_share_of_its_own_default(tmp_path):
    """A swapped-in RTX 4090 (450 W default) gets 85% of its own default, the 3090 85% of 350 W."""
    machine = copy.deepcopy(RTX3090_PAIR)
    machine["gpus"][1]["name"] = "NVIDIA GeForce RTX 4090"
    machine["gpus"][1]["power"] = {"default_mw": 450000, "min_mw": 150000, "max_mw": 600000}
    run, after = boot(tmp_path, machine, "85%")
    assert run.returncode == 0, run.stdout + run.stderr
    assert after["set"] == [
        {"gpu": 0, "persistence": 1},
        {"gpu": 0, "power_limit_mw": 298000},
        {"gpu": 1, "persistence": 1},
        {"gpu": 1, "power_limit_mw": 382000},
    ]
    assert run.stdout.splitlines() == [
        "<6>GPU0 NVIDIA GeForce RTX 3090: power limit 298.0 W, persistence mode on (set: power_limit, persistence)",
        "<6>GPU1 NVIDIA GeForce RTX 4090: power limit 382.0 W, persistence mode on (set: power_limit, persistence)",
    ]


def test_a_limit_a_card_refuses_sets_nothing_and_says_why(tmp_path):
    run, after = boot(tmp_path, copy.deepcopy(RTX3090_PAIR), "420")
    assert run.returncode == 1
    assert "set" not in after
    assert run.stdout.splitlines()[0] == (
        "<3>gpubox_gpu_power_limit_w='420': 420 W is outside the power limits of GPU0 (NVIDIA GeForce RTX 3090), "
        "100 W to 400 W (NVML); nothing was set"
    )


def test_what_is_already_set_is_left(tmp_path):
    machine = copy.deepcopy(RTX3090_PAIR)
    for gpu in machine["gpus"]:
        gpu["persistence"] = 1
        gpu["power"]["limit_mw"] = 290000
    run, after = boot(tmp_path, machine, "290")
    assert run.returncode == 0
    assert "set" not in after
    assert run.stdout.splitlines()[1].endswith("(set: nothing)")
