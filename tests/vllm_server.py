"""A real vLLM (CPU build, tiny model) deployed by the vllm role on this machine, shared by the role and proxy tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml
from conftest import ROOT, VLLM_CACHE_ENV, require, run_ansible

# Each pytest-xdist worker (gw0, gw1) deploys its own shared server, on its own port and Compose project; the ports a
# file derives from PORT (PORT + 1 .. PORT + 6) stay below the next worker's.
WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
PORT = 18123 + 1000 * WORKER
KEY = "test-secret-key-5f2c"
PROJECT = f"gpubox-test-vllm-gw{WORKER}"
# The correctness gate's prompts for the tiny model: runs of its own text (tests/vllm-image/make_tiny_model.py),
# which it continues; 12 words each, since this VM's CPU crashes vLLM's bf16 kernels on prompts of a few tokens.
GATE_PROMPTS = [
    "the quick brown fox jumps over a lazy dog while gpus share",
    "lazy dog while gpus share tensors over links and nginx streams tokens",
    "links and nginx streams tokens to agents who ask for answers about",
    "who ask for answers about models memory bandwidth latency user assistant system",
    "bandwidth latency user assistant system hello world yes no one two three",
    "yes no one two three four five six seven eight nine ten",
    "six seven eight nine ten the quick brown fox jumps over a",
    "brown fox jumps over a lazy dog while gpus share tensors over",
]


def docker(*argv: str) -> str:
    return subprocess.run([require("docker"), *argv], capture_output=True, text=True, check=True).stdout.strip()


def image_name() -> str:
    name = subprocess.run([ROOT / "scripts" / "vllm-test-image.sh", "--name"], capture_output=True, text=True, check=True)
    return name.stdout.strip()


def vllm_cache() -> str:
    """The run's vLLM cache folder, shared by its servers (tests/conftest.py)."""
    return os.environ[VLLM_CACHE_ENV]


def role_vars(work: Path, image: str, records: Path | None = None, **extra) -> dict:
    """The role's variables for the model and caches in ``work``; its records in ``records`` (``work`` by default)."""
    repo, tag = image.split(":")
    records = records or work
    return {
        "ansible_python_interpreter": sys.executable,
        "vllm_model": str(work / "tiny-chat"),
        "vllm_served_model_name": "tiny",
        "vllm_device": "cpu",
        "vllm_image": repo,
        "vllm_image_tag": tag,
        "vllm_project_dir": str(work / "project"),
        "vllm_project_name": PROJECT,
        "vllm_port": PORT,
        "vllm_hf_cache_dir": str(work / "hf"),
        "vllm_cache_dir": vllm_cache(),
        "vllm_max_model_len": 512,
        "vllm_dtype": "bfloat16",
        "vllm_enforce_eager": True,
        "vllm_api_key": KEY,
        "vllm_wait_timeout": 300,
        "vllm_gate_prompts": GATE_PROMPTS,
        # The role's state (/var/lib/gpubox on a box) goes to the test's folder, not this machine's /var/lib.
        "_vllm_state_dir": str(records / "state"),
        # A start-up line every 2 s, so that the tests see them.
        "_vllm_progress_interval": 2,
        # This machine has no systemd to run the watchdog's timer: test_vllm_watchdog.py runs its program itself.
        "vllm_watchdog": False,
        **extra,
    }


def role_argv(work: Path, variables: dict) -> list[str]:
    """The ``ansible-playbook`` command line that runs the vllm role on this machine with ``variables``."""
    playbook = work / "play.yml"
    playbook.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "roles": ["gpubox.inference.vllm"]}]))
    extra = work / "vars.json"
    extra.write_text(json.dumps(variables))
    return ["ansible-playbook", "-i", "localhost,", "-c", "local", "-e", f"@{extra}", str(playbook)]


def run_role(work: Path, variables: dict) -> subprocess.CompletedProcess:
    return run_ansible(*role_argv(work, variables))


@contextmanager
def deployed(image: str, work: Path, variables: dict) -> Iterator[subprocess.CompletedProcess]:
    """The role run once over a copy of the tiny model in ``work``; its Compose project torn down after."""
    copy_model_out(image, work)
    try:
        yield run_role(work, variables)
    finally:
        down = ["docker", "compose", "--project-name", variables["vllm_project_name"], "down", "--timeout", "5"]
        subprocess.run(down, capture_output=True, check=False)


def copy_model_out(image: str, work: Path) -> None:
    """The tiny model, copied out of the image to a host folder, as a user's local model would be."""
    container = docker("create", image)
    try:
        docker("cp", f"{container}:/models/tiny-chat", str(work / "tiny-chat"))
    finally:
        docker("rm", container)


def metric(name: str, **labels: str) -> float:
    """Sum of a Prometheus metric on the server's /metrics, over series whose labels match."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics", timeout=10) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        series, _sep, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in series for k, v in labels.items()):
            total += float(value)
    return total
