# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Private: read PCIe ACS (``lspci -vvv`` or raw config space) and IOMMU settings (the kernel command line).

Pure functions, text in and data out, no Ansible imports, except ``read_configs``, which reads
each device's configuration space under a root folder (/ on a box, a hand-made tree in tests),
as ``_pcie.read_sysfs_pci`` reads /sys. ACS (Access Control
Services) on a PCIe bridge decides whether a peer-to-peer request between two
devices below it may go straight across, or is redirected up to the root
complex (and through the IOMMU when it translates). Redirected GPU P2P is the
classic cause of NCCL hangs and silent slowdowns on consumer and workstation
boards, so the parser reports every ACS capability it sees, and ``judge_acs``
says whether P2P is being redirected and where.
"""

from __future__ import annotations

import os
import re

from ansible_collections.gpubox.inference.plugins.module_utils._pcie import normalize_bdf

ACS_FLAGS = ("SrcValid", "TransBlk", "ReqRedir", "CmpltRedir", "UpstreamFwd", "EgressCtrl", "DirectTrans")
# Control bits that send P2P requests or completions up to the root complex instead of across.
REDIRECT_FLAGS = ("ReqRedir", "CmpltRedir", "EgressCtrl")

# "0000:40:01.1 PCI bridge: ..." or "40:01.1 PCI bridge: ..." at the start of a line.
_DEVICE_HEADER_RE = re.compile(r"^(?P<bdf>(?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s+(?P<desc>\S.*)$")
_ACS_LINE_RE = re.compile(r"^\s*(?P<kind>ACSCap|ACSCtl)\s*:\s*(?P<flags>.*)$")
_FLAG_RE = re.compile(r"\b(" + "|".join(ACS_FLAGS) + r")([+-])")

# The PCI Express extended capability of Access Control Services: after its 4-byte header
# come the 16-bit capability and control registers, bit i standing for ACS_FLAGS[i] in both.
ACS_EXT_CAP_ID = 0x000D
_EXT_CAP_START = 0x100  # where the extended capability list starts; conventional PCI ends here
# Class codes of /sys/bus/pci/devices/*/class (base class and subclass) named as lspci names them.
_CLASS_NAMES = {"0x0600": "Host bridge", "0x0604": "PCI bridge", "0x0300": "VGA compatible controller",
                "0x0302": "3D controller"}  # fmt: skip


class AcsParseError(ValueError):
    """An ACS line this parser cannot read; the message names the line."""


def parse_flags(text: str, lineno: int, line: str) -> dict[str, bool]:
    flags = {name: sign == "+" for name, sign in _FLAG_RE.findall(text)}
    missing = [name for name in ACS_FLAGS if name not in flags]
    if missing:
        raise AcsParseError(f"line {lineno}: ACS flags {', '.join(missing)} are missing ({line.strip()!r})")
    return flags


def parse_lspci_acs(text: str) -> list[dict]:
    """Every ACS capability in ``lspci -vvv`` output (whole, one device, or just grepped ACSCtl lines).

    Returns one entry per ACSCtl line, in input order: ``bdf`` (as printed; null
    when the input has no device header, as with ``lspci -vvv | grep ACSCtl``),
    ``description`` (the rest of the header line), ``cap`` (the ACSCap flags
    before it in the same device, or null) and ``ctl`` (the control flags), as
    booleans keyed SrcValid, TransBlk, ReqRedir, CmpltRedir, UpstreamFwd,
    EgressCtrl, DirectTrans.
    """
    entries: list[dict] = []
    bdf = description = None
    cap: dict[str, bool] | None = None
    for lineno, line in enumerate(text.splitlines(), start=1):
        header = _DEVICE_HEADER_RE.match(line)
        if header:
            bdf, description, cap = header.group("bdf").lower(), header.group("desc").strip(), None
            continue
        acs = _ACS_LINE_RE.match(line)
        if not acs:
            continue
        flags = parse_flags(acs.group("flags"), lineno, line)
        if acs.group("kind") == "ACSCap":
            cap = flags
        else:
            entries.append({"bdf": bdf, "description": description, "cap": cap, "ctl": flags})
            cap = None
    return entries


def parse_config_acs(config: bytes) -> dict | None:
    """The ACS capability in one device's configuration space (``/sys/bus/pci/devices/<bdf>/config``).

    Walks the extended capability list from offset 0x100 and returns ``cap`` and
    ``ctl`` as booleans keyed as in parse_lspci_acs, or None when the device has
    no ACS capability or no extended space (256 bytes or fewer: conventional PCI,
    or a read without root, which the caller tells apart by the file's size).
    Raises AcsParseError for a list that loops or points outside the space.
    """
    offset, seen = _EXT_CAP_START, set()
    while offset and len(config) > _EXT_CAP_START:
        if offset in seen or offset < _EXT_CAP_START or offset + 8 > len(config):
            raise AcsParseError(f"the extended capability list points to {offset:#x}, "
                                f"{'again' if offset in seen else f'outside the {len(config)}-byte space'}")  # fmt: skip
        seen.add(offset)
        header = int.from_bytes(config[offset : offset + 4], "little")
        if header in (0, 0xFFFFFFFF):  # no extended capabilities, or the device is gone
            return None
        if header & 0xFFFF == ACS_EXT_CAP_ID:
            registers = [int.from_bytes(config[at : at + 2], "little") for at in (offset + 4, offset + 6)]
            cap, ctl = ({name: bool(value >> bit & 1) for bit, name in enumerate(ACS_FLAGS)} for value in registers)
            return {"cap": cap, "ctl": ctl}
        offset = header >> 20 & 0xFFC
    return None


def read_configs(root: str, sysfs: dict[str, dict]) -> dict[str, dict]:
    """Each device of a ``_pcie.read_sysfs_pci`` result with its configuration space as /sys gives it to this user.

    ``config`` is the bytes read (None when there is no file), ``size`` the file's full size (a reader without
    root gets only the first 64 bytes of a 4096-byte space). ``root`` is / on a box, a hand-made tree in tests.
    """
    devices = {}
    for bdf, info in sysfs.items():
        path = os.path.join(root, "sys", "bus", "pci", "devices", bdf, "config")
        try:
            with open(path, "rb") as handle:
                config = handle.read()
            size = os.path.getsize(path)
        except OSError:
            config, size = None, None
        devices[bdf] = {**info, "config": config, "size": size}
    return devices


def sysfs_acs(devices: dict[str, dict]) -> tuple[list[dict], str | None]:
    """ACS entries, as parse_lspci_acs gives them, from each device's configuration space read in /sys.

    ``devices``: bus id -> ``config`` (the bytes read, or None when there is no
    file), ``size`` (the file's size: 256 or 4096), ``class``, ``vendor`` and
    ``device`` (as in /sys). Returns the entries in bus order and, when some
    space could not be read whole, why ACS is unknown (the kernel gives only the
    first 64 bytes to a reader without root).
    """
    read = {bdf: d for bdf, d in devices.items() if d.get("config") is not None}
    if not read:
        return [], "no PCI configuration space could be read in /sys"
    short = sorted(bdf for bdf, d in read.items() if len(d["config"]) < (d.get("size") or 0))
    if short:
        return [], (f"the PCI configuration space in /sys gives only its first {len(read[short[0]]['config'])} bytes "
                    f"of {short[0]} (not root?)")  # fmt: skip
    entries = []
    for bdf in sorted(read):
        try:
            acs = parse_config_acs(read[bdf]["config"])
        except AcsParseError as exc:
            raise AcsParseError(f"{bdf}: {exc}") from None
        if acs:
            info = read[bdf]
            name = _CLASS_NAMES.get((info.get("class") or "")[:6], f"class {(info.get('class') or '?')[:6]}")
            ids = f"{(info.get('vendor') or '?').removeprefix('0x')}:{(info.get('device') or '?').removeprefix('0x')}"
            entries.append({"bdf": bdf, "description": f"{name} [{ids}]", **acs})
    return entries, None


def redirects(entry: dict) -> list[str]:
    """The control bits of one ACS entry that redirect P2P traffic."""
    return [flag for flag in REDIRECT_FLAGS if entry["ctl"].get(flag)]


def judge_acs(
    entries: list[dict],
    gpu_paths: dict[str, list[str]] | None = None,
    unreadable: str | None = None,
    complete: bool = False,
) -> dict:
    """Whether GPU peer-to-peer traffic is redirected to the root complex, and where.

    ``unreadable`` says why no capability could be read (lspci missing, or run
    without root): the verdict is then ``unknown`` with that reason, since a
    bridge whose ACS nobody could read may still redirect. ``complete`` says the
    entries are every ACS capability of the host (read from each device's
    configuration space), so none at all means nothing can redirect.

    ``gpu_paths`` maps each GPU's bus id to the bridges above it (nearest first),
    when known (read live from sysfs). Without it, every redirecting bridge in
    the input counts, since nothing says which devices sit below it.
    """
    redirecting = [{"bdf": e["bdf"], "flags": redirects(e)} for e in entries if redirects(e)]
    result: dict = {"redirecting": redirecting, "gpu_pairs": []}
    if gpu_paths and len(gpu_paths) >= 2:
        by_bdf = {normalize_bdf(e["bdf"]): e for e in entries if e["bdf"]}
        gpus = sorted(gpu_paths)
        for i, a in enumerate(gpus):
            for b in gpus[i + 1 :]:
                shared = set(gpu_paths[a]) & set(gpu_paths[b])
                # Bridges on the way from each GPU up to where the two paths meet.
                between = [p for p in gpu_paths[a] if p not in shared] + [p for p in gpu_paths[b] if p not in shared]
                common = next((p for p in gpu_paths[a] if p in shared), None)
                if common:
                    between.append(common)
                blocking = [p for p in between if p in by_bdf and redirects(by_bdf[p])]
                result["gpu_pairs"].append({"gpus": [a, b], "bridges": between, "redirecting": blocking})
        bad = [p for p in result["gpu_pairs"] if p["redirecting"]]
        if unreadable:
            result.update(verdict="unknown", reason=unreadable)
        elif bad:
            first = bad[0]
            result.update(
                verdict="redirected",
                reason=f"ACS on {first['redirecting'][0]} redirects peer-to-peer traffic between "
                f"{first['gpus'][0]} and {first['gpus'][1]} up to the root complex.",
            )
        else:
            result.update(verdict="clear", reason="No bridge between any two GPUs redirects peer-to-peer traffic.")
        return result
    if unreadable:
        result.update(verdict="unknown", reason=unreadable)
    elif not entries and complete:
        result.update(verdict="clear", reason="No PCI device has an ACS capability, so none redirects peer-to-peer traffic.")
    elif not entries:
        result.update(verdict="unknown", reason="No ACS capability was found (lspci needs root to show it).")
    elif redirecting:
        where = redirecting[0]["bdf"] or "a bridge (the input names no device)"
        result.update(
            verdict="redirected",
            reason=f"ACS on {where} redirects peer-to-peer traffic ({', '.join(redirecting[0]['flags'])}) "
            "up to the root complex.",
        )
    else:
        result.update(verdict="clear", reason="No ACS capability redirects peer-to-peer traffic.")
    return result


_IOMMU_FLAG_RE = re.compile(r"^(iommu|amd_iommu|intel_iommu|pci|iommu\.passthrough|iommu\.strict)=(.*)$")


def parse_cmdline(text: str) -> dict:
    """IOMMU settings from ``/proc/cmdline``.

    ``mode``: ``passthrough`` (iommu=pt or iommu.passthrough=1: devices are not
    translated, so P2P is not remapped), ``off`` (iommu=off, intel_iommu=off,
    amd_iommu=off), ``translated`` (intel_iommu=on or iommu.passthrough=0 without
    pt), else ``unknown`` (the kernel default, which depends on the distribution
    and the firmware; read live, the IOMMU groups decide).
    """
    flags = {}
    for token in text.split():
        match = _IOMMU_FLAG_RE.match(token)
        if match:
            flags[match.group(1)] = match.group(2)
    options = {key: value.split(",") for key, value in flags.items()}
    mode = "unknown"
    if "off" in options.get("iommu", []) + options.get("intel_iommu", []) + options.get("amd_iommu", []):
        mode = "off"
    elif "pt" in options.get("iommu", []) or flags.get("iommu.passthrough") == "1":
        mode = "passthrough"
    elif "on" in options.get("intel_iommu", []) + options.get("amd_iommu", []) or flags.get("iommu.passthrough") == "0":
        mode = "translated"
    pci_options = options.get("pci", [])
    return {
        "mode": mode,
        "enabled": {"off": False, "unknown": None}.get(mode, True),
        "flags": [f"{k}={v}" for k, v in flags.items()],
        "pci_noacs": "noacs" in pci_options,
    }
