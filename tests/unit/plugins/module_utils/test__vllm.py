"""_vllm.plan: one case per derivation rule and per validation rule, and the KV-cache estimate."""

from __future__ import annotations

import pytest
from conftest import LLAMA_8B, plan_gpus, plan_settings

from ansible_collections.gpubox.inference.plugins.module_utils import _words
from ansible_collections.gpubox.inference.plugins.module_utils._p2p import decide
from ansible_collections.gpubox.inference.plugins.module_utils._preflight import for_group
from ansible_collections.gpubox.inference.plugins.module_utils._vllm import cuda_finding, cuda_required, largest_fitting_tp, plan

settings = plan_settings
gpus = plan_gpus


def measured(count: int, bad: dict[str, str] | None = None, verified: bool = True) -> dict:
    """gpu_p2p facts as _p2p.decide makes them: every ordered pair ``ok`` unless ``bad`` says otherwise."""
    pairs = {f"{i}-{j}": {"status": "ok"} for i in range(count) for j in range(count) if i != j}
    pairs |= {pair: {"status": status} for pair, status in (bad or {}).items()}
    return {"decisions": decide(pairs, count, verified=verified)}


def preflight(count: int, hanging: tuple = (), group: int = 0, failures: tuple = ()) -> dict:
    """A preflight report as _preflight.combine makes one: ``hanging`` pairs (i, j) redirected by ACS on 40:01.1."""
    names = [f"GPU{i}" for i in range(count)]
    pairs = [
        {
            "gpus": [names[i], names[j]],
            "link": "PIX",
            "verdict": "hang" if (i, j) in hanging else "fit",
            "causes": [{"code": "cause.acs_redirect", "bridge": "40:01.1"}] if (i, j) in hanging else [],
        }
        for i in range(count)
        for j in range(i + 1, count)
    ]
    members = names[: group or count]
    report = {"group": members, "pairs": pairs, "problems": [], "iommu_translated": False, "rdma_nics": []}
    return {**report, **for_group(report, members), **({"failures": list(failures)} if failures else {})}


def flag(result: dict, name: str) -> str | None:
    args = result["args"]
    return args[args.index(name) + 1] if name in args else None


# ------------------------------------------------------------ derivations


def test_tp_defaults_to_the_preflight_group():
    result = plan(settings(), {"gpu": gpus(4), "preflight": preflight(4, group=2)}, LLAMA_8B)
    assert flag(result, "--tensor-parallel-size") == "2"
    assert result["decisions"]["--tensor-parallel-size"] == {
        "code": "tp.derived",
        "size": 2,
        "allowed": 2,
        "heads": 32,
        "kv_heads": 8,
    }
    assert result["reasons"]["--tensor-parallel-size"] == (
        "2: the largest group of the 2 GPU(s) the preflight allows whose size divides the model's "
        "32 attention heads and 8 KV heads"
    )


def test_tp_defaults_to_every_gpu_without_preflight():
    result = plan(settings(), {"gpu": gpus(4)}, LLAMA_8B)
    assert flag(result, "--tensor-parallel-size") == "4"
    assert result["decisions"]["--tensor-parallel-size"]["allowed"] == 4


@pytest.mark.parametrize(
    ("count", "heads", "kv_heads", "size"),
    [(3, 28, 4, 2), (3, 32, 8, 2), (6, 40, 8, 4), (3, 24, 3, 3), (8, 64, 2, 8), (5, 40, 5, 5), (7, 28, 4, 4)],
)
def test_a_derived_size_fits_the_heads_and_the_kv_heads(count, heads, kv_heads, size):
    """3 GPUs and Qwen2.5-7B's 28 heads (4 KV heads): 2, never an invalid 3; KV heads fewer than TP replicate."""
    config = {**LLAMA_8B, "num_attention_heads": heads, "num_key_value_heads": kv_heads}
    result = plan(settings(), {"gpu": gpus(count), "preflight": preflight(count)}, config)
    assert result["tensor_parallel_size"] == size
    assert result["errors"] == []


def test_the_3_gpu_default_derives_a_valid_size_where_the_old_plan_failed():
    qwen_7b = {**LLAMA_8B, "num_attention_heads": 28, "num_key_value_heads": 4}
    result = plan(settings(), {"gpu": gpus(3), "preflight": preflight(3)}, qwen_7b)
    assert result["errors"] == []
    assert flag(result, "--tensor-parallel-size") == "2"
    assert "of the 3 GPU(s)" in result["reasons"]["--tensor-parallel-size"]


def test_a_pinned_size_that_misfits_the_kv_heads_is_refused():
    config = {**LLAMA_8B, "num_attention_heads": 24, "num_key_value_heads": 8}
    result = plan(settings(tensor_parallel_size=3), {"gpu": gpus(4)}, config)
    assert result["errors"] == ["vllm_tensor_parallel_size=3 must divide the model's 8 KV heads, or be a multiple of them"]


def test_broken_p2p_disables_nccl_p2p_and_custom_all_reduce_with_the_measured_reason():
    result = plan(settings(), {"gpu": gpus(2), "gpu_p2p": measured(2, {"1-0": "broken"})}, LLAMA_8B)
    assert result["env"]["NCCL_P2P_DISABLE"] == "1"
    assert "--disable-custom-all-reduce" in result["args"]
    assert result["decisions"]["NCCL_P2P_DISABLE"] == {
        "code": "nccl_p2p_disable.measured",
        "pair": "GPU0-GPU1",
        "status": "broken",
    }
    assert result["reasons"]["NCCL_P2P_DISABLE"] == "GPU0-GPU1 P2P copies lose or corrupt data"


