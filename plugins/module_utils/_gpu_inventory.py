# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Private: the GPU inventory from NVML, its swap fingerprint, and what changed since the stored one.

No Ansible imports. ``collect`` takes the NVML binding (nvidia-ml-py's
``pynvml`` module) as an argument, so tests hand it a stand-in with values from
real captures; ``fingerprint`` and ``changes`` are pure.
"""

from __future__ import annotations

import contextlib
import hashlib
import json

# NVML P2P status -> the codes nvidia-smi topo -p2p prints.
P2P_STATUS_CODES = {0: "OK", 1: "CNS", 2: "GNS", 3: "TNS", 4: "DR", 5: "NS", 6: "U"}
P2P_CAPS = {"read": 0, "write": 1, "nvlink": 2, "atomics": 3, "pci": 4}
# NVML topology common ancestor -> the codes nvidia-smi topo -m prints.
TOPOLOGY_CODES = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


def text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def optional(nvml, getter: str, *args):
    """An NVML value, or None where the GPU or driver does not support the query (``_power`` reads with it too)."""
    function = getattr(nvml, getter, None)
    if function is None:
        return None
    try:
        return function(*args)
    except nvml.NVMLError:
        return None


def _bus_id(raw: str) -> str:
    """NVML's ``00000000:01:00.0`` -> ``0000:01:00.0`` (lower case), as sysfs and lspci write it."""
    raw = text(raw).lower()
    domain, _sep, rest = raw.partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest else raw


def collect(nvml) -> dict:
    """The ``gpu`` facts from an initialised-or-not NVML binding; never raises for a missing driver or GPU."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return {"present": False, "reason": f"NVML could not start: {exc}", "count": 0, "devices": []}
    try:
        driver = text(nvml.nvmlSystemGetDriverVersion())
        cuda = optional(nvml, "nvmlSystemGetCudaDriverVersion")
        count = nvml.nvmlDeviceGetCount()
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        devices = [_device(nvml, i, h) for i, h in enumerate(handles)]
        for i, device in enumerate(devices):
            device["p2p"], device["topology"] = {}, {}
            for j, other in enumerate(handles):
                if i == j:
                    continue
                name = f"GPU{j}"
                device["p2p"][name] = {
                    cap: P2P_STATUS_CODES.get(optional(nvml, "nvmlDeviceGetP2PStatus", handles[i], other, index), "U")
                    for cap, index in P2P_CAPS.items()
                }
                level = optional(nvml, "nvmlDeviceGetTopologyCommonAncestor", handles[i], other)
                device["topology"][name] = TOPOLOGY_CODES.get(level, "U") if level is not None else None
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()
    facts = {
        "present": count > 0,
        "reason": None if count else "the NVIDIA driver is loaded but reports no GPU",
        "driver_version": driver,
        "cuda_driver_version": f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None,
        "count": count,
        "devices": devices,
    }
    facts["fingerprint"] = fingerprint(facts)
    return facts


def _device(nvml, index: int, handle) -> dict:
    pci = nvml.nvmlDeviceGetPciInfo(handle)
    memory = optional(nvml, "nvmlDeviceGetMemoryInfo", handle)
    capability = optional(nvml, "nvmlDeviceGetCudaComputeCapability", handle)
    pstate = optional(nvml, "nvmlDeviceGetPerformanceState", handle)
    return {
        "index": index,
        "name": text(nvml.nvmlDeviceGetName(handle)),
        "uuid": text(nvml.nvmlDeviceGetUUID(handle)),
        "serial": text(serial) if (serial := optional(nvml, "nvmlDeviceGetSerial", handle)) else None,
        "memory_total_mib": memory.total // (1024 * 1024) if memory else None,
        "pci_bus_id": _bus_id(pci.busId),
        "pci_device_id": f"0x{pci.pciDeviceId:08x}",
        "pcie_gen_current": optional(nvml, "nvmlDeviceGetCurrPcieLinkGeneration", handle),
        "pcie_gen_max": optional(nvml, "nvmlDeviceGetMaxPcieLinkGeneration", handle),
        "pcie_width_current": optional(nvml, "nvmlDeviceGetCurrPcieLinkWidth", handle),
        "pcie_width_max": optional(nvml, "nvmlDeviceGetMaxPcieLinkWidth", handle),
        "numa_node": optional(nvml, "nvmlDeviceGetNumaNodeId", handle),
        "compute_capability": f"{capability[0]}.{capability[1]}" if capability else None,
        # P0 (full load) to P12 (idle): a link below its best generation is a fault only under load.
        "performance_state": f"P{pstate}" if pstate is not None else None,
    }


def fingerprint(facts: dict) -> str:
    """A stable hash of the sorted (UUID, bus id, PCI device id) of every GPU, plus the driver version."""
    gpus = sorted((d["uuid"], d["pci_bus_id"], d["pci_device_id"]) for d in facts.get("devices", []))
    blob = json.dumps({"gpus": gpus, "driver": facts.get("driver_version")}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def record(facts: dict) -> dict:
    """What the host keeps to compare the next run against (written by a role, never by the facts module)."""
    return {
        "fingerprint": facts.get("fingerprint"),
        "driver_version": facts.get("driver_version"),
        "gpus": [
            {"uuid": d["uuid"], "pci_bus_id": d["pci_bus_id"], "pci_device_id": d["pci_device_id"], "name": d["name"]}
            for d in facts.get("devices", [])
        ],
    }


def changes(previous: dict | None, current: dict) -> list[str]:
    """What changed between a stored record and the current one, in words; [] when nothing did."""
    if not previous:
        return []
    if previous.get("fingerprint") == current.get("fingerprint"):
        return []
    out = []
    old = {g["uuid"]: g for g in previous.get("gpus", [])}
    new = {g["uuid"]: g for g in current.get("gpus", [])}
    old_at = {g["pci_bus_id"]: g for g in old.values()}
    new_at = {g["pci_bus_id"]: g for g in new.values()}
    replaced = set()
    for bus, gpu in sorted(new_at.items()):
        before = old_at.get(bus)
        if before and before["uuid"] != gpu["uuid"] and before["uuid"] not in new and gpu["uuid"] not in old:
            out.append(f"GPU at {bus} replaced: {before['name']} ({before['uuid']}) -> {gpu['name']} ({gpu['uuid']})")
            replaced |= {before["uuid"], gpu["uuid"]}
    for uuid, gpu in sorted(new.items(), key=lambda item: item[1]["pci_bus_id"]):
        if uuid in replaced:
            continue
        if uuid not in old:
            out.append(f"GPU added: {gpu['name']} ({uuid}) at {gpu['pci_bus_id']}")
        elif old[uuid]["pci_bus_id"] != gpu["pci_bus_id"]:
            out.append(f"GPU moved slot: {gpu['name']} ({uuid}) {old[uuid]['pci_bus_id']} -> {gpu['pci_bus_id']}")
    for uuid, gpu in sorted(old.items(), key=lambda item: item[1]["pci_bus_id"]):
        if uuid not in new and uuid not in replaced:
            out.append(f"GPU removed: {gpu['name']} ({uuid}) from {gpu['pci_bus_id']}")
    if previous.get("driver_version") != current.get("driver_version"):
        out.append(f"driver changed: {previous.get('driver_version')} -> {current.get('driver_version')}")
    return out or ["fingerprint changed (PCI device id of a GPU)"]
