"""wait_for_vllm, run as Ansible runs it (its action plugin, which runs the module on the host once per interval),
against a stand-in docker CLI and a URL that refuses connections. The answered path is every deploy of the
integration tests (tests/integration/roles/test_vllm.py reads its progress lines)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ANSIBLE_ENV, ROOT

LOG = [
    "(APIServer pid=1) INFO 12-01 12:44:26 [api_utils.py:286] non-default args: {'port': 18190}",
    "(EngineCore pid=24) INFO 12-01 12:44:42 [cpu_model_runner.py:68] Starting to load model /models/tiny-chat...",
]


@pytest.fixture
def refused():
    """A loopback URL nothing listens on (the socket is bound, not listening, so no other test takes the port)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1/models"


def stand_in_docker(tmp_path: Path, status: str = "running", exit_code: int = 0, restarts: int = 0, exists: bool = True):
    """A docker CLI that answers ``inspect`` with the given state and ``logs`` with LOG, and logs each call."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "calls.log"
    logs = tmp_path / "container.log"
    logs.write_text("\n".join(LOG) + "\n")
    state = json.dumps({"Status": status, "ExitCode": exit_code, "Running": status == "running"})
    inspect = f"echo '{state} {restarts}'" if exists else "echo 'Error: No such object: x' >&2; exit 1"
    script = bindir / "docker"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$1" >> {calls}\n'
        'case "$1" in\n'
        f"  inspect) {inspect} ;;\n"
        f"  logs) cat {logs} ;;\n"
        '  *) echo "unexpected: $*" >&2; exit 3 ;;\n'
        "esac\n"
    )
    script.chmod(0o755)
    return bindir, calls


def wait(args: dict, bindir: Path, check: bool = False) -> tuple[dict, str]:
    """The task's result and what the run printed on stderr (the progress lines)."""
    env = {**ANSIBLE_ENV, "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_STDOUT_CALLBACK": "json"}
    env["PATH"] = f"{bindir}{os.pathsep}{env['PATH']}"
    argv = ["ansible", "localhost", "-c", "local", "-i", "localhost,", "-e", f"ansible_python_interpreter={sys.executable}"]
    argv += ["-m", "gpubox.inference.wait_for_vllm", "-a", json.dumps(args)] + (["--check"] if check else [])
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    document, _end = json.JSONDecoder().raw_decode(proc.stdout[proc.stdout.index("{") :])
    return document["plays"][0]["tasks"][0]["hosts"]["localhost"], proc.stdout + proc.stderr


def calls(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


def test_a_container_that_exits_fails_at_once_with_its_log(tmp_path, refused):
    bindir, log = stand_in_docker(tmp_path, status="exited", exit_code=2)
    result, _out = wait({"url": refused, "container": "c", "timeout": 300, "interval": 30}, bindir)
    assert result["failed"]
    assert result["msg"].startswith(f"vLLM's container exited (exit code 2) before it answered on {refused}")
    assert "Starting to load model" in result["msg"]
    # One module run, which saw the exit at its first look, read the log once and returned: no round waited.
    assert calls(log) == ["inspect", "logs"]


def test_a_container_docker_restarted_is_a_crash(tmp_path, refused):
    bindir, _log = stand_in_docker(tmp_path, restarts=1, exit_code=1)
    result, _out = wait({"url": refused, "container": "c", "timeout": 300}, bindir)
    assert result["failed"]
    assert result["msg"].startswith("vLLM's container restarted 1 time(s) (exit code 1) before it answered")


def test_a_server_that_does_not_answer_says_what_it_is_doing_each_interval_then_times_out(tmp_path, refused):
    bindir, log = stand_in_docker(tmp_path)
    result, out = wait({"url": refused, "container": "c", "project": "box", "timeout": 6, "interval": 1}, bindir)
    assert result["failed"]
    assert result["msg"].startswith(f"vLLM did not answer on {refused} within vllm_wait_timeout=6 s; its last log lines:")
    assert "Starting to load model" in result["msg"]
    progress = [line for line in out.splitlines() if line.startswith("box: ")]
    assert progress, out
    assert all(line.startswith("box: loading the weights, ") for line in progress), progress
    # A module run per interval: each read the log once, at its end; the last run's log went into the failure.
    assert calls(log).count("logs") == len(progress) + 1
    assert calls(log).count("inspect") >= calls(log).count("logs")


def test_a_container_not_created_yet_is_waited_for(tmp_path, refused):
    bindir, log = stand_in_docker(tmp_path, exists=False)
    result, _out = wait({"url": refused, "container": "c", "timeout": 2, "interval": 1}, bindir)
    assert result["msg"].startswith("vLLM did not answer")
    assert "inspect" in calls(log)


def test_check_mode_waits_for_nothing(tmp_path, refused):
    bindir, log = stand_in_docker(tmp_path)
    result, _out = wait({"url": refused, "container": "c"}, bindir, check=True)
    assert result["skipped"]
    assert not result.get("failed")
    assert calls(log) == []


def test_the_key_is_never_shown(tmp_path, refused):
    bindir, _log = stand_in_docker(tmp_path, status="exited")
    key = "sk-wait-secret-0123456789"
    result, out = wait({"url": refused, "container": "c", "api_key": key, "timeout": 5}, bindir)
    assert result["failed"]
    assert key not in out


def test_missing_arguments_are_named(tmp_path):
    bindir, _log = stand_in_docker(tmp_path)
    result, _out = wait({"url": "http://127.0.0.1:1/v1/models"}, bindir)
    assert result["failed"]
    assert result["msg"] == "wait_for_vllm needs url and container"
