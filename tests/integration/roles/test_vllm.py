"""The vllm role end to end: a real vLLM (CPU build, tiny local model) deployed by the role through Docker Compose
on this machine, then streamed from with the official openai client. No mock server.

Needs Docker and the image from scripts/vllm-test-image.sh (`make deps` builds both).
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest
import yaml
from conftest import ANSIBLE_ENV, ROOT, run_ansible
from hardware import one_stand_in_gpu
from vllm_server import GATE_PROMPTS, KEY, PORT, PROJECT, docker, role_argv, role_vars, run_role


@pytest.fixture(scope="module")
def image(vllm_server) -> str:
    return vllm_server["image"]


@pytest.fixture(scope="module")
def workdir(vllm_server) -> Path:
    return vllm_server["workdir"]


@pytest.fixture(scope="module")
def deployed(vllm_server):
    return vllm_server["result"]


def client() -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{PORT}/v1", api_key=KEY)


def stream_text(prompt: str) -> tuple[list[str], str | None]:
    pieces, finish = [], None
    stream = client().chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": prompt}], max_tokens=8, temperature=0, stream=True
    )
    for chunk in stream:
        choice = chunk.choices[0]
        if choice.delta.content:
            pieces.append(choice.delta.content)
        finish = choice.finish_reason or finish
    return pieces, finish


def test_bad_settings_are_refused_before_anything_changes(workdir, image):
    work = workdir / "refused"
    work.mkdir()
    variables = role_vars(workdir, image, vllm_tensor_parallel_size=3, vllm_project_dir=str(work / "project"))
    result = run_role(work, {**variables, "vllm_gpu_memory_utilization": 1.5})
    out = result.stdout + result.stderr
    assert result.returncode == 2
    assert "vllm_tensor_parallel_size=3 must divide the model's 2 attention heads" in out
    assert "vllm_gpu_memory_utilization=1.5 must be in (0, 1]" in out
    assert not (work / "project").exists()


def plan_only(work: Path, variables: dict) -> subprocess.CompletedProcess:
    """The role's plan entry point alone (what site.yml runs before it touches the box)."""
    task = {"ansible.builtin.include_role": {"name": "gpubox.inference.vllm", "tasks_from": "plan.yml"}}
    show = {"ansible.builtin.debug": {"msg": "{{ __vllm_plan.warnings }}"}}
    (work / "plan.yml").write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": [task, show]}]))
    (work / "vars.json").write_text(json.dumps(variables))
    extra = f"@{work / 'vars.json'}"
    return run_ansible("ansible-playbook", "-i", "localhost,", "-c", "local", "-e", extra, str(work / "plan.yml"))


@pytest.mark.parametrize("allow", [False, True])
def test_a_gpu_swap_that_loses_a_gpu_is_refused_unless_allowed(workdir, image, tmp_path, monkeypatch, allow):
    """The last deployment ran on 2 GPUs; now NVML sees 1. The plan fails before anything changes, or warns."""
    one_stand_in_gpu(tmp_path, monkeypatch)
    variables = role_vars(workdir, image, vllm_device="cuda", vllm_project_dir=str(tmp_path / "project"))
    variables["_vllm_state_dir"] = str(tmp_path / "state")
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "vllm.json").write_text(json.dumps({"tensor_parallel_size": 2, "nccl_p2p_disable": False}))
    result = plan_only(tmp_path, {**variables, "vllm_allow_downgrade": allow})
    out = result.stdout + result.stderr
    if allow:
        assert result.returncode == 0, out[-3000:]
        assert "downgraded after the GPU change: tensor parallel size 2 -> 1" in out
    else:
        assert result.returncode == 2
        assert "the GPUs changed and the running deployment cannot be kept as it is: tensor parallel size 2 -> 1" in out
        assert "set vllm_allow_downgrade=true" in out
    assert not (tmp_path / "project").exists()