def test_acs_redirect_from_preflight_disables_nccl_p2p():
    result = plan(settings(), {"gpu": gpus(2), "preflight": preflight(2, hanging=((0, 1),))}, LLAMA_8B)
    assert result["env"]["NCCL_P2P_DISABLE"] == "1"
    assert result["decisions"]["NCCL_P2P_DISABLE"] == {
        "code": "nccl_p2p_disable.acs_redirect",
        "bridge": "40:01.1",
        "pair": "GPU0-GPU1",
    }
    assert result["reasons"]["NCCL_P2P_DISABLE"] == "ACS redirects P2P on 40:01.1 (GPU pair GPU0-GPU1)"


def test_decisions_are_limited_to_the_deployed_group():
    """GPU2's bad pairs do not turn P2P off for a deployment on GPU0 and GPU1."""
    facts = {
        "gpu": gpus(3),
        "preflight": preflight(3, hanging=((0, 2), (1, 2))),
        "gpu_p2p": measured(3, {"2-0": "broken", "2-1": "broken"}),
    }
    result = plan(settings(tensor_parallel_size=2), facts, LLAMA_8B)
    assert "NCCL_P2P_DISABLE" not in result["env"]
    assert result["env"]["NCCL_P2P_LEVEL"] == "SYS"
    assert "--disable-custom-all-reduce" not in result["args"]
    everything = plan(settings(tensor_parallel_size=4), {**facts, "gpu": gpus(4)}, LLAMA_8B)
    assert everything["env"]["NCCL_P2P_DISABLE"] == "1"


def test_a_hung_measurement_turns_p2p_off():
    p2p = {"decisions": decide({}, 0, verified=False, tool_hang_s=120.0)}
    result = plan(settings(), {"gpu": gpus(2), "gpu_p2p": p2p}, LLAMA_8B)
    assert result["env"]["NCCL_P2P_DISABLE"] == "1"
    assert result["reasons"]["NCCL_P2P_DISABLE"] == "the P2P measurement did not finish within 120 s"


def test_preflight_failures_are_plan_errors_so_no_tag_deploys_what_the_preflight_refuses():
    refused = preflight(2, failures=("GPU1 (0000:04:00.0) hangs off the chipset",))
    result = plan(settings(), {"gpu": gpus(2), "preflight": refused}, LLAMA_8B)
    assert result["errors"] == [
        "the preflight refuses this box: GPU1 (0000:04:00.0) hangs off the chipset (preflight_fail_on_* decides what it refuses)"
    ]


def test_verified_p2p_sets_the_level_and_keeps_custom_all_reduce():
    result = plan(settings(), {"gpu": gpus(2), "gpu_p2p": measured(2)}, LLAMA_8B)
    assert result["env"]["NCCL_P2P_LEVEL"] == "SYS"
    assert "NCCL_P2P_DISABLE" not in result["env"]
    assert "--disable-custom-all-reduce" not in result["args"]
    unverified = plan(settings(), {"gpu": gpus(2), "gpu_p2p": measured(2, verified=False)}, LLAMA_8B)
    assert "NCCL_P2P_LEVEL" not in unverified["env"]


def test_single_gpu_needs_no_nccl_settings():
    result = plan(settings(), {"gpu": gpus(1), "gpu_p2p": measured(1)}, LLAMA_8B)
    assert "NCCL_P2P_DISABLE" not in result["env"]
    assert "NCCL_P2P_LEVEL" not in result["env"]


@pytest.mark.parametrize(("nics", "disabled"), [([], True), (["mlx5_0"], False)])
def test_ib_disabled_only_without_an_ib_nic(nics, disabled):
    result = plan(settings(), {"gpu": gpus(2), "preflight": {**preflight(2), "rdma_nics": nics}}, LLAMA_8B)
    assert ("NCCL_IB_DISABLE" in result["env"]) is disabled


SCENARIOS = [
    (settings(), {"gpu": gpus(2), "gpu_p2p": measured(2, {"1-0": "broken"})}),
    (settings(), {"gpu": gpus(3), "preflight": preflight(3, hanging=((0, 1),))}),
    (settings(), {"gpu": gpus(2), "gpu_p2p": measured(2)}),
    (settings(tensor_parallel_size=4, allow_downgrade=True), {"gpu": gpus(3)}),
    (settings(device="cpu", network_mode="bridge", env={"X": 1}), {}),
    (settings(disable_custom_all_reduce=True), {"gpu": gpus(2), "gpu_p2p": {"decisions": decide({}, 0, False, 9.0)}}),
]


@pytest.mark.parametrize(("config", "facts"), SCENARIOS)
def test_rewording_every_message_changes_no_plan(config, facts, monkeypatch):
    """Words are rendered from the decisions, never read back: garbage templates deploy exactly the same."""
    before = plan(config, facts, LLAMA_8B)
    garbage = {code: f"reworded {index}" for index, code in enumerate(_words.TEMPLATES)}
    monkeypatch.setattr(_words, "TEMPLATES", garbage)
    after = plan(config, facts, LLAMA_8B)
    deployed = ("args", "env", "record", "tensor_parallel_size", "decisions", "errors", "kv_cache")
    assert {k: after[k] for k in deployed} == {k: before[k] for k in deployed}
    assert after["reasons"] != before["reasons"], "the reasons are rendered from the templates"


