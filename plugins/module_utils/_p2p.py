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
STATUS_REASONS = {
    "ok": "P2P copies arrive intact and beat the host-staged copy",
    "no_peer_access": "the driver reports no peer access between them",
    "slower_than_staged": "P2P is slower than copying through host memory",
    "broken": "P2P copies lose or corrupt data",
    "hang": "a P2P copy never returned",
}


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


def from_report(report: dict) -> dict:
    """A parsed nvbandwidth or p2pBandwidthLatencyTest report -> the gpu_p2p facts."""
    count = report["gpus"]
    pairs = {}
    matrices = report["matrices"]
    if report["source"] == "p2pBandwidthLatencyTest":
        access = report.get("can_access_peer", {})
        for i in range(count):
            for j in range(count):
                if i == j:
                    continue
                result = {
                    "can_access_peer": access.get(str(i), {}).get(str(j), False) and access.get(str(j), {}).get(str(i), False)
                }
                for name in ("unidirectional_p2p_enabled", "unidirectional_p2p_disabled"):
                    if name in matrices:
                        result[name] = matrices[name][i][j]
                pairs[f"{i}-{j}"] = {
                    "status": pair_status(result),
                    "can_access_peer": result["can_access_peer"],
                    "verified": None,
                }
    else:
        d2d = {name: rows for name, rows in matrices.items() if name.startswith("device_to_device") and len(rows) == count}
        waived = [t for t in report.get("waived", []) if t.startswith("device_to_device")]
        for i in range(count):
            for j in range(count):
                if i == j or not (d2d or waived):
                    continue
                values = [rows[i][j] for rows in d2d.values() if rows[i][j]]
                status = "ok" if values else "no_peer_access"
                pairs[f"{i}-{j}"] = {"status": status, "can_access_peer": bool(values), "verified": None}
    facts = {
        "source": report["source"],
        "gpus": count,
        "devices": report.get("devices", []),
        "matrices": matrices,
        "pairs": pairs,
    }
    facts["decisions"] = decide(pairs, count, verified=False)
    return facts


def _pair_limit(links: dict[str, dict], a: str, b: str) -> float | None:
    """The PCIe limit of the narrower of the two GPUs' links, per direction."""
    limits = [pcie_limit_gbps(links.get(bus, {}).get("gen"), links.get(bus, {}).get("width")) for bus in (a, b)]
    known = [limit for limit in limits if limit]
    return min(known) if len(known) == 2 else None


def decide(pairs: dict[str, dict], count: int, verified: bool) -> dict:
    """Per unordered pair ``p2p_usable`` and why, and the NCCL/vLLM settings it implies."""
    decisions: dict = {"pairs": {}, "reasons": []}
    for i in range(count):
        for j in range(i + 1, count):
            statuses = [pairs.get(f"{i}-{j}", {}).get("status"), pairs.get(f"{j}-{i}", {}).get("status")]
            worst = next((s for s in ("hang", "broken", "slower_than_staged", "no_peer_access") if s in statuses), None)
            if None in statuses and worst is None:
                continue
            usable = worst is None
            decisions["pairs"][f"{i}-{j}"] = {"p2p_usable": usable, "reason": STATUS_REASONS[worst or "ok"]}
    unusable = {k: v for k, v in decisions["pairs"].items() if not v["p2p_usable"]}
    decisions["nccl_p2p_disable"] = bool(unusable)
    decisions["vllm_disable_custom_all_reduce"] = bool(unusable)
    # Every pair measured, verified and usable: let NCCL use P2P at any distance (its default stops at PXB/PHB).
    decisions["nccl_p2p_level"] = "SYS" if verified and decisions["pairs"] and not unusable else None
    for pair, verdict in unusable.items():
        decisions["reasons"].append(
            f"NCCL_P2P_DISABLE=1 and --disable-custom-all-reduce: GPU{pair.replace('-', '-GPU')} {verdict['reason']}"
        )
    if decisions["nccl_p2p_level"]:
        decisions["reasons"].append("NCCL_P2P_LEVEL=SYS: every pair's P2P was measured, verified and faster than staging")
    return decisions
