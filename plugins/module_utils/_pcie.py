# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Private: the PCIe platform under the GPUs: CPU class and lanes, root ports, chipset, link training.

Parsers take text and return data (``parse_cpuinfo``, ``parse_smi_q``,
``parse_lspci_tree``, ``parse_lspci_links``); ``read_sysfs_pci`` reads a /sys
tree under a root folder so tests point it at a hand-made tree;
``analyse_platform`` combines them. No Ansible imports.
"""

from __future__ import annotations

import os
import re

from ansible_collections.gpubox.inference.plugins.module_utils._text import strip_ansi

NVIDIA_VENDOR = "0x10de"
# PCIe transfer rate (GT/s) -> generation.
SPEED_TO_GEN = {"2.5": 1, "5": 2, "8": 3, "16": 4, "32": 5, "64": 6}
# Bridges that belong to AMD's desktop chipsets (Promontory), from the PCI ID database:
# 400 Series Chipset PCIe Bridge/Port, 500 Series Chipset Switch Upstream/Downstream Port,
# 600 Series Chipset PCIe Switch Upstream/Downstream Port.
AMD_CHIPSET_BRIDGES = {"0x43c6", "0x43c7", "0x43e9", "0x43ea", "0x43f4", "0x43f5"}
# On Intel client platforms the PCH's root ports sit on bus 00 at devices 1b, 1c and 1d;
# the CPU's own root ports are 00:01.x and 00:06.0.
INTEL_PCH_ROOT_DEVICES = {"1b", "1c", "1d"}
_CHIPSET_WORDS_RE = re.compile(r"\b(Chipset|PCH|Promontory)\b", re.IGNORECASE)
_BDF_RE = re.compile(r"^(?:(?P<domain>[0-9a-fA-F]{4,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):(?P<dev>[0-9a-fA-F]{1,2})\.(?P<fn>[0-7])$")


def normalize_bdf(text: str) -> str | None:
    """``00000000:19:00.0``, ``19:00.0`` or ``0:2:0`` -> ``0000:19:00.0``; None if it is no bus id."""
    text = text.strip()
    old = re.match(r"^(\d+):(\d+):(\d+)$", text)
    if old:  # very old nvidia-smi: bus:device:function in decimal
        return f"0000:{int(old.group(1)):02x}:{int(old.group(2)):02x}.{int(old.group(3))}"
    match = _BDF_RE.match(text)
    if not match:
        return None
    domain = int(match.group("domain") or "0", 16)
    return f"{domain:04x}:{int(match.group('bus'), 16):02x}:{int(match.group('dev'), 16):02x}.{match.group('fn')}"


def speed_to_gen(speed: str | None) -> int | None:
    """``16.0 GT/s PCIe`` or ``16GT/s`` -> 4."""
    if not speed:
        return None
    match = re.match(r"^\s*([\d.]+)\s*GT/s", speed)
    return SPEED_TO_GEN.get(match.group(1).removesuffix(".0")) if match else None


# ---------------------------------------------------------------- CPU


def parse_cpuinfo(text: str) -> dict:
    """Vendor, model, class (server / workstation / consumer), sockets and PCIe lanes from /proc/cpuinfo."""
    vendor = model = None
    sockets = set()
    for line in text.splitlines():
        key, _sep, value = (part.strip() for part in line.partition(":"))
        if key == "vendor_id" and vendor is None:
            vendor = {"AuthenticAMD": "AMD", "GenuineIntel": "Intel"}.get(value, value)
        elif key == "model name" and model is None:
            model = re.sub(r"\s+", " ", value)
        elif key == "physical id":
            sockets.add(value)
    family, cpu_class, lanes = classify_cpu(model or "")
    count = max(len(sockets), 1) if model else None
    return {
        "vendor": vendor,
        "model": model,
        "family": family,
        "class": cpu_class,
        "sockets": count,
        "pcie_lanes": lanes,
        "pcie_lanes_total": lanes * count if lanes and count else None,
    }


def classify_cpu(model: str) -> tuple[str | None, str | None, int | None]:
    """(family, class, PCIe lanes per socket from the CPU) for a model name; lanes None where not known."""
    rules = [
        (r"EPYC\s+4\d{3}", "EPYC", "server", 28),
        (r"EPYC\s+8\d{3}", "EPYC", "server", 96),
        (r"EPYC", "EPYC", "server", 128),
        (r"Threadripper\s+PRO", "Threadripper PRO", "workstation", 128),
        (r"Threadripper\s+7\d{3}", "Threadripper", "workstation", 92),
        (r"Threadripper\s+3\d{3}", "Threadripper", "workstation", 88),
        (r"Threadripper", "Threadripper", "workstation", 64),
        (r"Xeon.*\bw[579]-3\d{3}", "Xeon W", "workstation", 112),
        (r"Xeon.*\bw[3579]-2\d{3}", "Xeon W", "workstation", 64),
        (r"Xeon\s+W", "Xeon W", "workstation", None),
        (r"Xeon.*(Platinum|Gold|Silver|Bronze)\s+[4-9]\d{2}[0-9A-Z]", "Xeon", "server", 80),
        (r"Xeon.*(Platinum|Gold|Silver|Bronze)\s+[1-9]\d{2}[0-9A-Z]?\b", "Xeon", "server", None),
        (r"Xeon", "Xeon", "server", None),
        (r"Ryzen\s+\d\s+[79]\d{3}", "Ryzen", "consumer", 24),
        (r"Ryzen", "Ryzen", "consumer", 20),
        (r"Core.*Ultra\s+\d\s+2\d{2}", "Core", "consumer", 20),
        (r"Core.*i\d-1[2-4]\d{3}", "Core", "consumer", 20),
        (r"Core", "Core", "consumer", 16),
    ]
    for pattern, family, cpu_class, lanes in rules:
        if re.search(pattern, model):
            return family, cpu_class, lanes
    return None, None, None


# ---------------------------------------------------------------- nvidia-smi -q


def parse_smi_q(text: str) -> list[dict]:
    """The PCI part of ``nvidia-smi -q`` per GPU: bus id, link generation and width, replays, performance state.

    Takes whole outputs and excerpts (a block without its ``GPU <bus id>`` line
    is one GPU). Old drivers print no GPU Link Info: those fields are null.
    """
    gpus: list[dict] = []
    current: dict | None = None
    path: list[tuple[int, str]] = []

    def new_gpu(bus_id: str | None) -> dict:
        gpu = {
            "bus_id": bus_id,
            "pcie_gen_max": None,
            "pcie_gen_current": None,
            "pcie_gen_device_max": None,
            "pcie_gen_host_max": None,
            "pcie_width_max": None,
            "pcie_width_current": None,
            "pcie_replays": None,
            "performance_state": None,
        }
        gpus.append(gpu)
        return gpu

    for line in text.splitlines():
        if not line.strip():
            continue
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        gpu_header = re.match(r"^GPU\s+([0-9A-Fa-f:.]+)$", stripped)
        if gpu_header and indent == 0:
            current = new_gpu(normalize_bdf(gpu_header.group(1)))
            path = []
            continue
        match = re.match(r"^(.*?)\s+:\s?(.*)$", stripped)
        key, value = (match.group(1).strip(), match.group(2).strip()) if match else (stripped, None)
        while path and path[-1][0] >= indent:
            path.pop()
        section = [name for _indent, name in path]
        if value is None:
            path.append((indent, key))
            continue
        if section[-1:] == ["PCI"] and key == "Bus Id":
            if current is None:
                current = new_gpu(None)
            current["bus_id"] = current["bus_id"] or normalize_bdf(value)
            continue
        if current is None:
            if section[:1] == ["PCI"] or "GPU Link Info" in section or key == "Performance State":
                current = new_gpu(None)
            else:
                continue
        number = _int_or_none(value)
        if section[-2:] == ["GPU Link Info", "PCIe Generation"]:
            field = {
                "Max": "pcie_gen_max",
                "Current": "pcie_gen_current",
                "Device Max": "pcie_gen_device_max",
                "Host Max": "pcie_gen_host_max",
            }.get(key)
            if field:
                current[field] = number
        elif section[-2:] == ["GPU Link Info", "Link Width"]:
            field = {"Max": "pcie_width_max", "Current": "pcie_width_current"}.get(key)
            if field:
                current[field] = _int_or_none(value.rstrip("x"))
        elif key.lower() == "replays since reset":
            current["pcie_replays"] = number
        elif key == "Performance State":
            current["performance_state"] = value
    return gpus


def _int_or_none(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


# ---------------------------------------------------------------- lspci -tv

_TREE_DEVICE_RE = re.compile(r"(?P<dev>[0-9a-f]{2}\.[0-7])(?:-\[(?P<sec>[0-9a-f]{2})(?:-[0-9a-f]{2})?\])?")
_TREE_ROOT_RE = re.compile(r"\[(?P<domain>[0-9a-f]{4}):(?P<bus>[0-9a-f]{2})\]-(?P<branch>[+-])")


def parse_lspci_tree(text: str) -> dict[str, dict]:
    """``lspci -tv`` -> bus id -> {description, parent (the bridge above it, or None on a root bus), secondary bus}.

    Follows the drawing by column: a branch (``+-`` or backslash-``-``) at a
    column belongs to the bus that the bridge which opened that column leads
    to; ``----`` continues to a bridge's only child on the same line.
    """
    devices: dict[str, dict] = {}
    column_bus: dict[int, tuple[str, str]] = {}
    bridge_of_bus: dict[tuple[str, str], str] = {}
    domain = "0000"
    for line in text.splitlines():
        line = line.rstrip()
        root = _TREE_ROOT_RE.search(line)
        position = 0
        inline_bus: tuple[str, str] | None = None
        if root:
            domain = root.group("domain")
            column_bus[root.end() - 1] = (domain, root.group("bus"))
            inline_bus = (domain, root.group("bus"))
            position = root.end()
        elif not re.match(r"^[\s|+\\-]*[+\\]-[0-9a-f]{2}\.[0-7]", line):
            continue
        for match in _TREE_DEVICE_RE.finditer(line, position):
            start = match.start()
            before = line[max(0, start - 2) : start]
            if before in ("+-", "\\-") and (start - 2) in column_bus:
                bus = column_bus[start - 2]
            elif inline_bus is not None and before.endswith("-"):
                bus = inline_bus
            else:
                continue
            bdf = f"{bus[0]}:{bus[1]}:{match.group('dev')}"
            rest = line[match.end() :]
            description = rest.strip() if rest.startswith("  ") else None
            devices[bdf] = {
                "description": description,
                "parent": bridge_of_bus.get(bus),
                "secondary_bus": match.group("sec"),
            }
            inline_bus = None
            if description is not None:
                break  # a leaf: the rest of the line is its name, which may contain look-alikes
            if match.group("sec"):
                child_bus = (bus[0], match.group("sec"))
                bridge_of_bus[child_bus] = bdf
                after = line[match.end() :]
                if after.startswith("--+-"):
                    column_bus[match.end() + 2] = child_bus
                    inline_bus = child_bus
                elif after.startswith("----"):
                    inline_bus = child_bus
    return devices


def tree_chain(devices: dict[str, dict], bdf: str) -> list[str]:
    """Bridges above a device in a parsed tree, nearest first."""
    chain = []
    parent = devices.get(bdf, {}).get("parent")
    while parent and parent not in chain:
        chain.append(parent)
        parent = devices.get(parent, {}).get("parent")
    return chain


# ---------------------------------------------------------------- lspci -vvv (link state)

# A device line: the bus id, then its PCI class and a colon ("01:00.0 VGA compatible controller: NVIDIA ...").
# It may follow a label a script put before it ("Card: 01:00.0 VGA ..."), never another bus id.
_LSPCI_DEVICE_RE = re.compile(
    r"(?:^|^\S*:\s+)(?P<bdf>(?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s+(?P<desc>[A-Z0-9][^:]*:\s*\S.*)$"
)
_LNK_RE = re.compile(r"^\s*(?P<kind>LnkCap|LnkSta):\s*(?P<rest>.*)$")
_LNK_SPEED_RE = re.compile(r"\bSpeed\s+(?P<speed>[\d.]+GT/s|unknown)(?:\s*\((?P<speed_note>[^)]*)\))?")
_LNK_WIDTH_RE = re.compile(r"\bWidth\s+x(?P<width>\d+)(?:\s*\((?P<width_note>[^)]*)\))?")
_GPU_CLASSES_RE = re.compile(r"^(VGA compatible controller|3D controller|Display controller):\s*NVIDIA\b")


class LspciParseError(ValueError):
    """A link line this parser cannot attribute or read; the message names the line."""


def _link_entry(bus_id: str | None, description: str | None) -> dict:
    """One device's link as parse_lspci_links returns it, before its Lnk lines are read (``_lines``: kind -> line)."""
    return {
        "bus_id": bus_id,
        "description": description,
        "is_nvidia_gpu": bool(_GPU_CLASSES_RE.match(description)) if description is not None else None,
        "pcie_gen_max": None,
        "pcie_width_max": None,
        "pcie_gen_current": None,
        "pcie_width_current": None,
        "downgraded": [],
        "_lines": {},
    }


