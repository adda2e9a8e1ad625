"""The serving layout chosen by measurement, end to end, with the real vLLM CPU server deployed by the vllm role.

On this 2-CPU machine: one server with tensor parallelism 2 (two workers, one CPU each) against two
replicas of one worker each (one CPU each, their own ports). vllm_layout=auto deploys and measures both
with llm_stream_probe at the target load, keeps the faster within the TTFT bound and stores the numbers;
a rerun measures nothing and changes nothing; a forced measurement (numbers written to the store, as a
measurement that came out the other way) deploys the other layout. Its own project and ports.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, run_ansible
from vllm_server import KEY, deployed, docker, role_vars, run_role

from ansible_collections.gpubox.inference.plugins.module_utils import _layout

PROJECT = "gpubox-test-layout"
PORT = 18130
LOAD = {"vllm_tune_concurrency": 4, "vllm_tune_prompt_tokens": 24, "vllm_tune_max_tokens": 16}
CANDIDATES = _layout.candidates(2, lambda size: True)


def layout_vars(work: Path, image: str, **extra) -> dict:
    settings = {"vllm_project_name": PROJECT, "vllm_port": PORT, "vllm_tensor_parallel_size": 2, "vllm_layout": "auto",
                "vllm_gate": False, **LOAD, **extra}  # fmt: skip
    return role_vars(work, image, **settings)


def stored(work: Path) -> dict:
    (entry,) = json.loads((work / "state" / "layout.json").read_text()).values()
    return entry


def services(work: Path) -> list[str]:
    listed = subprocess.run(
        ["docker", "compose", "--project-name", PROJECT, "ps", "--format", "{{.Service}}"],
        capture_output=True, text=True, check=True, cwd=work / "project",
    )  # fmt: skip
    return sorted(listed.stdout.split())


def models(port: int) -> list[str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return [model["id"] for model in json.load(response)["data"]]


@pytest.fixture(scope="module")
def measured(vllm_image, tmp_path_factory):
    """Both layouts measured once by the role; torn down at the end."""
    work = tmp_path_factory.mktemp("layout")
    with deployed(vllm_image, work, layout_vars(work, vllm_image)) as first:
        yield {"work": work, "image": vllm_image, "first": first}


def test_auto_measures_both_layouts_and_keeps_the_faster_within_the_bound(measured):
    first, work = measured["first"], measured["work"]
    assert first.returncode == 0, first.stdout[-6000:]
    assert "Layout: measuring tp2, 2xtp1 one after the other, each at 4 concurrent requests" in first.stdout
    entry = stored(work)
    numbers = entry["measured"]
    assert set(numbers) == {"tp2", "2xtp1"}
    for name in numbers:
        assert numbers[name]["succeeded"] == numbers[name]["requests"] == 16, numbers
        assert numbers[name]["tokens_per_s"] > 0
        assert numbers[name]["kv_cache_tokens"] > 0  # from each server's vllm:cache_config_info
    # The choice follows the numbers: the faster of those within twice the lowest TTFT p99.
    bound = 2 * min(n["ttft_p99_ms"] for n in numbers.values())
    faster = max((n for n in numbers if numbers[n]["ttft_p99_ms"] <= bound), key=lambda n: numbers[n]["tokens_per_s"])
    assert entry["chosen"] == faster
    assert entry["load"] == {"concurrency": 4, "prompt_tokens": 24, "max_tokens": 16}
    print("\n".join(_layout.table(CANDIDATES, numbers, entry["chosen"])))  # for the record (pytest -s)
    # The table, with the kept one marked.
    assert f"{faster}*" in first.stdout
    assert "TTFT p99 ms" in first.stdout
    expected = ["vllm", "vllm-2"] if faster == "2xtp1" else ["vllm"]
    assert services(work) == expected


def test_replicas_each_take_one_cpu_and_their_own_port(measured):
    """Whichever was kept, the replicas' Compose services as the measurement deployed them, and both answer."""
    work = measured["work"]
    if stored(work)["chosen"] != "2xtp1":
        force(work, faster="2xtp1")
        result = run_role(work, layout_vars(work, measured["image"]))
        assert result.returncode == 0, result.stdout[-5000:]
    compose = (work / "project" / "compose.yaml").read_text()
    assert '"VLLM_CPU_OMP_THREADS_BIND": "0"' in compose
    assert '"VLLM_CPU_OMP_THREADS_BIND": "1"' in compose
    assert f'"--port", "{PORT + 1}"' in compose
    assert models(PORT) == models(PORT + 1) == ["tiny"]
    # vLLM really bound each replica's worker threads to its own CPU.
    assert worker_cpus(f"{PROJECT}-vllm-1") == {"0"}
    assert worker_cpus(f"{PROJECT}-vllm-2-1") == {"1"}


