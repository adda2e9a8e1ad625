"""A stand-in for nvidia-ml-py's ``pynvml``, for hosts without a GPU.

It serves a machine described in the JSON file named by ``GPUBOX_FAKE_NVML``
(see tests/hardware.py: ``nvml_machine``), so gpu_facts and the power
module and program run unchanged through Ansible. Only the calls they make are
here. What is set (persistence mode, power limits) is written back to that file,
and each call to a setter is appended to its ``set`` list, so a test reads what
was set and in which order. The sensors (temperature, fan, utilisation, memory
in use, clocks event reasons) are the machine's values as they stand; a value it
leaves out is not supported. A GPU draws ``draw_share`` (default 0.9) of its
power limit, so its energy counter grows with the limit and with time.
"""

from __future__ import annotations

import json
import os
import time
from types import SimpleNamespace


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_InvalidArgument(NVMLError):
    pass


def _machine() -> dict:
    with open(os.environ["GPUBOX_FAKE_NVML"], encoding="utf-8") as handle:
        return json.load(handle)


def nvmlInit():
    error = _machine().get("init_error")
    if error:
        raise NVMLError(error)


def nvmlShutdown():
    pass


def nvmlSystemGetDriverVersion():
    return _machine()["driver"]


def nvmlSystemGetCudaDriverVersion():
    return _machine()["cuda"]


def nvmlDeviceGetCount():
    return len(_machine()["gpus"])


def nvmlDeviceGetHandleByIndex(index):
    return index


def _gpu(handle) -> dict:
    return _machine()["gpus"][handle]


def _value(handle, key):
    value = _gpu(handle).get(key)
    if value is None:
        raise NVMLError_NotSupported("Not Supported")
    return value


def nvmlDeviceGetName(handle):
    return _value(handle, "name")


def nvmlDeviceGetUUID(handle):
    return _value(handle, "uuid")


def nvmlDeviceGetSerial(handle):
    return _value(handle, "serial")


def nvmlDeviceGetMemoryInfo(handle):
    used = _gpu(handle).get("memory_used_bytes")
    return SimpleNamespace(total=_value(handle, "memory_bytes"), **({"used": used} if used is not None else {}))


def nvmlDeviceGetPciInfo(handle):
    gpu = _gpu(handle)
    return SimpleNamespace(busId=gpu["bus_id"].encode(), pciDeviceId=gpu["device_id"])


def nvmlDeviceGetCurrPcieLinkGeneration(handle):
    return _value(handle, "gen")[0]


def nvmlDeviceGetMaxPcieLinkGeneration(handle):
    return _value(handle, "gen")[1]


def nvmlDeviceGetCurrPcieLinkWidth(handle):
    return _value(handle, "width")[0]


def nvmlDeviceGetMaxPcieLinkWidth(handle):
    return _value(handle, "width")[1]


def nvmlDeviceGetNumaNodeId(handle):
    return _value(handle, "numa")


def nvmlDeviceGetPerformanceState(handle):
    return _value(handle, "pstate")


def nvmlDeviceGetCudaComputeCapability(handle):
    return tuple(_value(handle, "cc"))


def nvmlDeviceGetP2PStatus(a, b, caps):
    return _machine()["p2p"][f"{a}-{b}"][caps]


def nvmlDeviceGetTopologyCommonAncestor(a, b):
    return _machine()["topology"][f"{a}-{b}"]


# ------------------------------------------------------------ sensors (the monitoring role's gpubox-gpu-metrics)


def nvmlDeviceGetTemperature(handle, sensor):
    if sensor != 0:
        raise NVMLError_InvalidArgument("Invalid Argument")
    return _value(handle, "temperature_c")


def nvmlDeviceGetFanSpeed(handle):
    return _value(handle, "fan_percent")


def nvmlDeviceGetUtilizationRates(handle):
    gpu, memory = _value(handle, "utilization")
    return SimpleNamespace(gpu=gpu, memory=memory)


def nvmlDeviceGetCurrentClocksEventReasons(handle):
    return _value(handle, "clocks_event_reasons")


# ------------------------------------------------------------ power (the gpu_power module, gpubox-gpu-power)


def _store(machine: dict) -> None:
    path = os.environ["GPUBOX_FAKE_NVML"]
    with open(f"{path}.partial", "w", encoding="utf-8") as handle:
        json.dump(machine, handle, indent=2)
    os.replace(f"{path}.partial", path)


def _power(handle) -> dict:
    power = _gpu(handle).get("power")
    if power is None:
        raise NVMLError_NotSupported("Not Supported")
    return power


def nvmlDeviceGetPowerManagementLimitConstraints(handle):
    power = _power(handle)
    return power["min_mw"], power["max_mw"]


def nvmlDeviceGetPowerManagementDefaultLimit(handle):
    return _power(handle)["default_mw"]


def nvmlDeviceGetPowerManagementLimit(handle):
    power = _power(handle)
    return power.get("limit_mw", power["default_mw"])


def nvmlDeviceGetPowerUsage(handle):
    power = _power(handle)
    return int(power.get("limit_mw", power["default_mw"]) * power.get("draw_share", 0.9))


def nvmlDeviceGetTotalEnergyConsumption(handle):
    """mJ since a fixed start: the draw at the current limit, integrated since the limit was last set."""
    power = _power(handle)
    since = time.time() - power.get("limit_set_at", 0.0)
    return int(power.get("energy_mj", 0) + nvmlDeviceGetPowerUsage(handle) * since)


def nvmlDeviceSetPowerManagementLimit(handle, milliwatts):
    machine = _machine()
    power = machine["gpus"][handle]["power"]
    if not power["min_mw"] <= milliwatts <= power["max_mw"]:
        raise NVMLError_InvalidArgument("Invalid Argument")
    now = time.time()
    # Bank the energy drawn at the old limit before the new one counts.
    limit = power.get("limit_mw", power["default_mw"])
    drawn = limit * power.get("draw_share", 0.9) * (now - power.get("limit_set_at", 0.0))
    power["energy_mj"] = int(power.get("energy_mj", 0) + drawn)
    power["limit_mw"], power["limit_set_at"] = int(milliwatts), now
    machine.setdefault("set", []).append({"gpu": handle, "power_limit_mw": int(milliwatts)})
    _store(machine)


def nvmlDeviceGetPersistenceMode(handle):
    return _gpu(handle).get("persistence", 0)


def nvmlDeviceSetPersistenceMode(handle, mode):
    machine = _machine()
    machine["gpus"][handle]["persistence"] = int(mode)
    machine.setdefault("set", []).append({"gpu": handle, "persistence": int(mode)})
    _store(machine)
