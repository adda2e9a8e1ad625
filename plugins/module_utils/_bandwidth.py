# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Private: read GPU bandwidth reports (nvbandwidth, cuda-samples p2pBandwidthLatencyTest) and judge P2P from them.

Pure functions, text in and data out, no Ansible imports. Every matrix comes
back as a list of rows, each a list of floats with None for N/A, row and column
as printed, under a test name: nvbandwidth's own (``device_to_device_memcpy_read_ce``)
or, for p2pBandwidthLatencyTest, ``unidirectional_p2p_disabled``,
``unidirectional_p2p_enabled``, ``bidirectional_p2p_disabled``,
``bidirectional_p2p_enabled``, ``latency_gpu_p2p_disabled_us``,
``latency_gpu_p2p_enabled_us`` (and the CPU latencies beside them).
"""

from __future__ import annotations

import re

# Usable PCIe bandwidth per direction in GB/s for x1, by generation (after line encoding):
# Gen1/2 use 8b/10b, Gen3+ 128b/130b; Gen6 uses FLIT mode, taken at the raw rate.
PCIE_GBPS_PER_LANE = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}

_P2PBLT_TITLES = [
    (re.compile(r"^P2P Connectivity Matrix"), "connectivity"),
    (re.compile(r"^Unidirectional P2P=Disabled Bandwidth"), "unidirectional_p2p_disabled"),
    (re.compile(r"^Unidirectional P2P=Enabled Bandwidth"), "unidirectional_p2p_enabled"),
    (re.compile(r"^Bidirectional P2P=Disabled Bandwidth"), "bidirectional_p2p_disabled"),
    (re.compile(r"^Bidirectional P2P=Enabled Bandwidth"), "bidirectional_p2p_enabled"),
    (re.compile(r"^P2P=Disabled Latency"), "latency_{}_p2p_disabled_us"),
    (re.compile(r"^P2P=Enabled Latency"), "latency_{}_p2p_enabled_us"),
]
_NUMBER_RE = re.compile(r"^-?\d+(?:\.\d+)?$")


class BandwidthParseError(ValueError):
    """A report this parser cannot read; the message names the line."""


def _cell(token: str, lineno: int, line: str) -> float | None:
    if token in ("N/A", "n/a", "-"):
        return None
    if not _NUMBER_RE.match(token):
        raise BandwidthParseError(f"line {lineno}: {token!r} is not a number ({line.strip()!r})")
    return float(token)


def _matrix_header(line: str) -> list[int] | None:
    """Column indices of a header row such as ``   D\\D     0      1`` or ``          0         1``."""
    tokens = line.split()
    if tokens and tokens[0] in ("D\\D", "GPU", "CPU"):
        tokens = tokens[1:]
    if tokens and all(t.isdigit() for t in tokens) and tokens == [str(i) for i in range(len(tokens))]:
        return [int(t) for t in tokens]
    return None


def _read_rows(lines: list[str], start: int, columns: int) -> tuple[list[list[float | None]], int]:
    rows: list[list[float | None]] = []
    index = start
    while index < len(lines):
        tokens = lines[index].split()
        if len(tokens) != columns + 1 or not tokens[0].isdigit() or int(tokens[0]) != len(rows):
            break
        rows.append([_cell(t, index + 1, lines[index]) for t in tokens[1:]])
        index += 1
    return rows, index


def parse_p2p_bandwidth_latency_test(text: str) -> dict:
    """cuda-samples ``p2pBandwidthLatencyTest`` output."""
    lines = text.splitlines()
    devices = []
    can_access: dict[str, dict[str, bool]] = {}
    matrices: dict[str, list] = {}
    title = None
    index = 0
    while index < len(lines):
        line = lines[index].strip()
        device = re.match(
            r"^Device: (\d+), (.*?), pciBusID: ([0-9a-fA-F]+), pciDeviceID: ([0-9a-fA-F]+), pciDomainID:\s*([0-9a-fA-F]+)",
            line,
        )
        access = re.match(r"^Device=(\d+) (CAN|CANNOT) Access Peer Device=(\d+)", line)
        if device:
            devices.append(
                {
                    "index": int(device.group(1)),
                    "name": device.group(2),
                    # pciDeviceID is the device number on the bus; the GPU is function 0.
                    "pci_bus_id": "{:04x}:{:02x}:{:02x}.0".format(*(int(device.group(g), 16) for g in (5, 3, 4))),
                }
            )
        elif access:
            can_access.setdefault(access.group(1), {})[access.group(3)] = access.group(2) == "CAN"
        else:
            for pattern, name in _P2PBLT_TITLES:
                if pattern.match(line):
                    title = name
                    break
            header = _matrix_header(line)
            if header is not None and title:
                kind = line.split()[0].lower() if line.split()[0] in ("GPU", "CPU") else "gpu"
                rows, index = _read_rows(lines, index + 1, len(header))
                matrices[title.format(kind)] = rows
                continue
        index += 1
    if not matrices:
        raise BandwidthParseError("no p2pBandwidthLatencyTest matrix found (expected 'P2P Connectivity Matrix' and friends)")
    count = len(devices) or len(next(iter(matrices.values())))
    return {
        "source": "p2pBandwidthLatencyTest",
        "gpus": count,
        "devices": devices,
        "can_access_peer": can_access,
        "matrices": matrices,
    }


def parse_nvbandwidth(text: str) -> dict:
    """``nvbandwidth`` output, old and new formats: matrices per test, SUM lines, waived tests."""
    lines = text.splitlines()
    devices = []
    versions = {}
    matrices: dict[str, list] = {}
    sums: dict[str, float] = {}
    waived: list[str] = []
    test = None
    index = 0
    while index < len(lines):
        line = lines[index].strip()
        device = re.match(r"^Device (\d+): (.*?)(?: \(([0-9a-fA-F:.]+)\))?$", line)
        version = re.match(r"^(nvbandwidth Version|CUDA Runtime Version|CUDA Driver Version|Driver Version):\s*(\S+)", line)
        running = re.match(r"^Running (\w+)\.?$", line)
        waiving = re.match(r"^Waiving (\w+)\.?$", line)
        total = re.match(r"^SUM (\w+) ([\d.]+)", line)
        if device:
            devices.append({"index": int(device.group(1)), "name": device.group(2), "pci_bus_id": device.group(3)})
        elif version:
            versions[version.group(1).lower().replace(" ", "_")] = version.group(2)
        elif running:
            test = running.group(1)
        elif waiving:
            waived.append(waiving.group(1))
        elif total:
            sums[total.group(1)] = float(total.group(2))
        elif test and _matrix_header(line) is not None:
            rows, index = _read_rows(lines, index + 1, len(_matrix_header(line)))
            matrices[test] = rows
            continue
        index += 1
    if not matrices and not waived:
        raise BandwidthParseError("no nvbandwidth test found (expected 'Running <test>.' and a matrix, or 'Waiving <test>.')")
    count = len(devices) or max((len(r) for rows in matrices.values() for r in rows), default=0)
    return {
        "source": "nvbandwidth",
        "gpus": count,
        "devices": devices,
        "versions": versions,
        "matrices": matrices,
        "sums": sums,
        "waived": waived,
    }


def parse_report(text: str) -> dict:
    """Either report, told apart by its banner."""
    if "P2P (Peer-to-Peer) GPU Bandwidth Latency Test" in text or "P2P Connectivity Matrix" in text:
        return parse_p2p_bandwidth_latency_test(text)
    if "nvbandwidth" in text or re.search(r"^Running \w+_(ce|sm)\.?$", text, re.MULTILINE):
        return parse_nvbandwidth(text)
    raise BandwidthParseError("neither nvbandwidth nor p2pBandwidthLatencyTest output")


def pcie_limit_gbps(gen: int | None, width: int | None) -> float | None:
    """Usable bandwidth per direction of a PCIe link, in GB/s (Gen4 x16 -> 31.5)."""
    if not gen or not width or gen not in PCIE_GBPS_PER_LANE:
        return None
    return round(PCIE_GBPS_PER_LANE[gen] * width, 1)