def worker_cpus(container: str) -> set[str]:
    """The CPUs the threads of the container's vLLM worker process may run on."""
    script = (
        'for p in /proc/[0-9]*; do [ "$(cat $p/comm)" = "VLLM::Worker" ] || continue; '
        "for t in $p/task/*; do grep Cpus_allowed_list $t/status | cut -f2; done; done"
    )
    return set(docker("exec", container, "bash", "-c", script).split())


def test_a_rerun_measures_nothing_and_changes_nothing(measured):
    again = run_role(measured["work"], layout_vars(measured["work"], measured["image"]))
    assert again.returncode == 0, again.stdout[-5000:]
    assert "Layout: measuring" not in again.stdout
    assert "changed=0" in again.stdout, again.stdout[-3000:]


def force(work: Path, faster: str) -> None:
    """Write a measurement in which ``faster`` won, as the role stores one."""
    path = work / "state" / "layout.json"
    store = json.loads(path.read_text())
    (key,) = store
    numbers = {name: {"tokens_per_s": 10.0, "ttft_p50_ms": 50.0, "ttft_p99_ms": 100.0, "requests": 16, "succeeded": 16,
                      "kv_cache_tokens": 1000} for name in ("tp2", "2xtp1")}  # fmt: skip
    numbers[faster]["tokens_per_s"] = 20.0
    outcome = _layout.outcome(CANDIDATES, numbers)
    assert outcome["chosen"] == faster
    store[key] = {**store[key], "chosen": outcome["chosen"], "decision": outcome["decision"], "measured": numbers}
    path.write_text(json.dumps(store))


def test_a_forced_measurement_flips_the_deployed_layout(measured):
    """With the gate on: the layout deployed follows the stored numbers, and the gate judges it."""
    work = measured["work"]
    other = "tp2" if stored(work)["chosen"] == "2xtp1" else "2xtp1"
    force(work, faster=other)
    result = run_role(work, layout_vars(work, measured["image"], vllm_gate=True))
    assert result.returncode == 0, result.stdout[-6000:]
    assert "Layout: measuring" not in result.stdout
    assert services(work) == (["vllm", "vllm-2"] if other == "2xtp1" else ["vllm"])
    assert f"{other} measured 20.0 tokens/s" in (work / "project" / "compose.yaml").read_text()
    assert "Correctness gate: the correctness gate passed" in result.stdout
    assert (json.loads((work / "state" / "vllm.json").read_text()))["layout"] == other


def test_tune_measures_again_prints_the_table_and_deploys_what_vllm_layout_says(measured):
    """playbooks/tune.yml over a forced store: both layouts measured anew; vllm_layout=tp keeps one server."""
    work = measured["work"]
    force(work, faster="2xtp1")
    inventory = work / "tune-hosts.yml"
    host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory.write_text(yaml.safe_dump({"all": {"children": {"gpu_boxes": {"hosts": {"localhost": host}}}}}))
    extra = work / "tune-vars.json"
    extra.write_text(json.dumps(layout_vars(work, measured["image"], vllm_layout="tp")))
    result = run_ansible("ansible-playbook", "-i", str(inventory), "-e", f"@{extra}", str(ROOT / "playbooks" / "tune.yml"))
    assert result.returncode == 0, result.stdout[-6000:]
    assert "Layout: measuring tp2, 2xtp1 one after the other" in result.stdout
    assert "TTFT p99 ms" in result.stdout
    entry = stored(work)
    assert {n["tokens_per_s"] for n in entry["measured"].values()} != {10.0, 20.0}  # measured, not the forced numbers
    assert services(work) == ["vllm"]
    assert json.loads((work / "state" / "vllm.json").read_text())["layout"] == "tp2"
