"""_pcie on captured nvidia-smi -q and lspci -tv outputs, and on hand-made /sys trees."""

from __future__ import annotations

import pytest
from conftest import captures
from hardware import RYZEN_CHIPSET, bridge, cpuinfo, gpu, make_sysfs

from ansible_collections.gpubox.inference.plugins.module_utils._pcie import (
    analyse_platform,
    classify_cpu,
    judge_link,
    normalize_bdf,
    parse_cpuinfo,
    parse_lspci_tree,
    parse_smi_q,
    read_sysfs_pci,
    speed_to_gen,
    tree_chain,
)

SMI = {c.path.stem: c for c in captures("E_smi_q_pcie")}
LSPCI = {c.path.stem: c for c in captures("C_lspci")}


# ------------------------------------------------------------ nvidia-smi -q


@pytest.mark.parametrize(
    ("stem", "bus_id", "gen", "width", "state", "downtrained"),
    [
        ("h100_sxm_della_q_pci_gen5_x16_p0_atomics", "0000:19:00.0", (5, 5, 5, 5), (16, 16), "P0", False),
        ("h200_firecracker_vm_q_pci_gen5_x16_host_max_na_driver580", "0000:00:06.0", (5, 5, 5, None), (16, 16), "P0", False),
        (
            "laptop_tu117_asus_q_pci_gen3max_gen1cur_x16max_x8cur_driver575",
            "0000:01:00.0",
            (3, 1, 3, 3),
            (16, 8),
            "P8",
            True,
        ),
        ("rtx_a6000_q_pci_gen4max_gen1cur_idle_bus4f", "0000:4f:00.0", (4, 1, 4, 4), (16, 16), "P8", False),
        ("v100_pcie_32gb_driver410_q_excerpt_gen3_x16", "0000:18:00.0", (3, 3, None, None), (16, 16), "P0", False),
        ("tesla_m2090_driver270_q_old_format_no_link_info", "0000:00:02.0", (None,) * 4, (None, None), None, None),
    ],
)
def test_smi_q_link_info(stem, bus_id, gen, width, state, downtrained):
    (gpu,) = parse_smi_q(SMI[stem].text)
    assert gpu["bus_id"] == bus_id
    assert (gpu["pcie_gen_max"], gpu["pcie_gen_current"], gpu["pcie_gen_device_max"], gpu["pcie_gen_host_max"]) == gen
    assert (gpu["pcie_width_max"], gpu["pcie_width_current"]) == width
    assert gpu["performance_state"] == state
    (report,) = analyse_platform(smi_q=[gpu])["gpus"]
    assert report["downtrained"] is downtrained


def test_idle_gen1_is_power_saving_not_a_fault():
    (gpu,) = parse_smi_q(SMI["rtx_a6000_q_pci_gen4max_gen1cur_idle_bus4f"].text)
    downtrained, note = judge_link(gpu)
    assert downtrained is False
    assert "power saving" in note


def test_gen_below_max_under_load_is_a_fault():
    downtrained, note = judge_link({"pcie_gen_current": 3, "pcie_gen_max": 4, "pcie_gen_host_max": 4, "performance_state": "P0"})
    assert downtrained is True
    assert "Gen3 under load (P0)" in note


def test_two_gpus_in_one_log():
    text = "GPU 00000000:01:00.0\n    PCI\n        Bus Id : 00000000:01:00.0\n        GPU Link Info\n"
    text += "            Link Width\n                Max : 16x\n                Current : 16x\n"
    text += "GPU 00000000:02:00.0\n    PCI\n        Bus Id : 00000000:02:00.0\n        GPU Link Info\n"
    text += "            Link Width\n                Max : 16x\n                Current : 4x\n"
    gpus = parse_smi_q(text)
    assert [(g["bus_id"], g["pcie_width_current"]) for g in gpus] == [("0000:01:00.0", 16), ("0000:02:00.0", 4)]


# ------------------------------------------------------------ lspci -tv


