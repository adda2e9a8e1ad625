"""playbooks/power.yml against the real vLLM CPU server, on the stand-in NVML, which records each limit set.

The CPU serves the same tokens per second at any GPU limit and the stand-in GPUs draw 0.9 of
their limit, so each step's average watts is known: the sweep's energy arithmetic is checked
against it, and the knee is the one its rule picks from the rows.
"""

from __future__ import annotations

import copy
import json
import sys

import pytest
import yaml
from conftest import ROOT, run_ansible
from hardware import RTX3090_PAIR, nvml_machine
from vllm_server import KEY

FAKES = ROOT / "tests" / "fakes"


def test_the_sweep_sets_each_limit_measures_tokens_per_joule_and_sets_the_default_back(vllm_server, tmp_path):
    machine = nvml_machine(tmp_path / "machine.json", copy.deepcopy(RTX3090_PAIR))
    host = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "gpubox_environment": {"PYTHONPATH": str(FAKES), "GPUBOX_FAKE_NVML": str(machine)},
        "vllm_api_key": KEY,
        "vllm_tune_concurrency": 2,
        "vllm_tune_prompt_tokens": 16,
        "vllm_tune_max_tokens": 16,
    }
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {"gpu_boxes": {"hosts": {"localhost": host}}}}}))
    # The shared server's deployment record (tests/vllm_server.py); the role's own vars give way only to -e.
    extra = {"_vllm_state_dir": str(vllm_server["workdir"] / "state"), "power_sweep_steps": 3}
    result = run_ansible("ansible-playbook", "-i", str(inventory), "-e", json.dumps(extra), str(ROOT / "playbooks" / "power.yml"))
    assert result.returncode == 0, result.stdout[-6000:]
    recorded = json.loads(machine.read_text())["set"]
    limits = [entry["power_limit_mw"] for entry in recorded if entry["gpu"] == 0 and "power_limit_mw" in entry]
    # 350 W is the cards' default (nothing to set), then 225 W, 100 W (the minimum), then each card's default
    # again (gpubox_gpu_power_limit_w unset).
    assert limits == [225000, 100000, 350000], recorded
    assert {"gpu": 1, "power_limit_mw": 100000} in recorded
    assert "350 W: " in result.stdout
    assert "8/8 requests" in result.stdout
    table = result.stdout[result.stdout.index("limit W | tok/s") :]
    rows = [line.strip(' ",') for line in table.splitlines()[1:4]]
    watts = [float(row.split("|")[2]) for row in rows]
    # Two stand-in GPUs drawing 0.9 of each limit.
    for limit, measured in zip((350, 225, 100), watts, strict=True):
        assert measured == pytest.approx(2 * 0.9 * limit, rel=0.05), rows
    shares = [float(row.split("|")[4]) for row in rows]
    per_joule = [float(row.split("|")[3]) for row in rows]
    kept = [i for i, share in enumerate(shares) if share >= 0.9]
    knee = max(kept, key=lambda i: per_joule[i])
    assert f"Recommended: {(350, 225, 100)[knee]} W keeps" in result.stdout
    assert f"set gpubox_gpu_power_limit_w: {(350, 225, 100)[knee]}" in result.stdout
