# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Private: the closing summary of site.yml, in words: what was found, what was decided and why, the result.

Pure function, data in and lines out, no Ansible imports. Every part is optional, so
a run limited by tags (or a host without GPUs, a model or a proxy) still gets the
lines that apply to it.
"""

from __future__ import annotations

from collections import Counter

from ansible_collections.gpubox.inference.plugins.module_utils._fleet import fleet_lines
from ansible_collections.gpubox.inference.plugins.module_utils._preflight import VERDICT_WORDS
from ansible_collections.gpubox.inference.plugins.module_utils._words import STEPS

SETTINGS_SHOWN = (
    "--tensor-parallel-size",
    "--disable-custom-all-reduce",
    "--max-model-len",
    "NCCL_P2P_DISABLE",
    "NCCL_P2P_LEVEL",
)


def _gpu_lines(gpu: dict) -> list[str]:
    if not gpu:
        return []
    if not gpu.get("present"):
        return [f"GPUs: none ({gpu.get('reason') or 'not found'})"]
    names = Counter(device.get("name") or "GPU" for device in gpu.get("devices") or [])
    listed = ", ".join(f"{count} x {name}" for name, count in names.items()) or f"{gpu.get('count')} GPUs"
    if gpu.get("changed_since_stored"):
        state = f"CHANGED since the last deploy: {gpu.get('change_summary')}"
    elif gpu.get("fingerprint_stored"):
        state = "unchanged since the last deploy"
    else:
        state = "first deploy on this GPU set"
    return [f"GPUs: {listed} (driver {gpu.get('driver_version')}), fingerprint {str(gpu.get('fingerprint'))[:12]}; {state}"]


def _p2p_lines(p2p: dict) -> list[str]:
    return _pair_lines(p2p) + _host_link_lines(p2p)


def _host_link_lines(p2p: dict) -> list[str]:
    parts = []
    for index, link in sorted((p2p.get("host_links") or {}).items(), key=lambda item: int(item[0])):
        text = f"GPU{index} {link.get('status')}"
        if link.get("status") == "ok":
            text += f" to GPU {link['host_to_device_gbps']:.1f} GB/s, from GPU {link['device_to_host_gbps']:.1f} GB/s"
            if link.get("ratio_to_limit") is not None:
                text += f" ({link['ratio_to_limit']:.2f} of the link)"
        parts.append(text)
    return [f"Host links, {_how(p2p)}: " + "; ".join(parts)] if parts else []


def _how(p2p: dict) -> str:
    return "from the cache (measured earlier for these GPUs)" if p2p.get("cached") else p2p.get("source", "measured")


def _pair_lines(p2p: dict) -> list[str]:
    if not p2p or not p2p.get("pairs"):
        return []
    bandwidth = (p2p.get("matrices") or {}).get("unidirectional_p2p_enabled") or []
    parts = []
    for pair, result in sorted(p2p["pairs"].items()):
        i, j = (int(index) for index in pair.split("-"))
        value = bandwidth[i][j] if i < len(bandwidth) and j < len(bandwidth[i]) else None
        text = f"GPU{i}->GPU{j} {result.get('status')}"
        if value is not None and result.get("status") != "broken":
            text += f" {value:.1f} GB/s"
            if result.get("ratio_to_limit") is not None:
                text += f" ({result['ratio_to_limit']:.2f} of the link)"
        parts.append(text)
    return [f"P2P, {_how(p2p)}: " + "; ".join(parts)]


def _preflight_lines(preflight: dict) -> list[str]:
    if not preflight or "verdict" not in preflight:
        return []
    verdict = preflight["verdict"]
    line = f"Preflight: {VERDICT_WORDS.get(verdict, verdict.replace('_', ' '))}"
    if preflight.get("group"):
        line += f", tensor-parallel group {', '.join(preflight['group'])}"
    failures, warnings = preflight.get("failures") or [], preflight.get("warnings") or []
    if failures:
        line += f"; {len(failures)} failure(s): {failures[0]}"
    if warnings:
        line += f"; {len(warnings)} warning(s): {warnings[0]}"
    return [line]


def _vllm_lines(vllm: dict) -> list[str]:
    if not vllm:
        return []
    lines = [f"Model: {vllm.get('served_model_name')} ({vllm.get('model')}), tensor parallel {vllm.get('tensor_parallel_size')}"]
    reasons = vllm.get("reasons") or {}
    if (vllm.get("replicas") or 1) > 1:
        lines[0] += f", {vllm['replicas']} replicas on {', '.join(vllm.get('upstreams') or [])}"
    cluster = vllm.get("cluster") or {}
    if cluster:
        lines.append(
            f"Ray cluster: head {cluster.get('head')}, workers {', '.join(cluster.get('workers') or [])}; tensor parallel "
            f"{cluster.get('tensor_parallel_size')} within each box, pipeline parallel {cluster.get('pipeline_parallel_size')} "
            "across the boxes"
        )
    if "layout" in reasons:
        lines.append(f"Layout: {reasons['layout']}")
    env = vllm.get("env") or {}
    decided = []
    for key in SETTINGS_SHOWN:
        if key in reasons:
            value = env.get(key) if key in env else ""
            decided.append(f"{key}{'=' + value if value else ''} ({reasons[key]})")
    if decided:
        lines.append("Decided: " + "; ".join(decided))
    gate = vllm.get("gate") or {}
    if gate.get("words"):
        lines.append(f"Correctness gate: {gate['words']}")
        for name, words in STEPS.items():
            result = (gate.get("results") or {}).get(name)
            if result and not result.get("passed"):
                lines.append(f"Correctness gate, {words}: failed ({'; '.join(result.get('findings') or []) or 'no reason kept'})")
    if vllm.get("swapped"):
        # How P2P was obtained is the P2P line's fact (measured now, or cached by an earlier run for these GPUs).
        lines.append("GPU swap handled: vLLM's P2P cache cleared, the vLLM container recreated")
    lines += [f"Warning: {warning}" for warning in vllm.get("warnings") or []]
    return lines


def _smoke_lines(smoke: dict) -> list[str]:
    if not smoke or "succeeded" not in smoke:
        return []
    ttft = (smoke.get("ttft_ms") or {}).get("p50")
    rate = smoke.get("output_tokens_per_s")
    return [
        f"Smoke test: {smoke['succeeded']}/{smoke['requests']} streams OK, "
        f"TTFT p50 {ttft:.1f} ms, {rate:.0f} tok/s, {smoke['buffering']['verdict']}"
        if ttft is not None and rate is not None
        else f"Smoke test: {smoke['succeeded']}/{smoke['requests']} streams OK"
    ]


def _power_lines(power: dict) -> list[str]:
    gpus = power.get("gpus") or []
    if not gpus:
        return []
    limits = ", ".join(
        f"GPU{gpu['index']} {gpu['target_w'] if gpu.get('target_w') is not None else gpu.get('limit_w'):g} W" for gpu in gpus
    )
    persistence = "on" if all(gpu.get("persistence_target") for gpu in gpus) else "as it was"
    return [f"GPU power: {limits}, persistence mode {persistence}; set again at every boot (gpubox-gpu-power.service)"]


def _watch_lines(vllm: dict, drift: dict) -> list[str]:
    watchdog = (vllm or {}).get("watchdog") or {}
    parts = []
    if watchdog:
        parts.append(
            f"the engine watchdog probes vLLM every {watchdog['interval']} s and recreates it when its engine dies or hangs "
            "(journalctl -u gpubox-vllm-watchdog)"
        )
    if drift.get("interval"):
        parts.append(
            f"the drift watch compares the box with this deployment every {drift['interval']} s (journalctl -u gpubox-drift)"
        )
    return [f"Watched: {'; '.join(parts)}; metrics in /var/lib/gpubox/metrics"] if parts else []


def _monitoring_lines(monitoring: dict) -> list[str]:
    if not monitoring.get("prometheus"):
        return []
    scraped = {"vllm": "vLLM", "nginx": "Nginx", "node": "the box"}
    jobs = [scraped[job] for job in monitoring.get("jobs") or [] if job in scraped]
    if monitoring.get("gpus"):
        jobs.append("the GPUs (gpubox-gpu-metrics)")
    where = ", ".join(monitoring.get("alertmanagers") or []) or f"{monitoring['prometheus']}/alerts"
    return [
        f"Monitoring: Prometheus at {monitoring['prometheus']} reads {', '.join(jobs)} every {monitoring['interval']} s; "
        f"alerts at {where}; Grafana dashboard {monitoring['dashboard']}"
    ]


def _gateway_lines(gateway: dict) -> list[str]:
    if not gateway.get("url"):
        return []
    lines = [f"Gateway: {gateway['url']} (OpenAI-compatible; API key required), in front of the fleet"]
    return lines + fleet_lines(gateway, gateway.get("answers"))


def summary(host: str, parts: dict) -> list[str]:
    """Lines for one host. ``parts``: gpu, gpu_p2p, preflight, vllm, endpoint, smoke, power, drift, monitoring,
    gateway (each optional)."""
    lines = [f"{host}:"]
    lines += _gpu_lines(parts.get("gpu") or {})
    lines += _preflight_lines(parts.get("preflight") or {})
    lines += _p2p_lines(parts.get("gpu_p2p") or {})
    lines += _vllm_lines(parts.get("vllm") or {})
    endpoint = parts.get("endpoint") or {}
    if endpoint.get("url"):
        lines.append(f"Endpoint: {endpoint['url']} (OpenAI-compatible; {endpoint.get('auth', 'API key required')})")
    lines += _smoke_lines(parts.get("smoke") or {})
    lines += _power_lines(parts.get("power") or {})
    lines += _watch_lines(parts.get("vllm") or {}, parts.get("drift") or {})
    lines += _monitoring_lines(parts.get("monitoring") or {})
    lines += _gateway_lines(parts.get("gateway") or {})
    if len(lines) == 1:
        lines.append("nothing deployed in this run (check the tags and vllm_model / nginx_proxy_api_keys)")
    return lines
