# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Private: parse ``nvidia-smi topo -m`` and ``topo -p2p`` matrices and judge them for tensor parallelism.

Pure functions, text in and data out, no Ansible imports. The parsers read the
general grammar of these outputs (a header naming devices from GPU0 on, one row
per device, optional affinity columns, legends) rather than one driver's exact
layout, so they take what people paste: prompts and commands before the header,
the command glued to it, tabs turned into spaces, re-indented blocks, cut
legends, empty affinity fields, and the ANSI escapes that underline the header
(driver 580 prints them even into a pipe). Input they cannot read raises
``TopologyParseError`` naming the line; they never guess a matrix.

One damage nvidia-smi itself prints is read around rather than refused: on
boxes with many NICs the last NIC cell of a GPU row can run into the CPU
Affinity (``PHB`` + tab + ``0-115`` printed as ``PH0-115``). Every other cell
of such a row is unambiguous, so the parser keeps them, leaves the damaged
link and the CPU Affinity out, and lists both in ``unreadable`` (row, column
and the text as printed). A damaged GPU-GPU cell is still refused.
"""

from __future__ import annotations

import re

from ansible_collections.gpubox.inference.plugins.module_utils._text import strip_ansi

ATTRIBUTE_COLUMNS = (
    ("CPU Affinity", "cpu_affinity"),
    ("NUMA Affinity", "numa_affinity"),
    ("GPU NUMA ID", "gpu_numa_id"),
)
_ATTRIBUTE_RE = re.compile("|".join(re.escape(label) for label, _key in ATTRIBUTE_COLUMNS))
_HEADER_START_RE = re.compile(r"GPU0(?=\s|$)")
_DEVICE_NAME_RE = re.compile(r"^[A-Za-z][\w.:-]*$")
_GPU_NAME_RE = re.compile(r"^GPU(\d+)$")
_LINK_CODE_RE = re.compile(r"^(X|NV\d+|[A-Z][A-Z0-9]*)$")
_NIC_LEGEND_RE = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")
# NIC devices that carry RDMA (InfiniBand, RoCE, iWARP), as the NIC Legend names them: the RDMA drivers' own names
# (mlx5_0, bnxt_re0, irdma0, ...) and rdma-core's predictable ones (rocep49s0, ibp3s0, iwp1s0). NCCL's network
# transport uses them; without one it falls back to sockets.
RDMA_DEVICE = re.compile(r"^(mlx\d+_\d+|bnxt_re\d+|irdma\d+|qedr\d+|efa_\d+|hfi\d+_\d+|ionic_\d+|(roce|ib|iw)[ps]\d+\w*|ib\d+)$")
# A link code run into the CPU Affinity after it: the code's first letters, then a CPU list (``PH0-115``).
_GLUED_CELL_RE = re.compile(r"^[A-Z]{1,4}\d[\d,-]*$")

# Best to worst, for the links nvidia-smi prints between two devices.
# SOC is what drivers before ~384 printed for today's SYS.
LINK_RANK = {"NVLINK": 0, "PIX": 1, "PXB": 2, "PHB": 3, "NODE": 4, "SYS": 5}
LINK_MEANING = {
    "NVLINK": "joined by NVLink",
    "PIX": "behind a single PCIe bridge",
    "PXB": "behind several PCIe bridges, without the CPU's host bridge",
    "PHB": "meeting only at the CPU's PCIe host bridge",
    "NODE": "on different PCIe host bridges of one NUMA node",
    "SYS": "on different NUMA nodes, across the CPU interconnect (QPI/UPI/Infinity Fabric)",
}

P2P_STATUS = {
    "OK": "supported",
    "CNS": "chipset not supported",
    "GNS": "GPU not supported",
    "TNS": "topology not supported",
    "NS": "not supported",
    "DR": "disabled by regkey",
    "U": "unknown",
}


class TopologyParseError(ValueError):
    """The text is not a matrix this parser can read; the message names the line."""


def _fail(lineno: int | None, line: str | None, problem: str) -> TopologyParseError:
    where = f"line {lineno}: " if lineno is not None else ""
    shown = f" ({line.strip()!r})" if line is not None else ""
    return TopologyParseError(f"{where}{problem}{shown}")


def _is_header(line: str) -> re.Match | None:
    """The first ``GPU0`` that starts a header: in GPU0's own row the next cell is always X."""
    for match in _HEADER_START_RE.finditer(line):
        if line[match.end() :].split()[:1] != ["X"]:
            return match
    return None


