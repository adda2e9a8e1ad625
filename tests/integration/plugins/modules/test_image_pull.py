"""image_pull: a real `docker pull` from a real registry (Debian's docker-registry, on loopback), with progress lines."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, require, run_ansible


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """A registry on 127.0.0.1 (Docker pulls from loopback over plain HTTP) holding a four-layer image."""
    work = tmp_path_factory.mktemp("registry")
    port = free_port()
    (work / "config.yml").write_text(
        yaml.safe_dump(
            {
                "version": 0.1,
                "storage": {"filesystem": {"rootdirectory": str(work / "data")}},
                "http": {"addr": f"127.0.0.1:{port}"},
            }
        )
    )
    server = subprocess.Popen(
        [require("docker-registry"), "serve", str(work / "config.yml")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    docker = require("docker")
    image = f"127.0.0.1:{port}/gpubox/pull-test:1"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2)
                break
            except OSError:
                assert time.monotonic() < deadline, "the registry did not start"
                time.sleep(0.2)
        base = subprocess.run(
            [ROOT / "scripts" / "test-image.sh", "--name"], capture_output=True, text=True, check=True
        ).stdout.strip()
        layers = "".join(f"RUN head -c 8000000 /dev/urandom > /layer{n}\n" for n in range(3))
        (work / "Dockerfile").write_text(f"FROM {base}\n{layers}")
        subprocess.run([docker, "build", "-q", "-t", image, str(work)], capture_output=True, check=True)
        subprocess.run([docker, "push", image], capture_output=True, check=True)
        subprocess.run([docker, "image", "rm", image], capture_output=True, check=True)
        yield {"image": image, "port": port, "work": work}
    finally:
        subprocess.run([docker, "image", "rm", "-f", image], capture_output=True, check=False)
        server.terminate()
        server.wait()


def pull(work: Path, image: str, *flags: str) -> subprocess.CompletedProcess:
    task = {"gpubox.inference.image_pull": {"name": image, "interval": 0.3}}
    (work / "pull.yml").write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": [task]}]))
    extra = json.dumps({"ansible_python_interpreter": sys.executable})
    return run_ansible("ansible-playbook", "-i", "localhost,", "-c", "local", *flags, "-e", extra, str(work / "pull.yml"))


def test_a_missing_image_is_pulled_with_layer_progress_then_left_alone(registry):
    image, work = registry["image"], registry["work"]
    check = pull(work, image, "--check")
    assert "changed=1" in check.stdout, check.stdout[-2000:]
    first = pull(work, image)
    assert first.returncode == 0, first.stdout[-3000:]
    assert "changed=1" in first.stdout
    lines = [line for line in first.stderr.splitlines() if line.startswith(f"{image}: ")]
    assert lines, first.stderr[-3000:]
    assert lines[-1].startswith(f"{image}: 4 of 4 layers pulled (4 downloaded), "), lines
    assert subprocess.run([require("docker"), "image", "inspect", image], capture_output=True, check=False).returncode == 0
    assert not [name for name in os.listdir("/tmp") if name.startswith("gpubox-pull-")], "the pull's log was left behind"
    again = pull(work, image)
    assert "changed=0" in again.stdout, again.stdout[-2000:]
    assert not [line for line in again.stderr.splitlines() if line.startswith(f"{image}: ")]


def test_a_pull_that_fails_says_what_docker_said(registry):
    missing = f"127.0.0.1:{registry['port']}/gpubox/pull-test:no-such-tag"
    result = pull(registry["work"], missing)
    out = result.stdout + result.stderr
    assert result.returncode == 2, out[-2000:]
    assert f"docker pull {missing} failed (exit code 1)" in out
    assert "not found" in out or "manifest unknown" in out
