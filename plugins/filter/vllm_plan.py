# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vllm_plan filter: a thin door from the vllm role to module_utils/_vllm."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpubox.inference.plugins.module_utils._vllm import plan

REQUIRED = (
    "model",
    "container_model",
    "served_model_name",
    "device",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "gpu_memory_utilization",
    "max_model_len",
    "dtype",
)


def vllm_plan(settings, facts, model_config=None, weights_bytes=None):
    """The deployment plan (see the filter's documentation)."""
    if not isinstance(settings, dict) or not isinstance(facts, dict):
        raise AnsibleFilterError("vllm_plan: settings and facts must be dicts")
    missing = [key for key in REQUIRED if key not in settings]
    if missing:
        raise AnsibleFilterError(f"vllm_plan: settings lack {missing}")
    return plan(dict(settings), dict(facts), model_config or None, int(weights_bytes) if weights_bytes else None)


class FilterModule:
    def filters(self):
        return {"vllm_plan": vllm_plan}