def parse_lspci_links(text: str) -> list[dict]:
    """Each device's PCIe link from ``lspci -vvv`` (or ``-vvd 10de:``, ``-vv -s BDF``, or their LnkCap/LnkSta lines).

    Returns one entry per device with a link, in input order: ``bus_id`` (normalised; null when the input has
    no device line, as with ``lspci -vv | grep LnkSta`` for one device), ``description``, ``is_nvidia_gpu``
    (an NVIDIA VGA, 3D or display controller, not its audio or USB function), ``pcie_gen_max`` and
    ``pcie_width_max`` (LnkCap), ``pcie_gen_current`` and ``pcie_width_current`` (LnkSta), and
    ``downgraded`` (what lspci itself marked: ``speed``, ``width``). Refused, naming the line: a LnkSta or
    LnkCap met twice for one device, or link lines of a second device with no device line between them.
    """
    entries: list[dict] = []
    current: dict | None = None
    for lineno, raw in enumerate(strip_ansi(text).splitlines(), start=1):
        line = raw.rstrip()
        header = _LSPCI_DEVICE_RE.match(line.strip())
        if header and not line.startswith((" ", "\t")):
            current = _link_entry(normalize_bdf(header.group("bdf")), header.group("desc").strip())
            entries.append(current)
            continue
        link = _LNK_RE.match(line)
        if not link:
            continue
        kind = link.group("kind")
        if current is None or kind in current["_lines"]:
            if current is not None and current["bus_id"] is not None:
                raise LspciParseError(
                    f"line {lineno}: a second {kind} for {current['bus_id']} (the first is at line {current['_lines'][kind]})"
                )
            if current is not None:
                raise LspciParseError(
                    f"line {lineno}: a second {kind} with no device line before it, so it cannot be told which device it "
                    "belongs to (save lspci -vvv whole, or one device with lspci -vv -s BUS_ID)"
                )
            current = _link_entry(None, None)
            entries.append(current)
        current["_lines"][kind] = lineno
        speed, width = _LNK_SPEED_RE.search(link.group("rest")), _LNK_WIDTH_RE.search(link.group("rest"))
        if not speed or not width:
            raise LspciParseError(f"line {lineno}: {kind} without a Speed and a Width ({line.strip()!r})")
        suffix = "max" if kind == "LnkCap" else "current"
        current[f"pcie_gen_{suffix}"] = speed_to_gen(speed.group("speed"))
        current[f"pcie_width_{suffix}"] = int(width.group("width"))
        if kind == "LnkSta":
            current["downgraded"] = [
                what for what, note in (("speed", speed.group("speed_note")), ("width", width.group("width_note")))
                if note == "downgraded"
            ]  # fmt: skip
    for entry in entries:
        entry.pop("_lines")
    return [entry for entry in entries if entry["pcie_gen_max"] or entry["pcie_gen_current"] or entry["pcie_width_current"]]