def test_the_role_deploys_a_server_that_streams(deployed, workdir):
    assert KEY not in deployed.stdout + deployed.stderr, "the API key leaked into the output"
    pieces, finish = stream_text("hello")
    assert len(pieces) >= 2, pieces
    assert finish == "length"


def test_output_is_deterministic_at_temperature_zero(deployed):
    # Chunk boundaries may differ between runs; the text may not.
    first, second = ("".join(stream_text("tell me about gpus")[0]) for _run in range(2))
    assert first
    assert first == second


def test_stream_ends_with_done_event(deployed):
    request = urllib.request.Request(
        f"http://127.0.0.1:{PORT}/v1/chat/completions",
        data=json.dumps(
            {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0, "stream": True}
        ).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        events = [line for line in response.read().decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert len(events) >= 3


def test_the_key_is_required(deployed):
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"http://127.0.0.1:{PORT}/v1", api_key="wrong").models.list()


def listening(port: int) -> list[str]:
    """The local addresses this machine listens on at ``port``, from ss."""
    out = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True).stdout
    return sorted(line.split()[3] for line in out.splitlines())


def test_compose_project_is_loopback_only_and_explains_itself(deployed, workdir):
    compose = (workdir / "project" / "compose.yaml").read_text()
    assert "    network_mode: host\n" in compose
    assert "ports:" not in compose
    assert f"#   --host: 127.0.0.1:{PORT} on the host's own network, loopback only" in compose
    assert "#   --tensor-parallel-size: 1: the CPU backend" in compose
    assert KEY not in compose
    env_file = workdir / "project" / "vllm.env"
    assert oct(env_file.stat().st_mode & 0o777) == "0o600"
    assert docker("inspect", "-f", "{{.HostConfig.NetworkMode}}", f"{PROJECT}-vllm-1") == "host"
    # The server itself binds the host's loopback, and nothing else on that port.
    assert listening(PORT) == [f"127.0.0.1:{PORT}"]


def test_bridge_network_publishes_the_port_on_loopback_only(workdir, image):
    work = workdir / "bridge"
    work.mkdir()
    project = f"{PROJECT}-bridge"
    # Its own records, so the main deployment's second converge still finds its own.
    variables = role_vars(
        workdir, image, records=work, vllm_network_mode="bridge", vllm_port=PORT + 2, vllm_project_name=project,
        vllm_project_dir=str(work / "project"),
    )  # fmt: skip
    try:
        result = run_role(work, variables)
        assert result.returncode == 0, result.stdout[-3000:]
        compose = (work / "project" / "compose.yaml").read_text()
        assert f'ports: ["127.0.0.1:{PORT + 2}:8000"]' in compose
        assert "network_mode" not in compose
        assert docker("port", f"{project}-vllm-1", "8000").splitlines() == [f"127.0.0.1:{PORT + 2}"]
        models = openai.OpenAI(base_url=f"http://127.0.0.1:{PORT + 2}/v1", api_key=KEY).models.list()
        assert [model.id for model in models] == ["tiny"]
    finally:
        subprocess.run(
            ["docker", "compose", "--project-name", project, "down", "--timeout", "1"], capture_output=True, check=False
        )


def test_second_converge_changes_nothing_and_keeps_the_container(deployed, workdir, image):
    started = docker("inspect", "-f", "{{.State.StartedAt}}", f"{PROJECT}-vllm-1")
    again = run_role(workdir, role_vars(workdir, image))
    assert again.returncode == 0, again.stdout[-3000:]
    assert "changed=0" in again.stdout, again.stdout[-3000:]
    assert docker("inspect", "-f", "{{.State.StartedAt}}", f"{PROJECT}-vllm-1") == started


def test_models_endpoint_without_key_is_refused(deployed):
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"http://127.0.0.1:{PORT}/v1/models", timeout=10)
    assert refused.value.code == 401


