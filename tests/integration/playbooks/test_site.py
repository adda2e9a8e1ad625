"""site.yml on a stand-in 2x RTX 3090 box whose ACS redirects P2P: a run limited by tags deploys what a full run would.

The box is this machine, seen through the stand-ins that run the real modules unchanged: the
stand-in NVML (two RTX 3090s), the stand-in libcuda (P2P measures fine), and the preflight's
saved outputs (a SYS pair whose root port redirects P2P, captured on a real EPYC board). The runs
are in check mode with --diff, so nothing on this machine changes; what the play would deploy is
read from its JSON output: the plan and the compose.yaml the template would write.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ANSIBLE_ENV, FIXTURES, LLAMA_8B, ROOT, parse_capture, run_playbook_json
from hardware import RTX3090_PAIR, nvml_machine
from vllm_server import vllm_cache

SYS_3090 = FIXTURES / "A_topo_m" / "2x_rtx3090_SYS_numa_affinity_NA_on_gpu0_club3090_178.txt"
EPYC_ACS = FIXTURES / "C_lspci" / "amd_epyc_gpp_bridge_40_01_1_acs_enabled_elided_plus_tv_subtree_rccl547.txt"


@pytest.fixture
def box(tmp_path, fake_libcuda, monkeypatch) -> Path:
    """An inventory for this machine as the stand-in box; returns its path."""
    fakes = ROOT / "tests" / "fakes"
    monkeypatch.setitem(ANSIBLE_ENV, "PYTHONPATH", os.pathsep.join([str(fakes), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setitem(ANSIBLE_ENV, "GPUBOX_FAKE_NVML", str(nvml_machine(tmp_path / "machine.json", RTX3090_PAIR)))
    monkeypatch.setitem(ANSIBLE_ENV, "GPUBOX_LIBCUDA", str(fake_libcuda))
    monkeypatch.setitem(ANSIBLE_ENV, "FAKE_CUDA_DEVICES", "2")
    # No nvidia-smi here: the topology comes from the saved output.
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], **LLAMA_8B}))
    saved = {}
    for name, capture in (("topology", SYS_3090), ("lspci", EPYC_ACS)):
        saved[name] = tmp_path / f"{name}.txt"
        saved[name].write_text(parse_capture(capture).text)
    (tmp_path / "cmdline").write_text("ro quiet\n")
    (tmp_path / "sysfs").mkdir()
    host = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "preflight_topology_src": str(saved["topology"]),
        "preflight_lspci_src": str(saved["lspci"]),
        "preflight_cmdline_src": str(tmp_path / "cmdline"),
        "preflight_sysfs_root": str(tmp_path / "sysfs"),
        "preflight_report_dir": str(tmp_path / "reports"),
        "vllm_model": str(model),
        "vllm_served_model_name": "llama",
        "vllm_max_model_len": 8192,
        "vllm_project_dir": str(tmp_path / "project"),
        "vllm_hf_cache_dir": str(tmp_path / "hf"),
        "vllm_cache_dir": vllm_cache(),
        "_vllm_state_dir": str(tmp_path / "state"),
    }
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {"gpu_boxes": {"hosts": {"box": host}}}}}))
    return inventory


def run_site(inventory: Path, *flags: str) -> dict:
    """site.yml in check mode with --diff; the JSON callback's document."""
    argv = ["-i", str(inventory), "--check", "--diff", *flags, str(ROOT / "site.yml")]
    result, run = run_playbook_json(*argv)
    if run is None:
        pytest.fail(f"no JSON from site.yml {' '.join(flags)} (rc {result.returncode}):\n{result.stdout[-3000:]}{result.stderr}")
    return run


def task_results(run: dict, name: str) -> list[dict]:
    return [
        result
        for play in run["plays"]
        for task in play["tasks"]
        if task["task"]["name"].split(" : ")[-1] == name
        for result in task["hosts"].values()
    ]


def deployed(run: dict) -> dict:
    """What the run would deploy: the plan's settings, and the Compose file the template would write."""
    (plan,) = [r["ansible_facts"]["__vllm_plan"] for r in task_results(run, "Plan the deployment")]
    (compose,) = [r["diff"][0]["after"] for r in task_results(run, "Render the Compose project") if r.get("diff")]
    return {"args": plan["args"], "env": plan["env"], "decisions": plan["decisions"], "compose": compose}


