# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The preflight_report filter: a thin door from the preflight role to module_utils/_preflight."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpubox.inference.plugins.module_utils._preflight import build

POLICY_KEYS = ("fail_on_chipset_gpu", "fail_on_downtrained", "fail_on_acs_redirect", "tensor_parallel_size")


def preflight_report(topology, host, platform, iommu, acs, policy):
    """Combine the three preflight modules' results into the report (see the filter's documentation)."""
    for name, value in (
        ("topology", topology),
        ("platform", platform),
        ("iommu", iommu),
        ("acs", acs),
        ("policy", policy),
    ):
        if not isinstance(value, dict):
            raise AnsibleFilterError(f"preflight_report: {name} must be a dict, got {type(value).__name__}")
    unknown = sorted(set(policy) - set(POLICY_KEYS))
    if unknown:
        raise AnsibleFilterError(f"preflight_report: unknown policy keys {unknown}; known: {list(POLICY_KEYS)}")
    policy = dict(policy)
    try:  # `-e vllm_tensor_parallel_size=2` gives a string
        policy["tensor_parallel_size"] = int(policy.get("tensor_parallel_size") or 0)
    except (TypeError, ValueError):
        raise AnsibleFilterError(f"vllm_tensor_parallel_size={policy['tensor_parallel_size']!r} must be a number") from None
    return build(str(host), topology, platform, iommu, acs, policy)


class FilterModule:
    def filters(self):
        return {"preflight_report": preflight_report}
