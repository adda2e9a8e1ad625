"""_acs against every captured lspci output; each file's ``# expected:`` header is the ground truth."""

from __future__ import annotations

import subprocess

import pytest
from conftest import captures, require
from hardware import config_space, lspci_dump

from ansible_collections.gpubox.inference.plugins.module_utils._acs import (
    ACS_FLAGS,
    AcsParseError,
    judge_acs,
    parse_cmdline,
    parse_config_acs,
    parse_lspci_acs,
    redirects,
    sysfs_acs,
)

CAPS = {c.path.stem: c for c in captures("C_lspci")}
ALL_OFF = dict.fromkeys(ACS_FLAGS, False)


def flags(text: str) -> dict[str, bool]:
    return {token[:-1]: token[-1] == "+" for token in text.split()}


def acs(stem: str) -> list[dict]:
    return parse_lspci_acs(CAPS[stem].text)


def test_epyc_root_port_redirects_p2p():
    (entry,) = acs("amd_epyc_gpp_bridge_40_01_1_acs_enabled_elided_plus_tv_subtree_rccl547")
    assert entry["bdf"] == "40:01.1"
    assert entry["description"].startswith("PCI bridge: Advanced Micro Devices, Inc. [AMD] Starship/Matisse GPP Bridge")
    assert entry["cap"] == flags("SrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans+")
    assert entry["ctl"] == flags("SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-")
    assert redirects(entry) == ["ReqRedir", "CmpltRedir"]
    verdict = judge_acs([entry])
    assert verdict["verdict"] == "redirected"
    assert "40:01.1" in verdict["reason"]


def test_grepped_acsctl_lines_have_no_device_and_keep_their_order():
    entries = acs("amd_pcie_switch_grep_ACSCtl_mixed_SrcValid_nccl606")
    assert len(entries) == 9
    assert all(e["bdf"] is None and e["cap"] is None for e in entries)
    assert [e["ctl"]["SrcValid"] for e in entries] == [True, True, False, False, False, False, False, True, True]
    assert all(not redirects(e) for e in entries)
    assert judge_acs(entries)["verdict"] == "clear"


def test_puget_wrx90_all_26_disabled():
    entries = acs("puget_wrx90_lspci_vvv_grep_ACSCtl_all_disabled")
    assert len(entries) == 26
    assert all(e["ctl"] == ALL_OFF for e in entries)
    assert judge_acs(entries)["verdict"] == "clear"


def test_plx_switch_port_has_acs_capable_but_disabled():
    (entry,) = acs("plx_pex8747_downstream_port_03_08_0_full_vvv_acs_disabled_titanx")
    assert entry["bdf"] == "03:08.0"
    assert entry["description"].startswith("PCI bridge: PLX Technology, Inc. PEX 8747")
    assert entry["cap"] == dict.fromkeys(ACS_FLAGS, True)
    assert entry["ctl"] == ALL_OFF


def test_redacted_capture_reads_its_acs_without_a_device_header():
    (entry,) = acs("rtx3090_x8_upstream_amd_00_03_2_acs_enabled_redaction_corrupted_club3090_1095")
    assert entry["bdf"] is None  # its '# lspci -vvv -s ...' lines are comments, not device headers
    assert redirects(entry) == ["ReqRedir", "CmpltRedir"]
    assert judge_acs([entry])["reason"].startswith("ACS on a bridge (the input names no device) redirects")


@pytest.mark.parametrize(
    "stem",
    [
        "rtx6000ada_endpoint_lspci_vvv_c1_00_0_lnksta_downgraded",
        "asus_esc8000a_e12_genoa_4x_rtx6000ada_separate_root_complexes_lspci_tv",
    ],
)
def test_outputs_without_acs_say_unknown(stem):
    assert acs(stem) == []
    assert judge_acs([])["verdict"] == "unknown"


def test_every_capture_parses():
    for stem in CAPS:
        parse_lspci_acs(CAPS[stem].text)


