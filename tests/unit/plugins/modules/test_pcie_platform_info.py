"""pcie_platform_info run as Ansible runs it, on a hand-made /sys tree and on saved outputs."""

from __future__ import annotations

from pathlib import Path

from conftest import FIXTURES, parse_capture, run_module
from hardware import RYZEN_CHIPSET, cpuinfo, make_sysfs


def test_hand_made_tree_with_a_chipset_gpu(tmp_path: Path):
    root = make_sysfs(tmp_path, RYZEN_CHIPSET)
    (root / "proc").mkdir()
    (root / "proc" / "cpuinfo").write_text(cpuinfo("AuthenticAMD", "AMD Ryzen 9 5950X 16-Core Processor"))
    result = run_module("pcie_platform_info", {"sysfs_root": str(root)}, check=True)
    assert result["changed"] is False
    platform = result["platform"]
    assert platform["cpu"]["family"] == "Ryzen"
    assert [(g["bus_id"], g["behind_chipset"]) for g in platform["gpus"]] == [
        ("0000:01:00.0", False),
        ("0000:04:00.0", True),
    ]


def test_saved_smi_q_and_lspci_tree_of_another_machine(tmp_path: Path):
    smi = tmp_path / "q.txt"
    smi.write_text(
        parse_capture(FIXTURES / "E_smi_q_pcie" / "laptop_tu117_asus_q_pci_gen3max_gen1cur_x16max_x8cur_driver575.txt").text
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run_module("pcie_platform_info", {"sysfs_root": str(empty), "nvidia_smi_q_src": str(smi)})
    (gpu,) = result["platform"]["gpus"]
    assert (gpu["bus_id"], gpu["pcie_width_current"], gpu["downtrained"]) == ("0000:01:00.0", 8, True)
    assert result["platform"]["cpu"]["class"] is None


def test_live_host_without_nvidia_gpus_reports_none():
    result = run_module("pcie_platform_info", {})
    assert result.get("failed") is not True, result
    assert result["platform"]["gpus"] == []
    assert result["platform"]["cpu"]["model"]


def test_bad_sysfs_root_names_the_option(tmp_path: Path):
    result = run_module("pcie_platform_info", {"sysfs_root": str(tmp_path / "nope")})
    assert result["failed"] is True
    assert result["msg"] == f"sysfs_root='{tmp_path / 'nope'}': not a directory"