def test_cuda_order_and_spawn_are_always_set_for_gpus():
    result = plan(settings(), {"gpu": gpus(2)}, LLAMA_8B)
    assert result["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert result["env"]["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    assert set(result["env"]) <= set(result["reasons"]), "every derived setting carries its reason"


def test_user_overrides_win():
    result = plan(
        settings(env={"NCCL_P2P_DISABLE": "0"}, disable_custom_all_reduce=False),
        {"gpu": gpus(2), "gpu_p2p": measured(2, {"0-1": "broken"})},
        LLAMA_8B,
    )
    assert result["env"]["NCCL_P2P_DISABLE"] == "0"
    assert result["reasons"]["NCCL_P2P_DISABLE"] == "your choice (vllm_env)"
    assert "--disable-custom-all-reduce" not in result["args"]


def test_custom_all_reduce_stays_off_on_broken_p2p_even_when_nccl_is_told_otherwise():
    """vllm_env may force NCCL's P2P back on; custom all-reduce copies over P2P itself, so it stays off."""
    result = plan(settings(env={"NCCL_P2P_DISABLE": "0"}), {"gpu": gpus(2), "gpu_p2p": measured(2, {"0-1": "broken"})}, LLAMA_8B)
    assert result["env"]["NCCL_P2P_DISABLE"] == "0"
    assert "--disable-custom-all-reduce" in result["args"]
    assert result["reasons"]["--disable-custom-all-reduce"] == "GPU0-GPU1 P2P copies lose or corrupt data"


def test_flags_are_rendered_only_when_set():
    result = plan(
        settings(enable_prefix_caching=True, quantization="awq", extra_args=["--seed", 7], max_num_batched_tokens=4096),
        {"gpu": gpus(1)},
        LLAMA_8B,
    )
    assert "--enable-prefix-caching" in result["args"]
    assert not [arg for arg in result["args"] if "chunked-prefill" in arg]
    assert flag(result, "--quantization") == "awq"
    assert flag(result, "--max-num-batched-tokens") == "4096"
    assert result["args"][-2:] == ["--seed", "7"]


def test_server_binds_the_hosts_loopback_on_the_host_network_by_default():
    result = plan(settings(port="8123"), {"gpu": gpus(1)}, LLAMA_8B)
    assert (flag(result, "--host"), flag(result, "--port")) == ("127.0.0.1", "8123")
    assert result["reasons"]["--host"].startswith("127.0.0.1:8123 on the host's own network, loopback only")
    assert "docker-proxy" in result["reasons"]["--host"]


def test_bridge_network_listens_inside_the_container_for_the_published_port():
    result = plan(settings(network_mode="bridge", port=8123), {"gpu": gpus(1)}, LLAMA_8B)
    # Inside the container; Compose publishes it on 127.0.0.1 only.
    assert (flag(result, "--host"), flag(result, "--port")) == ("0.0.0.0", "8000")
    assert result["reasons"]["--host"] == "the container's bridge network, published on 127.0.0.1:8123 only (your choice)"


def test_cpu_backend():
    result = plan(settings(device="cpu"), {}, LLAMA_8B)
    assert result["tensor_parallel_size"] == 1
    assert "--gpu-memory-utilization" not in result["args"]
    assert flag(result, "--distributed-executor-backend") == "uni"
    assert "CUDA_DEVICE_ORDER" not in result["env"]


# ------------------------------------------------------------ validation

# The engine watchdog's settings as vars/main.yml assembles them (the defaults).
WATCHDOG = {"watchdog": True, "watchdog_interval": 30, "watchdog_timeout": 30, "watchdog_failures": 3, "watchdog_max_restarts": 3}


@pytest.mark.parametrize(
    ("overrides", "facts", "message"),
    [
        ({"tensor_parallel_size": 3}, {"gpu": gpus(4)}, "vllm_tensor_parallel_size=3 must divide the model's 32 attention heads"),
        ({"tensor_parallel_size": 8}, {"gpu": gpus(4)}, "must be at most the 4 GPUs on this host"),
        (
            {"tensor_parallel_size": 2, "pipeline_parallel_size": 4},
            {"gpu": gpus(4)},
            "vllm_pipeline_parallel_size=4 must be at most",
        ),
        ({"gpu_memory_utilization": 0}, {"gpu": gpus(1)}, "vllm_gpu_memory_utilization=0 must be in (0, 1]"),
        ({"gpu_memory_utilization": 1.2}, {"gpu": gpus(1)}, "vllm_gpu_memory_utilization=1.2 must be in (0, 1]"),
        ({"max_model_len": -1}, {"gpu": gpus(1)}, "vllm_max_model_len=-1 must be positive"),
        ({"max_model_len": 200000}, {"gpu": gpus(1)}, "vllm_max_model_len=200000 must fit the model's context of 131072"),
        ({"model": "/srv/models/missing", "model_exists": False}, {"gpu": gpus(1)}, "is a path that does not exist on the host"),
        ({"model": ""}, {"gpu": gpus(1)}, "vllm_model must name a Hugging Face model id or an absolute path"),
        ({"port": 0}, {"gpu": gpus(1)}, "vllm_port=0 must be a TCP port, from 1 to 65535"),
        ({"port": 70000}, {"gpu": gpus(1)}, "vllm_port=70000 must be a TCP port, from 1 to 65535"),
        ({**WATCHDOG, "watchdog_interval": 1}, {"gpu": gpus(1)}, "vllm_watchdog_interval=1 must be at least 5"),
        ({**WATCHDOG, "watchdog_failures": 0}, {"gpu": gpus(1)}, "vllm_watchdog_failures=0 must be at least 1"),
        ({**WATCHDOG, "watchdog_max_restarts": 0}, {"gpu": gpus(1)}, "vllm_watchdog_max_restarts=0 must be at least 1"),
        ({**WATCHDOG, "watchdog_timeout": 0}, {"gpu": gpus(1)}, "vllm_watchdog_timeout=0 must be at least 1"),
    ],
)
def test_each_rule(overrides, facts, message):
    result = plan(settings(**overrides), facts, LLAMA_8B)
    assert any(message in error for error in result["errors"]), result["errors"]
    assert result["kv_cache"] is None


def test_valid_settings_have_no_errors():
    assert plan(settings(tensor_parallel_size=2), {"gpu": gpus(2)}, LLAMA_8B)["errors"] == []


def test_a_watchdog_that_is_off_is_not_checked():
    off = {**WATCHDOG, "watchdog": False, "watchdog_interval": 0}
    assert plan(settings(**off), {"gpu": gpus(1)}, LLAMA_8B)["errors"] == []
    assert plan(settings(**WATCHDOG), {"gpu": gpus(1)}, LLAMA_8B)["errors"] == []


# ------------------------------------------------------------ KV cache


def test_kv_cache_estimate_for_llama_8b_on_two_24gb_gpus():
    result = plan(settings(tensor_parallel_size=2, max_model_len=8192), {"gpu": gpus(2)}, LLAMA_8B, weights_bytes=16_060_000_000)
    kv = result["kv_cache"]
    # 2 (K,V) x 32 layers x 4 KV heads per GPU x 128 head dim x 2 bytes
    assert kv["bytes_per_token_per_gpu"] == 65536
    assert kv["weights_gib_per_gpu"] == 7.48
    # 24 GiB x 0.9, less 7.48 GiB of weights and 1.5 GiB of activations, over 64 KiB per token
    assert kv["kv_cache_tokens"] == int((24576 * 2**20 * 0.9 - 16_060_000_000 / 2 - 1.5 * 2**30) // 65536) == 206790
    assert kv["concurrent_sequences"] == kv["kv_cache_tokens"] // 8192
    assert result["warnings"] == []


def test_long_context_on_a_small_gpu_warns():
    result = plan(settings(max_model_len=131072), {"gpu": gpus(1)}, LLAMA_8B, weights_bytes=16_060_000_000)
    assert result["kv_cache"]["concurrent_sequences"] == 0
    assert result["warnings"][0].startswith("vllm_max_model_len=131072 leaves KV cache for about 0 concurrent sequences")


# ------------------------------------------------------------ after a GPU swap

BROKEN = measured(2, {"1-0": "broken"})["decisions"]


def swapped(count: int, previous: dict, **extra) -> dict:
    return {"gpu": {**gpus(count), "fingerprint": "new"}, "previous": previous, **extra}


def test_the_record_is_what_the_next_run_compares_with():
    result = plan(settings(), {"gpu": {**gpus(2), "fingerprint": "abc"}}, LLAMA_8B)
    assert result["record"] == {
        "tensor_parallel_size": 2,
        "nccl_p2p_disable": False,
        "fingerprint": "abc",
        "model_revision": "main",
        "model_commit": None,
        "gate_step": "as_planned",
        "layout": "tp2",
        "replicas": 1,
        "upstreams": ["127.0.0.1:8000"],
        "services": ["vllm"],
    }
    assert plan(settings(), {"gpu": gpus(2), "gpu_p2p": {"decisions": BROKEN}}, LLAMA_8B)["record"]["nccl_p2p_disable"]


def test_fewer_gpus_than_the_last_deployment_fails_and_says_how_to_allow_it():
    result = plan(settings(), swapped(1, {"tensor_parallel_size": 2, "nccl_p2p_disable": False}), LLAMA_8B)
    assert result["errors"] == [
        "the GPUs changed and the running deployment cannot be kept as it is: tensor parallel size 2 -> 1. "
        "Fix the hardware, or set vllm_allow_downgrade=true to redeploy with less"
    ]


def test_a_pair_now_broken_fails_when_the_last_deployment_used_p2p():
    previous = {"tensor_parallel_size": 2, "nccl_p2p_disable": False}
    result = plan(settings(), swapped(2, previous, gpu_p2p={"decisions": BROKEN}), LLAMA_8B)
    assert len(result["errors"]) == 1
    assert "GPU peer-to-peer was on and must now be off (NCCL_P2P_DISABLE=1)" in result["errors"][0]


def test_allowed_downgrade_deploys_with_less_and_warns():
    previous = {"tensor_parallel_size": 2, "nccl_p2p_disable": False}
    result = plan(settings(allow_downgrade=True), swapped(2, previous, gpu_p2p={"decisions": BROKEN}), LLAMA_8B)
    assert result["errors"] == []
    assert result["env"]["NCCL_P2P_DISABLE"] == "1"
    assert result["warnings"] == [
        "downgraded after the GPU change: GPU peer-to-peer was on and must now be off (NCCL_P2P_DISABLE=1)"
    ]


def test_pinned_tp_above_the_gpus_is_lowered_only_when_allowed():
    previous = {"tensor_parallel_size": 4, "nccl_p2p_disable": False}
    refused = plan(settings(tensor_parallel_size=4), swapped(3, previous), LLAMA_8B)
    assert (
        "vllm_tensor_parallel_size=4 x vllm_pipeline_parallel_size=1 must be at most the 3 GPUs on this host" in refused["errors"]
    )
    allowed = plan(settings(tensor_parallel_size=4, allow_downgrade=True), swapped(3, previous), LLAMA_8B)
    assert allowed["errors"] == []
    # 3 GPUs, but Llama 8B's 32 heads split over 2 at most of them.
    assert flag(allowed, "--tensor-parallel-size") == "2"
    assert allowed["reasons"]["--tensor-parallel-size"] == (
        "2: lowered from vllm_tensor_parallel_size=4, this host has 3 GPUs (vllm_allow_downgrade)"
    )
    assert allowed["warnings"] == ["downgraded after the GPU change: tensor parallel size 4 -> 2"]


@pytest.mark.parametrize(
    ("previous", "count", "p2p"),
    [
        (None, 1, None),  # first deployment: nothing to lose
        ({"tensor_parallel_size": 2, "nccl_p2p_disable": False}, 2, None),  # same shape
        ({"tensor_parallel_size": 2, "nccl_p2p_disable": True}, 2, BROKEN),  # P2P was already off
        ({"tensor_parallel_size": 2, "nccl_p2p_disable": False}, 4, None),  # more GPUs is no downgrade
    ],
)
def test_no_downgrade_no_error(previous, count, p2p):
    facts = swapped(count, previous, **({"gpu_p2p": {"decisions": p2p}} if p2p else {}))
    assert plan(settings(), facts, LLAMA_8B)["errors"] == []


@pytest.mark.parametrize(
    ("gpus_", "heads", "size"), [(8, 32, 8), (3, 32, 2), (6, 28, 4), (5, 40, 5), (1, 32, 1), (0, 32, 1), (3, None, 3)]
)
def test_largest_fitting_tp(gpus_, heads, size):
    assert largest_fitting_tp(gpus_, heads) == size


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (None, None),
        ("", None),
        (True, "--enable-{}"),
        ("true", "--enable-{}"),
        (False, "--no-enable-{}"),
        ("false", "--no-enable-{}"),
    ],
)
@pytest.mark.parametrize("name", ["prefix-caching", "chunked-prefill"])
def test_settings_vllm_turns_on_are_tri_state(name, value, shown):
    """Unset leaves vLLM's default and says so; false passes --no-enable-..., since vLLM's default is on."""
    key = "enable_" + name.replace("-", "_")
    result = plan(settings(**{key: value}), {"gpu": gpus(1)}, LLAMA_8B)
    passed = [arg for arg in result["args"] if arg.endswith(name)]
    assert passed == ([shown.format(name)] if shown else [])
    reason = result["reasons"][f"--enable-{name}"]
    assert reason == (
        "your choice" if shown else "unset: vLLM's own default (on in current releases); set it true or false to decide"
    )


