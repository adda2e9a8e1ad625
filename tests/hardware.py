"""Builders for the hardware these tests do not have: /proc/cpuinfo text and /sys PCI trees.

A tree is laid out as the kernel lays it out: device folders nested below
``sys/devices/pci<domain>:<bus>/`` along the bridges, and relative symlinks to
them in ``sys/bus/pci/devices/``, so the real reading code runs unchanged.
"""

from __future__ import annotations

import os
from pathlib import Path

CPUINFO = "processor\t: {n}\nvendor_id\t: {vendor}\nmodel name\t: {model}\nphysical id\t: {socket}\n\n"


def cpuinfo(vendor: str, model: str, sockets: int = 1) -> str:
    return "".join(CPUINFO.format(n=i, vendor=vendor, model=model, socket=i % sockets) for i in range(4))


def make_sysfs(root: Path, devices: dict[str, dict[str, str]]) -> Path:
    """A /sys tree: each key is the device's path below /sys/devices, e.g. 'pci0000:00/0000:00:01.1/0000:01:00.0'."""
    links = root / "sys" / "bus" / "pci" / "devices"
    links.mkdir(parents=True)
    for path, attributes in devices.items():
        folder = root / "sys" / "devices" / path
        folder.mkdir(parents=True, exist_ok=True)
        for name, value in attributes.items():
            (folder / name).write_text(value + "\n")
        os.symlink(os.path.relpath(folder, links), links / Path(path).name)
    return root


def bridge(vendor="0x1022", device="0x1483", speed="16.0 GT/s PCIe", width="16"):
    return {"vendor": vendor, "device": device, "class": "0x060400", "max_link_speed": speed, "max_link_width": width}


def gpu(cur_speed="16.0 GT/s PCIe", cur_width="16", max_speed="16.0 GT/s PCIe", max_width="16"):
    return {
        "vendor": "0x10de",
        "device": "0x2204",
        "class": "0x030000",
        "current_link_speed": cur_speed,
        "current_link_width": cur_width,
        "max_link_speed": max_speed,
        "max_link_width": max_width,
    }


def config_space(acs: tuple[int, int] | None, vendor=0x1022, device=0x1483, class_code=0x0604, size=4096) -> bytes:
    """A PCIe bridge's configuration space, as /sys/bus/pci/devices/<bdf>/config gives it to root.

    The extended capability list holds Advanced Error Reporting at 0x100, then,
    when ``acs`` is (capability register, control register), Access Control
    Services at 0x148 (capabilities sit on 4-byte boundaries, as 0x148 and 0x10c
    in a PLX switch port's space). ``size`` 256 is a device without extended space.
    """
    config = bytearray(size)
    config[0:4] = vendor.to_bytes(2, "little") + device.to_bytes(2, "little")
    config[0x06] = 0x10  # status: a capability list follows
    config[0x0A:0x0C] = class_code.to_bytes(2, "little")
    config[0x0E] = 0x01 if class_code == 0x0604 else 0x00  # header type: bridge or endpoint
    config[0x34] = 0x40  # the PCI Express capability, a root port's (version 2, type 4)
    config[0x40:0x44] = bytes([0x10, 0x00, 0x42, 0x00])
    if size > 0x100:
        config[0x100:0x104] = (0x0001 | 1 << 16 | (0x148 if acs else 0) << 20).to_bytes(4, "little")
        if acs:
            config[0x148:0x14C] = (0x000D | 1 << 16).to_bytes(4, "little")
            config[0x14C:0x150] = acs[0].to_bytes(2, "little") + acs[1].to_bytes(2, "little")
    return bytes(config)


def lspci_dump(bdf: str, config: bytes) -> str:
    """``config`` as ``lspci -xxxx`` prints it, which ``lspci -F`` reads back."""
    rows = (f"{at:02x}: " + " ".join(f"{b:02x}" for b in config[at : at + 16]) for at in range(0, len(config), 16))
    return f"{bdf} PCI bridge: test\n" + "\n".join(rows) + "\n\n"