def test_genoa_tree_puts_each_gpu_on_its_own_root_port():
    tree = parse_lspci_tree(LSPCI["asus_esc8000a_e12_genoa_4x_rtx6000ada_separate_root_complexes_lspci_tv"].text)
    platform = analyse_platform(tree=tree)
    assert [(g["bus_id"], g["root_port"], g["behind_chipset"]) for g in platform["gpus"]] == [
        ("0000:01:00.0", "0000:00:01.1", False),
        ("0000:41:00.0", "0000:40:01.1", False),
        ("0000:c1:00.0", "0000:c0:01.1", False),
        ("0000:e1:00.0", "0000:e0:01.1", False),
    ]
    assert tree_chain(tree, "0000:21:00.0") == ["0000:20:03.1"]
    assert tree["0000:c0:03.2"]["secondary_bus"] == "c2"


def test_epyc_subtree_follows_every_bridge_level():
    tree = parse_lspci_tree(LSPCI["amd_epyc_gpp_bridge_40_01_1_acs_enabled_elided_plus_tv_subtree_rccl547"].text)
    assert tree_chain(tree, "0000:4a:00.0") == [
        "0000:49:00.0",
        "0000:48:00.0",
        "0000:47:00.0",
        "0000:46:00.0",
        "0000:44:01.0",
        "0000:43:00.0",
        "0000:40:01.1",
    ]
    assert tree_chain(tree, "0000:45:00.0") == ["0000:44:00.0", "0000:43:00.0", "0000:40:01.1"]
    assert tree["0000:52:00.0"]["description"] == "SK hynix Device 2839"


# ------------------------------------------------------------ CPU


@pytest.mark.parametrize(
    ("model", "family", "cpu_class", "lanes"),
    [
        ("AMD EPYC 7763 64-Core Processor", "EPYC", "server", 128),
        ("AMD EPYC 9654 96-Core Processor", "EPYC", "server", 128),
        ("AMD EPYC 4564P 16-Core Processor", "EPYC", "server", 28),
        ("AMD Ryzen Threadripper PRO 5995WX 64-Cores", "Threadripper PRO", "workstation", 128),
        ("AMD Ryzen Threadripper 3975WX 32-Cores", "Threadripper", "workstation", 88),
        ("AMD Ryzen Threadripper 7980X 64-Cores", "Threadripper", "workstation", 92),
        ("AMD Ryzen 9 5950X 16-Core Processor", "Ryzen", "consumer", 20),
        ("AMD Ryzen 9 7950X 16-Core Processor", "Ryzen", "consumer", 24),
        ("Intel(R) Core(TM) i9-13900K", "Core", "consumer", 20),
        ("Intel(R) Core(TM) i7-3770K CPU @ 3.50GHz", "Core", "consumer", 16),
        ("Intel(R) Xeon(R) Platinum 8480+", "Xeon", "server", 80),
        ("Intel(R) Xeon(R) w9-3495X", "Xeon W", "workstation", 112),
        ("Some Future CPU", None, None, None),
    ],
)
def test_cpu_classes(model, family, cpu_class, lanes):
    assert classify_cpu(model) == (family, cpu_class, lanes)


def test_cpuinfo_counts_sockets():
    cpu = parse_cpuinfo(cpuinfo("GenuineIntel", "Intel(R) Xeon(R) Platinum 8480+", sockets=2))
    assert (cpu["vendor"], cpu["sockets"], cpu["pcie_lanes_total"]) == ("Intel", 2, 160)


# ------------------------------------------------------------ sysfs trees


def test_ryzen_board_with_one_gpu_behind_the_chipset(tmp_path):
    sysfs = read_sysfs_pci(str(make_sysfs(tmp_path, RYZEN_CHIPSET)))
    platform = analyse_platform(cpuinfo("AuthenticAMD", "AMD Ryzen 9 5950X 16-Core Processor"), sysfs)
    assert platform["cpu"]["class"] == "consumer"
    first, second = platform["gpus"]
    assert (first["bus_id"], first["root_port"], first["behind_chipset"]) == ("0000:01:00.0", "0000:00:01.1", False)
    assert (first["pcie_gen_current"], first["pcie_width_current"], first["downtrained"]) == (4, 16, False)
    assert second["root_port"] == "0000:00:01.2"
    assert second["bridges"] == ["0000:03:04.0", "0000:02:00.2", "0000:00:01.2"]
    assert second["behind_chipset"] is True
    # x4 in a slot wired x4 is what both ends support: behind the chipset, but not downtrained.
    assert (second["pcie_width_current"], second["pcie_width_host_max"], second["downtrained"]) == (4, 4, False)
    assert second["pcie_gen_host_max"] == 3