HUB = {"commit": "0123456789abcdef0123456789abcdef01234567", "disk_problem": None}


def test_a_fetched_hub_model_runs_offline_on_its_commit_and_is_recorded():
    result = plan(settings(model_revision="v1.0"), {"gpu": gpus(1), "hub": HUB}, LLAMA_8B)
    assert result["env"]["HF_HUB_OFFLINE"] == "1"
    assert result["reasons"]["HF_HUB_OFFLINE"] == (
        "the role fetched meta-llama/Llama-3.1-8B-Instruct at 0123456789ab before the server started: "
        "restarts and reboots never need the network"
    )
    assert "--revision" not in result["args"], "the snapshot folder is the revision"
    assert result["record"]["model_commit"] == HUB["commit"]
    assert result["record"]["model_revision"] == "v1.0"


def test_a_hub_model_left_to_vllm_gets_its_revision_and_endpoint():
    result = plan(settings(model_revision="v1.0", hf_endpoint="https://hf-mirror.com/"), {"gpu": gpus(1)}, LLAMA_8B)
    assert flag(result, "--revision") == "v1.0"
    assert result["env"]["HF_ENDPOINT"] == "https://hf-mirror.com"
    assert "HF_HUB_OFFLINE" not in result["env"]
    default = plan(settings(hf_endpoint="https://huggingface.co"), {"gpu": gpus(1)}, LLAMA_8B)
    assert "HF_ENDPOINT" not in default["env"]
    assert "--revision" not in default["args"]