def _find_header(lines: list[str]) -> tuple[int, list[str], list[str]]:
    """Return (index of the header line, device names, attribute labels)."""
    for index, line in enumerate(lines):
        match = _is_header(line)
        if not match:
            continue
        tail = line[match.start() :]
        first_label = _ATTRIBUTE_RE.search(tail)
        device_part = tail[: first_label.start()] if first_label else tail
        devices = device_part.split()
        labels = _ATTRIBUTE_RE.findall(tail)
        bad = [d for d in devices if not _DEVICE_NAME_RE.match(d)]
        if bad:
            raise _fail(index + 1, line, f"header names {bad[0]!r}, which is not a device name")
        if len(set(devices)) != len(devices):
            raise _fail(index + 1, line, "header names a device twice")
        if not any(_GPU_NAME_RE.match(d) for d in devices):
            continue
        return index, devices, labels
    raise _fail(None, None, "no matrix header found: expected a line naming GPU0 (and GPU1, NIC0, ... after it)")


def _split_attributes(remainder: str, labels: list[str]) -> dict[str, str | None]:
    """Assign the fields after the link cells to the header's attribute columns.

    nvidia-smi separates fields with tabs and leaves a field empty when it has no
    value (an empty CPU Affinity under a job cgroup, padding before GPU NUMA ID).
    With tabs, the first field is CPU Affinity and the last non-empty one GPU NUMA
    ID; without tabs (pasted as spaces) empty fields are gone, so the values are
    aligned from the right, where nvidia-smi always prints something.
    """
    keys = [dict(ATTRIBUTE_COLUMNS)[label] for label in labels]
    values: dict[str, str | None] = dict.fromkeys(keys)
    if not keys:
        return values
    if "\t" in remainder:
        fields = [f.strip() for f in remainder.lstrip(" ").removeprefix("\t").split("\t")]
        if keys[0] == "cpu_affinity":
            values["cpu_affinity"] = fields[0] or None
            keys, fields = keys[1:], fields[1:]
        tokens = [f for f in fields if f]
    else:
        tokens = remainder.split()
    if len(tokens) > len(keys):
        tokens = tokens[: len(keys)]
    for key, token in zip(reversed(keys), reversed(tokens), strict=False):
        values[key] = token
    return values


def _na(value: str | None) -> str | None:
    return None if value in (None, "", "N/A") else value


def _read_matrix(text: str, allowed_cells, glued_ok: bool = False) -> tuple[list[str], list[str], dict, dict, int, list]:
    """Shared reader for both matrices: (devices, labels, links, attributes per row, last line index, unreadable cells).

    ``glued_ok``: a row's last cell may be a NIC link run into the CPU Affinity (see the module docstring).
    """
    lines = text.splitlines()
    header_index, devices, labels = _find_header(lines)
    links: dict[str, dict[str, str]] = {}
    attributes: dict[str, dict[str, str | None]] = {}
    unreadable: list[dict] = []
    index = header_index + 1
    while index < len(lines):
        line = lines[index]
        tokens = line.split()
        if not tokens or tokens[0] not in devices:
            break
        name = tokens[0]
        if name in links:
            raise _fail(index + 1, line, f"second row for {name}")
        cells = tokens[1 : 1 + len(devices)]
        if len(cells) < len(devices):
            raise _fail(index + 1, line, f"row {name} has {len(cells)} cells, the header names {len(devices)} devices")
        glued = None
        for position, (column, cell) in enumerate(zip(devices, cells, strict=True)):
            if column == name:
                if cell != "X":
                    raise _fail(index + 1, line, f"row {name} has {cell!r} where its own column should say X")
            elif not allowed_cells(cell):
                last = position == len(devices) - 1
                nic_before_affinity = last and not _GPU_NAME_RE.match(column) and labels[:1] == ["CPU Affinity"]
                if glued_ok and nic_before_affinity and _GLUED_CELL_RE.match(cell):
                    glued = column
                    continue
                raise _fail(index + 1, line, f"row {name}, column {column}: {cell!r} is not a link code")
        links[name] = {column: cell for column, cell in zip(devices, cells, strict=True) if column not in (name, glued)}
        # Everything after the last link cell belongs to the attribute columns.
        position = 0
        for token in tokens[: 1 + len(devices)]:
            position = line.index(token, position) + len(token)
        if glued:
            # The glued cell holds the CPU Affinity too: what follows starts at the NUMA Affinity.
            attributes[name] = {"cpu_affinity": None, **_split_attributes(line[position:], labels[1:])}
            unreadable += [
                {"row": name, "column": glued, "text": cells[-1], "line": index + 1},
                {"row": name, "column": "CPU Affinity", "text": cells[-1], "line": index + 1},
            ]
        else:
            attributes[name] = _split_attributes(line[position:], labels)
        index += 1
    missing = [d for d in devices if _GPU_NAME_RE.match(d) and d not in links]
    if missing:
        last = min(index, len(lines) - 1)
        raise _fail(
            last + 1,
            lines[last],
            f"the matrix ends before the row for {missing[0]} (the header names {', '.join(devices)})",
        )
    return devices, labels, links, attributes, index, unreadable


