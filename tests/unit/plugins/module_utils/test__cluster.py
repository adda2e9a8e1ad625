"""A model larger than one box on vLLM over Ray: whether the boxes form one cluster, the split, NCCL's settings."""

from __future__ import annotations

import pytest
from conftest import LLAMA_8B, captures

from ansible_collections.gpubox.inference.plugins.module_utils import _cluster, _topology
from ansible_collections.gpubox.inference.plugins.module_utils._words import explain


def box(name: str, gpus: int = 2, card: str = "NVIDIA GeForce RTX 3090", driver: str = "595.71.05",
        image: str = "vllm/vllm-openai:v0.32.0", nics: list | None = None, interface: str = "enp5s0") -> dict:  # fmt: skip
    gpu = {"present": True, "count": gpus, "driver_version": driver, "devices": [{"name": card}] * gpus}
    return {"name": name, "address": f"10.0.0.{len(name)}", "gpu": gpu, "image": image, "nics": nics or [],
            "interface": interface}  # fmt: skip


SETTINGS = {"tensor_parallel_size": 0, "pipeline_parallel_size": 0, "interface": ""}


def test_tensor_parallel_within_each_box_and_one_pipeline_stage_per_box():
    planned = _cluster.plan([box("a"), box("b")], LLAMA_8B, SETTINGS)
    assert planned["refusals"] == []
    assert (planned["head"], planned["workers"]) == ("a", ["b"])
    assert (planned["tensor_parallel_size"], planned["pipeline_parallel_size"]) == (2, 2)
    assert planned["args"] == [
        "--tensor-parallel-size", "2", "--pipeline-parallel-size", "2", "--distributed-executor-backend", "ray",
    ]  # fmt: skip
    assert explain(planned["reasons"]["--tensor-parallel-size"]) == (
        "2: tensor parallelism stays within a box: the largest size at most each box's 2 GPU(s) that divides the "
        "model's 32 attention heads and 8 KV heads"
    )
    pipeline = explain(planned["reasons"]["--pipeline-parallel-size"])
    assert pipeline.startswith("2: one pipeline stage per box, the model's 32 layers")


def test_the_tensor_parallel_size_fits_the_heads_not_just_the_gpus():
    """Three GPUs per box and 32 heads: 2 within each box (3 does not divide 32)."""
    planned = _cluster.plan([box("a", gpus=3), box("b", gpus=3), box("c", gpus=3)], LLAMA_8B, SETTINGS)
    assert (planned["tensor_parallel_size"], planned["pipeline_parallel_size"]) == (2, 3)
    assert planned["workers"] == ["b", "c"]


@pytest.mark.parametrize(
    ("other", "field", "words"),
    [
        (box("b", card="NVIDIA GeForce RTX 4090"), "gpu_model",
         "the boxes differ in gpu_model: a NVIDIA GeForce RTX 3090; b NVIDIA GeForce RTX 4090"),
        (box("b", gpus=4), "gpu_count", "the boxes differ in gpu_count: a 2; b 4"),
        (box("b", driver="580.95.05"), "driver", "the boxes differ in driver: a 595.71.05; b 580.95.05"),
        (box("b", image="vllm/vllm-openai:v0.31.0"), "image",
         "the boxes differ in image: a vllm/vllm-openai:v0.32.0; b vllm/vllm-openai:v0.31.0"),
    ],
    ids=["gpu-model", "gpu-count", "driver", "image"],
)  # fmt: skip
def test_boxes_that_disagree_are_refused_with_the_difference_named(other, field, words):
    planned = _cluster.plan([box("a"), other], LLAMA_8B, SETTINGS)
    (refusal,) = [r for r in planned["refusals"] if r["code"] == "cluster.disagree"]
    assert refusal["field"] == field
    assert explain(refusal) == words