# ---------------------------------------------------------------- sysfs


def read_sysfs_pci(root: str = "/") -> dict[str, dict]:
    """Every PCI device under ``<root>/sys/bus/pci/devices``: ids, class, link speed/width, and the bridges above it."""
    base = os.path.join(root, "sys", "bus", "pci", "devices")
    devices: dict[str, dict] = {}
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return devices
    for name in names:
        link = os.path.join(base, name)
        real = os.path.realpath(link)

        def read(attribute: str, real: str = real) -> str | None:
            try:
                with open(os.path.join(real, attribute), encoding="ascii") as handle:
                    return handle.read().strip() or None
            except (OSError, UnicodeDecodeError):
                return None

        parts = [p for p in real.split(os.sep) if normalize_bdf(p) and p.count(":") == 2]
        chain = list(reversed(parts[:-1]))
        devices[name] = {
            "vendor": read("vendor"),
            "device": read("device"),
            "class": read("class"),
            "current_link_speed": read("current_link_speed"),
            "max_link_speed": read("max_link_speed"),
            "current_link_width": read("current_link_width"),
            "max_link_width": read("max_link_width"),
            "parents": chain,
        }
    return devices


# ---------------------------------------------------------------- decisions


def is_chipset_bridge(bdf: str, info: dict | None, description: str | None = None) -> bool:
    info = info or {}
    if info.get("vendor") == "0x1022" and info.get("device") in AMD_CHIPSET_BRIDGES:
        return True
    if description and _CHIPSET_WORDS_RE.search(description):
        return True
    match = _BDF_RE.match(bdf)
    return bool(
        match
        and info.get("vendor") == "0x8086"
        and int(match.group("bus"), 16) == 0
        and match.group("dev").lower() in INTEL_PCH_ROOT_DEVICES
    )


