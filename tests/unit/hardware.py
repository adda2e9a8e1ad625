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


RYZEN_CHIPSET = {
    "pci0000:00/0000:00:01.1": bridge(),
    "pci0000:00/0000:00:01.1/0000:01:00.0": gpu(),
    "pci0000:00/0000:00:01.1/0000:01:00.1": {"vendor": "0x10de", "device": "0x1aef", "class": "0x040300"},
    "pci0000:00/0000:00:01.2": bridge(),
    "pci0000:00/0000:00:01.2/0000:02:00.2": bridge(device="0x43e9", width="4"),
    "pci0000:00/0000:00:01.2/0000:02:00.2/0000:03:04.0": bridge(device="0x43ea", speed="8.0 GT/s PCIe", width="4"),
    "pci0000:00/0000:00:01.2/0000:02:00.2/0000:03:04.0/0000:04:00.0": gpu(cur_speed="8.0 GT/s PCIe", cur_width="4"),
}
