"""_pcie on captured nvidia-smi -q and lspci -tv outputs, and on hand-made /sys trees."""

from __future__ import annotations

import re

import pytest
from conftest import captures
from hardware import RYZEN_CHIPSET, bridge, cpuinfo, gpu, make_sysfs

from ansible_collections.gpubox.inference.plugins.module_utils._pcie import (
    LspciParseError,
    analyse_platform,
    classify_cpu,
    judge_link,
    normalize_bdf,
    parse_cpuinfo,
    parse_lspci_links,
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


# ---------------------------------------------------------------- lspci -vvv link state (real captures)

FAH = "2x_rtx2060_lspci_vv_grep_gt_card_prefix_width_x8_downgraded_fah"
A6000 = "4x_rtxa6000_lspci_vvd_10de_first_gpu_and_audio_gen1_idle_excerpt"
ADA = "rtx6000ada_endpoint_lspci_vvv_c1_00_0_lnksta_downgraded"


def _link(entry: dict) -> tuple:
    keys = ("bus_id", "is_nvidia_gpu", "pcie_gen_max", "pcie_width_max", "pcie_gen_current", "pcie_width_current")
    return (*(entry[k] for k in keys), entry["downgraded"])


def test_lspci_links_of_two_gpus_narrowed_to_x8_behind_a_script_label():
    links = parse_lspci_links(LSPCI[FAH].text)
    assert [_link(e) for e in links] == [
        ("0000:01:00.0", True, 3, 16, 3, 8, ["width"]),
        ("0000:02:00.0", True, 3, 16, 3, 8, ["width"]),
    ]
    gpus = analyse_platform(lspci=links)["gpus"]
    assert [(g["bus_id"], g["downtrained"], g["link_source"]) for g in gpus] == [
        ("0000:01:00.0", True, "lspci"),
        ("0000:02:00.0", True, "lspci"),
    ]
    assert gpus[0]["link_note"] == "the link runs at x8 where both ends support x16"


def test_lspci_vvd_keeps_the_audio_function_out_of_the_gpus():
    links = parse_lspci_links(LSPCI[A6000].text)
    assert [_link(e) for e in links] == [
        ("0000:01:00.0", True, 4, 16, 1, 16, ["speed"]),
        ("0000:01:00.1", False, 4, 16, 1, 16, ["speed"]),
    ]
    assert links[1]["description"].startswith("Audio device: NVIDIA Corporation GA102")
    assert [g["bus_id"] for g in analyse_platform(lspci=links)["gpus"]] == ["0000:01:00.0"]


@pytest.mark.parametrize(("under_load", "downtrained"), [(None, None), (False, False), (True, True)])
def test_gen1_in_a_saved_lspci_needs_the_load_state(under_load, downtrained):
    (gpu,) = analyse_platform(lspci=parse_lspci_links(LSPCI[A6000].text), lspci_under_load=under_load)["gpus"]
    assert gpu["downtrained"] is downtrained
    assert (gpu["pcie_gen_current"], gpu["pcie_gen_max"]) == (1, 4)
    if under_load is None:
        assert "cannot tell power saving from a downtrained link" in gpu["link_note"]


def test_the_sudo_prompt_before_one_device_is_skipped():
    (link,) = parse_lspci_links(LSPCI[ADA].text)
    assert _link(link) == ("0000:c1:00.0", True, 4, 16, 1, 16, ["speed"])


def test_nvidia_smi_performance_state_wins_over_the_saved_load_state():
    smi = [{"bus_id": "0000:01:00.0", "pcie_gen_current": 1, "pcie_gen_max": 4, "performance_state": "P8"}]
    (gpu,) = analyse_platform(smi_q=smi, lspci=parse_lspci_links(LSPCI[A6000].text), lspci_under_load=True)["gpus"]
    assert (gpu["link_source"], gpu["downtrained"]) == ("nvidia-smi", False)


@pytest.mark.parametrize(
    "variant",
    [
        pytest.param(lambda t: t.replace("\n", "\r\n"), id="windows-line-endings"),
        pytest.param(lambda t: t.replace("\n", "  \n"), id="trailing-spaces"),
        pytest.param(lambda t: t.replace("LnkSta:", "\x1b[31mLnkSta:\x1b[0m"), id="ansi"),
        pytest.param(lambda t: t.replace("\n\n", "\n\n\n\n"), id="blank-lines"),
        pytest.param(lambda t: t.replace("        ", "\t"), id="tabs-for-spaces"),
    ],
)
def test_lspci_links_read_the_same_through_paste_damage(variant):
    assert [_link(e) for e in parse_lspci_links(variant(LSPCI[A6000].text))] == [
        _link(e) for e in parse_lspci_links(LSPCI[A6000].text)
    ]


def test_lnkcap_and_lnksta_of_one_device_without_its_device_line():
    text = (
        "    LnkCap: Port #0, Speed 16GT/s, Width x16, ASPM L1, Exit Latency L1 <16us\n"
        "    LnkSta: Speed 2.5GT/s (downgraded), Width x16 (ok)\n"
    )
    (link,) = parse_lspci_links(text)
    assert _link(link) == (None, None, 4, 16, 1, 16, ["speed"])
    two = [{"bus_id": "0000:01:00.0"}, {"bus_id": "0000:02:00.0"}]
    assert all(g["link_source"] is None for g in analyse_platform(smi_q=two, lspci=[link])["gpus"])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "LnkCap: Speed 8GT/s, Width x16\nLnkSta: Speed 8GT/s, Width x8\nLnkCap: Speed 16GT/s, Width x16\n",
            "line 3: a second LnkCap with no device line before it",
        ),
        (
            "01:00.0 VGA compatible controller: NVIDIA Corporation X\n"
            "\tLnkSta: Speed 8GT/s, Width x8\n\tLnkSta: Speed 8GT/s, Width x16\n",
            "line 3: a second LnkSta for 0000:01:00.0 (the first is at line 2)",
        ),
        ("01:00.0 3D controller: NVIDIA Corporation X\n\tLnkSta: Speed 8GT/s\n", "line 2: LnkSta without a Speed and a Width"),
    ],
)
def test_link_lines_that_could_be_misattributed_are_refused(text, message):
    with pytest.raises(LspciParseError, match=re.escape(message)):
        parse_lspci_links(text)