def test_a_model_the_disk_cannot_hold_is_a_plan_error_with_both_numbers():
    disk = {
        "code": "hub.disk",
        "model": "m/x",
        "path": "/var/lib/gpubox/huggingface",
        "missing": "15.0 GiB",
        "needed": "16.0 GiB",
        "free": "9.5 GiB",
    }
    result = plan(settings(), {"gpu": gpus(1), "hub": {**HUB, "disk_problem": disk}}, LLAMA_8B)
    assert result["errors"] == [
        "m/x does not fit in vllm_hf_cache_dir=/var/lib/gpubox/huggingface: 15.0 GiB still to download plus the margin "
        "needs 16.0 GiB, and 9.5 GiB is free there. Free some space, or set vllm_hf_cache_dir to a larger disk"
    ]


# The environment of an image built on nvidia/cuda:12.8.1-devel-ubuntu22.04 as `docker image inspect` shows it
# (its NVIDIA_REQUIRE_CUDA shortened: the real one lists more brands).
CUDA_12_8_ENV = [
    "PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "NVARCH=x86_64",
    "NVIDIA_REQUIRE_CUDA=cuda>=12.8 brand=unknown,driver>=470,driver<471 brand=grid,driver>=470,driver<471",
    "CUDA_VERSION=12.8.1",
]


@pytest.mark.parametrize(
    ("driver", "refused"), [("12.8", False), ("13.0", False), ("12.10", False), ("12.4", True), ("11.8", True)]
)
def test_an_image_that_needs_a_newer_cuda_than_the_driver_is_refused(driver, refused):
    finding = cuda_finding("vllm/vllm-openai:v0.32.0", CUDA_12_8_ENV, driver)
    if not refused:
        assert finding is None
        return
    assert _words.explain(finding) == (
        f"vllm/vllm-openai:v0.32.0 needs CUDA 12.8 (its NVIDIA_REQUIRE_CUDA), and the NVIDIA driver on this box supports "
        f"CUDA {driver} (NVML): update the driver, or set vllm_image_tag to a vLLM image built for CUDA {driver} or older"
    )


