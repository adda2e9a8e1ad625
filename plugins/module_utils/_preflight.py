# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Private: combine topology, PCIe platform and ACS/IOMMU findings into one verdict per GPU pair, and render it.

Pure functions, data in and data or text out, no Ansible imports. The preflight
role calls them through the ``gpubox.inference.preflight_*`` filters.

Per GPU pair the verdict is one of:
- ``fit``: fit for tensor parallelism (NVLink or a PCIe switch, P2P supported, nothing redirected);
- ``slow``: works but slow (host bridge, NUMA hop, chipset, narrow or downtrained link, no P2P);
- ``hang``: will hang or corrupt as it stands (ACS redirects the pair's P2P traffic while the
  driver reports P2P as supported, so NCCL uses it).
"""

from __future__ import annotations

from html import escape

from ansible_collections.gpubox.inference.plugins.module_utils._topology import is_rdma, link_class
from ansible_collections.gpubox.inference.plugins.module_utils._words import explain, say

VERDICT_WORDS = {
    "fit": "fit for tensor parallelism",
    "slow": "works but slow",
    "hang": "will hang or corrupt",
}
LINK_COLOURS = {
    "NVLINK": "#2e7d32",
    "PIX": "#1565c0",
    "PXB": "#1565c0",
    "PHB": "#ef6c00",
    "NODE": "#ef6c00",
    "SYS": "#c62828",
    "UNKNOWN": "#616161",
}


def _gpu_bus_ids(topology: dict, platform: dict) -> dict[str, str | None]:
    """GPUn -> bus id. nvidia-smi numbers GPUs in PCI bus order, as the platform list is sorted."""
    buses = sorted(g["bus_id"] for g in platform.get("gpus", []))
    names = [g["name"] for g in topology.get("gpus", [])]
    if len(buses) != len(names):
        return dict.fromkeys(names)
    return dict(zip(names, buses, strict=True))


def combine(topology: dict, platform: dict, acs: dict, iommu: dict, policy: dict) -> dict:
    """One verdict per GPU pair, the decisions later roles act on, and what fails or warns by policy.

    ``topology`` is gpu_topology_info's result, ``platform`` pcie_platform_info's,
    ``acs`` iommu_acs_info's ``acs_verdict``, ``iommu`` its ``iommu``. ``policy``
    has ``fail_on_chipset_gpu``, ``fail_on_downtrained``, ``fail_on_acs_redirect``
    (booleans) and ``tensor_parallel_size`` (0 for all GPUs).
    """
    bus_of = _gpu_bus_ids(topology, platform)
    by_bus = {g["bus_id"]: g for g in platform.get("gpus", [])}
    names = [g["name"] for g in topology.get("gpus", [])]
    size = policy.get("tensor_parallel_size") or len(names)
    group = names[:size]
    p2p = topology.get("p2p") or {}
    acs_pairs = {tuple(p["gpus"]): p for p in acs.get("gpu_pairs", [])}
    global_redirect = acs.get("verdict") == "redirected" and not acs_pairs

    pairs = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            causes = []
            verdict = "fit"
            code = topology["links_normalized"][a][b]
            pair_class = link_class(code)
            if pair_class not in ("NVLINK", "PIX", "PXB"):
                verdict = "slow"
                causes.append({"code": "cause.link", "link": code})
            status = [p2p.get(a, {}).get(b), p2p.get(b, {}).get(a)]
            bad_status = [s for s in status if s and s != "OK"]
            if bad_status:
                verdict = "slow"
                causes.append({"code": "cause.p2p_status", "status": bad_status[0]})
            for name in (a, b):
                gpu = by_bus.get(bus_of.get(name) or "", {})
                if gpu.get("behind_chipset"):
                    verdict = "slow" if verdict == "fit" else verdict
                    causes.append({"code": "cause.chipset", "gpu": name})
                if gpu.get("downtrained"):
                    verdict = "slow" if verdict == "fit" else verdict
                    causes.append({"code": "cause.downtrained", "gpu": name, "note": gpu.get("link_note")})
            pair_acs = acs_pairs.get(tuple(sorted((bus_of.get(a) or "", bus_of.get(b) or ""))))
            redirecting = (pair_acs or {}).get("redirecting") or (
                [r["bdf"] or "a bridge" for r in acs.get("redirecting", [])] if global_redirect else []
            )
            if redirecting and not bad_status and pair_class != "NVLINK":
                verdict = "hang"
                causes.append({"code": "cause.acs_redirect", "bridge": redirecting[0]})
            pairs.append({"gpus": [a, b], "link": code, "verdict": verdict, "causes": causes})

    report = {
        "gpu_count": len(names),
        "group": group,
        "pairs": pairs,
        "iommu_translated": iommu.get("mode") == "translated",
        # NCCL may use these for its network transport (the vLLM plan reads it).
        "rdma_nics": [n.get("device") for n in topology.get("nics", []) if is_rdma(n.get("device"))],
        "problems": _problems(pairs, group, bus_of, by_bus, policy),
    }
    return {**report, **for_group(report, group)}


def for_group(report: dict, names: list[str]) -> dict:
    """What the report says for the GPUs ``names`` only (the group that will be deployed).

    ``verdict`` (the worst pair inside, or V(single_gpu)), ``decisions`` (C(nccl_p2p_disable) with its
    C(cause), the C(pairs) it comes from, the redirecting C(bridge), C(iommu_translated)), and the policy's
    ``failures`` and ``warnings`` for those GPUs, in words.
    """
    members = set(names)
    pairs = _pairs_in(report, members)
    hanging = [p for p in pairs if p["verdict"] == "hang"]
    decisions = {"nccl_p2p_disable": False, "cause": None, "pairs": [], "bridge": None, "iommu_translated": False}
    if hanging:
        bridge = next(c["bridge"] for c in hanging[0]["causes"] if c["code"] == "cause.acs_redirect")
        decisions = {
            "nccl_p2p_disable": True,
            "cause": "acs_redirect",
            "pairs": [p["gpus"] for p in hanging],
            "bridge": bridge,
            "iommu_translated": bool(report.get("iommu_translated")),
        }
    problems = [
        p for p in report["problems"] if set(p["gpus"]) <= members and (p["code"] != "problem.chipset_gpu" or len(members) > 1)
    ]
    worst = max((p["verdict"] for p in pairs), key=list(VERDICT_WORDS).index, default=None)
    return {
        "verdict": worst or "single_gpu",
        "decisions": decisions,
        "failures": [_problem_words(p) for p in problems if p["fatal"]],
        "warnings": [_problem_words(p) for p in problems if not p["fatal"]],
    }


def cause_words(causes: list[dict]) -> list[str]:
    return [explain(c) for c in causes]


def decision_words(decisions: dict) -> list[str]:
    """The preflight's decision in words, for the report and the play's output."""
    if not decisions.get("nccl_p2p_disable"):
        return []
    words = [say("decision.acs_redirect", bridge=decisions["bridge"])]
    if decisions.get("iommu_translated"):
        words.append(say("decision.iommu_translated"))
    return words


def _problem_words(problem: dict) -> str:
    fields = {k: v for k, v in problem.items() if k not in ("code", "fatal", "gpus")}
    if problem["code"] == "problem.hang_pair":
        fields["causes"] = "; ".join(cause_words(fields["causes"]))
    return say(problem["code"], **fields)


def _problems(pairs, group, bus_of, by_bus, policy) -> list[dict]:
    """What the policy judges in the group: per GPU and per hanging pair, fatal (a failure) or not (a warning)."""
    problems: list[dict] = []
    tp = len(group) > 1
    for name in group:
        gpu = by_bus.get(bus_of.get(name) or "", {})
        if gpu.get("behind_chipset") and tp:
            problems.append(
                {
                    "code": "problem.chipset_gpu",
                    "gpus": [name],
                    "gpu": name,
                    "bus_id": gpu["bus_id"],
                    "fatal": bool(policy.get("fail_on_chipset_gpu")),
                }
            )
        if gpu.get("downtrained"):
            problems.append(
                {
                    "code": "problem.downtrained",
                    "gpus": [name],
                    "gpu": name,
                    "bus_id": gpu["bus_id"],
                    "note": gpu.get("link_note"),
                    "fatal": bool(policy.get("fail_on_downtrained")),
                }
            )
        elif gpu.get("downtrained") is None and gpu.get("link_source") == "lspci":
            # A saved lspci without its load state: a Gen1 link may be power saving or a fault; never fatal.
            problems.append(
                {
                    "code": "problem.link_load_unknown",
                    "gpus": [name],
                    "gpu": name,
                    "bus_id": gpu["bus_id"],
                    "note": gpu.get("link_note"),
                    "fatal": False,
                }
            )
    for pair in pairs:
        if pair["verdict"] == "hang" and set(pair["gpus"]) <= set(group):
            problems.append(
                {
                    "code": "problem.hang_pair",
                    "gpus": pair["gpus"],
                    "pair": "-".join(pair["gpus"]),
                    "causes": pair["causes"],
                    "fatal": bool(policy.get("fail_on_acs_redirect")),
                }
            )
    return problems


def _pairs_in(report: dict, members: set[str]) -> list[dict]:
    """The report's pairs whose two GPUs are both in ``members``."""
    return [p for p in report["pairs"] if set(p["gpus"]) <= members]