def test_a_server_that_does_not_come_up_fails_with_its_log(workdir, image):
    work = workdir / "broken"
    work.mkdir()
    variables = role_vars(
        workdir,
        image,
        vllm_project_dir=str(work / "project"),
        vllm_project_name="gpubox-test-vllm-broken",
        vllm_port=PORT + 1,
        vllm_extra_args=["--no-such-flag"],
    )
    try:
        result = run_role(work, variables)
        out = result.stdout + result.stderr
        assert result.returncode == 2
        # Said as soon as the container exits (vllm_wait_timeout is 300 s here), not at the timeout.
        assert f"before it answered on http://127.0.0.1:{PORT + 1}/v1/models; its last log lines:" in out
        assert "vLLM's container " in out
        assert "--no-such-flag" in out.split("its last log lines:", 1)[1]
        assert "Rolled back" not in out, "there was no earlier deployment to roll back to"
    finally:
        subprocess.run(
            ["docker", "compose", "--project-name", "gpubox-test-vllm-broken", "down", "--timeout", "1"],
            capture_output=True,
            check=False,
        )


def test_the_start_shows_what_the_server_is_doing(deployed):
    lines = [line for line in deployed.stderr.splitlines() if line.startswith(f"{PROJECT}: ")]
    assert lines, deployed.stderr[-3000:]
    assert any(line.endswith(" so far") for line in lines), lines
    # 42s, or 1m33s on a busy machine (_hub.human_seconds).
    assert re.fullmatch(rf"{PROJECT}: /v1/models answered after (\d+m)?\d+s", lines[-1]), lines


def test_a_deploy_that_does_not_come_up_rolls_back_to_the_one_that_answered(deployed, workdir, image):
    good = (workdir / "project" / "compose.yaml").read_text()
    assert (workdir / "state" / "compose.good.yaml").read_text() == good
    broken = run_role(workdir, role_vars(workdir, image, vllm_extra_args=["--no-such-flag"]))
    out = broken.stdout + broken.stderr
    assert broken.returncode == 2, out[-3000:]
    assert "its last log lines:" in out
    assert "Rolled back: the last deployment that answered is serving again" in out
    assert (workdir / "project" / "compose.yaml").read_text() == good
    assert [model.id for model in client().models.list()] == ["tiny"]
    pieces, _finish = stream_text("hello again")
    assert pieces


def test_an_image_that_needs_a_newer_cuda_than_the_driver_is_refused_before_the_switch(workdir, image, tmp_path, monkeypatch):
    """The image declares cuda>=12.8; the stand-in driver supports CUDA 12.4: refused, naming both, before Compose."""
    needs = f"{image.split(':')[0]}:needs-cuda-12.8"
    (tmp_path / "Dockerfile").write_text(
        f'FROM {image}\nENV NVIDIA_REQUIRE_CUDA="cuda>=12.8 brand=unknown,driver>=470,driver<471"\n'
    )
    docker("build", "-q", "-t", needs, str(tmp_path))
    try:
        one_stand_in_gpu(tmp_path, monkeypatch, cuda=12040)
        variables = role_vars(workdir, image, vllm_device="cuda", vllm_project_dir=str(tmp_path / "project"))
        variables |= {"vllm_image_tag": "needs-cuda-12.8", "_vllm_state_dir": str(tmp_path / "state")}
        result = run_role(tmp_path, variables)
        out = result.stdout + result.stderr
        assert result.returncode == 2, out[-3000:]
        assert f"{needs} needs CUDA 12.8 (its NVIDIA_REQUIRE_CUDA), and the NVIDIA driver on this box supports CUDA 12.4" in out
        assert not (tmp_path / "project" / "compose.yaml").exists()
    finally:
        docker("image", "rm", needs)