# The 2x RTX 3090 stand-in box's PCI tree (the bus ids of RTX3090_PAIR), each GPU below its own root port
# as on the captured EPYC board, every bridge with ACS and none redirecting: the drift watch's /sys in the
# unit tests and on Molecule's box (molecule/site/prepare.yml builds it there with ``stand_in_box``).
STAND_IN_BRIDGES = ("0000:00:01.1", "0000:40:01.1")
STAND_IN_GPUS = ("0000:09:00.0", "0000:41:00.0")
ACS_SRC_VALID, ACS_REQ_REDIR, ACS_CMPLT_REDIR = 1 << 0, 1 << 2, 1 << 3


def set_acs(root: Path, bdf: str, control: int) -> None:
    """Write a bridge's configuration space with ACS (all capabilities but DirectTrans) and ``control`` set."""
    (root / "sys" / "bus" / "pci" / "devices" / bdf / "config").write_bytes(config_space((0x5F, control)))


def stand_in_box(root: Path, cmdline: str = "ro quiet iommu=pt") -> Path:
    """/sys and /proc/cmdline of the stand-in box under ``root``."""
    make_sysfs(root, {
        "pci0000:00/0000:00:01.1": bridge(),
        "pci0000:00/0000:00:01.1/0000:09:00.0": gpu(),
        "pci0000:40/0000:40:01.1": bridge(),
        "pci0000:40/0000:40:01.1/0000:41:00.0": gpu(cur_speed="5.0 GT/s PCIe", cur_width="4"),
    })  # fmt: skip
    for bdf in STAND_IN_BRIDGES:
        set_acs(root, bdf, ACS_SRC_VALID)
    for bdf in STAND_IN_GPUS:
        (root / "sys" / "bus" / "pci" / "devices" / bdf / "config").write_bytes(config_space(None, 0x10DE, 0x2204, 0x0300))
    (root / "proc").mkdir(exist_ok=True)
    (root / "proc" / "cmdline").write_text(cmdline + "\n")
    return root


RYZEN_CHIPSET = {
    "pci0000:00/0000:00:01.1": bridge(),
    "pci0000:00/0000:00:01.1/0000:01:00.0": gpu(),
    "pci0000:00/0000:00:01.1/0000:01:00.1": {"vendor": "0x10de", "device": "0x1aef", "class": "0x040300"},
    "pci0000:00/0000:00:01.2": bridge(),
    "pci0000:00/0000:00:01.2/0000:02:00.2": bridge(device="0x43e9", width="4"),
    "pci0000:00/0000:00:01.2/0000:02:00.2/0000:03:04.0": bridge(device="0x43ea", speed="8.0 GT/s PCIe", width="4"),
    "pci0000:00/0000:00:01.2/0000:02:00.2/0000:03:04.0/0000:04:00.0": gpu(cur_speed="8.0 GT/s PCIe", cur_width="4"),
}


# ------------------------------------------------------------ NVML

# An RTX 3090's power limits in NVML (mW): 350 W by default (its TDP), settable from 100 W to 400 W as the
# Founders Edition reports them; persistence mode off, as after a boot.
RTX3090_POWER = {"default_mw": 350000, "min_mw": 100000, "max_mw": 400000}

# An idle RTX 3090 serving a model, as nvidia-smi -q reads one: vLLM holds most of the memory, the fan turns
# slowly, the clocks are down because the GPU is idle (nvmlClocksEventReasonGpuIdle, 0x1).
RTX3090_IDLE = {
    "temperature_c": 41,
    "fan_percent": 30,
    "utilization": [0, 0],
    "memory_used_bytes": 22 * 1024**3,
    "clocks_event_reasons": 0x1,
}

