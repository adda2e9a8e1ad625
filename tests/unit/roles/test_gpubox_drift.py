"""The gpubox role's drift program on a stand-in box: the stand-in NVML's two RTX 3090s and a hand-made /sys.

The role's timer needs a systemd host; here the program runs as the timer and site.yml run it:
record after a deploy, then check. Then the box drifts as real boxes do (a link trains down to
x4, a BIOS update turns ACS back on) and the check says so, in the journal and in the metrics.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

from conftest import COLLECTIONS, ROOT
from hardware import ACS_CMPLT_REDIR, ACS_REQ_REDIR, ACS_SRC_VALID, RTX3090_PAIR, nvml_machine, set_acs, stand_in_box

PROGRAM = ROOT / "roles" / "gpubox" / "files" / "gpubox-drift.py"
FAKES = ROOT / "tests" / "fakes"


def box(tmp_path):
    root = stand_in_box(tmp_path / "root")
    machine = copy.deepcopy(RTX3090_PAIR)
    for device in machine["gpus"]:
        device["pstate"] = 8
    path = nvml_machine(tmp_path / "machine.json", machine)
    config = tmp_path / "drift.json"
    config.write_text(json.dumps({"baseline": str(tmp_path / "state" / "drift.json"), "sysfs_root": str(root),
                                  "metrics": str(tmp_path / "state" / "metrics" / "drift.prom"), "project": "none"}))  # fmt: skip
    return root, path, config


def run(config, *argv: str, machine) -> subprocess.CompletedProcess:
    env = {**os.environ, "GPUBOX_LIB": str(COLLECTIONS), "GPUBOX_FAKE_NVML": str(machine), "PYTHONPATH": str(FAKES)}
    result = subprocess.run(
        [sys.executable, str(PROGRAM), *argv, str(config)], capture_output=True, text=True, env=env, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_record_then_check_then_drift(tmp_path):
    root, machine, config = box(tmp_path)
    baseline = tmp_path / "state" / "drift.json"
    assert json.loads(run(config, "record", machine=machine).stdout) == {"changed": True}
    recorded = json.loads(baseline.read_text())
    assert recorded["acs"] == {"verdict": "clear", "redirecting": []}
    assert recorded["iommu"] == {"mode": "passthrough", "enabled": True}
    assert [g["pcie_width_current"] for g in recorded["gpus"]] == [16, 4]
    assert json.loads(run(config, "record", machine=machine).stdout) == {"changed": False}
    check = run(config, "check", machine=machine)
    assert check.stdout.splitlines() == [
        "<6>no drift: the GPUs, their links, ACS, the IOMMU, the driver and vLLM's image are as deployed"
    ]
    metrics = (tmp_path / "state" / "metrics" / "drift.prom").read_text()
    assert "gpubox_drift_findings 0\n" in metrics

    # The box drifts: GPU0's link trains down to x4, a BIOS update turns ACS redirection back on above GPU1.
    stand_in = json.loads(machine.read_text())
    stand_in["gpus"][0]["width"] = [4, 16]
    machine.write_text(json.dumps(stand_in))
    set_acs(root, "0000:40:01.1", ACS_SRC_VALID | ACS_REQ_REDIR | ACS_CMPLT_REDIR)
    check = run(config, "check", machine=machine)
    assert check.stdout.splitlines() == [
        "<4>GPU0 (0000:09:00.0) runs its link at x4, x16 when deployed (it supports x16): reseat the card or check "
        "the slot and riser",
        "<4>ACS now redirects peer-to-peer traffic on 0000:40:01.1 (a BIOS update turns it back on): NCCL over P2P "
        "may hang; run site.yml, whose preflight turns P2P off or remediates",
    ]
    metrics = (tmp_path / "state" / "metrics" / "drift.prom").read_text()
    assert 'gpubox_drift{check="link_width",gpu="0"} 1\n' in metrics
    assert 'gpubox_drift{check="acs_redirect"} 1\n' in metrics
    assert "gpubox_drift_findings 2\n" in metrics
    # The check changed nothing; a record in check mode says it would, and writes nothing.
    assert json.loads(baseline.read_text()) == recorded
    assert json.loads(run(config, "record", "--check", machine=machine).stdout) == {"changed": True}
    assert json.loads(baseline.read_text()) == recorded


def test_a_check_before_any_record_says_so(tmp_path):
    _root, machine, config = box(tmp_path)
    assert run(config, "check", machine=machine).stdout.startswith("<4>nothing recorded at ")
