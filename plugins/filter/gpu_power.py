# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The power sweep's filters (playbooks/power.yml): a thin door to module_utils/_power."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpubox.inference.plugins.module_utils import _power
from ansible_collections.gpubox.inference.plugins.module_utils._words import say


def gpu_power_point(probe, limit_w, before, after):
    """One step: ``llm_stream_probe``'s probe and two ``gpu_power`` reads around it -> tokens, seconds, joules."""
    if not isinstance(probe, dict) or not isinstance(before, list) or not isinstance(after, list):
        raise AnsibleFilterError("gpu_power_point: needs the probe (a dict) and two lists of GPUs (gpu_power's gpus)")
    return _power.point(float(limit_w), before, after, probe)


def gpu_power_steps(gpus, steps):
    """``gpu_power``'s gpus -> the sweep's limits (W), from the lowest default down to the highest minimum."""
    if not isinstance(gpus, list):
        raise AnsibleFilterError(f"gpu_power_steps: needs gpu_power's gpus (a list), got {type(gpus).__name__}")
    return _power.sweep_steps(gpus, int(steps))


def gpu_power_sweep(points, keep=0.9):
    """The steps -> ``{rows, knee, lines, words}``: the table and the recommended limit in words."""
    if not isinstance(points, list):
        raise AnsibleFilterError(f"gpu_power_sweep: needs a list of steps, got {type(points).__name__}")
    result = _power.sweep(points, float(keep))
    return {**result, "lines": _power.table(result), "words": say(result["code"], **result.get("fields", {}))}


class FilterModule:
    def filters(self):
        return {"gpu_power_steps": gpu_power_steps, "gpu_power_point": gpu_power_point, "gpu_power_sweep": gpu_power_sweep}
