# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vllm_plan filter: a thin door from the vllm role to module_utils/_vllm."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpubox.inference.plugins.module_utils import _gate, _layout
from ansible_collections.gpubox.inference.plugins.module_utils._vllm import cuda_finding, plan
from ansible_collections.gpubox.inference.plugins.module_utils._words import explain

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


# Numbers as the plan compares them; `-e name=value` gives strings.
NUMBERS = {
    "tensor_parallel_size": int,
    "pipeline_parallel_size": int,
    "max_model_len": int,
    "max_num_batched_tokens": int,
    "min_concurrent_sequences": int,
    "port": int,
    "swap_space": int,
    "cpu_count": int,
    "replica_size": int,
    "tune_concurrency": int,
    "tune_prompt_tokens": int,
    "tune_max_tokens": int,
    "tune_max_ttft_ms": float,
    "gpu_memory_utilization": float,
}


def vllm_plan(settings, facts, model_config=None, weights_bytes=None):
    """The deployment plan (see the filter's documentation)."""
    if not isinstance(settings, dict) or not isinstance(facts, dict):
        raise AnsibleFilterError("vllm_plan: settings and facts must be dicts")
    missing = [key for key in REQUIRED if key not in settings]
    if missing:
        raise AnsibleFilterError(f"vllm_plan: settings lack {missing}")
    settings = dict(settings)
    for key, kind in NUMBERS.items():
        if key in settings and settings[key] not in (None, ""):
            try:
                settings[key] = kind(settings[key])
            except (TypeError, ValueError):
                raise AnsibleFilterError(f"vllm_{key}={settings[key]!r} must be a number") from None
    return plan(settings, dict(facts), model_config or None, int(weights_bytes) if weights_bytes else None)


def vllm_cuda_refusal(image_env, image, driver_cuda=None):
    """Why the image cannot run on this driver, in words, or an empty string (see vllm_cuda_refusal's documentation)."""
    finding = cuda_finding(str(image), list(image_env or []), str(driver_cuda) if driver_cuda else None)
    return explain(finding) if finding else ""


def vllm_gate_next(results, steps):
    """The name of the correctness gate's next configuration to try, or an empty string (see its documentation)."""
    return _gate.next_step(list(steps or []), dict(results or {})) or ""


def vllm_gate_choice(results, steps):
    """The configuration to keep with its reason and its words, or None (see vllm_gate_next's documentation)."""
    chosen = _gate.choose(list(steps or []), dict(results or {}))
    return {**chosen, "words": explain(chosen)} if chosen else None


def vllm_layout_measurement(probe, metrics=None):
    """One layout's numbers from llm_stream_probe's summary and its servers' /metrics (see its documentation)."""
    if not isinstance(probe, dict):
        raise AnsibleFilterError("vllm_layout_measurement: the input must be llm_stream_probe's probe dict")
    return _layout.measurement(probe, [str(text) for text in metrics or []])


def vllm_layout_choice(measured, layouts, max_ttft_ms=0):
    """The layout a measurement keeps, its decision and words, and the table (see its documentation)."""
    try:
        bound = float(max_ttft_ms or 0)
    except (TypeError, ValueError):
        raise AnsibleFilterError(f"vllm_tune_max_ttft_ms={max_ttft_ms!r} must be a number") from None
    result = _layout.outcome(list(layouts or []), dict(measured or {}), bound)
    return {**result, "words": explain(result["decision"])}


class FilterModule:
    def filters(self):
        return {
            "vllm_plan": vllm_plan,
            "vllm_cuda_refusal": vllm_cuda_refusal,
            "vllm_gate_next": vllm_gate_next,
            "vllm_gate_choice": vllm_gate_choice,
            "vllm_layout_measurement": vllm_layout_measurement,
            "vllm_layout_choice": vllm_layout_choice,
        }