# Two RTX 3090s as one capture reports them (A_topo_m/2x_rtx3090_SYS_...: bus 09:00.0 and 41:00.0,
# driver 595.71.05, GPU0-GPU1=SYS). UUIDs and serials are made up; consumer cards report no serial.
RTX3090_PAIR = {
    "driver": "595.71.05",
    "cuda": 13000,
    "gpus": [
        {
            "name": "NVIDIA GeForce RTX 3090",
            "uuid": "GPU-3090aaaa-0000-0000-0000-000000000000",
            "serial": None,
            "memory_bytes": 24 * 1024**3,
            "bus_id": "00000000:09:00.0",
            "device_id": 0x220410DE,
            "gen": [4, 4],
            "width": [16, 16],
            "numa": None,
            "cc": [8, 6],
            "power": RTX3090_POWER,
            **RTX3090_IDLE,
        },
        {
            "name": "NVIDIA GeForce RTX 3090",
            "uuid": "GPU-3090bbbb-0000-0000-0000-000000000000",
            "serial": None,
            "memory_bytes": 24 * 1024**3,
            "bus_id": "00000000:41:00.0",
            "device_id": 0x220410DE,
            "gen": [2, 4],
            "width": [4, 16],
            "numa": 1,
            "cc": [8, 6],
            "power": RTX3090_POWER,
            **RTX3090_IDLE,
        },
    ],
    # NVML P2P status per caps index (read, write, nvlink, atomics, prop); 5 = not supported.
    "p2p": {"0-1": [5, 5, 5, 5, 5], "1-0": [5, 5, 5, 5, 5]},
    "topology": {"0-1": 50, "1-0": 50},
}


def stand_in_pynvml():
    """The stand-in ``pynvml`` (tests/fakes/pynvml.py) as a module; it serves the file GPUBOX_FAKE_NVML names."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("stand_in_pynvml", Path(__file__).parent / "fakes" / "pynvml.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def nvml_machine(path: Path, machine: dict) -> Path:
    """Write a machine for tests/fakes/pynvml.py; point GPUBOX_FAKE_NVML at the returned path."""
    import json

    path.write_text(json.dumps(machine))
    return path


def one_stand_in_gpu(tmp_path: Path, monkeypatch, **machine) -> None:
    """NVML (the stand-in pynvml) and nvidia-smi see one RTX 3090 of the captured pair, for the plays this test runs."""
    from conftest import ANSIBLE_ENV, ROOT

    fakes = ROOT / "tests" / "fakes"
    monkeypatch.setitem(ANSIBLE_ENV, "PYTHONPATH", os.pathsep.join([str(fakes), os.environ.get("PYTHONPATH", "")]))
    one_gpu = {**RTX3090_PAIR, "gpus": RTX3090_PAIR["gpus"][:1], "p2p": {}, "topology": {}, **machine}
    monkeypatch.setitem(ANSIBLE_ENV, "GPUBOX_FAKE_NVML", str(nvml_machine(tmp_path / "machine.json", one_gpu)))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    topo = tmp_path / "topo.txt"
    topo.write_text("\tGPU0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \t0-15\t0\n")
    (bindir / "nvidia-smi").write_text(f"#!/bin/sh\ncat {topo}\n")
    (bindir / "nvidia-smi").chmod(0o755)
    monkeypatch.setitem(ANSIBLE_ENV, "PATH", f"{bindir}{os.pathsep}{ANSIBLE_ENV['PATH']}")


# ------------------------------------------------------------ CUDA driver

FAKE_LIBCUDA_SOURCE = Path(__file__).parent / "fakes" / "libcuda.c"


def build_fake_libcuda(folder: Path) -> Path:
    """Compile tests/fakes/libcuda.c into ``folder/libcuda.so.1`` with gcc."""
    import subprocess

    from conftest import require

    folder.mkdir(parents=True, exist_ok=True)
    library = folder / "libcuda.so.1"
    subprocess.run(
        [require("gcc"), "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o", str(library), str(FAKE_LIBCUDA_SOURCE)],
        check=True,
        capture_output=True,
        text=True,
    )
    return library
