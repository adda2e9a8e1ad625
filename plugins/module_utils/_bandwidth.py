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

p2pBandwidthLatencyTest run with ``--p2p_read`` prints the peer-enabled
unidirectional and latency matrices twice, once for writes and once for reads:
the reads come back as ``unidirectional_p2p_enabled_reads`` and
``latency_{gpu,cpu}_p2p_enabled_reads_us``; the unsuffixed names are always the
writes, the sample's default and what every run prints.

nvbandwidth is read in both of its formats: the text it prints by default, and
the JSON of ``nvbandwidth -j``. Both come back in one shape, with ``tests``
(name -> ``passed``, ``waived``, ``not_found`` or ``error``) and ``format``.
"""

from __future__ import annotations

import json
import re

from ansible_collections.gpubox.inference.plugins.module_utils._text import strip_ansi

# Usable PCIe bandwidth per direction in GB/s for x1, by generation (after line encoding):
# Gen1/2 use 8b/10b, Gen3+ 128b/130b; Gen6 uses FLIT mode, taken at the raw rate.
PCIE_GBPS_PER_LANE = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}

# Older samples print the peer-enabled titles without "(P2P Writes)"; with --p2p_read a "(P2P Reads)" copy follows.
_P2PBLT_TITLES = [
    (re.compile(r"^P2P Connectivity Matrix"), "connectivity"),
    (re.compile(r"^Unidirectional P2P=Disabled Bandwidth"), "unidirectional_p2p_disabled"),
    (re.compile(r"^Unidirectional P2P=Enabled Bandwidth \(P2P Reads\)"), "unidirectional_p2p_enabled_reads"),
    (re.compile(r"^Unidirectional P2P=Enabled Bandwidth(?: \(P2P Writes\))? Matrix"), "unidirectional_p2p_enabled"),
    (re.compile(r"^Bidirectional P2P=Disabled Bandwidth"), "bidirectional_p2p_disabled"),
    (re.compile(r"^Bidirectional P2P=Enabled Bandwidth"), "bidirectional_p2p_enabled"),
    (re.compile(r"^P2P=Disabled Latency"), "latency_{}_p2p_disabled_us"),
    (re.compile(r"^P2P=Enabled Latency \(P2P Reads\)"), "latency_{}_p2p_enabled_reads_us"),
    (re.compile(r"^P2P=Enabled Latency(?: \(P2P Writes\))? Matrix"), "latency_{}_p2p_enabled_us"),
]
# Any other peer-enabled title would be a variant this parser does not know: refused, not filed under a near name.
_P2PBLT_UNKNOWN_RE = re.compile(r"^(?:Unidirectional |Bidirectional )?P2P=\w+ (?:Bandwidth|Latency)")
_NUMBER_RE = re.compile(r"^-?\d+(?:\.\d+)?$")
NVBANDWIDTH_STATUSES = {"passed": "passed", "waived": "waived", "not found": "not_found", "error": "error", "running": "error"}


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
    """cuda-samples ``p2pBandwidthLatencyTest`` output, with or without ``--p2p_read``.

    A matrix title met twice (two runs pasted into one file) is refused with both line numbers.
    """
    lines = strip_ansi(text).splitlines()
    devices = []
    can_access: dict[str, dict[str, bool]] = {}
    matrices: dict[str, list] = {}
    seen: dict[str, int] = {}
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
            named = next((name for pattern, name in _P2PBLT_TITLES if pattern.match(line)), None)
            if named:
                title = named
            elif _P2PBLT_UNKNOWN_RE.match(line):
                raise BandwidthParseError(f"line {index + 1}: a matrix title this parser does not know ({line!r})")
            header = _matrix_header(line)
            if header is not None and title:
                kind = line.split()[0].lower() if line.split()[0] in ("GPU", "CPU") else "gpu"
                name = title.format(kind)
                if name in seen:
                    raise BandwidthParseError(
                        f"line {index + 1}: a second {name} matrix (the first is at line {seen[name]}); save one run per file"
                    )
                seen[name] = index + 1
                rows, index = _read_rows(lines, index + 1, len(header))
                matrices[name] = rows
                continue
        index += 1
    if not matrices:
        raise BandwidthParseError("no p2pBandwidthLatencyTest matrix found (expected 'P2P Connectivity Matrix' and friends)")
    count = len(devices) or len(next(iter(matrices.values())))
    return {
        "source": "p2pBandwidthLatencyTest",
        "format": "text",
        "gpus": count,
        "devices": devices,
        "can_access_peer": can_access,
        "matrices": matrices,
        "p2p_method": "read" if "unidirectional_p2p_enabled_reads" in matrices else "write",
    }


def parse_nvbandwidth(text: str) -> dict:
    """``nvbandwidth`` text output, old and new formats: matrices per test, SUM lines, waived tests.

    A matrix takes its test's name from the ``Running <test>.`` line before it or, where a paste cut that
    line, from the ``SUM <test> <value>`` line after it; a matrix named by neither is refused, and so is one
    whose two names disagree.
    """
    lines = strip_ansi(text).splitlines()
    devices = []
    versions = {}
    matrices: dict[str, list] = {}
    sums: dict[str, float] = {}
    waived: list[str] = []
    test = None
    # The last matrix read: (its line, the Running name or None); a SUM line names it or must agree with it.
    pending: tuple[int, str | None, list] | None = None
    index = 0

    def settle(lineno: int | None) -> None:
        if pending and pending[1] is None:
            where = f", and line {lineno} starts another" if lineno else ""
            raise BandwidthParseError(
                f"line {pending[0]}: a matrix without a test name (no 'Running <test>.' before it, "
                f"no 'SUM <test> <value>' after it{where})"
            )

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
            settle(index + 1)
            pending, test = None, running.group(1)
        elif waiving:
            waived.append(waiving.group(1))
        elif total:
            name = total.group(1)
            if pending and pending[1] not in (None, name):
                raise BandwidthParseError(
                    f"line {index + 1}: SUM names {name}, but the matrix at line {pending[0]} is under 'Running {pending[1]}.'"
                )
            if pending and pending[1] is None:
                matrices[name] = pending[2]
            sums[name] = float(total.group(2))
            pending, test = None, None
        elif _matrix_header(line) is not None:
            settle(index + 1)
            rows, end = _read_rows(lines, index + 1, len(_matrix_header(line)))
            if test:
                matrices[test] = rows
            pending = (index + 1, test, rows)
            index = end
            continue
        index += 1
    settle(None)
    if not matrices and not waived:
        raise BandwidthParseError(
            "no nvbandwidth test found (expected 'Running <test>.' or 'SUM <test> <value>' with a matrix, or 'Waiving <test>.')"
        )
    count = len(devices) or max((len(r) for rows in matrices.values() for r in rows), default=0)
    return {
        "source": "nvbandwidth",
        "format": "text",
        "gpus": count,
        "devices": devices,
        "versions": versions,
        "matrices": matrices,
        "sums": sums,
        "waived": waived,
        "tests": {**dict.fromkeys(matrices, "passed"), **dict.fromkeys(waived, "waived")},
        "errors": {},
    }


def parse_nvbandwidth_json(text: str) -> dict:
    """``nvbandwidth -j`` output, into the same shape as the text form.

    Lines before the JSON (a prompt, a warning) are skipped; every cell must be a number or V(N/A), and a
    test's status one nvbandwidth writes (Passed, Waived, Not Found, Error, Running); anything else is refused
    naming the test, the row and the column.
    """
    start = re.search(r"^\s*\{", text, re.MULTILINE)
    if not start:
        raise BandwidthParseError("no JSON object found (expected nvbandwidth -j output starting with '{')")
    try:
        document, _end = json.JSONDecoder().raw_decode(text[start.start() :].lstrip())
    except json.JSONDecodeError as exc:
        line = text[: start.start()].count("\n") + exc.lineno
        raise BandwidthParseError(f"line {line}: not valid JSON ({exc.msg})") from None
    root = document.get("nvbandwidth") if isinstance(document, dict) else None
    if not isinstance(root, dict) or not isinstance(root.get("testcases", []), list):
        raise BandwidthParseError("JSON without an 'nvbandwidth' object holding a 'testcases' list")
    matrices: dict[str, list] = {}
    sums: dict[str, float] = {}
    tests: dict[str, str] = {}
    errors: dict[str, str] = {}
    for number, case in enumerate(root.get("testcases", []), start=1):
        name = case.get("name") if isinstance(case, dict) else None
        if not isinstance(name, str) or not name:
            raise BandwidthParseError(f"testcase {number}: no 'name'")
        status = NVBANDWIDTH_STATUSES.get(str(case.get("status", "")).lower())
        if status is None:
            raise BandwidthParseError(f"testcase {name}: status {case.get('status')!r} is not one nvbandwidth writes")
        tests[name] = status
        if status == "error" or case.get("error"):
            errors[name] = str(case.get("error") or f"the test never finished (status {case.get('status')})")
            tests[name] = "error"
            continue
        if status != "passed":
            continue
        rows = case.get("bandwidth_matrix")
        if not isinstance(rows, list) or not rows or not all(isinstance(row, list) and row for row in rows):
            raise BandwidthParseError(f"testcase {name}: passed without a bandwidth_matrix")
        matrices[name] = [[_json_cell(cell, name, i, j) for j, cell in enumerate(row)] for i, row in enumerate(rows)]
        if isinstance(case.get("sum"), (int, float)):
            sums[name] = float(case["sum"])
    versions = {
        key: str(root[field])
        for key, field in (
            ("nvbandwidth_version", "version"),
            ("cuda_runtime_version", "CUDA Runtime Version"),
            ("driver_version", "Driver Version"),
        )
        if root.get(field) not in (None, "")
    }
    if root.get("error"):
        errors["nvbandwidth"] = str(root["error"])
    return {
        "source": "nvbandwidth",
        "format": "json",
        "gpus": max((len(row) for rows in matrices.values() for row in rows), default=0),
        "devices": [],
        "versions": versions,
        "matrices": matrices,
        "sums": sums,
        "waived": [name for name, status in tests.items() if status == "waived"],
        "tests": tests,
        "errors": errors,
    }


def _json_cell(cell, test: str, row: int, column: int) -> float | None:
    if cell == "N/A":
        return None
    if isinstance(cell, (int, float)) and not isinstance(cell, bool):
        return float(cell)
    if isinstance(cell, str) and re.match(r"^-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?$", cell):
        return float(cell)
    raise BandwidthParseError(f"testcase {test}, row {row}, column {column}: {cell!r} is not a number or N/A")


def parse_report(text: str) -> dict:
    """Any of the three, told apart by what they print: the JSON of nvbandwidth -j, its text, p2pBandwidthLatencyTest."""
    if re.search(r"^\s*\{", text, re.MULTILINE) and '"nvbandwidth"' in text:
        return parse_nvbandwidth_json(text)
    if "P2P (Peer-to-Peer) GPU Bandwidth Latency Test" in text or "P2P Connectivity Matrix" in text:
        return parse_p2p_bandwidth_latency_test(text)
    if "nvbandwidth" in text or re.search(r"^\s*(?:Running|SUM) \w+_(?:ce|sm)\b", text, re.MULTILINE):
        return parse_nvbandwidth(text)
    raise BandwidthParseError("neither nvbandwidth (text or -j JSON) nor p2pBandwidthLatencyTest output")


def pcie_limit_gbps(gen: int | None, width: int | None) -> float | None:
    """Usable bandwidth per direction of a PCIe link, in GB/s (Gen4 x16 -> 31.5)."""
    if not gen or not width or gen not in PCIE_GBPS_PER_LANE:
        return None
    return round(PCIE_GBPS_PER_LANE[gen] * width, 1)
