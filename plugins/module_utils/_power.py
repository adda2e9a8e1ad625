# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Private: GPU persistence mode and power limits: the setting read, checked against each card, applied; the sweep.

No Ansible imports. ``limit`` and ``plan`` are pure (the setting and each GPU's NVML constraints in, the
watts per GPU or the refusals out); ``read`` and ``apply`` take the NVML binding (nvidia-ml-py's ``pynvml``
module) as an argument, as ``_gpu_inventory.collect`` does, so the gpu_power module and the boot unit's
program (roles/gpubox/files/gpubox-gpu-power.py) run the same steps and tests hand them a stand-in.
``sweep_steps`` and ``sweep`` are the power sweep's (playbooks/power.yml): the limits to try, and the
tokens per joule at each with the knee recommended.
"""

from __future__ import annotations

import contextlib
import re
import time

from ansible_collections.gpubox.inference.plugins.module_utils._gpu_inventory import optional, text

SETTING = "gpubox_gpu_power_limit_w"
_LIMIT_RE = re.compile(r"^\s*(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>%|w|W)?\s*$")


def limit(value) -> tuple[dict | None, str | None]:
    """``gpubox_gpu_power_limit_w`` -> ``({"watts": W} | {"share": 0.85} | None, error)``.

    Watts as a number (``290``, ``"290"``, ``"290W"``), or a share of each card's default limit (``"85%"``);
    empty or null leaves the limits as they are.
    """
    if value is None or value == "":
        return None, None
    match = _LIMIT_RE.match(str(value)) if not isinstance(value, bool) else None
    if not match:
        return None, (f"{SETTING}={value!r} must be watts (290, or '290W') or a share of each card's default limit ('85%')")
    number = float(match.group("number"))
    if match.group("unit") == "%":
        if not 0 < number <= 100:
            return None, f"{SETTING}={value!r}: a share of the default limit must be above 0% and at most 100%"
        return {"share": number / 100}, None
    if number <= 0:
        return None, f"{SETTING}={value!r} must be above 0 W"
    return {"watts": number}, None


def plan(setting, persistence: bool, gpus: list[dict]) -> dict:
    """What to set on each GPU, or why not: ``{"gpus": [...], "errors": [...]}``.

    ``gpus``: ``read``'s entries (index, name, uuid, persistence, and the limits in W: ``limit_w``,
    ``default_w``, ``min_w``, ``max_w``; None where NVML does not say). Each entry comes back with
    ``target_w`` (None: leave the limit), ``persistence_target`` and ``changes`` (the fields that differ).
    A limit outside a card's NVML constraints is refused with both constraints named; nothing is set
    when any is refused.
    """
    wanted, error = limit(setting)
    errors = [error] if error else []
    out = []
    for gpu in gpus:
        entry = {**gpu, "target_w": None, "persistence_target": bool(persistence) or bool(gpu.get("persistence"))}
        if wanted and not error:
            entry["target_w"], problem = _target(wanted, gpu, setting)
            if problem:
                errors.append(problem)
        changes = []
        if entry["target_w"] is not None and entry["target_w"] != gpu.get("limit_w"):
            changes.append("power_limit")
        if entry["persistence_target"] and not gpu.get("persistence"):
            changes.append("persistence")
        entry["changes"] = changes
        out.append(entry)
    return {"gpus": out, "errors": errors}


def _target(wanted: dict, gpu: dict, setting) -> tuple[float | None, str | None]:
    name = f"GPU{gpu['index']} ({gpu.get('name')})"
    low, high = gpu.get("min_w"), gpu.get("max_w")
    if "share" in wanted:
        if gpu.get("default_w") is None:
            return None, f"{SETTING}={setting!r}: {name} does not report its default power limit, so set watts instead"
        watts = round(gpu["default_w"] * wanted["share"])
        how = f"{wanted['share'] * 100:g}% of its default {gpu['default_w']:g} W is {watts:g} W,"
    else:
        watts = round(wanted["watts"])
        how = f"{watts:g} W is"
    if low is None or high is None:
        return None, f"{SETTING}={setting!r}: {name} does not report its power limit constraints (NVML), so none is set"
    if not low <= watts <= high:
        return None, f"{SETTING}={setting!r}: {how} outside the power limits of {name}, {low:g} W to {high:g} W (NVML)"
    return float(watts), None


# ------------------------------------------------------------ NVML (the binding is an argument)


def _watts(milliwatts) -> float | None:
    return milliwatts / 1000 if milliwatts is not None else None


def read(nvml) -> list[dict]:
    """Each GPU's persistence mode, power limits (W), draw (W) and energy counter (mJ) through NVML."""
    nvml.nvmlInit()
    try:
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            constraints = optional(nvml, "nvmlDeviceGetPowerManagementLimitConstraints", handle)
            gpus.append(
                {
                    "index": index,
                    "name": text(nvml.nvmlDeviceGetName(handle)),
                    "uuid": text(nvml.nvmlDeviceGetUUID(handle)),
                    "persistence": optional(nvml, "nvmlDeviceGetPersistenceMode", handle) == 1,
                    "limit_w": _watts(optional(nvml, "nvmlDeviceGetPowerManagementLimit", handle)),
                    "default_w": _watts(optional(nvml, "nvmlDeviceGetPowerManagementDefaultLimit", handle)),
                    "min_w": _watts(constraints[0]) if constraints else None,
                    "max_w": _watts(constraints[1]) if constraints else None,
                    "power_w": _watts(optional(nvml, "nvmlDeviceGetPowerUsage", handle)),
                    "energy_mj": optional(nvml, "nvmlDeviceGetTotalEnergyConsumption", handle),
                    "read_at": time.time(),
                }
            )
        return gpus
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()


