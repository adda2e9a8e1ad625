# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet_boxes, fleet_members and fleet_refusal filters: the gateway's upstreams from the boxes' records; and
fleet_in_flight: a drained box's requests in flight (module_utils/_fleet.py)."""

from __future__ import annotations

import base64
import json

from ansible.errors import AnsibleFilterError

from ansible_collections.gpubox.inference.plugins.module_utils._fleet import in_flight, members, refusal_words


def _record(read):
    """A slurp result's JSON document, or None where the file was not there (or not JSON)."""
    if not isinstance(read, dict) or "content" not in read:
        return None
    try:
        return json.loads(base64.b64decode(read["content"]))
    except ValueError:
        return None


def fleet_boxes(deployments, endpoints, hostvars):
    """Two looped slurp results over gpu_boxes (vllm.json, proxy.json) -> ``[{name, address, deployment, endpoint}]``."""
    try:
        pairs = list(zip(deployments, endpoints, strict=True))
        return [
            {
                "name": str(read["item"]),
                "address": str(hostvars[read["item"]].get("ansible_host") or read["item"]),
                "deployment": _record(read),
                "endpoint": _record(seen),
            }
            for read, seen in pairs
        ]
    except (TypeError, KeyError, ValueError) as exc:
        raise AnsibleFilterError(f"fleet_boxes: needs two looped slurp results over the same hosts ({exc})") from exc


def fleet_members(boxes, model="", drained=None):
    """``[{name, address, deployment, endpoint}]`` -> ``{model, members, left_out, refusal}``."""
    if not isinstance(boxes, list) or not all(isinstance(box, dict) and box.get("name") for box in boxes):
        raise AnsibleFilterError("fleet_members: needs a list of {name, address, deployment, endpoint}")
    return members(boxes, str(model or ""), list(drained or []))


def fleet_refusal(fleet):
    """The refusal of fleet_members in words ("" when there is none)."""
    if not isinstance(fleet, dict):
        raise AnsibleFilterError(f"fleet_refusal: needs fleet_members' result, got {type(fleet).__name__}")
    return refusal_words(fleet)


def fleet_in_flight(metrics_text):
    """A vLLM server's /metrics text -> its requests running and waiting (None when it does not say)."""
    if not isinstance(metrics_text, str):
        raise AnsibleFilterError(f"fleet_in_flight: needs the text of vLLM's /metrics, got {type(metrics_text).__name__}")
    return in_flight(metrics_text)


class FilterModule:
    def filters(self):
        return {
            "fleet_boxes": fleet_boxes,
            "fleet_members": fleet_members,
            "fleet_refusal": fleet_refusal,
            "fleet_in_flight": fleet_in_flight,
        }
