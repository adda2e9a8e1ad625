"""A stand-in for nvidia-ml-py's ``pynvml``, for hosts without a GPU.

It serves a machine described in the JSON file named by ``GPUBOX_FAKE_NVML``
(see tests/unit/hardware.py: ``nvml_machine``), so gpu_facts runs unchanged
through Ansible. Only the calls gpu_facts makes are here.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
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
    return SimpleNamespace(total=_value(handle, "memory_bytes"))


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


def nvmlDeviceGetCudaComputeCapability(handle):
    return tuple(_value(handle, "cc"))


def nvmlDeviceGetP2PStatus(a, b, caps):
    return _machine()["p2p"][f"{a}-{b}"][caps]


def nvmlDeviceGetTopologyCommonAncestor(a, b):
    return _machine()["topology"][f"{a}-{b}"]
