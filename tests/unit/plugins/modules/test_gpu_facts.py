"""gpu_facts run as Ansible runs it: on this GPU-less machine with the real nvidia-ml-py, and on a stand-in NVML."""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

import pytest
from conftest import ANSIBLE_ENV, ROOT, run_ansible, run_module
from hardware import RTX3090_PAIR, nvml_machine

FAKES = ROOT / "tests" / "fakes"


@pytest.fixture
def fake_nvml(tmp_path, monkeypatch):
    """Put the stand-in pynvml first on the module's PYTHONPATH, serving the given machine."""

    def serve(machine: dict) -> None:
        monkeypatch.setitem(ANSIBLE_ENV, "PYTHONPATH", os.pathsep.join([str(FAKES), os.environ.get("PYTHONPATH", "")]))
        monkeypatch.setitem(ANSIBLE_ENV, "GPUBOX_FAKE_NVML", str(nvml_machine(tmp_path / "machine.json", machine)))

    return serve


def test_machine_without_driver_says_so_and_does_not_fail(tmp_path: Path):
    result = run_module("gpu_facts", {"fingerprint_path": str(tmp_path / "none.fact")})
    gpu = result["ansible_facts"]["gpu"]
    assert result.get("failed") is not True
    assert gpu["present"] is False
    assert gpu["reason"].startswith("NVML could not start") or "no NVIDIA driver" in gpu["reason"]
    assert gpu["change_summary"] == "no fingerprint stored on this host yet"


def test_two_gpus_first_run(tmp_path: Path, fake_nvml):
    fake_nvml(RTX3090_PAIR)
    result = run_module("gpu_facts", {"fingerprint_path": str(tmp_path / "none.fact")}, check=True)
    gpu = result["ansible_facts"]["gpu"]
    assert result["changed"] is False
    assert gpu["present"] is True
    assert [d["pci_bus_id"] for d in gpu["devices"]] == ["0000:09:00.0", "0000:41:00.0"]
    assert gpu["devices"][0]["topology"] == {"GPU1": "SYS"}
    assert len(gpu["fingerprint"]) == 64
    assert gpu["fingerprint_stored"] is None
    assert gpu["changed_since_stored"] is False
    assert gpu["record"]["fingerprint"] == gpu["fingerprint"]


def test_swap_is_named_against_the_stored_record(tmp_path: Path, fake_nvml):
    fake_nvml(RTX3090_PAIR)
    stored = tmp_path / "gpubox_gpu.fact"
    stored.write_text(json.dumps(run_module("gpu_facts", {"fingerprint_path": str(stored)})["ansible_facts"]["gpu"]["record"]))
    same = run_module("gpu_facts", {"fingerprint_path": str(stored)})["ansible_facts"]["gpu"]
    assert same["changed_since_stored"] is False
    assert same["change_summary"] == "no change since the stored fingerprint"

    swapped = copy.deepcopy(RTX3090_PAIR)
    swapped["gpus"][0].update(name="NVIDIA GeForce RTX 4090", uuid="GPU-4090cccc-0000-0000-0000-000000000000")
    fake_nvml(swapped)
    gpu = run_module("gpu_facts", {"fingerprint_path": str(stored)})["ansible_facts"]["gpu"]
    assert gpu["changed_since_stored"] is True
    assert gpu["fingerprint_stored"] != gpu["fingerprint"]
    assert gpu["change_summary"].startswith("GPU at 0000:09:00.0 replaced: NVIDIA GeForce RTX 3090")


def test_unreadable_record_is_a_warning(tmp_path: Path, fake_nvml):
    fake_nvml(RTX3090_PAIR)
    stored = tmp_path / "gpubox_gpu.fact"
    stored.write_text("{not json")
    result = run_module("gpu_facts", {"fingerprint_path": str(stored)})
    assert "could not be read as JSON" in " ".join(result.get("warnings", []))
    assert result["ansible_facts"]["gpu"]["fingerprint_stored"] is None


def test_works_as_a_facts_module_in_gathering(tmp_path: Path, fake_nvml, monkeypatch):
    fake_nvml(RTX3090_PAIR)
    monkeypatch.setitem(ANSIBLE_ENV, "ANSIBLE_FACTS_MODULES", "ansible.builtin.setup,gpubox.inference.gpu_facts")
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        "- hosts: localhost\n  gather_facts: true\n  tasks:\n"
        "    - ansible.builtin.debug:\n        msg: 'gpus={{ ansible_facts.gpu.count }} os={{ ansible_facts.os_family }}'\n"
    )
    result = run_ansible(
        "ansible-playbook", "-i", "localhost,", "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}", str(playbook)
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert '"msg": "gpus=2 os=Debian"' in result.stdout