def test_a_box_of_a_fleet_is_drained_only_when_its_server_restarts_and_its_streams_finish_first(deployed, workdir, image):
    """vllm_drain_flag: a rerun that changes nothing leaves the box in rotation; a changed setting drains it (the
    flag, which the box's front door reads) and waits for the streams in flight before the server restarts.

    No Nginx here: the test plays the gateway. Its streams stop starting once the flag is there; the requests that
    reach the box as the door closes keep coming until the wait has seen them in flight, so that the wait always has
    something to wait for, however long the role takes from the flag to the wait's first look."""
    import threading
    import time

    flag = workdir / "drain" / "drained"
    flag.parent.mkdir(exist_ok=True)
    same = run_role(workdir, role_vars(workdir, image, vllm_drain_flag=str(flag)))
    assert same.returncode == 0, same.stdout[-3000:]
    assert "changed=0" in same.stdout, same.stdout[-3000:]
    assert not flag.exists(), "a box whose server does not restart is not drained"

    streams: list[dict] = []
    stop = threading.Event()

    def stream_once(index: int, max_tokens: int) -> None:
        record: dict = {"finished": set(), "tokens": 0, "start": time.monotonic()}
        streams.append(record)
        prompt = GATE_PROMPTS[index % len(GATE_PROMPTS)]
        try:
            stream = client().completions.create(
                model="tiny", prompt=prompt, max_tokens=max_tokens, n=4, temperature=0.8, stream=True,
                extra_body={"ignore_eos": True},
            )  # fmt: skip
            for chunk in stream:
                for choice in chunk.choices:
                    record["tokens"] += 1
                    if choice.finish_reason:
                        record["finished"].add(choice.index)
        except openai.APIError as exc:
            record["error"] = repr(exc)
        record["seconds"] = round(time.monotonic() - record.pop("start"), 1)

    def keep_streaming(index: int) -> None:
        # Four sequences a request, each thread its own length, so that the streams do not finish together.
        while not stop.is_set() and not flag.exists():
            stream_once(index, 480 - 60 * index)

    log = workdir / "drain" / "ansible.log"
    waited = re.compile(r"FAILED - RETRYING: .*Wait for the requests in flight to finish")

    def late_requests(index: int) -> None:
        # The requests that reach the box as its front door closes (a gateway's in flight to it): back to back from
        # the flag until the wait has seen requests in flight and says so, three threads so that one is always
        # running when the wait first reads /metrics, however long the role takes from the flag to that read.
        while not stop.is_set() and not flag.exists():
            time.sleep(0.01)
        while not stop.is_set() and not waited.search(log.read_text(errors="replace")):
            stream_once(index, 120)

    threads = [threading.Thread(target=keep_streaming, args=(index,), daemon=True) for index in range(6)]
    threads += [threading.Thread(target=late_requests, args=(index,), daemon=True) for index in range(6, 9)]
    for thread in threads:
        thread.start()
    time.sleep(1)
    changed = {"VLLM_GPUBOX_TEST_DRAIN": "1"}
    try:
        with log.open("w") as sink:
            argv = role_argv(workdir, role_vars(workdir, image, vllm_drain_flag=str(flag), vllm_env=changed))
            role = subprocess.Popen(argv, cwd=ROOT, env=ANSIBLE_ENV, stdout=sink, stderr=subprocess.STDOUT, text=True)
            try:
                returncode = role.wait(timeout=900)
            finally:
                role.kill()
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    out = log.read_text(errors="replace")
    try:
        assert returncode == 0, out[-3000:]
        assert flag.exists(), "the caller (site.yml) removes the flag after the box's smoke test"
        assert "Take the box out of the fleet's rotation" in out
        assert streams, "no stream ran"
        cut = [record for record in streams if len(record["finished"]) < 4]
        assert not cut, f"{len(cut)} of {len(streams)} streams were cut by the restart: {cut[:3]}"
        # The wait saw requests in flight and waited for them (the retry lines are its progress).
        wait = out[out.find("Take the box out of the fleet's rotation") :][:3000]
        assert waited.search(out), (wait, streams)
    finally:
        flag.unlink(missing_ok=True)
        restored = run_role(workdir, role_vars(workdir, image))
        assert restored.returncode == 0, restored.stdout[-3000:]