def _is_link_code(cell: str) -> bool:
    return bool(_LINK_CODE_RE.match(cell)) and cell != "X"


def parse_topology(text: str) -> dict:
    """Parse ``nvidia-smi topo -m`` (or ``-mp``, ``--matrix``) output.

    Returns ``gpus`` (name, index, cpu_affinity, numa_affinity, gpu_numa_id as
    printed, None where absent or N/A), ``nics`` (name and device, the device
    from the NIC Legend or the column name when the output names NICs directly),
    ``links`` (row -> column -> code exactly as printed, both directions, no
    self entries), ``legend_nics`` (NIC Legend as printed) and ``unreadable``
    (cells nvidia-smi printed run together: ``row``, ``column``, ``text``,
    ``line``; those cells are absent from ``links`` and the affinity is null).
    """
    text = strip_ansi(text)
    devices, _labels, links, attributes, end, unreadable = _read_matrix(text, _is_link_code, glued_ok=True)
    damaged = {(cell["row"], cell["column"]) for cell in unreadable}
    # A NIC column without its own row still has links from the GPU rows; a damaged cell stays unread.
    for row, columns in list(links.items()):
        for column, code in columns.items():
            if (column, row) not in damaged:
                links.setdefault(column, {}).setdefault(row, code)
    legend = {}
    for line in text.splitlines()[end:]:
        match = _NIC_LEGEND_RE.match(line)
        if match:
            legend[match.group(1)] = match.group(2)
    gpus = []
    nics = []
    for name in devices:
        gpu = _GPU_NAME_RE.match(name)
        attrs = attributes.get(name, {})
        if gpu:
            numa_id = _na(attrs.get("gpu_numa_id"))
            gpus.append(
                {
                    "name": name,
                    "index": int(gpu.group(1)),
                    "cpu_affinity": _na(attrs.get("cpu_affinity")),
                    "numa_affinity": _na(attrs.get("numa_affinity")),
                    "gpu_numa_id": int(numa_id) if numa_id and numa_id.isdigit() else numa_id,
                }
            )
        else:
            device = legend.get(name) or (None if re.match(r"^NIC\d+$", name) else name)
            nics.append({"name": name, "device": device})
    return {"gpus": gpus, "nics": nics, "links": links, "legend_nics": legend, "unreadable": unreadable}


def parse_p2p(text: str) -> dict[str, dict[str, str]]:
    """Parse ``nvidia-smi topo -p2p r|w|rw|n|a|p`` output into GPU -> GPU -> status code."""

    def is_status(cell: str) -> bool:
        return cell in P2P_STATUS

    _devices, _labels, links, _attributes, _end, _unreadable = _read_matrix(strip_ansi(text), is_status)
    return links


def topology_from_p2p(p2p: dict[str, dict[str, str]]) -> dict:
    """The topology view of a P2P matrix read on its own: its GPUs, no NICs, no link codes."""
    names = sorted(p2p, key=lambda name: int(_GPU_NAME_RE.match(name).group(1)))
    gpus = [
        {"name": name, "index": int(name[3:]), "cpu_affinity": None, "numa_affinity": None, "gpu_numa_id": None} for name in names
    ]
    return {"gpus": gpus, "nics": [], "links": {}, "legend_nics": {}, "unreadable": []}


def check_p2p_matches(topology: dict, p2p: dict[str, dict[str, str]]) -> str | None:
    """The first GPU a P2P matrix names that the topology matrix does not (they come from different boxes), or None."""
    known = {gpu["name"] for gpu in topology["gpus"]}
    return next((name for name in sorted(p2p) if name not in known), None)


def normalize_link(code: str) -> str:
    """SOC is what old drivers printed for SYS; NV<n> is NVLink with n links."""
    if code == "SOC":
        return "SYS"
    return code


def link_class(code: str) -> str:
    code = normalize_link(code)
    if re.match(r"^NV\d+$", code):
        return "NVLINK"
    return code if code in LINK_RANK else "UNKNOWN"


