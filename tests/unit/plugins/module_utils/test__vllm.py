"""_vllm.plan: one case per derivation rule and per validation rule, and the KV-cache estimate."""

from __future__ import annotations

import pytest

from ansible_collections.gpubox.inference.plugins.module_utils._vllm import largest_fitting_tp, plan

LLAMA_8B = {
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
}


def settings(**overrides) -> dict:
    base = {
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "model_exists": False,
        "container_model": "meta-llama/Llama-3.1-8B-Instruct",
        "served_model_name": "llama",
        "device": "cuda",
        "tensor_parallel_size": 0,
        "pipeline_parallel_size": 1,
        "gpu_memory_utilization": 0.9,
        "max_model_len": 8192,
        "max_num_batched_tokens": 0,
        "dtype": "auto",
        "env": {},
        "extra_args": [],
        "disable_custom_all_reduce": "auto",
        "min_concurrent_sequences": 4,
    }
    return {**base, **overrides}


def gpus(count: int, mib: int = 24576) -> dict:
    return {"present": True, "count": count, "devices": [{"memory_total_mib": mib} for _gpu in range(count)]}


def flag(result: dict, name: str) -> str | None:
    args = result["args"]
    return args[args.index(name) + 1] if name in args else None


# ------------------------------------------------------------ derivations


def test_tp_defaults_to_the_preflight_group():
    result = plan(settings(), {"gpu": gpus(4), "preflight": {"group": ["GPU0", "GPU1"]}}, LLAMA_8B)
    assert flag(result, "--tensor-parallel-size") == "2"
    assert result["reasons"]["--tensor-parallel-size"] == "2: the GPUs the preflight allows"


def test_tp_defaults_to_every_gpu_without_preflight():
    result = plan(settings(), {"gpu": gpus(4)}, LLAMA_8B)
    assert flag(result, "--tensor-parallel-size") == "4"
    assert result["reasons"]["--tensor-parallel-size"] == "4: the GPUs on this host"


def test_broken_p2p_disables_nccl_p2p_and_custom_all_reduce_with_the_measured_reason():
    p2p = {
        "nccl_p2p_disable": True,
        "reasons": ["NCCL_P2P_DISABLE=1 and --disable-custom-all-reduce: GPU0-GPU1 P2P copies lose or corrupt data"],
    }
    result = plan(settings(), {"gpu": gpus(2), "gpu_p2p": {"decisions": p2p}}, LLAMA_8B)
    assert result["env"]["NCCL_P2P_DISABLE"] == "1"
    assert "--disable-custom-all-reduce" in result["args"]
    assert result["reasons"]["NCCL_P2P_DISABLE"] == "GPU0-GPU1 P2P copies lose or corrupt data"


def test_acs_redirect_from_preflight_disables_nccl_p2p():
    preflight = {
        "group": ["GPU0", "GPU1"],
        "decisions": {"nccl_p2p_disable": True, "reasons": ["NCCL_P2P_DISABLE=1 because ACS redirects P2P on 40:01.1"]},
    }
    result = plan(settings(), {"gpu": gpus(2), "preflight": preflight}, LLAMA_8B)
    assert result["env"]["NCCL_P2P_DISABLE"] == "1"
    assert result["reasons"]["NCCL_P2P_DISABLE"] == "ACS redirects P2P on 40:01.1"


def test_verified_p2p_sets_the_level_and_keeps_custom_all_reduce():
    result = plan(settings(), {"gpu": gpus(2), "gpu_p2p": {"decisions": {"nccl_p2p_level": "SYS"}}}, LLAMA_8B)
    assert result["env"]["NCCL_P2P_LEVEL"] == "SYS"
    assert "NCCL_P2P_DISABLE" not in result["env"]
    assert "--disable-custom-all-reduce" not in result["args"]


def test_single_gpu_needs_no_nccl_settings():
    p2p = {"nccl_p2p_disable": True, "reasons": ["x"]}
    result = plan(settings(), {"gpu": gpus(1), "gpu_p2p": {"decisions": p2p}}, LLAMA_8B)
    assert "NCCL_P2P_DISABLE" not in result["env"]


@pytest.mark.parametrize(("nics", "disabled"), [([], True), ([{"name": "NIC0", "device": "mlx5_0"}], False)])
def test_ib_disabled_only_without_an_ib_nic(nics, disabled):
    result = plan(settings(), {"gpu": gpus(2), "topology": {"nics": nics}}, LLAMA_8B)
    assert ("NCCL_IB_DISABLE" in result["env"]) is disabled


def test_cuda_order_and_spawn_are_always_set_for_gpus():
    result = plan(settings(), {"gpu": gpus(2)}, LLAMA_8B)
    assert result["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert result["env"]["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    assert set(result["env"]) <= set(result["reasons"]), "every derived setting carries its reason"


def test_user_overrides_win():
    p2p = {"nccl_p2p_disable": True, "reasons": ["x"]}
    result = plan(
        settings(env={"NCCL_P2P_DISABLE": "0"}, disable_custom_all_reduce=False),
        {"gpu": gpus(2), "gpu_p2p": {"decisions": p2p}},
        LLAMA_8B,
    )
    assert result["env"]["NCCL_P2P_DISABLE"] == "0"
    assert result["reasons"]["NCCL_P2P_DISABLE"] == "your choice (vllm_env)"
    assert "--disable-custom-all-reduce" not in result["args"]


def test_flags_are_rendered_only_when_set():
    result = plan(
        settings(enable_prefix_caching=True, quantization="awq", extra_args=["--seed", 7], max_num_batched_tokens=4096),
        {"gpu": gpus(1)},
        LLAMA_8B,
    )
    assert "--enable-prefix-caching" in result["args"]
    assert "--enable-chunked-prefill" not in result["args"]
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
    ],
)
def test_each_rule(overrides, facts, message):
    result = plan(settings(**overrides), facts, LLAMA_8B)
    assert any(message in error for error in result["errors"]), result["errors"]
    assert result["kv_cache"] is None


def test_valid_settings_have_no_errors():
    assert plan(settings(tensor_parallel_size=2), {"gpu": gpus(2)}, LLAMA_8B)["errors"] == []


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

BROKEN = {
    "nccl_p2p_disable": True,
    "reasons": ["NCCL_P2P_DISABLE=1 and --disable-custom-all-reduce: GPU0-GPU1 P2P copies lose or corrupt data"],
}


def swapped(count: int, previous: dict, **extra) -> dict:
    return {"gpu": {**gpus(count), "fingerprint": "new"}, "previous": previous, **extra}


def test_the_record_is_what_the_next_run_compares_with():
    result = plan(settings(), {"gpu": {**gpus(2), "fingerprint": "abc"}}, LLAMA_8B)
    assert result["record"] == {"tensor_parallel_size": 2, "nccl_p2p_disable": False, "fingerprint": "abc"}
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
