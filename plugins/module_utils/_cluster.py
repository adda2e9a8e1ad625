# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Private: a model larger than one box, on vLLM over Ray across boxes: whether the boxes can form one cluster,
how the model is split over them, and what NCCL is told. Data in, data out; no Ansible imports.

vLLM's multi-node mode puts tensor parallelism within a box (its GPUs talk over NVLink or PCIe) and pipeline
parallelism across boxes (one stage per box, activations over the network once per layer group). Each box is
described by what its own run read: ``{"name", "address", "gpu": gpu_facts, "image": "repo:tag", "nics":
[{"name", "device"}] from the topology, "interface": its default route's interface}``.

Decisions come back as fields with reason codes (``_words.say`` renders them); refusals name the field and
each box's value.
"""

from __future__ import annotations

import re

from ansible_collections.gpubox.inference.plugins.module_utils._topology import is_rdma
from ansible_collections.gpubox.inference.plugins.module_utils._vllm import fits_heads, largest_fitting_tp

# What every box of one cluster must share, and how each box's value is read.
AGREE = {
    "gpu_model": lambda box: ", ".join(sorted({d.get("name") or "?" for d in (box.get("gpu") or {}).get("devices") or []})),
    "gpu_count": lambda box: int((box.get("gpu") or {}).get("count") or 0),
    "driver": lambda box: (box.get("gpu") or {}).get("driver_version") or "",
    "image": lambda box: box.get("image") or "",
}


# What a cluster on vLLM's CPU backend shares: no GPU to compare.
AGREE_CPU = ("image",)


def disagreements(boxes: list[dict], device: str = "cuda") -> list[dict]:
    """Each shared property on which the boxes differ: ``{"code": "cluster.disagree", "field", "values": {box: value}}``."""
    found = []
    for field, read in AGREE.items():
        if device == "cpu" and field not in AGREE_CPU:
            continue
        values = {box["name"]: read(box) for box in boxes}
        if len(set(values.values())) > 1:
            found.append({"code": "cluster.disagree", "field": field, "values": values})
    return found


def has_rdma(box: dict) -> bool:
    return any(is_rdma(nic.get("device")) for nic in box.get("nics") or [])


def _nccl(boxes: list[dict], interface: str) -> tuple[dict, dict, list[dict]]:
    """Per box, NCCL's and Gloo's interface and whether InfiniBand is off; the reasons; refusals."""
    env: dict[str, dict] = {}
    refusals = []
    without_rdma = [box["name"] for box in boxes if not has_rdma(box)]
    for box in boxes:
        chosen = interface or box.get("interface") or ""
        if not chosen:
            refusals.append({"code": "cluster.no_interface", "box": box["name"]})
            continue
        env[box["name"]] = {"NCCL_SOCKET_IFNAME": chosen, "GLOO_SOCKET_IFNAME": chosen}
        if without_rdma:
            env[box["name"]]["NCCL_IB_DISABLE"] = "1"
    why = {"NCCL_SOCKET_IFNAME": {"code": "cluster.interface.user" if interface else "cluster.interface.route"}}
    if without_rdma:
        # Both ends of a connection must offer the same transport: one box without RDMA turns it off for all.
        why["NCCL_IB_DISABLE"] = {"code": "cluster.ib_disable", "boxes": without_rdma}
    return env, why, refusals


def plan(boxes: list[dict], model_config: dict | None, settings: dict) -> dict:
    """The cluster: head and workers, tensor and pipeline parallel sizes with their reasons, vLLM's arguments and
    each box's environment, or the refusals.

    ``settings``: ``tensor_parallel_size`` and ``pipeline_parallel_size`` (0: derived), ``interface`` ("" : each
    box's default route's interface), ``network_mode`` (the server's; a cluster needs ``host``), ``device``
    (``cuda``, or ``cpu``: no GPU to count or compare, one tensor-parallel rank per box). The first box is the Ray
    head.
    """
    device = settings.get("device") or "cuda"
    config = model_config or {}
    heads = config.get("num_attention_heads")
    kv_heads = config.get("num_key_value_heads") or heads
    layers = config.get("num_hidden_layers")
    refusals: list[dict] = []
    if len(boxes) < 2:
        refusals.append({"code": "cluster.one_box", "boxes": [box["name"] for box in boxes]})
    refusals += [{"code": "cluster.no_address", "box": box["name"]} for box in boxes if not box.get("address")]
    if (settings.get("network_mode") or "host") != "host":
        # Ray and NCCL open ports of their own choosing between the boxes; the server answers the head's front door.
        refusals.append({"code": "cluster.network_mode", "mode": settings["network_mode"]})
    refusals += disagreements(boxes, device)
    gpus = 1 if device == "cpu" else min((AGREE["gpu_count"](box) for box in boxes), default=0)
    if boxes and not gpus:
        refusals.append({"code": "cluster.no_gpu", "boxes": [box["name"] for box in boxes if not AGREE["gpu_count"](box)]})
    reasons: dict[str, dict] = {}
    tp = int(settings.get("tensor_parallel_size") or 0)
    if tp:
        reasons["--tensor-parallel-size"] = {"code": "tp.user"}
        if gpus and tp > gpus:
            refusals.append({"code": "cluster.tp_exceeds_box", "size": tp, "gpus": gpus})
        elif not fits_heads(tp, heads, kv_heads):
            refusals.append({"code": "cluster.tp_heads", "size": tp, "heads": heads, "kv_heads": kv_heads})
    else:
        tp = largest_fitting_tp(gpus, heads, kv_heads)
        reasons["--tensor-parallel-size"] = {"code": "cluster.tp", "size": tp, "gpus": gpus, "heads": heads, "kv_heads": kv_heads}
    pp = int(settings.get("pipeline_parallel_size") or 0)
    if pp:
        reasons["--pipeline-parallel-size"] = {"code": "pp.user"}
        if pp != len(boxes):
            refusals.append({"code": "cluster.pp_boxes", "size": pp, "boxes": len(boxes)})
    else:
        pp = len(boxes)
        reasons["--pipeline-parallel-size"] = {"code": "cluster.pp", "size": pp, "layers": layers}
    if layers and pp > layers:
        refusals.append({"code": "cluster.pp_layers", "size": pp, "layers": layers})
    env, nccl_why, nccl_refusals = _nccl(boxes, settings.get("interface") or "")
    reasons.update(nccl_why)
    refusals += nccl_refusals
    args = ["--tensor-parallel-size", str(tp), "--pipeline-parallel-size", str(pp), "--distributed-executor-backend", "ray"]
    # The head serves the model over the cluster where vLLM's platform runs on Ray: CUDA does, the CPU backend does not.
    serve = device == "cuda"
    reasons["server"] = {"code": "cluster.serve" if serve else "cluster.serve.cpu", "head": boxes[0]["name"] if boxes else None}
    return {
        "head": boxes[0]["name"] if boxes else None,
        "workers": [box["name"] for box in boxes[1:]],
        "tensor_parallel_size": tp,
        "pipeline_parallel_size": pp,
        "args": args,
        "serve": serve,
        "env": env,
        "reasons": reasons,
        "refusals": refusals,
    }


# The flags by which the cluster's plan replaces a box's own parallelism, each with its value.
PARALLEL_FLAGS = ("--tensor-parallel-size", "--pipeline-parallel-size", "--distributed-executor-backend")


def server_args(planned: dict, box_args: list[str]) -> list[str]:
    """The head's vLLM arguments: the box's own plan (model, name, address, limits; ``_vllm.plan``'s ``args``) with
    its parallelism replaced by the cluster's (tensor parallelism within a box, a pipeline stage per box, on Ray)."""
    args, skip = [], False
    for index, arg in enumerate(box_args):
        if skip:
            skip = False
            continue
        flag = arg.split("=", 1)[0]
        if flag in PARALLEL_FLAGS:
            # "--flag value", or "--flag=value" in one word.
            skip = "=" not in arg and index + 1 < len(box_args)
            continue
        args.append(arg)
    return args + planned["args"]


def node_command(planned: dict, addresses: dict, name: str, port: int) -> list[str]:
    """``ray start``'s arguments for box ``name``: the head listens on ``port``, a worker joins it; each node gives its
    own address (``addresses``: box -> the address the other boxes reach it at), and stays in the foreground so that
    its container lives and dies with it (Compose restarts it)."""
    own = ["--node-ip-address", addresses[name], "--block", "--disable-usage-stats"]
    if name == planned["head"]:
        return ["start", "--head", "--port", str(port), *own]
    return ["start", "--address", f"{addresses[planned['head']]}:{port}", *own]


_ACTIVE_NODE = re.compile(r"^\s*(\d+)\s+node_[0-9a-f]+\s*$")


def active_nodes(status_text: str) -> int | None:
    """The nodes that ``ray status`` lists as Active (None when the text has no Active section: not Ray's status)."""
    count, section = None, None
    for line in status_text.splitlines():
        stripped = line.strip()
        if stripped.endswith(":"):
            section = stripped[:-1]
            if section == "Active":
                count = 0
            continue
        match = _ACTIVE_NODE.match(line)
        if section == "Active" and match:
            count += int(match.group(1))
    return count