@pytest.mark.parametrize(
    ("env", "driver"),
    [
        ([], "11.0"),
        (["NVIDIA_REQUIRE_CUDA="], "11.0"),
        (["NVIDIA_REQUIRE_CUDA=brand=tesla,driver>=470"], "11.0"),
        (CUDA_12_8_ENV, None),
    ],
)
def test_what_an_image_or_a_driver_does_not_say_is_not_judged(env, driver):
    assert cuda_finding("img", env, driver) is None


def test_the_requirement_is_read_from_its_own_variable():
    assert cuda_required(["OTHER=cuda>=99.0", "NVIDIA_REQUIRE_CUDA=cuda>=13.0 brand=unknown"]) == "13.0"


# ------------------------------------------------------------ the correctness gate's part

LLAMA_70B = {**LLAMA_8B, "num_hidden_layers": 80, "hidden_size": 8192, "intermediate_size": 28672, "num_attention_heads": 64}


def names(result: dict) -> list[str]:
    return [step["name"] for step in result["gate"]["steps"]]


def test_one_gpu_is_its_own_reference_and_has_no_fallback():
    result = plan(settings(), {"gpu": gpus(1)}, LLAMA_8B)
    assert result["gate"]["reference"] is None
    assert names(result) == ["as_planned"]
    assert result["gate"]["chosen"] is None
    assert result["record"]["gate_step"] == "as_planned"


def test_two_gpus_with_p2p_fall_back_to_no_custom_all_reduce_then_no_p2p():
    result = plan(settings(), {"gpu": gpus(2), "gpu_p2p": measured(2)}, LLAMA_8B)
    steps = {step["name"]: step for step in result["gate"]["steps"]}
    assert list(steps) == ["as_planned", "no_custom_all_reduce", "no_p2p"]
    assert "--disable-custom-all-reduce" not in steps["as_planned"]["args"]
    assert "--disable-custom-all-reduce" in steps["no_custom_all_reduce"]["args"]
    assert "NCCL_P2P_DISABLE" not in steps["no_custom_all_reduce"]["env"]
    assert steps["no_p2p"]["env"]["NCCL_P2P_DISABLE"] == "1"
    assert "--disable-custom-all-reduce" in steps["no_p2p"]["args"]
    assert not any(step.get("compare") for step in steps.values())


def test_the_reference_is_one_gpu_when_the_model_fits_one():
    """Llama 3.1 8B (16 GB) on 24 GiB cards leaves KV cache for a few sequences: one GPU answers for reference."""
    result = plan(settings(), {"gpu": gpus(2), "gpu_p2p": measured(2)}, LLAMA_8B, weights_bytes=16_060_000_000)
    reference = result["gate"]["reference"]
    assert reference["code"] == "gate.reference_one"
    assert reference["tensor_parallel_size"] == 1
    assert flag(reference, "--tensor-parallel-size") == "1"
    assert not any(key.startswith("NCCL_P2P") for key in reference["env"])


def test_the_reference_of_a_model_too_big_for_one_gpu_is_nccl_without_p2p():
    result = plan(settings(), {"gpu": gpus(4, mib=81920), "gpu_p2p": measured(4)}, LLAMA_70B, weights_bytes=141_000_000_000)
    reference = result["gate"]["reference"]
    assert reference["code"] == "gate.reference_no_p2p"
    assert flag(reference, "--tensor-parallel-size") == "4"
    assert reference["env"]["NCCL_P2P_DISABLE"] == "1"
    assert "--disable-custom-all-reduce" in reference["args"]
    assert _words.explain({k: v for k, v in reference.items() if k not in ("args", "env")}).startswith(
        "the reference answers come from 4 GPUs with custom all-reduce and P2P off"
    )


def test_p2p_already_off_leaves_no_fallback():
    """ACS redirects P2P: NCCL_P2P_DISABLE and no custom all-reduce are the plan; nothing safer is left."""
    facts = {"gpu": gpus(2), "preflight": preflight(2, hanging=((0, 1),))}
    result = plan(settings(), facts, LLAMA_8B)
    assert names(result) == ["as_planned"]


def consumer(count: int, link: str = "PHB") -> dict:
    devices = [{"memory_total_mib": 24576, "name": "NVIDIA GeForce RTX 3090"} for _gpu in range(count)]
    report = preflight(count)
    report["pairs"] = [{**pair, "link": link} for pair in report["pairs"]]
    return {"gpu": {**gpus(count), "devices": devices}, "gpu_p2p": measured(count), "preflight": report}


def test_geforce_over_pcie_measures_custom_all_reduce_against_nccl():
    result = plan(settings(), consumer(2), LLAMA_8B)
    assert [step.get("compare", False) for step in result["gate"]["steps"]] == [True, True, False]


def test_geforce_over_nvlink_does_not():
    result = plan(settings(), consumer(2, link="NV4"), LLAMA_8B)
    assert not any(step.get("compare") for step in result["gate"]["steps"])


def stored(result: dict, results: dict) -> dict:
    return {result["gate"]["key"]: {"reference": {"answers": []}, "results": results}}