def test_truncated_flag_line_names_the_line():
    with pytest.raises(AcsParseError, match=r"line 2: ACS flags EgressCtrl, DirectTrans are missing"):
        parse_lspci_acs("00:01.1 PCI bridge: x\n\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+\n")


def test_bridges_between_gpu_pairs_decide_when_paths_are_known():
    entries = parse_lspci_acs(
        "0000:00:01.1 PCI bridge: root port\n"
        "\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-\n"
        "0000:02:00.0 PCI bridge: switch downstream A\n"
        "\t\tACSCtl:\tSrcValid- TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- EgressCtrl- DirectTrans-\n"
        "0000:02:01.0 PCI bridge: switch downstream B\n"
        "\t\tACSCtl:\tSrcValid- TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- EgressCtrl- DirectTrans-\n"
    )
    # Both GPUs behind one switch below the redirecting root port:
    # P2P turns at the switch and never crosses the root port.
    paths = {
        "0000:03:00.0": ["0000:02:00.0", "0000:01:00.0", "0000:00:01.1"],
        "0000:04:00.0": ["0000:02:01.0", "0000:01:00.0", "0000:00:01.1"],
    }
    verdict = judge_acs(entries, paths)
    assert verdict["verdict"] == "clear"
    assert verdict["gpu_pairs"][0]["bridges"] == ["0000:02:00.0", "0000:02:01.0", "0000:01:00.0"]
    # Redirect on a switch port between them: redirected.
    entries[1]["ctl"]["ReqRedir"] = True
    verdict = judge_acs(entries, paths)
    assert verdict["verdict"] == "redirected"
    assert verdict["gpu_pairs"][0]["redirecting"] == ["0000:02:00.0"]
    # Nothing could be read (no lspci, or no root): unknown, whatever the paths, with the reason given.
    verdict = judge_acs([], paths, unreadable="lspci is not installed.")
    assert (verdict["verdict"], verdict["reason"]) == ("unknown", "lspci is not installed.")
    assert verdict["gpu_pairs"][0]["gpus"] == ["0000:03:00.0", "0000:04:00.0"]
    assert judge_acs([], None, unreadable="no root.")["reason"] == "no root."


def register(flags: dict[str, bool]) -> int:
    """An ACS capability or control register with these flags set (bit i is ACS_FLAGS[i])."""
    return sum(1 << bit for bit, name in enumerate(ACS_FLAGS) if flags[name])


# Every ACSCap/ACSCtl pair the captures hold, the settings real bridges have (a grepped ACSCtl line
# without its ACSCap gets every capability).
REAL_PAIRS = sorted({(register(e["cap"] or dict.fromkeys(ACS_FLAGS, True)), register(e["ctl"])) for s in CAPS for e in acs(s)})


def test_the_captures_hold_several_real_settings():
    # Redirecting and not, SrcValid alone, full and partial capabilities.
    assert {(0x5F, 0x1D), (0x7F, 0x00), (0x7F, 0x01)} <= set(REAL_PAIRS)


@pytest.mark.parametrize(("cap", "ctl"), REAL_PAIRS, ids=lambda v: f"{v:#04x}")
def test_config_space_reads_as_lspci_decodes_it(cap, ctl, tmp_path):
    """The raw reader against the real lspci decoding the same bytes (``lspci -F`` reads a dump)."""
    config = config_space((cap, ctl))
    got = parse_config_acs(config)
    assert (register(got["cap"]), register(got["ctl"])) == (cap, ctl)
    dump = tmp_path / "dump"
    dump.write_text(lspci_dump("40:01.1", config))
    decoded = subprocess.run([require("lspci"), "-F", str(dump), "-vvv"], capture_output=True, text=True, check=True).stdout
    (entry,) = parse_lspci_acs(decoded)
    assert (entry["cap"], entry["ctl"]) == (got["cap"], got["ctl"])


def test_config_space_without_acs():
    assert parse_config_acs(config_space(None)) is None  # AER only
    assert parse_config_acs(config_space(None, size=256)) is None  # conventional PCI: no extended space
    assert parse_config_acs(config_space((0x5F, 0x1D))[:64]) is None  # what a reader without root gets
    assert parse_config_acs(bytes(4096)) is None  # an empty list
    assert parse_config_acs(b"\xff" * 4096) is None  # a device that is gone reads all ones