def apply(nvml, planned: list[dict]) -> list[str]:
    """Set what ``plan`` found different; the errors NVML raised, in words (empty when all was set)."""
    errors = []
    nvml.nvmlInit()
    try:
        for gpu in planned:
            handle = nvml.nvmlDeviceGetHandleByIndex(gpu["index"])
            try:
                if "persistence" in gpu["changes"]:
                    nvml.nvmlDeviceSetPersistenceMode(handle, 1)
                if "power_limit" in gpu["changes"]:
                    nvml.nvmlDeviceSetPowerManagementLimit(handle, int(gpu["target_w"] * 1000))
            except nvml.NVMLError as exc:
                errors.append(f"GPU{gpu['index']} ({gpu.get('name')}): NVML refused the setting: {exc} (run as root?)")
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()
    return errors


# ------------------------------------------------------------ the sweep (playbooks/power.yml)


def sweep_steps(gpus: list[dict], steps: int) -> list[int]:
    """``steps`` limits (W) from the lowest default limit down to the highest minimum, every GPU can take each."""
    top = min((g["default_w"] for g in gpus if g.get("default_w")), default=None)
    bottom = max((g["min_w"] for g in gpus if g.get("min_w")), default=None)
    if top is None or bottom is None or steps < 2 or bottom >= top:
        return [int(top)] if top else []
    return [round(top - (top - bottom) * i / (steps - 1)) for i in range(steps)]


def point(limit_w: float, before: list[dict], after: list[dict], probe: dict) -> dict:
    """One sweep step from two ``read``s around an ``llm_stream_probe`` run.

    ``before`` and ``after`` carry each GPU's ``energy_mj`` and the read's ``read_at`` (epoch seconds, on every
    entry); the energy of all GPUs between the reads is scaled to the probe's own ``wall_s`` (the reads frame the
    probe with a second or so of module start-up at the same draw).
    """
    energies = [(b.get("energy_mj"), a.get("energy_mj")) for b, a in zip(before, after, strict=False)]
    span = (after[0].get("read_at") or 0) - (before[0].get("read_at") or 0) if before and after else 0
    joules = None
    if energies and all(b is not None and a is not None for b, a in energies) and span > 0:
        joules = sum(a - b for b, a in energies) / 1000 * min(1.0, probe.get("wall_s", 0) / span)
    return {
        "limit_w": float(limit_w),
        "tokens": probe.get("output_tokens", 0),
        "seconds": probe.get("wall_s", 0),
        "joules": joules,
        "failed": probe.get("requests", 0) - probe.get("succeeded", 0),
    }


def sweep(points: list[dict], keep: float) -> dict:
    """Tokens per joule at each limit, and the knee: the most tokens per joule that keeps ``keep`` of the best speed.

    ``points``: ``limit_w``, ``tokens`` (output tokens), ``seconds``, ``joules`` (all GPUs, from NVML's energy
    counters) and ``failed`` (requests that did not complete). A point with failures or no energy reading
    does not count.
    """
    rows = []
    for point in points:
        sound = not point.get("failed") and point.get("joules") and point.get("seconds")
        tokens_per_s = point["tokens"] / point["seconds"] if point.get("seconds") else None
        rows.append(
            {
                **point,
                "tokens_per_s": tokens_per_s,
                "watts": point["joules"] / point["seconds"] if sound else None,
                "tokens_per_joule": point["tokens"] / point["joules"] if sound else None,
                "sound": bool(sound),
            }
        )
    counted = [r for r in rows if r["sound"]]
    if not counted:
        return {"rows": rows, "knee": None, "code": "power.none"}
    fastest = max(counted, key=lambda r: r["tokens_per_s"])
    for row in rows:
        row["speed_share"] = row["tokens_per_s"] / fastest["tokens_per_s"] if row["sound"] and fastest["tokens_per_s"] else None
    kept = [r for r in counted if r["speed_share"] >= keep]
    knee = max(kept, key=lambda r: (r["tokens_per_joule"], -r["limit_w"]))
    return {
        "rows": rows,
        "knee": knee["limit_w"],
        "code": "power.knee",
        "fields": {
            "limit_w": knee["limit_w"],
            "speed_share": knee["speed_share"],
            "tokens_per_joule": knee["tokens_per_joule"],
            "fastest_w": fastest["limit_w"],
            "fastest_tokens_per_joule": fastest["tokens_per_joule"],
            "watts": knee["watts"],
            "fastest_watts": fastest["watts"],
            "keep": keep,
        },
    }


def table(result: dict) -> list[str]:
    """The sweep as lines: one per limit, then the recommendation in words."""
    lines = ["limit W | tok/s  | avg W  | tok/J  | speed"]
    for row in result["rows"]:
        if row["sound"]:
            lines.append(
                f"{row['limit_w']:7.0f} | {row['tokens_per_s']:6.1f} | {row['watts']:6.1f} | "
                f"{row['tokens_per_joule']:6.3f} | {row['speed_share']:.2f}"
            )
        else:
            lines.append(f"{row['limit_w']:7.0f} | failed or no energy reading")
    return lines
