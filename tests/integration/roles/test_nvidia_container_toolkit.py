"""The nvidia_container_toolkit role's GPU half (tasks/gpus.yml) on a stand-in 2x RTX 3090 box: the CDI spec.

NVIDIA's nvidia-ctk cannot be installed here (its repository is out of reach, and no
registry here carries it), so a stand-in on PATH records every invocation and writes a
spec that lists the GPUs the stand-in NVML serves, as the real one lists what NVML sees. A
stand-in docker answers the role's check container the same way. The role runs unchanged.
"""

from __future__ import annotations

import copy
import json
import os
import re
import sys
from pathlib import Path

import yaml
from conftest import ANSIBLE_ENV, ROOT, run_ansible
from hardware import RTX3090_PAIR, nvml_machine

NVIDIA_CTK = """#!/usr/bin/env python3
import json, os, sys
with open(os.environ["CTK_LOG"], "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\\n")
machine = json.load(open(os.environ["GPUBOX_FAKE_NVML"]))
if sys.argv[1:3] == ["cdi", "generate"] and sys.argv[3].startswith("--output="):
    devices = "".join(f"- name: '{i}'\\n  uuid: {g['uuid']}\\n" for i, g in enumerate(machine["gpus"]))
    with open(sys.argv[3].split("=", 1)[1], "w") as spec:
        spec.write("cdiVersion: 0.5.0\\nkind: nvidia.com/gpu\\ndevices:\\n" + devices)
else:
    sys.exit(f"stand-in nvidia-ctk: unexpected arguments {sys.argv[1:]}")
"""

DOCKER = """#!/usr/bin/env python3
import json, os, sys
machine = json.load(open(os.environ["GPUBOX_FAKE_NVML"]))
if sys.argv[1:2] == ["run"] and sys.argv[-2:] == ["nvidia-smi", "-L"]:
    for i, g in enumerate(machine["gpus"]):
        print(f"GPU {i}: {g['name']} (UUID: {g['uuid']})")
else:
    sys.exit(f"stand-in docker: unexpected arguments {sys.argv[1:]}")
"""


def run_gpus(tmp_path: Path) -> tuple[int, str]:
    tasks = [
        {"name": "Read the GPUs", "gpubox.inference.gpu_facts": {"fingerprint_path": str(tmp_path / "gpu.json")}},
        {"ansible.builtin.include_role": {"name": "gpubox.inference.nvidia_container_toolkit", "tasks_from": "gpus.yml"}},
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": tasks}]))
    extra = {
        "ansible_python_interpreter": sys.executable,
        "nvidia_container_toolkit_cdi_spec": str(tmp_path / "cdi" / "nvidia.yaml"),
        "_nvidia_container_toolkit_fingerprint_file": str(tmp_path / "state" / "cdi.fingerprint"),
    }
    (tmp_path / "vars.json").write_text(json.dumps(extra))
    argv = ["ansible-playbook", "-i", "localhost,", "-c", "local", "-e", f"@{tmp_path / 'vars.json'}", str(tmp_path / "play.yml")]
    result = run_ansible(*argv)
    return result.returncode, result.stdout + result.stderr


def changed(out: str) -> int:
    match = re.search(r"localhost\s*:\s*ok=\d+\s+changed=(\d+)", out)
    assert match, out[-3000:]
    return int(match.group(1))


def test_the_cdi_spec_is_made_once_per_gpu_set_and_again_after_a_swap(tmp_path, monkeypatch):
    fakes = ROOT / "tests" / "fakes"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, script in (("nvidia-ctk", NVIDIA_CTK), ("docker", DOCKER)):
        (bindir / name).write_text(script)
        (bindir / name).chmod(0o755)
    (tmp_path / "cdi").mkdir()
    (tmp_path / "state").mkdir()
    machine = tmp_path / "machine.json"
    monkeypatch.setitem(ANSIBLE_ENV, "PYTHONPATH", os.pathsep.join([str(fakes), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setitem(ANSIBLE_ENV, "GPUBOX_FAKE_NVML", str(nvml_machine(machine, RTX3090_PAIR)))
    monkeypatch.setitem(ANSIBLE_ENV, "CTK_LOG", str(tmp_path / "ctk.log"))
    monkeypatch.setitem(ANSIBLE_ENV, "PATH", f"{bindir}{os.pathsep}{ANSIBLE_ENV['PATH']}")
    spec = tmp_path / "cdi" / "nvidia.yaml"

    def invocations() -> list[list[str]]:
        log = tmp_path / "ctk.log"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    rc, out = run_gpus(tmp_path)
    assert rc == 0, out[-3000:]
    assert invocations() == [["cdi", "generate", f"--output={spec}"]]
    assert "GPU-3090bbbb-0000-0000-0000-000000000000" in spec.read_text()
    assert "A container sees all 2 GPUs" in out

    rc, out = run_gpus(tmp_path)
    assert rc == 0, out[-3000:]
    assert len(invocations()) == 1, "the same GPUs must not regenerate the spec"
    assert changed(out) == 0

    swapped = copy.deepcopy(RTX3090_PAIR)
    swapped["gpus"][1]["uuid"] = "GPU-3090cccc-0000-0000-0000-000000000000"
    nvml_machine(machine, swapped)
    rc, out = run_gpus(tmp_path)
    assert rc == 0, out[-3000:]
    assert invocations()[1:] == [["cdi", "generate", f"--output={spec}"]]
    assert "GPU-3090cccc-0000-0000-0000-000000000000" in spec.read_text()
    assert "GPU-3090bbbb" not in spec.read_text()
