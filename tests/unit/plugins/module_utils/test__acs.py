"""_acs against every captured lspci output; each file's ``# expected:`` header is the ground truth."""

from __future__ import annotations

import pytest
from conftest import captures

from ansible_collections.gpubox.inference.plugins.module_utils._acs import (
    ACS_FLAGS,
    AcsParseError,
    judge_acs,
    parse_cmdline,
    parse_lspci_acs,
    redirects,
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