def test_two_digit_and_domain_bus_ids_and_lnkcap2_is_not_lnkcap():
    text = (
        "0001:c1:00.0 3D controller: NVIDIA Corporation GH100 [H100 PCIe] (rev a1)\n"
        "\t\tLnkCap:\tPort #0, Speed 32GT/s, Width x16\n\t\tLnkSta:\tSpeed 32GT/s (ok), Width x16 (ok)\n"
        "\t\tLnkCap2: Supported Link Speeds: 2.5-32GT/s\n\t\tLnkSta2: Current De-emphasis Level: -6dB\n"
    )
    (link,) = parse_lspci_links(text)
    assert _link(link) == ("0001:c1:00.0", True, 5, 16, 5, 16, [])


@pytest.mark.parametrize("cap", [pytest.param(c, id=c.path.stem) for c in captures("C_lspci")])
def test_every_lspci_capture_gives_its_links_to_named_devices(cap):
    if "CORRUPTED BY THE POSTER'S REDACTION" in cap.expected:
        # Its device lines are comments with redacted bus ids: two devices' links, no device to give them to.
        with pytest.raises(LspciParseError, match=r"line 6: a second LnkCap with no device line before it"):
            parse_lspci_links(cap.text)
        return
    links = parse_lspci_links(cap.text)
    for entry in links:
        assert entry["bus_id"] is not None, "every capture here prints its device lines"
        assert entry["pcie_width_current"] is not None or entry["pcie_width_max"] is not None
    gpus = [e["bus_id"] for e in links if e["is_nvidia_gpu"]]
    assert all(bus.endswith(".0") for bus in gpus)


def test_the_upstream_bridge_in_the_saved_lspci_is_the_host_end():
    """A GPU at x8 behind a root port that is x8 itself is not downtrained: both ends support x8 at most."""
    tree = parse_lspci_tree(LSPCI["asus_esc8000a_e12_genoa_4x_rtx6000ada_separate_root_complexes_lspci_tv"].text)
    text = (
        "00:01.1 PCI bridge: Advanced Micro Devices, Inc. [AMD] Device 149f\n"
        "\t\tLnkCap:\tPort #1, Speed 16GT/s, Width x8, ASPM L1\n\t\tLnkSta:\tSpeed 16GT/s, Width x8\n"
        "01:00.0 VGA compatible controller: NVIDIA Corporation AD102GL [RTX 6000 Ada Generation] (rev a1)\n"
        "\t\tLnkCap:\tPort #0, Speed 16GT/s, Width x16, ASPM L1\n\t\tLnkSta:\tSpeed 16GT/s (ok), Width x8 (downgraded)\n"
    )
    gpus = {g["bus_id"]: g for g in analyse_platform(tree=tree, lspci=parse_lspci_links(text))["gpus"]}
    gpu = gpus["0000:01:00.0"]
    assert (gpu["pcie_width_host_max"], gpu["pcie_width_current"], gpu["lspci_downgraded"]) == (8, 8, ["width"])
    assert gpu["downtrained"] is False
    assert gpus["0000:41:00.0"]["link_source"] is None