def test_a_stored_fallback_is_deployed_and_says_why():
    facts = {"gpu": {**gpus(2), "fingerprint": "fp"}, "gpu_p2p": measured(2)}
    first = plan(settings(image="vllm/vllm-openai", image_tag="v0.32.0"), facts, LLAMA_8B)
    store = stored(first, {"as_planned": {"passed": False}, "no_custom_all_reduce": {"passed": True}})
    again = plan(settings(image="vllm/vllm-openai", image_tag="v0.32.0"), {**facts, "gate_store": store}, LLAMA_8B)
    assert "--disable-custom-all-reduce" in again["args"]
    assert again["record"]["gate_step"] == "no_custom_all_reduce"
    assert again["reasons"]["--disable-custom-all-reduce"] == (
        "the correctness gate failed with as planned and passed with custom all-reduce off (--disable-custom-all-reduce)"
    )
    # A new image is a new key: nothing stored applies, the plan starts over.
    newer = plan(settings(image="vllm/vllm-openai", image_tag="v0.33.0"), {**facts, "gate_store": store}, LLAMA_8B)
    assert "--disable-custom-all-reduce" not in newer["args"]
    assert newer["gate"]["chosen"] is None


def test_a_stored_no_p2p_is_a_p2p_change_in_the_record():
    facts = {"gpu": {**gpus(2), "fingerprint": "fp"}, "gpu_p2p": measured(2)}
    first = plan(settings(), facts, LLAMA_8B)
    results = {"as_planned": {"passed": False}, "no_custom_all_reduce": {"passed": False}, "no_p2p": {"passed": True}}
    again = plan(settings(), {**facts, "gate_store": stored(first, results)}, LLAMA_8B)
    assert again["env"]["NCCL_P2P_DISABLE"] == "1"
    assert again["record"]["nccl_p2p_disable"] is True
    assert set(again["reasons"]) >= {"NCCL_P2P_DISABLE", "--disable-custom-all-reduce"}


def test_the_cpu_backend_runs_two_workers_bound_to_their_own_cpus():
    result = plan(settings(device="cpu", tensor_parallel_size=2, cpu_count=2), {}, LLAMA_8B)
    assert flag(result, "--distributed-executor-backend") == "mp"
    assert result["env"]["VLLM_CPU_OMP_THREADS_BIND"] == "0|1"
    reference = result["gate"]["reference"]
    assert reference["code"] == "gate.reference_one"
    assert flag(reference, "--distributed-executor-backend") == "uni"
    assert flag(reference, "--tensor-parallel-size") == "1"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in reference["env"]
    words = _words.explain({"code": reference["code"], "unit": reference["unit"]})
    assert words.startswith("the reference answers come from one CPU worker")


@pytest.mark.parametrize(("cpus", "workers", "binding"), [(2, 2, "0|1"), (8, 2, "0-3|4-7"), (6, 4, "0|1|2|3")])
def test_cpu_binding_splits_the_cpus_evenly(cpus, workers, binding):
    from ansible_collections.gpubox.inference.plugins.module_utils._vllm import cpu_binding

    assert cpu_binding(cpus, workers) == binding


# ------------------------------------------------------------ layout (vllm_layout)


# 48 GiB cards: Llama 3.1 8B and its KV cache for 4 sequences fit one.
BIG = 49152


def layout_of(result: dict) -> list[tuple]:
    return [(s["name"], s["port"], s["gpus"], flag(s, "--port"), flag(s, "--tensor-parallel-size")) for s in result["services"]]


def test_tp_layout_is_one_server_and_says_nothing_new():
    result = plan(settings(), {"gpu": gpus(2, mib=BIG)}, LLAMA_8B)
    assert layout_of(result) == [("vllm", 8000, ["0", "1"], "8000", "2")]
    assert "layout" not in result["decisions"]
    assert result["record"]["upstreams"] == ["127.0.0.1:8000"]


def test_replicas_take_their_own_gpus_and_ports():
    result = plan(settings(layout="replicas", port=8100), {"gpu": gpus(4, mib=BIG)}, LLAMA_8B)
    assert layout_of(result) == [
        ("vllm", 8100, ["0"], "8100", "1"),
        ("vllm-2", 8101, ["1"], "8101", "1"),
        ("vllm-3", 8102, ["2"], "8102", "1"),
        ("vllm-4", 8103, ["3"], "8103", "1"),
    ]
    assert result["record"]["upstreams"] == [f"127.0.0.1:{port}" for port in range(8100, 8104)]
    assert result["record"]["services"] == ["vllm", "vllm-2", "vllm-3", "vllm-4"]
    assert result["reasons"]["layout"] == "4 replicas of 1 GPU(s) each behind Nginx (vllm_layout=replicas)"
    assert result["record"]["layout"] == "4xtp1"


def test_replica_size_must_divide_the_gpus_and_fit():
    errors = plan(settings(layout="replicas", replica_size=3), {"gpu": gpus(4, mib=BIG)}, LLAMA_8B)["errors"]
    assert errors == [
        "vllm_replica_size=3 must divide the 4 GPUs of the layout and fit the model (heads, and the KV cache for "
        "vllm_min_concurrent_sequences=4); these fit: 4, 2, 1"
    ]
    # 8B in bf16 (16.5 GiB) leaves KV cache for 3 sequences of 8192 tokens on one 24 GiB card, not 4.
    small = plan(settings(layout="replicas"), {"gpu": gpus(2)}, LLAMA_8B)
    assert small["layout"]["candidates"] == [{"name": "tp2", "size": 2, "replicas": 1}]
    assert layout_of(small)[0][4] == "2"


def test_bridge_replicas_listen_on_8000_inside_and_publish_their_own_ports():
    result = plan(settings(layout="replicas", network_mode="bridge", port=9000), {"gpu": gpus(2, mib=BIG)}, LLAMA_8B)
    assert [(s["port"], flag(s, "--port")) for s in result["services"]] == [(9000, "8000"), (9001, "8000")]


