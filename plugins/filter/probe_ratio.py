# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The probe_ratio filter: one line comparing a probe through a proxy with the direct one."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError


def probe_ratio(pair):
    """``[proxied, direct]`` probe summaries -> 'TTFT p50 1.05x, throughput 0.97x direct'."""
    try:
        proxied, direct = pair
        ttft = proxied["ttft_ms"]["p50"] / direct["ttft_ms"]["p50"]
        throughput = proxied["output_tokens_per_s"] / direct["output_tokens_per_s"]
    except (TypeError, KeyError, ValueError, ZeroDivisionError) as exc:
        raise AnsibleFilterError(f"probe_ratio: needs two probe summaries with TTFT and throughput ({exc})") from exc
    return f"TTFT p50 {ttft:.2f}x, throughput {throughput:.2f}x direct"


class FilterModule:
    def filters(self):
        return {"probe_ratio": probe_ratio}
