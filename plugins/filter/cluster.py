# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The cluster_plan, cluster_refusal, cluster_node_command, cluster_server_args and cluster_active_nodes filters: a Ray
cluster across boxes for vLLM (module_utils/_cluster.py)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpubox.inference.plugins.module_utils._cluster import active_nodes, node_command, plan, server_args
from ansible_collections.gpubox.inference.plugins.module_utils._words import explain


def cluster_plan(boxes, model_config=None, settings=None):
    """``[{name, address, gpu, image, nics, interface}]`` -> the plan (head, workers, sizes, args, env, reasons, refusals)."""
    if not isinstance(boxes, list) or not all(isinstance(box, dict) and box.get("name") for box in boxes):
        raise AnsibleFilterError("cluster_plan: needs a list of {name, address, gpu, image, nics, interface}")
    planned = plan(boxes, model_config if isinstance(model_config, dict) else None, dict(settings or {}))
    return {**planned, "reason_words": {key: explain(reason) for key, reason in planned["reasons"].items()}}


def cluster_refusal(planned):
    """The plan's refusals in words, joined ("" when there is none)."""
    if not isinstance(planned, dict) or "refusals" not in planned:
        raise AnsibleFilterError("cluster_refusal: needs cluster_plan's result")
    return "; ".join(explain(refusal) for refusal in planned["refusals"])


def cluster_node_command(planned, addresses, name, port=6379):
    """``ray start``'s arguments for one box of the plan."""
    try:
        return node_command(planned, dict(addresses), str(name), int(port))
    except (KeyError, TypeError, ValueError) as exc:
        raise AnsibleFilterError(f"cluster_node_command: {name!r} is not a box of the plan with an address ({exc})") from exc


def cluster_server_args(planned, box_args):
    """The head's vLLM arguments: the box's own plan's, with the cluster's parallelism."""
    if not isinstance(planned, dict) or "args" not in planned:
        raise AnsibleFilterError("cluster_server_args: needs cluster_plan's result")
    if not isinstance(box_args, list):
        raise AnsibleFilterError(f"cluster_server_args: needs the box plan's args (a list), got {type(box_args).__name__}")
    return server_args(planned, [str(arg) for arg in box_args])


def cluster_active_nodes(status_text):
    """``ray status``'s text -> the number of Active nodes (none when it is not Ray's status)."""
    if not isinstance(status_text, str):
        raise AnsibleFilterError(f"cluster_active_nodes: needs the text of ray status, got {type(status_text).__name__}")
    return active_nodes(status_text)


class FilterModule:
    def filters(self):
        return {
            "cluster_plan": cluster_plan,
            "cluster_refusal": cluster_refusal,
            "cluster_node_command": cluster_node_command,
            "cluster_server_args": cluster_server_args,
            "cluster_active_nodes": cluster_active_nodes,
        }
