# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The deployment_summary filter: site.yml's closing summary for one host (module_utils/_summary.py)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpubox.inference.plugins.module_utils._summary import summary


def deployment_summary(parts, host):
    """``{gpu, gpu_p2p, preflight, vllm, endpoint, smoke, power}`` -> lines of text for ``host``."""
    if not isinstance(parts, dict):
        raise AnsibleFilterError(f"deployment_summary: needs a dict of parts, got {type(parts).__name__}")
    return summary(str(host), {key: value for key, value in parts.items() if isinstance(value, dict)})


class FilterModule:
    def filters(self):
        return {"deployment_summary": deployment_summary}
