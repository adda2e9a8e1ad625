# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Private: judge GPU peer-to-peer from measurements or imported reports, and decide NCCL/vLLM settings.

Pure functions, data in and data out, no Ansible imports. A pair's ``status`` is
``ok``, ``no_peer_access`` (the driver offers no P2P, so NCCL stages through the
host), ``slower_than_staged`` (P2P works but loses to the host-staged copy),
``broken`` (the P2P copy lost or changed data) or ``hang`` (the copy never returned).
"""

from __future__ import annotations

from ansible_collections.gpubox.inference.plugins.module_utils._bandwidth import pcie_limit_gbps

MATRIX_NAMES = (
    "unidirectional_p2p_enabled",
    "unidirectional_p2p_disabled",
    "bidirectional_p2p_enabled",
    "bidirectional_p2p_disabled",
    "latency_gpu_p2p_enabled_us",
    "latency_gpu_p2p_disabled_us",
)
STATUSES = ("ok", "no_peer_access", "slower_than_staged", "broken", "hang")
# Bumped when the shape of the facts changes: a cache written by another shape is measured again.
SCHEMA = 2


def pair_status(result: dict) -> str:
    if result.get("hang"):
        return "hang"
    if result.get("verified") is False:
        return "broken"
    if not result.get("can_access_peer"):
        return "no_peer_access"
    enabled, staged = result.get("unidirectional_p2p_enabled"), result.get("unidirectional_p2p_disabled")
    if enabled is not None and staged is not None and enabled < staged:
        return "slower_than_staged"
    return "ok"


def from_measurement(measured: dict, links: dict[str, dict] | None = None) -> dict:
    """``_cuda_p2p.measure`` output -> the gpu_p2p facts (matrices, pairs, decisions)."""
    count = len(measured["devices"])
    matrices = {name: [[None] * count for _row in range(count)] for name in MATRIX_NAMES}
    pairs = {}
    for (i, j), result in sorted(measured["pairs"].items()):
        for name in MATRIX_NAMES:
            value = result.get(name)
            matrices[name][i][j] = round(value, 2) if value is not None else None
        status = pair_status(result)
        limit = _pair_limit(links or {}, measured["devices"][i], measured["devices"][j])
        bandwidth = result.get("unidirectional_p2p_enabled")
        pairs[f"{i}-{j}"] = {
            "status": status,
            "can_access_peer": result.get("can_access_peer"),
            "verified": result.get("verified"),
            "detail": result.get("verify_detail") or (f"no answer within {result['timeout_s']} s" if status == "hang" else None),
            "pcie_limit_gbps": limit,
            "ratio_to_limit": round(bandwidth / limit, 2) if limit and bandwidth and status != "broken" else None,
        }
    facts = {"source": "measured", "gpus": count, "devices": measured["devices"], "matrices": matrices, "pairs": pairs}
    facts["host_links"] = host_links(measured, links or {})
    facts["decisions"] = decide(pairs, count, verified=True)
    if count < 2:
        facts["reason"] = "fewer than two GPUs: no pair to measure, only each GPU's copies to and from the host"
    return facts


def host_links(measured: dict, links: dict[str, dict]) -> dict[str, dict]:
    """Each GPU's measured link to the host: both directions, the PCIe limit, and a bit-exact round trip.

    ``ratio_to_limit`` uses the faster direction: what the link carried at best (a link trained to x4,
    or to Gen1 under load, shows here as a low ratio whatever the host's memory does).
    """
    out = {}
    for i, result in sorted((measured.get("host") or {}).items()):
        bus = measured["devices"][i]
        link = links.get(bus, {})
        limit = pcie_limit_gbps(link.get("gen"), link.get("width"))
        h2d, d2h = result.get("host_to_device_gbps"), result.get("device_to_host_gbps")
        status = "hang" if result.get("hang") else "broken" if result.get("verified") is False else "ok"
        best = max(h2d or 0, d2h or 0)
        out[str(i)] = {
            "bus_id": bus,
            "status": status,
            "host_to_device_gbps": round(h2d, 2) if h2d is not None else None,
            "device_to_host_gbps": round(d2h, 2) if d2h is not None else None,
            "verified": result.get("verified"),
            "detail": result.get("verify_detail") or (f"no answer within {result['timeout_s']} s" if status == "hang" else None),
            "pcie_limit_gbps": limit,
            "ratio_to_limit": round(best / limit, 2) if limit and best and status == "ok" else None,
        }
    return out


# The matrices pair statuses are decided from, per source: what the facts' ``decided_from`` names.
# p2pBandwidthLatencyTest: the writes (the sample's default; a --p2p_read run adds the reads beside them).
DECIDED_FROM_P2PBLT = ("unidirectional_p2p_enabled", "unidirectional_p2p_disabled")


def from_report(report: dict) -> dict:
    """A parsed nvbandwidth (text or JSON) or p2pBandwidthLatencyTest report -> the gpu_p2p facts.

    ``decided_from`` names the matrices (or waived tests) the pair statuses come from.
    """
    count = report["gpus"]
    pairs = {}
    matrices = report["matrices"]
    if report["source"] == "p2pBandwidthLatencyTest":
        access = report.get("can_access_peer", {})
        decided_from = [name for name in DECIDED_FROM_P2PBLT if name in matrices]
        for i in range(count):
            for j in range(count):
                if i == j:
                    continue
                result = {
                    "can_access_peer": access.get(str(i), {}).get(str(j), False) and access.get(str(j), {}).get(str(i), False)
                }
                for name in decided_from:
                    result[name] = matrices[name][i][j]
                pairs[f"{i}-{j}"] = {
                    "status": pair_status(result),
                    "can_access_peer": result["can_access_peer"],
                    "verified": None,
                }
    else:
        d2d = {name: rows for name, rows in matrices.items() if name.startswith("device_to_device") and len(rows) == count}
        waived = [t for t in report.get("waived", []) if t.startswith("device_to_device")]
        decided_from = sorted(d2d) + sorted(waived)
        for i in range(count):
            for j in range(count):
                if i == j or not (d2d or waived):
                    continue
                values = [rows[i][j] for rows in d2d.values() if rows[i][j]]
                status = "ok" if values else "no_peer_access"
                pairs[f"{i}-{j}"] = {"status": status, "can_access_peer": bool(values), "verified": None}
    facts = {
        "source": report["source"],
        "format": report.get("format", "text"),
        "gpus": count,
        "devices": report.get("devices", []),
        "matrices": matrices,
        "pairs": pairs,
        "decided_from": decided_from,
    }
    if report["source"] == "nvbandwidth":
        facts.update(tests=report.get("tests", {}), waived=report.get("waived", []), errors=report.get("errors", {}))
        facts["sums"] = report.get("sums", {})
    facts["decisions"] = decide(pairs, count, verified=False)
    return facts


def _pair_limit(links: dict[str, dict], a: str, b: str) -> float | None:
    """The PCIe limit of the narrower of the two GPUs' links, per direction."""
    limits = [pcie_limit_gbps(links.get(bus, {}).get("gen"), links.get(bus, {}).get("width")) for bus in (a, b)]
    known = [limit for limit in limits if limit]
    return min(known) if len(known) == 2 else None


def decide(pairs: dict[str, dict], count: int, verified: bool, tool_hang_s: float | None = None) -> dict:
    """Per unordered pair ``p2p_usable`` and its worst ``status``, and the NCCL settings for all ``count`` GPUs.

    ``tool_hang_s``: the measuring tool itself never returned (after that many seconds), so no pair can be trusted.
    """
    decisions: dict = {"pairs": {}, "verified": verified, "tool_hang_s": tool_hang_s}
    for i in range(count):
        for j in range(i + 1, count):
            statuses = [pairs.get(f"{i}-{j}", {}).get("status"), pairs.get(f"{j}-{i}", {}).get("status")]
            worst = next((s for s in ("hang", "broken", "slower_than_staged", "no_peer_access") if s in statuses), None)
            if None in statuses and worst is None:
                continue
            decisions["pairs"][f"{i}-{j}"] = {"p2p_usable": worst is None, "status": worst or "ok"}
    decisions.update(for_group(decisions, range(count)))
    return decisions


def for_group(decisions: dict, indices) -> dict:
    """The NCCL settings the P2P measurement implies for the GPUs ``indices`` only (the deployed group).

    ``nccl_p2p_disable`` with its ``cause`` (V(measured): ``unusable`` names the pairs, worst first in GPU order;
    V(tool_hang): the measurement never returned), and ``nccl_p2p_level`` V(SYS) when every pair in the group was
    measured, verified bit for bit and usable.
    """
    group = sorted(set(indices))
    size = len(group)
    inside = {
        pair: verdict
        for pair, verdict in (decisions.get("pairs") or {}).items()
        if {int(index) for index in pair.split("-")} <= set(group)
    }
    unusable = [
        {"pair": "GPU" + pair.replace("-", "-GPU"), "status": verdict.get("status", "broken")}
        for pair, verdict in sorted(inside.items(), key=lambda item: [int(i) for i in item[0].split("-")])
        if not verdict["p2p_usable"]
    ]
    # A hung tool says nothing about any pair: P2P off for every group of two or more (or of unknown size).
    hang = decisions.get("tool_hang_s") is not None and size != 1
    every_pair = size > 1 and len(inside) == size * (size - 1) // 2
    return {
        "nccl_p2p_disable": bool(unusable) or hang,
        "cause": "tool_hang" if hang else "measured" if unusable else None,
        "unusable": unusable,
        "nccl_p2p_level": "SYS" if decisions.get("verified") and every_pair and not unusable and not hang else None,
    }