def judge_link(gpu: dict, load_state: str | None = None) -> tuple[bool | None, str]:
    """Whether a GPU's link trained below what both ends support, and why (or why not).

    A generation below the best is power saving when the GPU idles (P8 drops to 2.5 GT/s) and a fault under
    load. The load comes from nvidia-smi's performance state or, for a saved lspci, from what the caller says
    of it (``load_state`` ``load`` or ``idle``); a saved lspci without it cannot tell the two apart.
    """
    width, width_best = gpu.get("pcie_width_current"), _min(gpu.get("pcie_width_max"), gpu.get("pcie_width_host_max"))
    gen, gen_best = gpu.get("pcie_gen_current"), _min(gpu.get("pcie_gen_max"), gpu.get("pcie_gen_host_max"))
    if width and width_best and width < width_best:
        return True, f"the link runs at x{width} where both ends support x{width_best}"
    if gen and gen_best and gen < gen_best:
        state = gpu.get("performance_state")
        if state in ("P0", "P1", "P2"):
            return True, f"the link runs at Gen{gen} under load ({state}) where both ends support Gen{gen_best}"
        if state is None and load_state == "load":
            return True, f"the link runs at Gen{gen} under load (as saved) where both ends support Gen{gen_best}"
        if state is None and load_state is None and gpu.get("link_source") == "lspci":
            return None, (
                f"Gen{gen} of Gen{gen_best} in a saved lspci: an idle GPU drops to Gen1 to save power, so without the "
                "load state (lspci_under_load) this cannot tell power saving from a downtrained link"
            )
        idle = f"idle ({state})" if state else "idle (as saved)" if load_state == "idle" else "possibly idle"
        return False, f"Gen{gen} of Gen{gen_best} while {idle} is power saving; check it under load"
    if width is None and gen is None:
        return None, "link speed and width are not known"
    return False, "the link runs at what both ends support"


