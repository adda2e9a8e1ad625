"""The engine watchdog's program against the real vLLM CPU server that the vllm role deploys.

The server runs as vLLM runs on a GPU box, its engine in a process of its own (V1 multiprocessing),
here with VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1 as well (the API server of older vLLM releases outlived
its engine; 0.32 exits, and Docker restarts it). Each run of the program is one tick of the timer,
which this machine (no systemd) cannot run: Molecule's box runs the real timer. Its own project
and port, beside the shared server of the other role tests.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import COLLECTIONS, ROOT
from vllm_server import deployed, docker, role_vars, run_role

PROJECT = "gpubox-test-watchdog"
PORT = 18140
PROGRAM = ROOT / "roles" / "vllm" / "files" / "gpubox-vllm-watchdog.py"
# Find the engine core by its process title, inside the container, and send it a signal.
SIGNAL_ENGINE = """
import os, signal, sys
for pid in os.listdir("/proc"):
    if pid.isdigit() and open(f"/proc/{pid}/cmdline", "rb").read().startswith(b"VLLM::EngineCore"):
        os.kill(int(pid), getattr(signal, sys.argv[1]))
        print(pid)
"""


def engine(signal: str) -> str:
    """Signal vLLM's engine core process (SIGSTOP freezes it: a hang its API server does not see)."""
    pid = docker("exec", f"{PROJECT}-vllm-1", "python3", "-c", SIGNAL_ENGINE, signal)
    assert pid, "no VLLM::EngineCore process in the container"
    return pid


def server_vars(work: Path, image: str) -> dict:
    """The role's variables for this file's server (the role itself installs no watchdog here: vllm_watchdog false)."""
    return role_vars(
        work,
        image,
        vllm_project_name=PROJECT,
        vllm_port=PORT,
        vllm_gate=False,
        vllm_env={"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1"},
    )


@pytest.fixture(scope="module")
def server(vllm_image, tmp_path_factory):
    work = tmp_path_factory.mktemp("watchdog")
    with deployed(vllm_image, work, server_vars(work, vllm_image)) as result:
        assert result.returncode == 0, result.stdout[-4000:]
        config = {
            "project_dir": str(work / "project"),
            "project_name": PROJECT,
            "record": str(work / "state" / "vllm.json"),
            "state": str(work / "state" / "watchdog.json"),
            "metrics": str(work / "state" / "metrics" / "vllm_watchdog.prom"),
            "timeout_s": 3,
            "health_timeout_s": 3,
            "log_lines": 5,
            "policy": {"failures": 3, "max_restarts": 3, "window_s": 3600, "start_grace_s": 120},
        }
        (work / "watchdog.json").write_text(json.dumps(config))
        yield work