def _shown(report: dict) -> list[dict]:
    """The pairs inside the judged group."""
    return _pairs_in(report, set(report.get("group") or []))


def _link(gpu: dict) -> str:
    gen, width = gpu.get("pcie_gen_current"), gpu.get("pcie_width_current")
    return " ".join(([f"Gen{gen}"] if gen else []) + ([f"x{width}"] if width else [])) or "link unknown"


def _attached_to(gpu: dict) -> str:
    """Where a GPU's link goes up: the chipset, a CPU root port, or straight onto the root bus (a VM's passthrough)."""
    if gpu.get("behind_chipset"):
        return "the chipset"
    if gpu.get("root_port"):
        return f"CPU root port {gpu['root_port']}"
    return "the root bus, no PCIe bridge above it (as in a virtual machine)"


def render_lines(report: dict, topology: dict, platform: dict, iommu: dict, acs: dict) -> list[str]:
    """The short human report printed at the end of the play, one line per fact."""
    lines = []
    if not topology.get("gpus"):
        return ["No NVIDIA GPU found on this host: nothing to check."]
    cpu = platform.get("cpu") or {}
    lanes = f", {cpu['pcie_lanes']} PCIe lanes per socket" if cpu.get("pcie_lanes") else ""
    lines.append(f"CPU: {cpu.get('model') or 'unknown'} ({cpu.get('class') or 'unknown class'}{lanes})")
    names = [g["name"] for g in topology["gpus"]]
    links = "  ".join(f"{a}-{b}={topology['links'][a][b]}" for i, a in enumerate(names) for b in names[i + 1 :])
    lines.append("Matrix: " + (links or "one GPU, no pair"))
    bus_of = _gpu_bus_ids(topology, platform)
    by_bus = {g["bus_id"]: g for g in platform.get("gpus", [])}
    for name in names:
        gpu = by_bus.get(bus_of.get(name) or "", {})
        if gpu:
            lines.append(f"{name} {gpu['bus_id']}: {_link(gpu)} via {_attached_to(gpu)}; {gpu.get('link_note')}")
    flags = ", ".join(iommu.get("flags") or []) or "no IOMMU flags"
    lines.append(
        f"IOMMU: {iommu.get('mode', 'unknown')} ({flags}); ACS: {acs.get('verdict', 'unknown')}: {acs.get('reason', '')}"
    )
    for pair in _shown(report):
        why = f" ({'; '.join(cause_words(pair['causes']))})" if pair["causes"] else ""
        lines.append(f"{pair['gpus'][0]}-{pair['gpus'][1]} {pair['link']}: {VERDICT_WORDS[pair['verdict']]}{why}")
    decided = decision_words(report["decisions"]) or [say("decision.p2p_on")]
    lines += [f"Decision: {reason}" for reason in decided]
    lines += [f"FAIL: {m}" for m in report["failures"]] + [f"WARN: {m}" for m in report["warnings"]]
    return lines