def _min(*values: int | None) -> int | None:
    known = [v for v in values if v]
    return min(known) if known else None


def nvidia_gpus(sysfs: dict[str, dict]) -> list[str]:
    """Bus ids of the NVIDIA display and 3D controllers in a ``read_sysfs_pci`` result."""
    return [
        bdf
        for bdf, info in sorted(sysfs.items())
        if info.get("vendor") == NVIDIA_VENDOR and (info.get("class") or "").startswith("0x03")
    ]


def _tree_gpus(tree: dict[str, dict]) -> list[str]:
    """NVIDIA GPUs (function 0, not their audio or USB functions) in a parsed ``lspci -tv`` tree."""
    return [
        bdf
        for bdf, info in sorted(tree.items())
        if (info.get("description") or "").startswith("NVIDIA")
        and bdf.endswith(".0")
        and not re.search(r"Audio|USB|UCSI|Serial", info["description"])
    ]


def analyse_platform(
    cpuinfo: str | None = None,
    sysfs: dict[str, dict] | None = None,
    smi_q: list[dict] | None = None,
    tree: dict[str, dict] | None = None,
    lspci: list[dict] | None = None,
    lspci_under_load: bool | None = None,
) -> dict:
    """The platform report: ``cpu`` and one entry per NVIDIA GPU (display or 3D controller).

    Link state comes from nvidia-smi -q first, then /sys, then a saved lspci (``lspci``, from
    ``parse_lspci_links``); ``link_source`` says which. ``lspci_under_load`` is what the caller knows of
    the load when that lspci was saved (True, False, or None for not known).
    """
    sysfs = sysfs or {}
    tree = tree or {}
    smi_by_bus = {g["bus_id"]: g for g in smi_q or [] if g.get("bus_id")}
    links_by_bus = {e["bus_id"]: e for e in lspci or [] if e.get("bus_id")}
    bus_ids = nvidia_gpus(sysfs)
    if not bus_ids:  # analysing saved outputs of another machine
        bus_ids = [g["bus_id"] for g in smi_q or [] if g.get("bus_id")]
        bus_ids += [b for b in _tree_gpus(tree) if b not in bus_ids]
        bus_ids += [e["bus_id"] for e in lspci or [] if e.get("is_nvidia_gpu") and e["bus_id"] not in bus_ids]
    unlabelled = [g for g in smi_q or [] if not g.get("bus_id")]
    unlabelled_links = [e for e in lspci or [] if not e.get("bus_id")]
    gpus = []
    for bdf in bus_ids:
        info = sysfs.get(bdf, {})
        chain = info.get("parents") or tree_chain(tree, bdf)
        smi = smi_by_bus.get(bdf) or (unlabelled[0] if len(unlabelled) == 1 and len(bus_ids) == 1 else {})
        link = links_by_bus.get(bdf) or (unlabelled_links[0] if len(unlabelled_links) == 1 and len(bus_ids) == 1 else {})
        upstream = sysfs.get(chain[0], {}) if chain else {}
        upstream_link = links_by_bus.get(chain[0], {}) if chain else {}
        sources = [
            ("nvidia-smi", smi.get("pcie_gen_current")),
            ("sysfs", speed_to_gen(info.get("current_link_speed"))),
            ("lspci", link.get("pcie_gen_current")),
        ]
        gpu = {
            "bus_id": bdf,
            "root_port": chain[-1] if chain else None,
            "bridges": chain,
            "behind_chipset": any(is_chipset_bridge(b, sysfs.get(b), (tree.get(b) or {}).get("description")) for b in chain)
            if chain
            else None,
            "pcie_gen_current": next((gen for _source, gen in sources if gen), None),
            "pcie_gen_max": smi.get("pcie_gen_device_max")
            or smi.get("pcie_gen_max")
            or speed_to_gen(info.get("max_link_speed"))
            or link.get("pcie_gen_max"),
            "pcie_gen_host_max": smi.get("pcie_gen_host_max")
            or speed_to_gen(upstream.get("max_link_speed"))
            or upstream_link.get("pcie_gen_max"),
            "pcie_width_current": smi.get("pcie_width_current")
            or _int_or_none(info.get("current_link_width"))
            or link.get("pcie_width_current"),
            "pcie_width_max": smi.get("pcie_width_max") or _int_or_none(info.get("max_link_width")) or link.get("pcie_width_max"),
            "pcie_width_host_max": _int_or_none(upstream.get("max_link_width")) or upstream_link.get("pcie_width_max"),
            "pcie_replays": smi.get("pcie_replays"),
            "performance_state": smi.get("performance_state"),
            "link_source": next((source for source, gen in sources if gen), None),
            "lspci_downgraded": link.get("downgraded") if link else None,
        }
        saved_load = None if gpu["link_source"] != "lspci" or lspci_under_load is None else "load" if lspci_under_load else "idle"
        gpu["downtrained"], gpu["link_note"] = judge_link(gpu, saved_load)
        gpus.append(gpu)
    return {"cpu": parse_cpuinfo(cpuinfo or ""), "gpus": gpus}
