# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Private: the drift watch: what the box reads now against what the last deployment recorded, as findings.

No Ansible imports and no I/O. The drift program on the box (roles/gpubox/files/gpubox-drift.py, run by a
systemd timer) reads the GPUs through NVML (``_gpu_inventory.collect``), ACS from each bridge's
configuration space (``_acs.sysfs_acs`` and ``judge_acs``), the IOMMU from /proc/cmdline
(``_acs.parse_cmdline``) and the image the vLLM containers run, and hands them to ``reading``; ``compare``
turns a recorded reading and the current one into findings (codes with fields, rendered by
``_words.say``), ``metrics`` into the Prometheus textfile. It reports; it never changes the box.
"""

from __future__ import annotations

# What a reading keeps of each GPU.
GPU_KEYS = ("index", "name", "uuid", "pci_bus_id", "pcie_gen_current", "pcie_gen_max", "pcie_width_current",
            "pcie_width_max", "performance_state")  # fmt: skip
# A generation below the link's best counts only under load: an idle GPU drops to Gen1 to save power.
LOADED_STATES = ("P0", "P1", "P2")


def reading(gpu: dict, acs: dict, iommu: dict, images: list[str], now: float) -> dict:
    """One reading of the box, in the shape ``compare`` takes (and the drift program records).

    ``gpu``: ``_gpu_inventory.collect``'s facts, each device optionally with ``performance_state`` (``P0``..);
    ``acs``: ``_acs.judge_acs``'s verdict; ``iommu``: ``_acs.parse_cmdline``'s; ``images``: the image ids the
    project's containers run.
    """
    return {
        "at": now,
        "fingerprint": gpu.get("fingerprint"),
        "driver_version": gpu.get("driver_version"),
        "gpus": [{key: device.get(key) for key in GPU_KEYS} for device in gpu.get("devices") or []],
        "acs": {"verdict": acs.get("verdict"), "redirecting": sorted(entry["bdf"] for entry in acs.get("redirecting") or [])},
        "iommu": {"mode": iommu.get("mode"), "enabled": iommu.get("enabled")},
        "images": sorted(set(images)),
    }


def baseline(reading_: dict) -> dict:
    """The part of a reading that stays while nothing drifts (no time, no load-dependent link generation)."""
    kept = {key: value for key, value in reading_.items() if key != "at"}
    kept["gpus"] = [
        {key: value for key, value in gpu.items() if key not in ("pcie_gen_current", "performance_state")}
        for gpu in reading_.get("gpus") or []
    ]
    return kept


def compare(recorded: dict, now: dict) -> list[dict]:
    """The differences that matter between the recorded reading and the current one; [] when none."""
    findings = []
    if recorded.get("fingerprint") != now.get("fingerprint"):
        findings.append({"code": "drift.gpus", "recorded": recorded.get("fingerprint"), "now": now.get("fingerprint")})
    if recorded.get("driver_version") != now.get("driver_version"):
        findings.append({"code": "drift.driver", "recorded": recorded.get("driver_version"), "now": now.get("driver_version")})
    before = {gpu["uuid"]: gpu for gpu in recorded.get("gpus") or []}
    for gpu in now.get("gpus") or []:
        findings += _link_findings(before.get(gpu["uuid"]), gpu)
    old_acs, new_acs = recorded.get("acs") or {}, now.get("acs") or {}
    added = sorted(set(new_acs.get("redirecting") or []) - set(old_acs.get("redirecting") or []))
    if added:
        findings.append({"code": "drift.acs_redirect", "bridges": added, "verdict": new_acs.get("verdict")})
    old_mode, new_mode = (recorded.get("iommu") or {}).get("mode"), (now.get("iommu") or {}).get("mode")
    if old_mode != new_mode:
        findings.append({"code": "drift.iommu", "recorded": old_mode, "now": new_mode})
    if recorded.get("images") and now.get("images") and set(now["images"]) - set(recorded["images"]):
        findings.append({"code": "drift.image", "recorded": recorded["images"], "now": now["images"]})
    return findings


def _link_findings(before: dict | None, gpu: dict) -> list[dict]:
    where = {"gpu": gpu.get("index"), "bus_id": gpu.get("pci_bus_id")}
    findings = []
    width, width_max = gpu.get("pcie_width_current"), gpu.get("pcie_width_max")
    old_width = (before or {}).get("pcie_width_current")
    if width and old_width and width < old_width:
        findings.append({"code": "drift.link_width", **where, "recorded": old_width, "now": width, "max": width_max})
    for key, code in (("pcie_gen_max", "drift.link_gen_max"), ("pcie_width_max", "drift.link_width_max")):
        old, new = (before or {}).get(key), gpu.get(key)
        if old and new and new < old:
            findings.append({"code": code, **where, "recorded": old, "now": new})
    gen, gen_max = gpu.get("pcie_gen_current"), gpu.get("pcie_gen_max")
    state = gpu.get("performance_state")
    if gen and gen_max and gen < gen_max and state in LOADED_STATES:
        findings.append({"code": "drift.link_gen_under_load", **where, "now": gen, "max": gen_max, "state": state})
    return findings


def metrics(findings: list[dict], now: dict) -> str:
    """The drift watch for Prometheus (node exporter's textfile collector): 1 per finding, by check and GPU."""
    lines = [
        "# HELP gpubox_drift 1 for each difference from what the last deployment recorded, by check (and GPU)",
        "# TYPE gpubox_drift gauge",
    ]
    for finding in findings:
        check = finding["code"].removeprefix("drift.")
        gpu = f',gpu="{finding["gpu"]}"' if finding.get("gpu") is not None else ""
        lines.append(f'gpubox_drift{{check="{check}"{gpu}}} 1')
    lines += [
        "# HELP gpubox_drift_findings Differences from what the last deployment recorded",
        "# TYPE gpubox_drift_findings gauge",
        f"gpubox_drift_findings {len(findings)}",
        "# HELP gpubox_drift_last_check_timestamp_seconds When the drift watch last read the box",
        "# TYPE gpubox_drift_last_check_timestamp_seconds gauge",
        f"gpubox_drift_last_check_timestamp_seconds {int(now.get('at') or 0)}",
    ]
    return "\n".join(lines) + "\n"
