# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Private: the serving layout, one tensor-parallel server or replicas behind Nginx, chosen by measurement.

Pure functions, no Ansible imports. On a PCIe box without NVLink, a model that fits one
GPU often serves more tokens per second as one replica per GPU than as one server with
tensor parallelism over all of them. The vLLM plan (``_vllm.layout_plan``) lists the
layouts that fit (``candidates``); the vllm role deploys and measures each at the user's
target load; ``choose`` keeps the one with the highest throughput that meets a TTFT bound.

A layout is ``{"name", "size", "replicas"}``: ``replicas`` servers of ``size`` GPUs (or CPU
workers) each, on ``size x replicas`` units in all. Its name is ``tp<size>`` for one server,
``<replicas>xtp<size>`` for replicas.
"""

from __future__ import annotations

import re

LAYOUTS = ("tp", "replicas", "auto")


def name(size: int, replicas: int) -> str:
    return f"tp{size}" if replicas == 1 else f"{replicas}xtp{size}"


def layout(size: int, replicas: int) -> dict:
    return {"name": name(size, replicas), "size": size, "replicas": replicas}


def candidates(units: int, fits) -> list[dict]:
    """The layouts over ``units`` GPUs (or CPU workers): one server over all, then replicas of each size ``k``
    that divides them and for which ``fits(k)`` (heads, weights and KV cache), largest first."""
    out = [layout(units, 1)]
    out += [layout(k, units // k) for k in range(units - 1, 0, -1) if units % k == 0 and fits(k)]
    return out


def key(gate_key: str, units: int, load: dict) -> str:
    """What a stored choice is valid for: the gate's key (GPUs, model, revision, image), the units and the load."""
    return f"{gate_key}|units={units}|load={load['concurrency']}x{load['prompt_tokens']}+{load['max_tokens']}"


def kv_tokens(metrics: str) -> int | None:
    """The KV-cache tokens a vLLM server holds, from its ``/metrics``: ``vllm:cache_config_info``'s
    ``num_gpu_blocks`` times ``block_size``; None when the text lacks them."""
    for line in metrics.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            try:
                return int(labels["num_gpu_blocks"]) * int(labels["block_size"])
            except (KeyError, ValueError):
                return None
    return None


def measurement(probe: dict, metrics: list[str]) -> dict:
    """One layout's numbers from ``llm_stream_probe``'s summary and each of its servers' ``/metrics``."""
    tokens = [kv_tokens(text) for text in metrics]
    return {
        "tokens_per_s": probe.get("output_tokens_per_s") or 0.0,
        "ttft_p50_ms": (probe.get("ttft_ms") or {}).get("p50"),
        "ttft_p99_ms": (probe.get("ttft_ms") or {}).get("p99"),
        "requests": probe.get("requests"),
        "succeeded": probe.get("succeeded"),
        "kv_cache_tokens": sum(tokens) if tokens and None not in tokens else None,
    }


def _sound(result: dict | None) -> bool:
    return bool(result) and not result.get("failed") and result.get("succeeded") == result.get("requests")


def choose(layouts: list[dict], measured: dict, max_ttft_ms: float = 0) -> dict | None:
    """The layout to keep, with why (a decision: ``code`` and fields); None when none measured soundly.

    The highest throughput among the layouts whose TTFT p99 is at most ``max_ttft_ms``, or, when it
    is 0, at most twice the lowest TTFT p99 measured. When none meets an absolute bound, the lowest
    TTFT p99. A layout with a failed request or a failed start does not count.
    """
    sound = [c for c in layouts if _sound(measured.get(c["name"]))]
    if not sound:
        return None
    ttft = {c["name"]: measured[c["name"]]["ttft_p99_ms"] or 0.0 for c in sound}
    speed = {c["name"]: measured[c["name"]]["tokens_per_s"] for c in sound}
    bound = float(max_ttft_ms) if max_ttft_ms else 2 * min(ttft.values())
    meeting = [c for c in sound if ttft[c["name"]] <= bound]
    fields = {"bound_ms": round(bound, 1), "bound_from": "setting" if max_ttft_ms else "best"}
    if not meeting:
        kept = min(sound, key=lambda c: ttft[c["name"]])
        return {"code": "layout.none_in_bound", "layout": kept["name"], "ttft_p99_ms": ttft[kept["name"]], **fields}
    kept = max(meeting, key=lambda c: speed[c["name"]])
    others = [c for c in sound if c is not kept]
    decision = {"layout": kept["name"], "tokens_per_s": speed[kept["name"]], "ttft_p99_ms": ttft[kept["name"]], **fields}
    if not others:
        return {"code": "layout.only", **decision}
    other = max(others, key=lambda c: speed[c["name"]])
    return {
        "code": "layout.measured",
        **decision,
        "other": other["name"],
        "other_tokens_per_s": speed[other["name"]],
        "other_ttft_p99_ms": ttft[other["name"]],
    }


def table(layouts: list[dict], measured: dict, kept: str | None) -> list[str]:
    """The comparison as text rows: layout, TTFT p50 and p99, tokens/s, KV-cache tokens; ``*`` marks the kept one."""

    def number(value, digits=0):
        return "-" if value is None else f"{value:.{digits}f}"

    rows = [f"{'layout':<10} {'TTFT p50 ms':>11} {'TTFT p99 ms':>11} {'tok/s':>9} {'KV tokens':>10}"]
    for candidate in layouts:
        result = measured.get(candidate["name"]) or {}
        mark = "*" if candidate["name"] == kept else " "
        if result.get("failed"):
            rows.append(f"{candidate['name'] + mark:<10} did not start: {result['failed'][:80]}")
            continue
        if not result:
            rows.append(f"{candidate['name'] + mark:<10} not measured")
            continue
        failed = (result.get("requests") or 0) - (result.get("succeeded") or 0)
        p50, p99 = number(result.get("ttft_p50_ms"), 1), number(result.get("ttft_p99_ms"), 1)
        rows.append(
            f"{candidate['name'] + mark:<10} {p50:>11} {p99:>11} "
            f"{number(result.get('tokens_per_s'), 1):>9} {number(result.get('kv_cache_tokens')):>10}"
            + (f"  ({failed} requests failed)" if failed else "")
        )
    return rows


def outcome(layouts: list[dict], measured: dict, max_ttft_ms: float = 0) -> dict:
    """What a measurement decided: the layout kept (the first when none measured soundly), the decision, the table."""
    decision = choose(layouts, measured, max_ttft_ms) or {"code": "layout.none", "layout": layouts[0]["name"]}
    return {"chosen": decision["layout"], "decision": decision, "table": table(layouts, measured, decision["layout"])}
