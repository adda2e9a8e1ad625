# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Private: each GPU's sensors through NVML, the Xid errors in the kernel log, as a Prometheus textfile.

No Ansible imports. ``read`` takes the NVML binding (nvidia-ml-py's ``pynvml``) as an argument, so the tests
hand it the stand-in; ``xids`` parses kernel log text; ``metrics`` is pure. The monitoring role's program
(roles/monitoring/files/gpubox-gpu-metrics.py, run by a systemd timer) writes what ``metrics`` returns to
the node exporter's textfile folder. A value the GPU or driver does not report is left out, never made up.
"""

from __future__ import annotations

import contextlib
import re

from ansible_collections.gpubox.inference.plugins.module_utils._gpu_inventory import _bus_id, optional, text

# NVML's clocks event (throttle) reasons: the bit, and the label the metric carries (nvml.h,
# nvmlClocksEventReason*; the older name is nvmlClocksThrottleReason*).
THROTTLE_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
NVML_TEMPERATURE_GPU = 0
# "NVRM: Xid (PCI:0000:44:00): 79, pid=1234, name=python3, GPU has fallen off the bus." (older drivers leave out
# pid and name; some write the function, PCI:0000:44:00.0).
XID_LINE = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.[0-7])?\): (\d+)")


def read(nvml) -> list[dict]:
    """Each GPU's temperature, fan, power, memory, utilisation, PCIe link and clocks event reasons."""
    nvml.nvmlInit()
    try:
        return [_gpu(nvml, index, nvml.nvmlDeviceGetHandleByIndex(index)) for index in range(nvml.nvmlDeviceGetCount())]
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()


def _gpu(nvml, index: int, handle) -> dict:
    memory = optional(nvml, "nvmlDeviceGetMemoryInfo", handle)
    utilization = optional(nvml, "nvmlDeviceGetUtilizationRates", handle)
    reasons = optional(nvml, "nvmlDeviceGetCurrentClocksEventReasons", handle)
    if reasons is None:
        reasons = optional(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", handle)
    power = optional(nvml, "nvmlDeviceGetPowerUsage", handle)
    limit = optional(nvml, "nvmlDeviceGetPowerManagementLimit", handle)
    fan = optional(nvml, "nvmlDeviceGetFanSpeed", handle)
    return {
        "index": index,
        "name": text(nvml.nvmlDeviceGetName(handle)),
        "uuid": text(nvml.nvmlDeviceGetUUID(handle)),
        "pci_bus_id": _bus_id(nvml.nvmlDeviceGetPciInfo(handle).busId),
        "temperature_c": optional(nvml, "nvmlDeviceGetTemperature", handle, NVML_TEMPERATURE_GPU),
        "fan_ratio": fan / 100 if fan is not None else None,
        "power_w": power / 1000 if power is not None else None,
        "power_limit_w": limit / 1000 if limit is not None else None,
        "memory_used_bytes": getattr(memory, "used", None) if memory else None,
        "memory_total_bytes": getattr(memory, "total", None) if memory else None,
        "utilization_ratio": utilization.gpu / 100 if utilization else None,
        "memory_utilization_ratio": utilization.memory / 100 if utilization else None,
        "pcie_gen_current": optional(nvml, "nvmlDeviceGetCurrPcieLinkGeneration", handle),
        "pcie_gen_max": optional(nvml, "nvmlDeviceGetMaxPcieLinkGeneration", handle),
        "pcie_width_current": optional(nvml, "nvmlDeviceGetCurrPcieLinkWidth", handle),
        "pcie_width_max": optional(nvml, "nvmlDeviceGetMaxPcieLinkWidth", handle),
        "clocks_event_reasons": reasons,
    }


def xids(log: str) -> dict[str, dict]:
    """The Xid errors in kernel log text, by the GPU's bus (``0000:44:00``): ``{"count": n, "last": code}``."""
    found: dict[str, dict] = {}
    for match in XID_LINE.finditer(log):
        bus = match.group(1).lower()
        entry = found.setdefault(bus, {"count": 0, "last": None})
        entry["count"] += 1
        entry["last"] = int(match.group(2))
    return found


# (name, help, the reading's key) for the plain gauges, one series per GPU.
GAUGES = (
    ("gpubox_gpu_temperature_celsius", "GPU core temperature", "temperature_c"),
    ("gpubox_gpu_fan_speed_ratio", "Fan speed, as a share of its maximum", "fan_ratio"),
    ("gpubox_gpu_power_watts", "Power draw", "power_w"),
    ("gpubox_gpu_power_limit_watts", "Power limit in force", "power_limit_w"),
    ("gpubox_gpu_memory_used_bytes", "Framebuffer memory in use", "memory_used_bytes"),
    ("gpubox_gpu_memory_total_bytes", "Framebuffer memory", "memory_total_bytes"),
    ("gpubox_gpu_utilization_ratio", "Share of the last sample period a kernel ran", "utilization_ratio"),
    ("gpubox_gpu_memory_utilization_ratio", "Share of the last sample period memory was read or written",
     "memory_utilization_ratio"),
    ("gpubox_gpu_pcie_link_generation", "PCIe link generation now (an idle GPU drops to Gen1)", "pcie_gen_current"),
    ("gpubox_gpu_pcie_link_max_generation", "Best PCIe generation the GPU and its slot allow", "pcie_gen_max"),
    ("gpubox_gpu_pcie_link_width", "PCIe lanes now", "pcie_width_current"),
    ("gpubox_gpu_pcie_link_max_width", "Most PCIe lanes the GPU and its slot allow", "pcie_width_max"),
)  # fmt: skip


def _labels(gpu: dict, **extra) -> str:
    pairs = {"gpu": str(gpu["index"]), "uuid": gpu["uuid"], **extra}
    return ",".join(f'{key}="{value}"' for key, value in pairs.items())


def _number(value) -> str:
    return repr(float(value)) if isinstance(value, float) else str(int(value))


def metrics(gpus: list[dict], xid: dict[str, dict] | None, now: float) -> str:
    """The textfile: one series per GPU for each value it reported, the clocks event reasons one per reason, and
    the Xid errors of this boot (``xid`` None: the kernel log could not be read, and no Xid series is written)."""
    lines = []
    for name, help_, key in GAUGES:
        series = [(gpu, gpu[key]) for gpu in gpus if gpu.get(key) is not None]
        if not series:
            continue
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} gauge"]
        lines += [f"{name}{{{_labels(gpu)}}} {_number(value)}" for gpu, value in series]
    info = [f"gpubox_gpu_info{{{_labels(gpu, name=gpu['name'], pci_bus_id=gpu['pci_bus_id'])}}} 1" for gpu in gpus]
    lines += ["# HELP gpubox_gpu_info Each GPU, by index, with its name and bus", "# TYPE gpubox_gpu_info gauge", *info]
    reasons = [gpu for gpu in gpus if gpu.get("clocks_event_reasons") is not None]
    if reasons:
        lines += ["# HELP gpubox_gpu_clocks_event_reason 1 while this reason holds the GPU's clocks down",
                  "# TYPE gpubox_gpu_clocks_event_reason gauge"]  # fmt: skip
        for gpu in reasons:
            for bit, reason in THROTTLE_REASONS.items():
                held = 1 if gpu["clocks_event_reasons"] & bit else 0
                lines.append(f"gpubox_gpu_clocks_event_reason{{{_labels(gpu, reason=reason)}}} {held}")
    if xid is not None:
        lines += ["# HELP gpubox_gpu_xid_errors Xid errors the driver logged for this GPU since boot",
                  "# TYPE gpubox_gpu_xid_errors gauge"]  # fmt: skip
        last = []
        for gpu in gpus:
            entry = xid.get(gpu["pci_bus_id"].rsplit(".", 1)[0]) or {"count": 0, "last": None}
            lines.append(f"gpubox_gpu_xid_errors{{{_labels(gpu)}}} {entry['count']}")
            if entry["last"] is not None:
                last.append(f"gpubox_gpu_xid_last_code{{{_labels(gpu)}}} {entry['last']}")
        if last:
            lines += ["# HELP gpubox_gpu_xid_last_code The last Xid the driver logged for this GPU since boot",
                      "# TYPE gpubox_gpu_xid_last_code gauge", *last]  # fmt: skip
    lines += [
        "# HELP gpubox_gpu_metrics_last_read_timestamp_seconds When the GPUs were last read",
        "# TYPE gpubox_gpu_metrics_last_read_timestamp_seconds gauge",
        f"gpubox_gpu_metrics_last_read_timestamp_seconds {int(now)}",
    ]
    return "\n".join(lines) + "\n"