def tick(work: Path) -> list[str]:
    """One run of the program, as the timer starts it; its journal lines."""
    run = subprocess.run(
        [sys.executable, str(PROGRAM), str(work / "watchdog.json")],
        capture_output=True,
        text=True,
        env={**os.environ, "GPUBOX_LIB": str(COLLECTIONS)},
        timeout=700,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout.splitlines()


def state(work: Path) -> dict:
    return json.loads((work / "state" / "watchdog.json").read_text())


def container_id() -> str:
    return docker("compose", "--project-name", PROJECT, "ps", "--quiet", "vllm")


def test_turned_off_the_role_removes_only_the_watchdog_files_that_are_there(server, vllm_image):
    """vllm_watchdog false: the files a watchdog left (its state, its metrics) are removed, and only the files that
    are there are visited (the plan's read, vllm_state_info, says which); a box that never had the watchdog spends no
    task on it, which every other role run here shows (they change nothing). First in the file: the tests after it
    start from the watchdog's fresh state, as before. (The timer and its units, which need systemd, are removed on
    Molecule's box.)"""
    left = [server / "state" / "watchdog.json", server / "state" / "metrics" / "vllm_watchdog.prom"]
    left[1].parent.mkdir(exist_ok=True)
    left[0].write_text('{"ticks": 3, "restarts_total": 0}\n')
    left[1].write_text("gpubox_vllm_watchdog_sound 1\n")
    run = run_role(server, server_vars(server, vllm_image))
    assert run.returncode == 0, run.stdout[-3000:]
    assert not [path for path in left if path.exists()]
    removed = re.findall(r"changed: \[localhost\] => \(item=(.*?)\)", run.stdout)
    assert removed == [str(path) for path in left], run.stdout[-3000:]
    assert "item=/etc/gpubox/vllm-watchdog.json" not in run.stdout, "a file that is not there is not visited"
    assert "changed=1 " in run.stdout, run.stdout[-3000:]


def test_a_healthy_server_is_never_restarted(server):
    before = container_id()
    lines = [line for _tick in range(8) for line in tick(server)]
    assert lines == ["<6>1 vLLM server(s) answer /health and a one-token completion"]
    assert state(server)["ticks"] == 8
    assert state(server)["restarts_total"] == 0
    assert container_id() == before
    metrics = (server / "state" / "metrics" / "vllm_watchdog.prom").read_text()
    assert "gpubox_vllm_watchdog_sound 1\n" in metrics
    assert "gpubox_vllm_watchdog_restarts_total 0\n" in metrics


def test_a_hung_engine_is_restarted_and_the_journal_says_why(server):
    """/health still answers 200 while the engine is frozen; the one-token completion does not."""
    before = container_id()
    engine("SIGSTOP")
    lines = tick(server) + tick(server)
    problem = "vllm: a one-token completion did not answer within 3 s and no token moved"
    assert lines == [
        f"<4>probe failed (1 of 3 in a row before a restart): {problem}",
        f"<4>probe failed (2 of 3 in a row before a restart): {problem}",
    ]
    started = time.monotonic()
    lines = tick(server)
    restart = "recreating the Compose project (restart 1 of at most 3 in 60 min)"
    assert lines[0] == f"<4>3 probes in a row failed ({problem}): {restart}"
    assert lines[1] == f"<4>last 5 log lines of {PROJECT}-vllm-1:"
    assert lines[2].startswith("<4>  | ")
    assert len(lines) == 7
    assert container_id() != before
    # Then the new container starts; the watchdog waits for it, then says it serves again.
    said = []
    while time.monotonic() - started < 300 and not any("serves again" in line for line in said):
        time.sleep(2)
        said += tick(server)
    assert said[0].startswith("<6>vllm is starting: "), said
    assert said[-1].startswith("<6>vLLM serves again, "), said
    assert state(server)["restarts_total"] == 1
    metrics = (server / "state" / "metrics" / "vllm_watchdog.prom").read_text()
    assert "gpubox_vllm_watchdog_restarts_total 1\n" in metrics
    assert "gpubox_vllm_watchdog_sound 1\n" in metrics


def test_a_dead_engine_whose_api_server_stays_up_is_restarted(server):
    """The engine process killed: the API server answers /health with 503 and never exits (keep-alive)."""
    before = container_id()
    engine("SIGKILL")
    time.sleep(2)
    lines = tick(server) + tick(server) + tick(server)
    assert lines[0] == "<4>probe failed (1 of 3 in a row before a restart): vllm: /health answered HTTP 503"
    assert lines[2].startswith("<4>3 probes in a row failed (vllm: /health answered HTTP 503): recreating")
    assert any("EngineDeadError" in line or "EngineCore" in line for line in lines[3:]), lines
    assert container_id() != before


def test_containers_stopped_on_purpose_are_left_alone(server):
    docker("compose", "--project-name", PROJECT, "stop", "--timeout", "5")
    lines = [line for _tick in range(4) for line in tick(server)]
    assert lines == ["<6>vLLM's containers are stopped (by hand, or by the correctness gate); the watchdog leaves them so"]
    assert docker("compose", "--project-name", PROJECT, "ps", "--quiet") == ""
