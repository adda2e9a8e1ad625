"""iommu_acs_info run as Ansible runs it: saved outputs, a hand-made /sys tree, and this machine's real lspci."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ANSIBLE_ENV, FIXTURES, parse_capture, require, run_module
from hardware import bridge, config_space, gpu, make_sysfs

from ansible_collections.gpubox.inference.plugins.module_utils._acs import parse_lspci_acs

EPYC = FIXTURES / "C_lspci" / "amd_epyc_gpp_bridge_40_01_1_acs_enabled_elided_plus_tv_subtree_rccl547.txt"


def saved(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_saved_lspci_and_cmdline(tmp_path: Path):
    result = run_module(
        "iommu_acs_info",
        {
            "lspci_src": saved(tmp_path, "lspci.txt", parse_capture(EPYC).text),
            "cmdline_src": saved(tmp_path, "cmdline", "BOOT_IMAGE=/vmlinuz ro amd_iommu=on iommu=pt\n"),
        },
        check=True,
    )
    assert result["changed"] is False
    assert result["iommu"]["mode"] == "passthrough"
    assert result["iommu"]["flags"] == ["amd_iommu=on", "iommu=pt"]
    (entry,) = result["acs"]
    assert (entry["bdf"], result["acs_source"]) == ("40:01.1", "lspci_src")
    assert result["acs_verdict"]["verdict"] == "redirected"


def test_gpu_pairs_and_iommu_groups_from_a_sysfs_tree(tmp_path: Path):
    root = make_sysfs(
        tmp_path / "root",
        {
            "pci0000:40/0000:40:01.1": bridge(),
            "pci0000:40/0000:40:01.1/0000:41:00.0": gpu(),
            "pci0000:40/0000:40:03.1": bridge(),
            "pci0000:40/0000:40:03.1/0000:42:00.0": gpu(),
        },
    )
    groups = root / "sys" / "kernel" / "iommu_groups"
    for number, bdf in (("14", "0000:41:00.0"), ("15", "0000:42:00.0")):
        (groups / number).mkdir(parents=True)
        device = os.path.realpath(root / "sys" / "bus" / "pci" / "devices" / bdf)
        os.symlink(os.path.relpath(groups / number, device), Path(device) / "iommu_group")
    lspci = (
        "40:01.1 PCI bridge: AMD GPP Bridge\n"
        "\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-\n"
        "40:03.1 PCI bridge: AMD GPP Bridge\n"
        "\t\tACSCtl:\tSrcValid- TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- EgressCtrl- DirectTrans-\n"
    )
    result = run_module(
        "iommu_acs_info",
        {
            "sysfs_root": str(root),
            "lspci_src": saved(tmp_path, "lspci.txt", lspci),
            "cmdline_src": saved(tmp_path, "cmdline", "ro quiet\n"),
        },
    )
    assert result["iommu"]["groups"] == {"0000:41:00.0": "14", "0000:42:00.0": "15"}
    assert result["iommu"]["enabled"] is True
    (pair,) = result["acs_verdict"]["gpu_pairs"]
    assert pair == {
        "gpus": ["0000:41:00.0", "0000:42:00.0"],
        "bridges": ["0000:40:01.1", "0000:40:03.1"],
        "redirecting": ["0000:40:01.1"],
    }
    assert result["acs_verdict"]["verdict"] == "redirected"


def test_live_host_runs_the_real_lspci():
    result = run_module("iommu_acs_info", {})
    assert result.get("failed") is not True, result
    assert result["acs_source"] == "lspci -vvv"
    assert result["acs_verdict"]["verdict"] in ("clear", "redirected", "unknown")
    assert result["iommu"]["mode"] in ("passthrough", "translated", "off", "unknown")


def test_damaged_acs_line_names_the_source_and_line(tmp_path: Path):
    bad = saved(tmp_path, "bad.txt", "00:01.1 PCI bridge: x\n\t\tACSCtl:\tSrcValid+ TransBlk-\n")
    result = run_module("iommu_acs_info", {"lspci_src": bad, "cmdline_src": saved(tmp_path, "c", "ro\n")})
    assert result["failed"] is True
    assert result["msg"].startswith(f"cannot read lspci_src={bad}: line 2: ACS flags ReqRedir")


@pytest.fixture
def no_lspci(tmp_path: Path, monkeypatch):
    """Ansible's PATH with every command of this machine but lspci (get_bin_path's sbin folders lack it too)."""
    tools = tmp_path / "bin"
    tools.mkdir()
    for folder in ("/usr/local/bin", "/usr/bin", "/bin"):
        for command in Path(folder).iterdir():
            if command.name != "lspci" and not (tools / command.name).exists():
                (tools / command.name).symlink_to(command)
    monkeypatch.setitem(ANSIBLE_ENV, "PATH", f"{Path(sys.executable).parent}{os.pathsep}{tools}")


def test_without_lspci_or_config_space_acs_is_unknown_and_the_rest_is_read(tmp_path: Path, no_lspci):
    """No pciutils, and no configuration space in /sys to read instead: the module warns and says so."""
    root = make_sysfs(
        tmp_path / "root",
        {"pci0000:40/0000:40:01.1/0000:41:00.0": gpu(), "pci0000:40/0000:40:03.1/0000:42:00.0": gpu()},
    )
    result = run_module("iommu_acs_info", {"sysfs_root": str(root), "cmdline_src": saved(tmp_path, "c", "ro iommu=pt\n")})
    assert result.get("failed") is not True, result
    assert (result["acs"], result["acs_source"]) == ([], "sysfs")
    assert result["acs_verdict"]["verdict"] == "unknown"
    assert result["acs_verdict"]["reason"].startswith(
        "lspci is not installed and no PCI configuration space could be read in /sys, so ACS is unknown. Install pciutils"
    )
    assert len(result["acs_verdict"]["gpu_pairs"]) == 1
    assert result["iommu"]["mode"] == "passthrough"
    assert any("lspci is not installed" in w for w in result["warnings"])


def with_config(root: Path, spaces: dict[str, bytes]) -> Path:
    for bdf, config in spaces.items():
        (root / "sys" / "bus" / "pci" / "devices" / bdf / "config").write_bytes(config)
    return root


def test_without_lspci_acs_is_read_from_the_config_space(tmp_path: Path, no_lspci):
    """The device check's H200 box has no pciutils: the raw bytes in /sys give the same answer as root."""
    root = with_config(
        make_sysfs(
            tmp_path / "root",
            {
                "pci0000:40/0000:40:01.1": bridge(),
                "pci0000:40/0000:40:01.1/0000:41:00.0": gpu(),
                "pci0000:40/0000:40:03.1": bridge(),
                "pci0000:40/0000:40:03.1/0000:42:00.0": gpu(),
            },
        ),
        {
            "0000:40:01.1": config_space((0x5F, 0x1D)),  # the EPYC root port of the rccl547 capture: redirects
            "0000:40:03.1": config_space((0x5F, 0x00)),
            "0000:41:00.0": config_space(None, vendor=0x10DE, device=0x2204, class_code=0x0300),
            "0000:42:00.0": config_space(None, vendor=0x10DE, device=0x2204, class_code=0x0300),
        },
    )
    result = run_module("iommu_acs_info", {"sysfs_root": str(root), "cmdline_src": saved(tmp_path, "c", "ro\n")})
    assert result.get("failed") is not True, result
    assert result["acs_source"] == "sysfs"
    assert [(e["bdf"], e["description"]) for e in result["acs"]] == [
        ("0000:40:01.1", "PCI bridge [1022:1483]"),
        ("0000:40:03.1", "PCI bridge [1022:1483]"),
    ]
    verdict = result["acs_verdict"]
    assert verdict["verdict"] == "redirected"
    assert verdict["gpu_pairs"] == [
        {"gpus": ["0000:41:00.0", "0000:42:00.0"], "bridges": ["0000:40:01.1", "0000:40:03.1"],
         "redirecting": ["0000:40:01.1"]}
    ]  # fmt: skip
    assert not result.get("warnings")