def _gpu_pairs(topology: dict) -> list[tuple[str, str]]:
    names = [g["name"] for g in topology["gpus"]]
    return [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]


def combine_p2p(*matrices: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """One status per GPU pair from several p2p matrices (e.g. read and write): OK only where all say OK."""
    combined: dict[str, dict[str, str]] = {}
    for matrix in matrices:
        for row, columns in matrix.items():
            for column, status in columns.items():
                current = combined.setdefault(row, {}).get(column)
                if current is None or current == "OK":
                    combined[row][column] = status
    return combined


def analyse(topology: dict, p2p: dict[str, dict[str, str]] | None = None) -> dict:
    """The normalised view and the tensor-parallel verdict, with its reason in one sentence.

    verdict: ``fit`` (NVLink or PCIe switches between every GPU pair, P2P not
    reported broken), ``slow`` (works, but traffic goes through the CPU's host
    bridge, across NUMA nodes, or through host memory because P2P is not
    supported), ``single_gpu`` (nothing to split), ``unknown`` (only a P2P
    matrix was read and it reports every pair OK: the links are not known).
    """
    p2p = p2p or {}
    normalized = {
        row: {column: normalize_link(code) for column, code in columns.items()} for row, columns in topology["links"].items()
    }
    pairs = _gpu_pairs(topology)
    nvlink_pairs = [
        {"gpus": [a, b], "links": int(normalized[a][b][2:])}
        for a, b in pairs
        if link_class(normalized.get(a, {}).get(b, "")) == "NVLINK"
    ]
    result = {"links_normalized": normalized, "nvlink_pairs": nvlink_pairs, "worst_gpu_link": None}
    if not pairs:
        result.update(
            verdict="single_gpu",
            reason="Only one GPU is present, so there is nothing to split with tensor parallelism.",
        )
        return result

    broken = [(x, y, p2p[x][y]) for a, b in pairs for x, y in ((a, b), (b, a)) if p2p.get(x, {}).get(y, "OK") != "OK"]
    if not all(b in normalized.get(a, {}) for a, b in pairs) and not broken:
        # Only a P2P matrix was read: it says whether peer access works, not how the GPUs are joined.
        result.update(
            verdict="unknown",
            reason="Only the peer-to-peer matrix was read: every GPU pair reports OK, but without the topology "
            "matrix (nvidia-smi topo -m) the links between them are not known.",
        )
        return result

    def rank(pair: tuple[str, str]) -> int:
        return LINK_RANK.get(link_class(normalized.get(pair[0], {}).get(pair[1], "")), len(LINK_RANK))

    if all(b in normalized.get(a, {}) for a, b in pairs):
        worst = max(pairs, key=rank)
        worst_code = normalized[worst[0]][worst[1]]
        worst_class = link_class(worst_code)
        result["worst_gpu_link"] = {"gpus": list(worst), "code": worst_code, "class": worst_class}

    if broken:
        a, b, status = broken[0]
        result.update(
            verdict="slow",
            reason=(
                f"Peer-to-peer between {a} and {b} is {status} ({P2P_STATUS.get(status, 'unknown status')}), "
                "so NCCL copies through host memory and tensor parallelism works but slowly."
            ),
        )
        return result
    pair_text = f"{worst[0]} and {worst[1]}"
    if worst_class == "UNKNOWN":
        result.update(
            verdict="slow",
            reason=f"{pair_text} are joined by {worst_code!r}, a link code this collection does not know; "
            "assuming the slow case.",
        )
    elif worst_class in ("NVLINK", "PIX", "PXB"):
        how = "NVLink" if worst_class == "NVLINK" else "PCIe switches"
        result.update(
            verdict="fit",
            reason=f"Every GPU pair is joined by {how} (the worst, {pair_text}, {worst_code}: "
            f"{LINK_MEANING[worst_class]}), so peer-to-peer traffic stays off the CPU.",
        )
    else:
        subset = ""
        if nvlink_pairs:
            first = nvlink_pairs[0]["gpus"]
            subset = f" {first[0]} and {first[1]} share NVLink and would be fit as a group of two."
        result.update(
            verdict="slow",
            reason=f"{pair_text} are {LINK_MEANING[worst_class]} ({worst_code}), so tensor-parallel all-reduce "
            f"works but is slower than over NVLink or a PCIe switch.{subset}",
        )
    return result


def is_rdma(device: str | None) -> bool:
    """Whether a NIC Legend device name is an RDMA NIC (``RDMA_DEVICE``)."""
    return bool(RDMA_DEVICE.match(str(device or "")))