def test_a_broken_capability_list_is_named():
    looped = bytearray(config_space(None))
    looped[0x100:0x104] = (0x0001 | 1 << 16 | 0x100 << 20).to_bytes(4, "little")
    with pytest.raises(AcsParseError, match=r"points to 0x100, again"):
        parse_config_acs(bytes(looped))
    with pytest.raises(AcsParseError, match=r"points to 0x148, outside the 320-byte space"):
        parse_config_acs(config_space((0x5F, 0x1D))[:0x140])


def test_sysfs_acs_names_devices_and_says_when_it_cannot_read():
    redirecting, off = config_space((0x5F, 0x1D)), config_space((0x7F, 0x00), vendor=0x10B5, device=0x8747)
    devices = {
        "0000:40:01.1": {"config": redirecting, "size": 4096, "class": "0x060400", "vendor": "0x1022", "device": "0x1483"},
        "0000:03:08.0": {"config": off, "size": 4096, "class": "0x060400", "vendor": "0x10b5", "device": "0x8747"},
        "0000:41:00.0": {"config": config_space(None, class_code=0x0300), "size": 4096, "class": "0x030000"},
        "0000:00:00.0": {"config": None, "size": None, "class": "0x060000"},  # no file: skipped
    }
    entries, why = sysfs_acs(devices)
    assert why is None
    assert [(e["bdf"], e["description"]) for e in entries] == [
        ("0000:03:08.0", "PCI bridge [10b5:8747]"),
        ("0000:40:01.1", "PCI bridge [1022:1483]"),
    ]
    assert entries[0]["cap"] == dict.fromkeys(ACS_FLAGS, True)
    assert entries[0]["ctl"] == ALL_OFF
    assert redirects(entries[1]) == ["ReqRedir", "CmpltRedir"]
    assert judge_acs(entries, complete=True)["reason"].startswith("ACS on 0000:40:01.1 redirects")
    # Without root the kernel gives the first 64 bytes of each space: unknown, and why.
    short = {bdf: {**d, "config": d["config"] and d["config"][:64]} for bdf, d in devices.items()}
    assert sysfs_acs(short) == ([], "the PCI configuration space in /sys gives only its first 64 bytes of "
                                    "0000:03:08.0 (not root?)")  # fmt: skip
    assert sysfs_acs({"0000:00:00.0": devices["0000:00:00.0"]}) == ([], "no PCI configuration space could be read in /sys")
    broken = {"0000:40:01.1": {**devices["0000:40:01.1"], "config": redirecting[:0x140], "size": 0x140}}
    with pytest.raises(AcsParseError, match=r"^0000:40:01.1: the extended capability list points to 0x148"):
        sysfs_acs(broken)


def test_no_acs_anywhere_is_clear_only_when_every_device_was_read():
    assert judge_acs([])["verdict"] == "unknown"
    verdict = judge_acs([], complete=True)
    assert (verdict["verdict"], verdict["reason"]) == (
        "clear", "No PCI device has an ACS capability, so none redirects peer-to-peer traffic."
    )  # fmt: skip


@pytest.mark.parametrize(
    ("cmdline", "mode", "enabled", "noacs"),
    [
        ("BOOT_IMAGE=/vmlinuz ro quiet splash", "unknown", None, False),
        ("ro quiet amd_iommu=on iommu=pt", "passthrough", True, False),
        ("ro intel_iommu=on,sm_on", "translated", True, False),
        ("ro iommu=off", "off", False, False),
        ("ro amd_iommu=off pci=noacs", "off", False, True),
        ("ro iommu.passthrough=1 pci=realloc,noacs", "passthrough", True, True),
    ],
)
def test_cmdline(cmdline, mode, enabled, noacs):
    result = parse_cmdline(cmdline)
    assert (result["mode"], result["enabled"], result["pci_noacs"]) == (mode, enabled, noacs)