def render_markdown(host: str, report: dict, topology: dict, platform: dict, iommu: dict, acs: dict) -> str:
    """The report as a Markdown page, with the diagram beside it as preflight.svg."""
    out = [f"# Preflight: {host}", ""]
    if not topology.get("gpus"):
        return "\n".join([*out, "No NVIDIA GPU found on this host: nothing to check.", ""])
    out += [
        f"**Verdict:** {VERDICT_WORDS.get(report['verdict'], report['verdict'])}",
        "",
        "![topology](preflight.svg)",
        "",
    ]
    names = [g["name"] for g in topology["gpus"]] + [n["name"] for n in topology.get("nics", [])]
    out += ["## Topology matrix", "", "| | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for row in names:
        cells = ["X" if row == col else topology["links"].get(row, {}).get(col, "") for col in names]
        out.append(f"| {row} | " + " | ".join(cells) + " |")
    out += ["", "## GPUs", "", "| GPU | bus id | link | attached to | note |", "|---|---|---|---|---|"]
    bus_of = _gpu_bus_ids(topology, platform)
    by_bus = {g["bus_id"]: g for g in platform.get("gpus", [])}
    for gpu_entry in topology["gpus"]:
        gpu = by_bus.get(bus_of.get(gpu_entry["name"]) or "", {})
        where = _attached_to(gpu) if gpu else "unknown"
        link = _link(gpu) if gpu else "unknown"
        out.append(f"| {gpu_entry['name']} | {gpu.get('bus_id', '')} | {link} | {where} | {gpu.get('link_note', '')} |")
    out += ["", "## Pairs", "", "| pair | link | verdict | why |", "|---|---|---|---|"]
    for pair in _shown(report):
        out.append(
            f"| {pair['gpus'][0]}-{pair['gpus'][1]} | {pair['link']} | {VERDICT_WORDS[pair['verdict']]} | "
            f"{'; '.join(cause_words(pair['causes']))} |"
        )
    out += [
        "",
        "## IOMMU and ACS",
        "",
        f"- IOMMU: {iommu.get('mode', 'unknown')} ({', '.join(iommu.get('flags') or []) or 'no flags'})",
    ]
    out += [f"- ACS: {acs.get('verdict', 'unknown')}: {acs.get('reason', '')}", "", "## What the later roles do", ""]
    out += [f"- {r}" for r in decision_words(report["decisions"])] or [f"- {say('decision.p2p_on')}."]
    if report["failures"] or report["warnings"]:
        out += (
            ["", "## Problems", ""] + [f"- FAIL: {m}" for m in report["failures"]] + [f"- WARN: {m}" for m in report["warnings"]]
        )
    return "\n".join([*out, ""])


def render_svg(topology: dict, platform: dict) -> str:
    """A diagram: NUMA nodes, root ports, GPUs and NICs, GPU-GPU links coloured by class."""
    gpus = topology.get("gpus", [])
    nics = topology.get("nics", [])
    bus_of = _gpu_bus_ids(topology, platform)
    by_bus = {g["bus_id"]: g for g in platform.get("gpus", [])}
    box_w, box_h, gap = 120, 44, 40
    width = max(max(len(gpus), len(nics), 1) * (box_w + gap) + gap, 2 * gap + 4 * 110)
    gpu_y = 150
    bottom = gpu_y + box_h + 30 + 18 * max(len(gpus) - 1, 0)
    nic_y = bottom + 20
    if nics:
        bottom = nic_y + box_h
    legend_y = bottom + 30
    height = legend_y + 16
    x_of = {g["name"]: gap + i * (box_w + gap) for i, g in enumerate(gpus)}
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        'font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
    ]
    # NUMA nodes: one shaded band per NUMA affinity value, around its GPUs.
    numa: dict[str, list[str]] = {}
    for g in gpus:
        numa.setdefault(g.get("numa_affinity") or "?", []).append(g["name"])
    for node, members in numa.items():
        left = min(x_of[m] for m in members) - 12
        right = max(x_of[m] for m in members) + box_w + 12
        parts.append(
            f'<rect x="{left}" y="20" width="{right - left}" height="{gpu_y + box_h - 8}" rx="8" fill="#f3f3f3" '
            f'stroke="#bbbbbb"/><text x="{left + 8}" y="36">NUMA {escape(node)}</text>'
        )
    # Each GPU's way up: its CPU root port, and between them the chipset or a PCIe switch.
    for g in gpus:
        info = by_bus.get(bus_of.get(g["name"]) or "", {})
        x, middle = x_of[g["name"]], x_of[g["name"]] + box_w / 2
        parts.append(f'<rect x="{x}" y="48" width="{box_w}" height="26" rx="4" fill="#e0e0e0" stroke="#757575"/>')
        parts.append(f'<text x="{middle}" y="66" text-anchor="middle">{escape(info.get("root_port") or "root port ?")}</text>')
        parts.append(f'<line x1="{middle}" y1="74" x2="{middle}" y2="{gpu_y}" stroke="#757575"/>')
        bridges = len(info.get("bridges") or [])
        if info.get("behind_chipset") or bridges > 1:
            label, fill = ("chipset", "#ffe0b2") if info.get("behind_chipset") else ("PCIe switch", "#fff9c4")
            parts.append(f'<rect x="{x + 10}" y="96" width="{box_w - 20}" height="26" rx="4" fill="{fill}" stroke="#757575"/>')
            parts.append(f'<text x="{middle}" y="114" text-anchor="middle">{escape(label)}</text>')
    # GPU-GPU links as arcs below the GPUs.
    names = [g["name"] for g in gpus]
    for i, a in enumerate(names):
        for j, b in enumerate(names[i + 1 :], start=i + 1):
            code = topology["links"][a][b]
            colour = LINK_COLOURS[link_class(code)]
            x1, x2 = x_of[a] + box_w / 2, x_of[b] + box_w / 2
            depth = gpu_y + box_h + 18 * (j - i)
            parts.append(
                f'<path d="M {x1} {gpu_y + box_h} C {x1} {depth + 20}, {x2} {depth + 20}, {x2} {gpu_y + box_h}" '
                f'fill="none" stroke="{colour}" stroke-width="2">'
                f"<title>{escape(a)}-{escape(b)} {escape(code)}</title></path>"
            )
            parts.append(f'<text x="{(x1 + x2) / 2}" y="{depth + 12}" text-anchor="middle" fill="{colour}">{escape(code)}</text>')
    for g in gpus:
        x = x_of[g["name"]]
        info = by_bus.get(bus_of.get(g["name"]) or "", {})
        link = f"Gen{info.get('pcie_gen_current')} x{info.get('pcie_width_current')}" if info else ""
        stroke = "#c62828" if info.get("downtrained") else "#2e7d32"
        parts.append(
            f'<rect x="{x}" y="{gpu_y}" width="{box_w}" height="{box_h}" rx="6" fill="#e8f5e9" '
            f'stroke="{stroke}" stroke-width="2"/>'
        )
        parts.append(
            f'<text x="{x + box_w / 2}" y="{gpu_y + 18}" text-anchor="middle" font-weight="bold">{escape(g["name"])}</text>'
        )
        parts.append(f'<text x="{x + box_w / 2}" y="{gpu_y + 34}" text-anchor="middle">{escape(link)}</text>')
    for i, n in enumerate(nics):
        x = gap + i * (box_w + gap)
        label = n["device"] or n["name"]
        parts.append(f'<rect x="{x}" y="{nic_y}" width="{box_w}" height="{box_h}" rx="6" fill="#e3f2fd" stroke="#1565c0"/>')
        parts.append(f'<text x="{x + box_w / 2}" y="{nic_y + 26}" text-anchor="middle">{escape(label)}</text>')
    for k, (name, colour) in enumerate(
        [("NVLink", "#2e7d32"), ("PIX/PXB", "#1565c0"), ("PHB/NODE", "#ef6c00"), ("SYS", "#c62828")]
    ):
        parts.append(
            f'<line x1="{gap + k * 110}" y1="{legend_y}" x2="{gap + k * 110 + 24}" y2="{legend_y}" '
            f'stroke="{colour}" stroke-width="3"/>'
        )
        parts.append(f'<text x="{gap + k * 110 + 30}" y="{legend_y + 4}">{name}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def build(host: str, topology: dict, platform: dict, iommu: dict, acs: dict, policy: dict) -> dict:
    """Everything the preflight role shows and keeps: the combined report, its lines, Markdown and SVG."""
    if not topology.get("gpus"):
        report = {"gpu_count": 0, "group": [], "pairs": [], "verdict": "no_gpu", "failures": [], "warnings": []}
        report.update(problems=[], rdma_nics=[], iommu_translated=False)
        report["decisions"] = {"nccl_p2p_disable": False, "cause": None, "pairs": [], "bridge": None, "iommu_translated": False}
    else:
        report = combine(topology, platform, acs, iommu, policy)
    return {
        **report,
        "lines": render_lines(report, topology, platform, iommu, acs),
        "markdown": render_markdown(host, report, topology, platform, iommu, acs),
        "svg": render_svg(topology, platform) if topology.get("gpus") else "",
    }