@pytest.mark.parametrize(
    ("boxes", "settings", "code", "words"),
    [
        ([box("a")], {}, "cluster.one_box", "a cluster needs two boxes or more (a given)"),
        ([box("a"), box("b")], {"tensor_parallel_size": 4}, "cluster.tp_exceeds_box",
         "a tensor-parallel size of 4 needs more GPUs than a box has (2)"),
        ([box("a", gpus=3), box("b", gpus=3)], {"tensor_parallel_size": 3}, "cluster.tp_heads",
         "a tensor-parallel size of 3 does not divide the model's 32 attention heads and 8 KV heads"),
        ([box("a"), box("b")], {"pipeline_parallel_size": 3}, "cluster.pp_boxes",
         "a pipeline-parallel size of 3 is not one stage per box (2 boxes)"),
        ([box("a", gpus=0), box("b", gpus=0)], {}, "cluster.no_gpu", "no GPU on a, b"),
        ([box("a", interface=""), box("b")], {}, "cluster.no_interface",
         "no network interface known for a (set vllm_cluster_interface, or give it a default route)"),
        ([box("a"), box("b")], {"network_mode": "bridge"}, "cluster.network_mode",
         "vllm_network_mode=bridge: a cluster's nodes and server use the host's network (Ray and NCCL open ports of "
         "their own choosing between the boxes); set it to host"),
    ],
    ids=["one-box", "tp-larger-than-a-box", "tp-not-dividing-the-heads", "pp-not-one-per-box", "no-gpu", "no-interface",
         "bridge-network"],
)  # fmt: skip
def test_a_cluster_that_cannot_run_is_refused_naming_why(boxes, settings, code, words):
    planned = _cluster.plan(boxes, LLAMA_8B, {**SETTINGS, **settings})
    refusal = next(r for r in planned["refusals"] if r["code"] == code)
    assert explain(refusal) == words


def test_more_stages_than_layers_are_refused():
    boxes = [box(name) for name in "abc"]
    planned = _cluster.plan(boxes, {**LLAMA_8B, "num_hidden_layers": 2}, SETTINGS)
    assert [explain(r) for r in planned["refusals"]] == ["3 pipeline stages for 2 layers"]


def test_nccl_uses_each_boxs_route_interface_and_turns_infiniband_off_only_without_rdma():
    rdma = [{"name": "NIC0", "device": "mlx5_0"}, {"name": "NIC1", "device": "mlx5_1"}]
    with_rdma = _cluster.plan([box("a", nics=rdma), box("b", nics=rdma, interface="eno1")], LLAMA_8B, SETTINGS)
    assert with_rdma["env"] == {
        "a": {"NCCL_SOCKET_IFNAME": "enp5s0", "GLOO_SOCKET_IFNAME": "enp5s0"},
        "b": {"NCCL_SOCKET_IFNAME": "eno1", "GLOO_SOCKET_IFNAME": "eno1"},
    }
    assert "NCCL_IB_DISABLE" not in with_rdma["reasons"]
    assert explain(with_rdma["reasons"]["NCCL_SOCKET_IFNAME"]).startswith("each box's interface of its default route")
    # One box without an RDMA NIC: sockets on both.
    mixed = _cluster.plan([box("a", nics=rdma), box("b")], LLAMA_8B, {**SETTINGS, "interface": "bond0"})
    assert mixed["env"]["a"] == mixed["env"]["b"] == {"NCCL_SOCKET_IFNAME": "bond0", "GLOO_SOCKET_IFNAME": "bond0",
                                                      "NCCL_IB_DISABLE": "1"}  # fmt: skip
    assert explain(mixed["reasons"]["NCCL_IB_DISABLE"]).startswith("no RDMA NIC on b: NCCL uses sockets on every box")
    assert explain(mixed["reasons"]["NCCL_SOCKET_IFNAME"]) == "your choice"


def test_the_rdma_nics_of_real_topologies_are_recognised():
    """Every NIC Legend device in the captured nvidia-smi topo -m outputs is an RDMA device: ConnectX (mlx5_N) and
    a RoCE NIC under rdma-core's predictable name (rocep49s0, a GH200 node)."""
    devices = {
        nic["device"]
        for capture in captures("A_topo_m")
        for nic in _topology.parse_topology(capture.text)["nics"]
        if nic.get("device")
    }
    assert "rocep49s0" in devices
    assert "mlx5_0" in devices
    assert [device for device in devices if not _topology.is_rdma(device)] == []
    for plain in ("eth0", "enp5s0", "eno1", "bond0", "wlan0", "docker0"):
        assert not _topology.is_rdma(plain), plain
    assert _cluster.has_rdma({"nics": [{"name": "NIC0", "device": "mlx5_0"}]})
    assert not _cluster.has_rdma({"nics": [{"name": "NIC0", "device": "eth0"}]})


def test_a_cpu_cluster_compares_only_the_image_and_puts_one_rank_on_each_box():
    """vLLM's CPU backend: no GPU to count or compare (the cluster test's nodes)."""
    cpu = {**SETTINGS, "device": "cpu"}
    boxes = [{**box("a"), "gpu": {}}, {**box("b", driver="580.95.05"), "gpu": {}}]
    planned = _cluster.plan(boxes, LLAMA_8B, cpu)
    assert planned["refusals"] == []
    assert (planned["tensor_parallel_size"], planned["pipeline_parallel_size"]) == (1, 2)
    other = _cluster.plan([boxes[0], {**boxes[1], "image": "vllm/vllm-openai:v0.31.0"}], LLAMA_8B, cpu)
    assert [r["field"] for r in other["refusals"]] == ["image"]


