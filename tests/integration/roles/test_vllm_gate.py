"""The correctness gate end to end, with the real vLLM CPU server deployed by the vllm role.

Tensor parallelism 2 on the CPU backend (two workers, one CPU each) is judged against the answers of one
worker (the known-safe configuration, deployed first); the verdict and the reference are stored by key and
reused; a new image tag is a new key. The same model with zeroed weights answers empty text: the gate
fails it, tries custom all-reduce off, then P2P off, stops the server and fails with the evidence.
Its own project and port, beside the shared server of the other role tests.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from vllm_server import deployed, docker, role_vars, run_role

PROJECT = "gpubox-test-gate"
PORT = 18150
REFERENCE = "Correctness gate: the reference answers come from one CPU worker"


def gate_vars(work: Path, image: str, **extra) -> dict:
    return role_vars(work, image, vllm_project_name=PROJECT, vllm_port=PORT, vllm_tensor_parallel_size=2, **extra)


def store(work: Path) -> dict:
    return json.loads((work / "state" / "gate.json").read_text())


@pytest.fixture(scope="module")
def gate(vllm_image, tmp_path_factory):
    """TP=2 deployed once through the gate; torn down at the end."""
    work = tmp_path_factory.mktemp("gate")
    with deployed(vllm_image, work, gate_vars(work, vllm_image)) as first:
        yield {"work": work, "image": vllm_image, "first": first}


def test_tensor_parallel_answers_agree_with_one_worker_and_a_rerun_reuses_the_reference(gate):
    first = gate["first"]
    assert first.returncode == 0, first.stdout[-5000:]
    assert REFERENCE in first.stdout
    assert "the correctness gate passed with the configuration as planned;  8 of 8 prompts agree" in first.stdout
    compose = (gate["work"] / "project" / "compose.yaml").read_text()
    assert '"--tensor-parallel-size", "2", "--distributed-executor-backend", "mp"' in compose
    assert '"VLLM_CPU_OMP_THREADS_BIND": "0|1"' in compose
    (entry,) = store(gate["work"]).values()
    assert entry["chosen"] == "as_planned"
    assert entry["reference"]["config"] == "gate.reference_one"
    assert len(entry["reference"]["answers"]) == 8
    # The tiny model continues its own text: the reference is what a sound server answers.
    assert entry["reference"]["answers"][0]["text"].startswith(" tensors over links and nginx streams tokens")
    assert entry["results"]["as_planned"]["agreement"]["agreeing"] == 8
    # The same deployment run again: the stored verdict and reference are reused, and nothing changes.
    again = run_role(gate["work"], gate_vars(gate["work"], gate["image"]))
    assert again.returncode == 0, again.stdout[-5000:]
    assert REFERENCE not in again.stdout
    assert "changed=0" in again.stdout, again.stdout[-3000:]


def test_a_new_image_tag_records_the_reference_again(gate):
    repo = gate["image"].split(":")[0]
    docker("tag", gate["image"], f"{repo}:gate-retag")
    try:
        result = run_role(gate["work"], gate_vars(gate["work"], gate["image"], vllm_image_tag="gate-retag"))
        assert result.returncode == 0, result.stdout[-5000:]
        assert REFERENCE in result.stdout
        assert sorted(key.rsplit(":", 1)[1] for key in store(gate["work"])) == sorted([gate["image"].split(":")[1], "gate-retag"])
    finally:
        # The server keeps running the new tag's image (the tag is only removed); the next test deploys its own.
        docker("rmi", f"{repo}:gate-retag")


def test_degenerate_answers_fall_back_then_stop_the_server_with_the_evidence(gate):
    """The weights under the same path go bad (zeroed): the stored reference shows it, every fallback fails too."""
    work = gate["work"]
    container = docker("create", gate["image"])
    try:
        docker("cp", f"{container}:/models/tiny-zero/model.safetensors", str(work / "tiny-chat" / "model.safetensors"))
    finally:
        docker("rm", container)
    docker("restart", f"{PROJECT}-vllm-1")
    result = run_role(work, gate_vars(work, gate["image"]))
    assert result.returncode != 0
    out = result.stdout
    assert "Correctness gate: trying no_custom_all_reduce next" in out
    assert "Correctness gate: trying no_p2p next" in out
    assert "No configuration passed the correctness gate, so the server is stopped" in out
    assert "0 of 8 prompts agree with the reference on their first 8 tokens (at least 7 must)" in out
    assert "the answer is empty" in out
    assert '\\"expected\\": \\" tensors over links and nginx streams tokens' in out
    assert docker("inspect", "-f", "{{.State.Running}}", f"{PROJECT}-vllm-1") == "false"
    compose = (work / "project" / "compose.yaml").read_text()
    assert "--disable-custom-all-reduce" in compose
    assert '"NCCL_P2P_DISABLE": "1"' in compose
    # Nothing that failed is stored as chosen: a rerun after the fix tries again.
    (entry,) = [v for k, v in store(work).items() if not k.endswith("gate-retag")]
    assert entry["chosen"] == "as_planned"