def test_cpu_replicas_bind_each_to_its_own_cpus():
    result = plan(settings(device="cpu", tensor_parallel_size=2, layout="replicas", cpu_count=4), {}, LLAMA_8B)
    assert [s["env"]["VLLM_CPU_OMP_THREADS_BIND"] for s in result["services"]] == ["0-1", "2-3"]
    # vLLM binds CPU workers only in its multiprocess executor, even for one worker.
    assert [flag(s, "--distributed-executor-backend") for s in result["services"]] == ["mp", "mp"]
    assert "VLLM_CPU_OMP_THREADS_BIND" not in result["env"]
    tp = plan(settings(device="cpu", tensor_parallel_size=2, cpu_count=4), {}, LLAMA_8B)
    assert [s["env"]["VLLM_CPU_OMP_THREADS_BIND"] for s in tp["services"]] == ["0-1|2-3"]


def test_replicas_share_the_strictest_nccl_setting_of_their_groups():
    # GPU2-GPU3 cannot copy peer to peer: every replica of two runs with NCCL_P2P_DISABLE=1.
    facts = {"gpu": gpus(4, mib=BIG), "gpu_p2p": measured(4, {"3-2": "broken"})}
    result = plan(settings(layout="replicas", replica_size=2), facts, LLAMA_8B)
    assert all(s["env"].get("NCCL_P2P_DISABLE") == "1" for s in result["services"])
    assert [s["gpus"] for s in result["services"]] == [["0", "1"], ["2", "3"]]


def test_auto_measures_first_then_keeps_the_stored_choice():
    first = plan(settings(layout="auto"), {"gpu": gpus(2, mib=BIG)}, LLAMA_8B)
    assert first["layout"]["measure"] is True
    assert first["record"]["layout"] == "tp2"
    assert first["reasons"]["layout"] == "tp2 until the layouts tp2, 2xtp1 are measured (vllm_layout=auto)"
    candidates = {c["name"]: [s["gpus"] for s in c["services"]] for c in first["layout"]["candidates"]}
    assert candidates == {"tp2": [["0", "1"]], "2xtp1": [["0"], ["1"]]}

    decision = {"code": "layout.only", "layout": "2xtp1", "tokens_per_s": 45.0, "ttft_p99_ms": 300.0,
                "bound_ms": 600.0, "bound_from": "best"}  # fmt: skip
    store = {first["layout"]["key"]: {"chosen": "2xtp1", "decision": decision}}
    second = plan(settings(layout="auto"), {"gpu": gpus(2, mib=BIG), "layout_store": store}, LLAMA_8B)
    assert second["layout"]["measure"] is False
    assert second["record"]["layout"] == "2xtp1"
    assert second["decisions"]["layout"] == decision
    # A new target load is another key: measured again.
    again = plan(settings(layout="auto", tune_concurrency=32), {"gpu": gpus(2, mib=BIG), "layout_store": store}, LLAMA_8B)
    assert again["layout"]["measure"] is True
    # tune.yml measures again whatever is stored; vllm_layout=tp keeps one server.
    forced = plan(settings(layout="tp", layout_measure=True), {"gpu": gpus(2, mib=BIG), "layout_store": store}, LLAMA_8B)
    assert forced["layout"]["measure"] is True
    assert forced["record"]["layout"] == "tp2"


def test_auto_with_one_gpu_has_nothing_to_measure():
    result = plan(settings(layout="auto"), {"gpu": gpus(1)}, LLAMA_8B)
    assert result["layout"]["measure"] is False
    assert result["reasons"]["layout"] == "only one layout fits the 1 GPU(s): tp1 (vllm_layout=auto)"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"layout": "spread"}, "vllm_layout='spread' must be one of tp, replicas, auto"),
        ({"layout": "replicas", "pipeline_parallel_size": 2}, "vllm_layout=replicas needs vllm_pipeline_parallel_size=1"),
        ({"layout": "replicas", "port": 65535}, "vllm_port=65535 leaves no port for each of the 2 replicas"),
    ],
)
def test_layout_settings_are_refused_with_the_rule(overrides, message):
    errors = plan(settings(**overrides), {"gpu": gpus(2, mib=BIG)}, LLAMA_8B)["errors"]
    assert any(error.startswith(message) for error in errors), errors


def test_replicas_are_their_own_gate_key_and_a_replica_of_one_needs_no_reference():
    tp = plan(settings(), {"gpu": gpus(2, mib=BIG)}, LLAMA_8B)
    replicas = plan(settings(layout="replicas"), {"gpu": gpus(2, mib=BIG)}, LLAMA_8B)
    assert replicas["gate"]["key"] == tp["gate"]["key"] + "|2xtp1"
    assert replicas["gate"]["reference"] is None
    assert [s["name"] for s in replicas["gate"]["steps"]] == ["as_planned"]
    assert [len(s["services"]) for s in replicas["gate"]["steps"]] == [2]
    assert [s["gpus"] for s in tp["gate"]["reference"]["services"]] == [["0"]]


def test_switching_layouts_is_not_a_downgrade_while_as_many_gpus_serve():
    previous = {"tensor_parallel_size": 2, "replicas": 1}
    assert plan(settings(layout="replicas"), {"gpu": gpus(2, mib=BIG), "previous": previous}, LLAMA_8B)["errors"] == []
    lost = plan(settings(), {"gpu": gpus(1), "previous": {"tensor_parallel_size": 1, "replicas": 2}}, LLAMA_8B)["errors"]
    assert len(lost) == 1
    assert "GPUs serving 2 -> 1" in lost[0]