def test_a_box_without_an_address_is_refused_naming_the_variable():
    planned = _cluster.plan([box("a"), {**box("b"), "address": ""}], LLAMA_8B, SETTINGS)
    (refusal,) = planned["refusals"]
    assert explain(refusal) == "no address known for b (set vllm_cluster_address, or give it a default route)"


def test_the_head_starts_the_cluster_and_a_worker_joins_it_at_the_heads_address():
    planned = _cluster.plan([box("a"), box("b")], LLAMA_8B, SETTINGS)
    addresses = {"a": "10.0.0.1", "b": "10.0.0.2"}
    assert _cluster.node_command(planned, addresses, "a", 6379) == [
        "start", "--head", "--port", "6379", "--node-ip-address", "10.0.0.1", "--block", "--disable-usage-stats",
    ]  # fmt: skip
    assert _cluster.node_command(planned, addresses, "b", 6380) == [
        "start", "--address", "10.0.0.1:6380", "--node-ip-address", "10.0.0.2", "--block", "--disable-usage-stats",
    ]  # fmt: skip


# `ray status` of ray 2.60.0 on the head of two nodes (the vLLM test image with Ray, 2026-12-02).
RAY_STATUS = """\
======== Autoscaler status: 2026-12-02 23:21:19.862839 ========
Node status
---------------------------------------------------------------
Active:
 1 node_d03033c342b5ea26991afb8dace02b5d0c52da55ee16462d06a9a0fd
 1 node_67f8d92d056cd2a92e607cd1200e6d4079e93f209c59b512071312cc
Pending:
 (no pending nodes)
Recent failures:
 (no failures)

Resources
---------------------------------------------------------------
Total Usage:
 0.0/2.0 CPU
 0B/32.73GiB memory
 0B/14.03GiB object_store_memory

From request_resources:
 (none)
Pending Demands:
 (no resource demands)
"""


def test_the_active_nodes_of_ray_status_are_counted():
    assert _cluster.active_nodes(RAY_STATUS) == 2
    one = RAY_STATUS.replace(" 1 node_67f8d92d056cd2a92e607cd1200e6d4079e93f209c59b512071312cc\n", "")
    assert _cluster.active_nodes(one) == 1
    # Pending nodes are not in.
    pending = one.replace(" (no pending nodes)", " 1 node_67f8d92d056cd2a92e607cd1200e6d4079e93f209c59b512071312cc")
    assert _cluster.active_nodes(pending) == 1
    assert _cluster.active_nodes("") is None
    assert _cluster.active_nodes("ConnectionError: could not find any running Ray instance") is None


def test_the_head_serves_over_cuda_and_nothing_serves_on_the_cpu_backend():
    planned = _cluster.plan([box("a"), box("b")], LLAMA_8B, SETTINGS)
    assert planned["serve"] is True
    assert explain(planned["reasons"]["server"]) == (
        "a serves the model over the cluster (the server's Ray driver beside its head node)"
    )
    cpu = _cluster.plan([{**box("a"), "gpu": {}}, {**box("b"), "gpu": {}}], LLAMA_8B, {**SETTINGS, "device": "cpu"})
    assert cpu["serve"] is False
    assert "vLLM's CPU platform does not run on Ray" in explain(cpu["reasons"]["server"])


# What _vllm.plan gives a box of two GPUs (its own parallelism: both GPUs, vLLM's multiprocess executor).
BOX_ARGS = [
    "--model", "/models/llama", "--served-model-name", "llama", "--host", "127.0.0.1", "--port", "8000",
    "--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.9", "--max-model-len", "8192",
    "--disable-custom-all-reduce",
]  # fmt: skip


@pytest.mark.parametrize(
    "extra",
    [[], ["--pipeline-parallel-size", "2", "--distributed-executor-backend", "mp"], ["--pipeline-parallel-size=2"]],
)
def test_the_heads_server_keeps_the_boxs_own_arguments_with_the_clusters_parallelism(extra):
    planned = _cluster.plan([box("a", gpus=4), box("b", gpus=4)], LLAMA_8B, SETTINGS)
    assert _cluster.server_args(planned, BOX_ARGS + extra) == [
        "--model", "/models/llama", "--served-model-name", "llama", "--host", "127.0.0.1", "--port", "8000",
        "--gpu-memory-utilization", "0.9", "--max-model-len", "8192", "--disable-custom-all-reduce",
        "--tensor-parallel-size", "4", "--pipeline-parallel-size", "2", "--distributed-executor-backend", "ray",
    ]  # fmt: skip