def test_one_gpu_on_the_root_bus_without_lspci_is_clear(tmp_path: Path, no_lspci):
    """The H200 VM's layout: one GPU on the root bus, no bridge, nothing with ACS: nothing can redirect."""
    root = with_config(
        make_sysfs(tmp_path / "root", {"pci0000:00/0000:00:06.0": gpu()}),
        {"0000:00:06.0": config_space(None, vendor=0x10DE, device=0x2335, class_code=0x0302)},
    )
    result = run_module("iommu_acs_info", {"sysfs_root": str(root), "cmdline_src": saved(tmp_path, "c", "ro\n")})
    assert (result["acs"], result["acs_source"]) == ([], "sysfs")
    assert (result["acs_verdict"]["verdict"], result["acs_verdict"]["reason"]) == (
        "clear", "No PCI device has an ACS capability, so none redirects peer-to-peer traffic."
    )  # fmt: skip


def test_a_broken_config_space_names_the_device(tmp_path: Path, no_lspci):
    looped = bytearray(config_space(None))
    looped[0x100:0x104] = (0x0001 | 1 << 16 | 0x100 << 20).to_bytes(4, "little")  # AER pointing at itself
    root = with_config(make_sysfs(tmp_path / "root", {"pci0000:40/0000:40:01.1": bridge()}), {"0000:40:01.1": bytes(looped)})
    result = run_module("iommu_acs_info", {"sysfs_root": str(root), "cmdline_src": saved(tmp_path, "c", "ro\n")})
    assert result["failed"] is True
    assert result["msg"] == (
        f"cannot read the PCI configuration space under {root}/sys: "
        "0000:40:01.1: the extended capability list points to 0x100, again"
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="past its first 64 bytes the configuration space needs root")
def test_this_machines_config_space_reads_as_its_lspci(no_lspci):
    """The live /sys of this machine, read without lspci, against what its lspci -vvv says (as root)."""
    from_sysfs = run_module("iommu_acs_info", {})
    assert from_sysfs.get("failed") is not True, from_sysfs
    assert from_sysfs["acs_source"] == "sysfs"
    assert not from_sysfs.get("warnings")
    lspci = subprocess.run([require("lspci"), "-D", "-vvv"], capture_output=True, text=True, check=True).stdout
    expected = [(e["bdf"], e["cap"], e["ctl"]) for e in parse_lspci_acs(lspci)]
    assert [(e["bdf"], e["cap"], e["ctl"]) for e in from_sysfs["acs"]] == expected
