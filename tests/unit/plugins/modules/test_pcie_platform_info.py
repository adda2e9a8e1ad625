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


def _saved(tmp_path: Path, folder: str, stem: str) -> str:
    out = tmp_path / f"{stem}.txt"
    out.write_text(parse_capture(FIXTURES / folder / f"{stem}.txt").text)
    return str(out)


def test_saved_lspci_vvv_gives_each_gpu_its_link(tmp_path: Path):
    empty = tmp_path / "empty"
    empty.mkdir()
    lspci = _saved(tmp_path, "C_lspci", "2x_rtx2060_lspci_vv_grep_gt_card_prefix_width_x8_downgraded_fah")
    gpus = run_module("pcie_platform_info", {"sysfs_root": str(empty), "lspci_src": lspci})["platform"]["gpus"]
    assert [(g["bus_id"], g["pcie_width_current"], g["pcie_width_max"], g["downtrained"]) for g in gpus] == [
        ("0000:01:00.0", 8, 16, True),
        ("0000:02:00.0", 8, 16, True),
    ]
    assert {g["lspci_downgraded"][0] for g in gpus} == {"width"}


def test_an_idle_gen1_link_in_a_saved_lspci_is_judged_only_with_the_load_state(tmp_path: Path):
    empty = tmp_path / "empty"
    empty.mkdir()
    lspci = _saved(tmp_path, "C_lspci", "4x_rtxa6000_lspci_vvd_10de_first_gpu_and_audio_gen1_idle_excerpt")
    args = {"sysfs_root": str(empty), "lspci_src": lspci}
    (unknown,) = run_module("pcie_platform_info", args)["platform"]["gpus"]
    (loaded,) = run_module("pcie_platform_info", {**args, "lspci_under_load": True})["platform"]["gpus"]
    (idle,) = run_module("pcie_platform_info", {**args, "lspci_under_load": False})["platform"]["gpus"]
    assert (unknown["downtrained"], loaded["downtrained"], idle["downtrained"]) == (None, True, False)
    assert "lspci_under_load" in unknown["link_note"]


def test_unattributable_lspci_and_a_stray_load_state_are_refused(tmp_path: Path):
    bad = tmp_path / "grep.txt"
    bad.write_text("LnkSta: Speed 8GT/s, Width x8\nLnkSta: Speed 8GT/s, Width x16\n")
    result = run_module("pcie_platform_info", {"lspci_src": str(bad)})
    assert result["failed"] is True
    assert result["msg"].startswith(f"cannot read lspci_src={bad}: line 2: a second LnkSta with no device line")
    stray = run_module("pcie_platform_info", {"lspci_under_load": True})
    assert stray["failed"] is True
    assert stray["msg"] == "lspci_under_load is set but lspci_src is not: it describes the saved lspci"