def test_x16_slot_trained_at_x4_is_downtrained(tmp_path):
    sysfs = read_sysfs_pci(
        str(
            make_sysfs(
                tmp_path,
                {
                    "pci0000:00/0000:00:01.1": bridge(),
                    "pci0000:00/0000:00:01.1/0000:01:00.0": gpu(cur_width="4"),
                },
            )
        )
    )
    (report,) = analyse_platform(None, sysfs)["gpus"]
    assert report["downtrained"] is True
    assert report["link_note"] == "the link runs at x4 where both ends support x16"


def test_epyc_four_gpus_on_four_root_ports(tmp_path):
    devices = {}
    for port in ["0000:00:01.1", "0000:40:01.1", "0000:80:01.1", "0000:c0:01.1"]:
        root = f"pci0000:{port[5:7]}/{port}"
        devices[root] = bridge()
        devices[f"{root}/0000:{int(port[5:7], 16) + 1:02x}:00.0"] = gpu()
    sysfs = read_sysfs_pci(str(make_sysfs(tmp_path, devices)))
    platform = analyse_platform(cpuinfo("AuthenticAMD", "AMD EPYC 7763 64-Core Processor"), sysfs)
    assert [g["root_port"] for g in platform["gpus"]] == [
        "0000:00:01.1",
        "0000:40:01.1",
        "0000:80:01.1",
        "0000:c0:01.1",
    ]
    assert not any(g["behind_chipset"] or g["downtrained"] for g in platform["gpus"])
    assert platform["cpu"]["pcie_lanes"] == 128


def test_threadripper_gpu_behind_a_plx_switch(tmp_path):
    sysfs = read_sysfs_pci(
        str(
            make_sysfs(
                tmp_path,
                {
                    "pci0000:40/0000:40:03.1": bridge(),
                    "pci0000:40/0000:40:03.1/0000:41:00.0": bridge(vendor="0x10b5", device="0x8747"),
                    "pci0000:40/0000:40:03.1/0000:41:00.0/0000:42:08.0": bridge(vendor="0x10b5", device="0x8747"),
                    "pci0000:40/0000:40:03.1/0000:41:00.0/0000:42:08.0/0000:43:00.0": gpu(),
                },
            )
        )
    )
    platform = analyse_platform(cpuinfo("AuthenticAMD", "AMD Ryzen Threadripper PRO 5995WX 64-Cores"), sysfs)
    (report,) = platform["gpus"]
    assert report["root_port"] == "0000:40:03.1"
    assert report["behind_chipset"] is False
    assert platform["cpu"]["class"] == "workstation"


def test_intel_pch_root_port_is_the_chipset(tmp_path):
    sysfs = read_sysfs_pci(
        str(
            make_sysfs(
                tmp_path,
                {
                    "pci0000:00/0000:00:01.0": bridge(vendor="0x8086", device="0xa70d"),
                    "pci0000:00/0000:00:01.0/0000:01:00.0": gpu(),
                    "pci0000:00/0000:00:1c.4": bridge(vendor="0x8086", device="0x7a3c", speed="8.0 GT/s PCIe", width="4"),
                    "pci0000:00/0000:00:1c.4/0000:05:00.0": gpu(cur_speed="8.0 GT/s PCIe", cur_width="4"),
                },
            )
        )
    )
    cpu_attached, pch_attached = analyse_platform(cpuinfo("GenuineIntel", "Intel(R) Core(TM) i9-13900K"), sysfs)["gpus"]
    assert cpu_attached["behind_chipset"] is False
    assert pch_attached["behind_chipset"] is True


def test_missing_sysfs_gives_no_gpus(tmp_path):
    assert read_sysfs_pci(str(tmp_path)) == {}
    assert analyse_platform(None, {})["gpus"] == []


@pytest.mark.parametrize(
    ("text", "bdf"),
    [("00000000:19:00.0", "0000:19:00.0"), ("4F:00.0", "0000:4f:00.0"), ("0:2:0", "0000:00:02.0"), ("nope", None)],
)
def test_normalize_bdf(text, bdf):
    assert normalize_bdf(text) == bdf


@pytest.mark.parametrize(("speed", "gen"), [("2.5 GT/s PCIe", 1), ("16.0 GT/s PCIe", 4), ("32GT/s", 5), ("Unknown", None)])
def test_speed_to_gen(speed, gen):
    assert speed_to_gen(speed) == gen
