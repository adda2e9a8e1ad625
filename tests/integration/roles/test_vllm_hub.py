"""A model from a Hub, end to end: resolved, checked, fetched with progress and served offline by the real vLLM.

No Hub is reachable here, so tests/hub_server.py answers the Hub's API on loopback with
the tiny test model; the download is the real huggingface_hub client in the vLLM image, the
server the real vLLM, the client the official openai one.

Needs Docker and the image from scripts/vllm-test-image.sh (`make deps` builds both).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import openai
import pytest
import yaml
from conftest import ANSIBLE_ENV, ROOT, require, run_ansible
from hub_server import Hub
from vllm_server import KEY, PORT, copy_model_out, docker, role_vars

HUB_PORT = PORT + 5
SERVED_PORT = PORT + 6
PROJECT = "gpubox-test-vllm-hub"
TOKEN = "hf_gpuboxTestToken7Qz2xW9v"
GATED = "gpubox/gated-chat"
BIG = "gpubox/big-weights"
WEIGHTS = 24 * 1024 * 1024


@pytest.fixture(scope="module")
def hub(vllm_image, tmp_path_factory):
    """The Hub on loopback: the tiny model open and gated, a repository of 24 MiB of weights, one with two commits."""
    folder = tmp_path_factory.mktemp("hub-models")
    copy_model_out(vllm_image, folder)
    tiny = folder / "tiny-chat"
    server = Hub()
    server.add("gpubox/tiny-chat", tiny)
    server.add(GATED, tiny, token=TOKEN)
    server.add(BIG, files={"config.json": (tiny / "config.json").read_bytes(), "model.safetensors": os.urandom(WEIGHTS)})
    revs = server.add("gpubox/two-commits", tiny)
    revs.tags["v1"] = revs.commits[0][0]
    changed = json.loads((tiny / "generation_config.json").read_text()) | {"temperature": 0.7}
    revs.commit({**revs.commits[0][1], "generation_config.json": json.dumps(changed).encode()})
    server.start(HUB_PORT)
    yield server
    server.stop()


def hub_vars(work: Path, image: str, **extra) -> dict:
    defaults = {
        "vllm_model": GATED,
        "vllm_hf_token": TOKEN,
        "vllm_hf_endpoint": f"http://127.0.0.1:{HUB_PORT}",
        "vllm_served_model_name": "tiny",
        "vllm_port": SERVED_PORT,
        "vllm_project_name": PROJECT,
        "_vllm_progress_interval": 1,
    }
    return role_vars(work, image, **(defaults | extra))


def play_argv(work: Path, tasks: list[dict], variables: dict, *flags: str) -> list[str]:
    """The command line of a play of these tasks on localhost, its files written to work."""
    (work / "play.yml").write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": tasks}]))
    (work / "vars.json").write_text(json.dumps(variables))
    return ["ansible-playbook", "-i", "localhost,", "-c", "local", *flags, "-e", f"@{work / 'vars.json'}", str(work / "play.yml")]


def play(work: Path, tasks: list[dict], variables: dict, *flags: str) -> subprocess.CompletedProcess:
    return run_ansible(*play_argv(work, tasks, variables, *flags))


def role(work: Path, variables: dict, *flags: str, tasks_from: str = "main.yml") -> subprocess.CompletedProcess:
    task = {"ansible.builtin.include_role": {"name": "gpubox.inference.vllm", "tasks_from": tasks_from}}
    return play(work, [task], variables, *flags)


FETCH_TASKS = [
    {
        "gpubox.inference.hf_model_info": {"model": "{{ model }}", "revision": "{{ revision | default('main') }}",
                                           "endpoint": "{{ endpoint }}", "cache_dir": "{{ cache }}"},
        "register": "found",
    },
    {
        "gpubox.inference.hf_model_fetch": {"model": "{{ model }}", "commit": "{{ found.commit }}", "files": "{{ found.files }}",
                                            "endpoint": "{{ endpoint }}", "cache_dir": "{{ cache }}", "image": "{{ image }}",
                                            "name": "gpubox-test-fetch", "interval": 1},
        "when": "not found.complete",
    },
]  # fmt: skip


def fetch(work: Path, image: str, model: str, cache: Path, **extra) -> subprocess.CompletedProcess:
    """The two modules alone, as the role runs them: resolve and measure, then download what is missing."""
    return play(work, FETCH_TASKS, fetch_vars(image, model, cache, **extra))


def fetch_vars(image: str, model: str, cache: Path, **extra) -> dict:
    endpoint = f"http://127.0.0.1:{HUB_PORT}"
    return {
        "ansible_python_interpreter": sys.executable,
        "model": model,
        "endpoint": endpoint,
        "cache": str(cache),
        "image": image,
        **extra,
    }


@pytest.fixture(scope="module")
def served(vllm_image, hub, tmp_path_factory):
    """The gated model deployed by the role with its token, under -vvv and --diff (the output the token must stay out of)."""
    work = tmp_path_factory.mktemp("vllm-hub")
    result = role(work, hub_vars(work, vllm_image), "-vvv", "--diff")
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
    yield {"work": work, "result": result}
    subprocess.run(
        [require("docker"), "compose", "--project-name", PROJECT, "down", "--timeout", "2"], capture_output=True, check=False
    )


def chat(port: int = SERVED_PORT) -> str:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY)
    reply = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0
    )
    return reply.choices[0].message.content or ""


def test_the_role_fetches_a_gated_model_with_its_token_and_serves_it_offline(served, hub):
    # Progress lines go to stderr, so that stdout stays the callback's (JSON with the json callback).
    out = served["result"].stderr
    assert f"{GATED}: downloading 6 files, 672.7 KiB to go, from http://127.0.0.1:{HUB_PORT}" in out
    assert f"{GATED}: 672.7 KiB of 672.7 KiB (100%)" in out
    assert hub.gets(GATED, "model.safetensors") == 1
    assert chat()
    compose = yaml.safe_load((served["work"] / "project" / "compose.yaml").read_text())["services"]["vllm"]
    commit = hub.repos[GATED].commits[-1][0]
    assert compose["command"][:2] == ["--model", f"/root/.cache/huggingface/hub/models--gpubox--gated-chat/snapshots/{commit}"]
    assert compose["environment"]["HF_HUB_OFFLINE"] == "1"
    assert compose["env_file"] == ["vllm.env"], "the server needs no token once the role fetched the model"
    record = json.loads((served["work"] / "state" / "vllm.json").read_text())
    assert (record["model_revision"], record["model_commit"]) == ("main", commit)
    assert docker("ps", "-aq", "--filter", f"name={PROJECT}-fetch") == "", "the download container is removed"


def test_the_token_is_only_in_its_0600_file(served):
    work = served["work"]
    token_file = work / "project" / "hub.env"
    assert token_file.read_text() == f"HF_TOKEN={TOKEN}\n"
    assert oct(token_file.stat().st_mode & 0o777) == "0o600"
    result = served["result"]
    assert TOKEN not in result.stdout + result.stderr, "the token is in the play's output (-vvv --diff)"
    assert "ESTABLISH LOCAL CONNECTION" in result.stdout, "the run was not verbose: the check above proves little"
    # Every file the role wrote (the project, the records, the cache), less the test's own -e file (a vault in real use).
    leaks = [
        str(path)
        for path in work.rglob("*")
        if path.is_file() and path not in (token_file, work / "vars.json") and TOKEN.encode() in path.read_bytes()
    ]
    assert leaks == []
    config = subprocess.run(
        [require("docker"), "compose", "--project-directory", str(work / "project"), "config"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert TOKEN not in config.stdout
    assert TOKEN not in docker("inspect", f"{PROJECT}-vllm-1")


def test_a_second_run_downloads_nothing_and_changes_nothing(served, hub, vllm_image):
    before = hub.gets(GATED, "model.safetensors")
    again = role(served["work"], hub_vars(served["work"], vllm_image))
    assert again.returncode == 0, again.stdout[-3000:]
    assert "changed=0" in again.stdout, again.stdout[-3000:]
    assert "downloading" not in again.stdout + again.stderr
    assert hub.gets(GATED, "model.safetensors") == before


@pytest.mark.parametrize(
    ("model", "token", "endpoint", "words"),
    [
        (GATED, "", None, f"{GATED} at http://127.0.0.1:{HUB_PORT} answered HTTP 401: the model is gated."),
        (
            GATED,
            "hf_someoneElsesToken00000",
            None,
            "answered HTTP 403: the token in vllm_hf_token has no access to this gated model",
        ),
        (
            "gpubox/tiny-caht",
            "",
            None,
            "gpubox/tiny-caht at http://127.0.0.1:{hub} answered HTTP 401: no such model. Check vllm_model",
        ),
        ("gpubox/tiny-chat", "", "http://127.0.0.1:9", "http://127.0.0.1:9 cannot be reached from the box for gpubox/tiny-chat"),
    ],
    ids=["gated-no-token", "gated-wrong-token", "typo", "unreachable"],
)
def test_a_model_that_cannot_be_fetched_stops_the_plan_before_anything_changes(
    hub, vllm_image, tmp_path, model, token, endpoint, words
):
    extra = {"vllm_model": model, "vllm_hf_token": token, "vllm_project_dir": str(tmp_path / "project")}
    if endpoint:
        extra["vllm_hf_endpoint"] = endpoint
    result = role(tmp_path, hub_vars(tmp_path, vllm_image, **extra))
    out = result.stdout + result.stderr
    assert result.returncode == 2, out[-3000:]
    assert words.format(hub=HUB_PORT) in out
    assert not (tmp_path / "project").exists()
    assert not (tmp_path / "hf").exists()


def test_a_model_the_disk_cannot_hold_is_refused_with_both_numbers(hub, vllm_image, tmp_path):
    cache = tmp_path / "small"
    cache.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(cache)], check=True)
    try:
        variables = hub_vars(tmp_path, vllm_image, vllm_model="gpubox/tiny-chat", vllm_hf_cache_dir=str(cache),
                             vllm_project_dir=str(tmp_path / "project"))  # fmt: skip
        result = role(tmp_path, variables)
        out = result.stdout + result.stderr
        assert result.returncode == 2, out[-3000:]
        assert (
            f"gpubox/tiny-chat does not fit in vllm_hf_cache_dir={cache}: 672.7 KiB still to download plus the margin needs "
            "1.0 GiB, and 512.0 KiB is free there"
        ) in out
        assert list(cache.iterdir()) == []
        assert not (tmp_path / "project").exists()
    finally:
        subprocess.run(["umount", str(cache)], check=False)


def progress_lines(stderr: list[str]) -> list[str]:
    return [line for line in stderr if line.startswith(f"{BIG}: ") and " of 24.0 MiB " in line]


def test_a_long_download_shows_progress_lines(hub, vllm_image, tmp_path):
    # Slow enough for lines to come while it runs, however long each poll takes on a loaded machine; once two have
    # come, the Hub lets the rest go at full speed, so the test costs no more than the polls it watches.
    hub.rate = 512 * 1024
    argv = play_argv(tmp_path, FETCH_TASKS, fetch_vars(vllm_image, BIG, tmp_path / "hf"))
    run = subprocess.Popen(argv, cwd=ROOT, env=ANSIBLE_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stderr: list[str] = []
    try:
        for line in run.stderr:
            stderr.append(line.rstrip("\n"))
            if len(progress_lines(stderr)) >= 2:
                hub.rate = 0
        stdout = run.stdout.read()
        run.wait(timeout=120)
    finally:
        hub.rate = 0
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, stdout[-3000:]
    lines = progress_lines(stderr)
    assert len(lines) >= 3, "\n".join(stderr[-30:])
    units = {"B": 1, "KiB": 1024, "MiB": 1024**2}
    done = [float(number) * units[unit] for number, unit in (line.split(": ", 1)[1].split(" ")[:2] for line in lines)]
    assert done == sorted(done), lines
    assert "(100%)" in lines[-1], lines
    assert "(100%)" not in lines[0], "the first line came after the download had finished"
    assert len(set(done)) >= 2, "the lines never moved"
    assert all(" at " in line and " left, " in line for line in lines)


def test_an_interrupted_download_resumes_with_what_it_had_not_finished(hub, vllm_image, tmp_path):
    cache = tmp_path / "hf"
    blobs = cache / "hub" / "models--gpubox--big-weights" / "blobs"
    sent = hub.gets(BIG, "config.json"), hub.gets(BIG, "model.safetensors")
    hub.rate = 2 * 1024 * 1024
    argv = play_argv(tmp_path, FETCH_TASKS, fetch_vars(vllm_image, BIG, cache))
    first = subprocess.Popen(
        argv, cwd=ROOT, env=ANSIBLE_ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 60
        while not list(blobs.glob("*.incomplete")) or os.path.getsize(next(blobs.glob("*.incomplete"))) < 10 * 1024**2:
            assert time.monotonic() < deadline, "the first download never got 10 MiB of the weights"
            time.sleep(0.2)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        subprocess.run([require("docker"), "kill", "gpubox-test-fetch"], capture_output=True, check=False)
        hub.rate = 0
    # Once read into memory by hf_model_info (the plan needs it before the download), once downloaded.
    assert hub.gets(BIG, "config.json") == sent[0] + 2
    again = fetch(tmp_path, vllm_image, BIG, cache)
    assert again.returncode == 0, again.stdout[-3000:]
    assert "changed=1" in again.stdout
    assert hub.gets(BIG, "config.json") == sent[0] + 2, "a file the first run finished was downloaded again"
    assert hub.gets(BIG, "model.safetensors") == sent[1] + 2
    assert list(blobs.glob("*.incomplete")) == [], "the killed download's partial file is left behind"
    check = fetch(tmp_path, vllm_image, BIG, cache)
    assert "changed=0" in check.stdout, check.stdout[-2000:]


def test_a_new_revision_downloads_only_the_files_that_differ(hub, vllm_image, tmp_path):
    model = "gpubox/two-commits"
    first = fetch(tmp_path, vllm_image, model, tmp_path / "hf", revision="v1")
    assert first.returncode == 0, first.stdout[-3000:]
    second = fetch(tmp_path, vllm_image, model, tmp_path / "hf")
    assert second.returncode == 0, second.stdout[-3000:]
    assert "changed=1" in second.stdout
    assert hub.gets(model, "generation_config.json") == 2
    assert (hub.gets(model, "model.safetensors"), hub.gets(model, "tokenizer.json")) == (1, 1)
    # config.json: read into memory by the first run's plan, then downloaded; the second reads it from the cache.
    assert hub.gets(model, "config.json") == 2
    snapshots = sorted(p.name for p in (tmp_path / "hf" / "hub" / "models--gpubox--two-commits" / "snapshots").iterdir())
    assert snapshots == sorted(commit for commit, _files in hub.repos[model].commits)


def test_the_served_model_answers_with_the_hub_gone(served, hub):
    """Last in this file: the Hub stops, the server restarts, and it still serves from the cache."""
    hub.stop()
    try:
        docker("restart", "--time", "2", f"{PROJECT}-vllm-1")
        deadline = time.monotonic() + 120
        while True:
            try:
                request = urllib.request.Request(
                    f"http://127.0.0.1:{SERVED_PORT}/v1/models", headers={"Authorization": f"Bearer {KEY}"}
                )
                with urllib.request.urlopen(request, timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, docker("logs", "--tail", "30", f"{PROJECT}-vllm-1")
            time.sleep(1)
        assert chat()
    finally:
        hub.start(HUB_PORT)