def test_tags_vllm_keeps_p2p_off_where_acs_redirects_it_and_deploys_what_the_preflight_play_would(box):
    """The run the README suggests for a vLLM change skips the preflight play, yet deploys the preflight's decision."""
    limited_run = run_site(box, "--tags", "vllm")
    limited = deployed(limited_run)
    assert limited["env"]["NCCL_P2P_DISABLE"] == "1"
    assert "NCCL_P2P_LEVEL" not in limited["env"]
    assert "--disable-custom-all-reduce" in limited["args"]
    assert limited["decisions"]["NCCL_P2P_DISABLE"] == {
        "code": "nccl_p2p_disable.acs_redirect",
        "bridge": "40:01.1",
        "pair": "GPU0-GPU1",
    }
    assert limited["args"][limited["args"].index("--tensor-parallel-size") + 1] == "2"
    assert 'NCCL_P2P_DISABLE": "1"' in limited["compose"]
    with_preflight_run = run_site(box, "--tags", "preflight,vllm")
    assert deployed(with_preflight_run) == limited
    # Each fact is gathered once per run, and handed on.
    for run in (limited_run, with_preflight_run):
        for task in (
            "Gather the host's facts, in every run",
            "Read the GPUs and compare them with the last deploy",
            "Read the GPU topology",
            "Read IOMMU and ACS",
        ):
            ran = [r for r in task_results(run, task) if not r.get("skipped")]
            assert len(ran) == 1, f"{task!r} ran {len(ran)} times"
        assert not [r for r in task_results(run, "Read the GPUs") if not r.get("skipped")], "the vllm role read them again"
        assert not task_results(run, "Gathering Facts"), "a play gathered the facts again"
        # The image and the model come in the play that takes every box at once, not in the vLLM play's turns.
        staged = [
            play["play"]["name"]
            for play in run["plays"]
            for task in play["tasks"]
            if task["task"]["name"].endswith("Create the project and cache folders")
            and not all(r.get("skipped") for r in task["hosts"].values())
        ]
        assert staged == ["The vLLM image and the model on every box"], staged


def test_a_pinned_size_narrows_the_preflight(box):
    """vllm_tensor_parallel_size=1: the preflight judges GPU0 alone, so no pair, no NCCL setting, no warning."""
    run = run_site(box, "--tags", "vllm", "-e", "vllm_tensor_parallel_size=1")  # a string from -e counts as its number
    combined = task_results(run, "Combine the findings into the preflight report")
    (report,) = [r["ansible_facts"]["preflight_result"] for r in combined]
    assert report["group"] == ["GPU0"]
    assert report["verdict"] == "single_gpu"
    assert report["warnings"] == []
    assert "NCCL_P2P_DISABLE" not in deployed(run)["env"]


def test_replicas_of_one_gpu_each_need_no_p2p_and_each_is_an_upstream(box):
    """vllm_layout=replicas on the box whose ACS redirects P2P: one server per GPU, so no pair to disable P2P for."""
    run = run_site(box, "--tags", "vllm", "-e", "vllm_layout=replicas", "-e", "vllm_max_model_len=2048")
    (plan,) = [r["ansible_facts"]["__vllm_plan"] for r in task_results(run, "Plan the deployment")]
    assert [(s["name"], s["port"], s["gpus"]) for s in plan["services"]] == [("vllm", 8000, ["0"]), ("vllm-2", 8001, ["1"])]
    assert all("NCCL_P2P_DISABLE" not in s["env"] for s in plan["services"])
    compose = yaml.safe_load(deployed(run)["compose"])
    assert sorted(compose["services"]) == ["vllm", "vllm-2"]
    devices = {name: service["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]
               for name, service in compose["services"].items()}  # fmt: skip
    assert devices == {"vllm": ["0"], "vllm-2": ["1"]}
    command = compose["services"]["vllm-2"]["command"]
    assert command[command.index("--port") + 1] == "8001"
    # The record vllm_deployment publishes, whose upstreams site.yml's Nginx play takes.
    assert plan["record"]["upstreams"] == ["127.0.0.1:8000", "127.0.0.1:8001"]
    assert plan["record"]["layout"] == "2xtp1"


def test_a_power_limit_a_card_cannot_take_stops_every_run_before_the_box_changes(box):
    """450 W on RTX 3090s (100 to 400 W): refused in the run's read-only part, whatever the tags, with both limits named."""
    for tags in ("all", "vllm"):
        run = run_site(box, "--tags", tags, "-e", "gpubox_gpu_power_limit_w=450")
        (check,) = task_results(run, "Check the power limit against every GPU's constraints")
        assert check["failed"] is True
        assert check["msg"].startswith(
            "gpubox_gpu_power_limit_w='450': 450 W is outside the power limits of GPU0 (NVIDIA GeForce RTX 3090), "
            "100 W to 400 W (NVML)"
        )
        assert not task_results(run, "Plan the deployment"), "the play went on past the refusal"
        assert not task_results(run, "Set GPU persistence mode and the power limits")
        # Only the OS baseline (base, the first play, on this unconverged machine) comes before the check.
        changed = {task["task"]["name"].split(" : ")[0] for play in run["plays"] for task in play["tasks"]
                   for result in task["hosts"].values() if result.get("changed")}  # fmt: skip
        assert changed <= {"gpubox.inference.base"}, changed


def test_the_power_limit_is_a_share_of_each_cards_default(box):
    run = run_site(box, "--tags", "gpubox", "-e", "gpubox_gpu_power_limit_w=85%")
    (power,) = task_results(run, "Set GPU persistence mode and the power limits")
    assert [(gpu["target_w"], gpu["changes"]) for gpu in power["gpus"]] == [(298.0, ["power_limit", "persistence"])] * 2
