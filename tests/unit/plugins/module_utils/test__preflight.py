"""_preflight: per-pair verdicts, decisions, policy and rendering, on captured matrices and made-up platforms."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from conftest import capture_params, captures

from ansible_collections.gpubox.inference.plugins.module_utils._acs import judge_acs, parse_lspci_acs
from ansible_collections.gpubox.inference.plugins.module_utils._preflight import build, combine, decision_words, for_group
from ansible_collections.gpubox.inference.plugins.module_utils._topology import analyse, parse_p2p, parse_topology

TOPO = {c.path.stem: c for c in captures("A_topo_m")}
P2P = {c.path.stem: c for c in captures("B_topo_p2p")}
POLICY = {
    "fail_on_chipset_gpu": True,
    "fail_on_downtrained": False,
    "fail_on_acs_redirect": False,
    "tensor_parallel_size": 0,
}
NO_ACS = {"verdict": "clear", "reason": "", "redirecting": [], "gpu_pairs": []}
REDIRECT = judge_acs(
    parse_lspci_acs(
        "40:01.1 PCI bridge: AMD\n\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-\n"
    )
)


def topology(stem: str, p2p_stem: str | None = None) -> dict:
    topo = parse_topology(TOPO[stem].text)
    p2p = parse_p2p(P2P[p2p_stem].text) if p2p_stem else {}
    return {**topo, **analyse(topo, p2p), "p2p": p2p}


def platform(*gpus: dict) -> dict:
    return {"cpu": {}, "gpus": list(gpus)}


def gpu(bus_id: str, **fields) -> dict:
    return {"bus_id": bus_id, "behind_chipset": False, "downtrained": False, "link_note": "ok", **fields}


def verdicts(report: dict) -> dict[str, str]:
    return {"-".join(p["gpus"]): p["verdict"] for p in report["pairs"]}


def test_nvlink_everywhere_is_fit():
    report = combine(topology("8x_a100_aws_p4d_NV12_no_nic_gpu_numa_id"), platform(), NO_ACS, {}, POLICY)
    assert set(verdicts(report).values()) == {"fit"}
    assert len(report["pairs"]) == 28
    assert report["verdict"] == "fit"
    assert report["decisions"] == {
        "nccl_p2p_disable": False,
        "cause": None,
        "pairs": [],
        "bridge": None,
        "iommu_translated": False,
    }


def test_host_bridge_is_slow_with_its_reason():
    report = combine(topology("2x_rtx5090_threadripper3975wx_PHB_gpu_numa_id"), platform(), NO_ACS, {}, POLICY)
    assert report["pairs"] == [
        {"gpus": ["GPU0", "GPU1"], "link": "PHB", "verdict": "slow", "causes": [{"code": "cause.link", "link": "PHB"}]}
    ]


def test_acs_redirect_on_a_pcie_pair_will_hang_and_disables_nccl_p2p():
    report = combine(
        topology("2gpu_aws_PIX_header_without_leading_tab_excerpt"),
        platform(),
        REDIRECT,
        {"mode": "translated"},
        POLICY,
    )
    assert verdicts(report) == {"GPU0-GPU1": "hang"}
    assert report["decisions"] == {
        "nccl_p2p_disable": True,
        "cause": "acs_redirect",
        "pairs": [["GPU0", "GPU1"]],
        "bridge": "40:01.1",
        "iommu_translated": True,
    }
    assert decision_words(report["decisions"]) == [
        "NCCL_P2P_DISABLE=1 because ACS redirects P2P on 40:01.1",
        "the IOMMU translates DMA, so redirected P2P also goes through it",
    ]
    assert report["warnings"] == ["GPU0-GPU1: will hang or corrupt (ACS redirects P2P on 40:01.1)"]
    assert report["failures"] == []


def test_acs_redirect_fails_only_when_policy_says_so():
    policy = {**POLICY, "fail_on_acs_redirect": True}
    report = combine(topology("2gpu_aws_PIX_header_without_leading_tab_excerpt"), platform(), REDIRECT, {}, policy)
    assert report["failures"] == ["GPU0-GPU1: will hang or corrupt (ACS redirects P2P on 40:01.1)"]


def test_p2p_not_supported_is_slow_not_hang_since_nccl_will_not_try_p2p():
    topo = topology("2x_rtx5090_threadripper3975wx_PHB_gpu_numa_id", "2x_rtx5090_p2p_rw_GNS")
    report = combine(topo, platform(), REDIRECT, {}, POLICY)
    assert verdicts(report) == {"GPU0-GPU1": "slow"}
    assert {"code": "cause.p2p_status", "status": "GNS"} in report["pairs"][0]["causes"]
    assert report["decisions"]["nccl_p2p_disable"] is False


def test_nvlink_pair_is_not_hurt_by_acs():
    report = combine(topology("3x_rtxa6000_NV4_pair_plus_NODE"), platform(), REDIRECT, {}, POLICY)
    assert verdicts(report) == {"GPU0-GPU1": "fit", "GPU0-GPU2": "hang", "GPU1-GPU2": "hang"}


def test_per_pair_acs_paths_decide_which_pairs_hang():
    acs = {
        "verdict": "redirected",
        "redirecting": [{"bdf": "0000:40:01.1", "flags": ["ReqRedir"]}],
        "gpu_pairs": [
            {"gpus": ["0000:01:00.0", "0000:41:00.0"], "bridges": [], "redirecting": ["0000:40:01.1"]},
            {"gpus": ["0000:01:00.0", "0000:81:00.0"], "bridges": [], "redirecting": []},
            {"gpus": ["0000:41:00.0", "0000:81:00.0"], "bridges": [], "redirecting": ["0000:40:01.1"]},
        ],
    }
    topo = parse_topology("\tGPU0\tGPU1\tGPU2\nGPU0\t X \tPIX\tPIX\nGPU1\tPIX\t X \tPIX\nGPU2\tPIX\tPIX\t X \n")
    topo = {**topo, **analyse(topo), "p2p": {}}
    plat = platform(gpu("0000:01:00.0"), gpu("0000:41:00.0"), gpu("0000:81:00.0"))
    report = combine(topo, plat, acs, {}, POLICY)
    assert verdicts(report) == {"GPU0-GPU1": "hang", "GPU0-GPU2": "fit", "GPU1-GPU2": "hang"}


def test_chipset_gpu_fails_in_the_group_and_is_only_slow_outside_it():
    topo = topology("2gpu_aws_PIX_header_without_leading_tab_excerpt")
    plat = platform(gpu("0000:01:00.0"), gpu("0000:04:00.0", behind_chipset=True))
    report = combine(topo, plat, NO_ACS, {}, POLICY)
    assert verdicts(report) == {"GPU0-GPU1": "slow"}
    assert report["failures"] == ["GPU1 (0000:04:00.0) hangs off the chipset, not a CPU root port, in a tensor-parallel group"]
    warn_only = combine(topo, plat, NO_ACS, {}, {**POLICY, "fail_on_chipset_gpu": False})
    assert warn_only["failures"] == []
    assert warn_only["warnings"] == report["failures"]
    alone = combine(topo, plat, NO_ACS, {}, {**POLICY, "tensor_parallel_size": 1})
    assert alone["group"] == ["GPU0"]
    assert alone["verdict"] == "single_gpu"
    assert alone["failures"] == []
    lines = build("box", topo, plat, {}, NO_ACS, {**POLICY, "tensor_parallel_size": 1})["lines"]
    assert not [line for line in lines if line.startswith("GPU0-GPU1 ")], "no pair verdict outside the group"


def test_a_group_narrower_than_the_report_judges_only_its_own_gpus():
    """The vLLM plan asks for the GPUs it deploys: GPU2's redirected pairs and chipset do not count for GPU0-GPU1."""
    acs = {
        "verdict": "redirected",
        "redirecting": [{"bdf": "0000:40:01.1", "flags": ["ReqRedir"]}],
        "gpu_pairs": [
            {"gpus": ["0000:01:00.0", "0000:41:00.0"], "bridges": [], "redirecting": []},
            {"gpus": ["0000:01:00.0", "0000:81:00.0"], "bridges": [], "redirecting": ["0000:40:01.1"]},
            {"gpus": ["0000:41:00.0", "0000:81:00.0"], "bridges": [], "redirecting": ["0000:40:01.1"]},
        ],
    }
    topo = parse_topology("\tGPU0\tGPU1\tGPU2\nGPU0\t X \tPIX\tPIX\nGPU1\tPIX\t X \tPIX\nGPU2\tPIX\tPIX\t X \n")
    topo = {**topo, **analyse(topo), "p2p": {}}
    plat = platform(gpu("0000:01:00.0"), gpu("0000:41:00.0"), gpu("0000:81:00.0", behind_chipset=True))
    report = combine(topo, plat, acs, {}, POLICY)
    assert report["decisions"]["nccl_p2p_disable"] is True
    assert len(report["failures"]) == 1
    two = for_group(report, ["GPU0", "GPU1"])
    assert two["decisions"]["nccl_p2p_disable"] is False
    assert (two["verdict"], two["failures"], two["warnings"]) == ("fit", [], [])
    assert for_group(report, ["GPU0"])["verdict"] == "single_gpu"


def test_downtrained_gpu_warns_or_fails_by_policy():
    topo = topology("2gpu_aws_PIX_header_without_leading_tab_excerpt")
    plat = platform(
        gpu("0000:01:00.0", downtrained=True, link_note="the link runs at x4 where both ends support x16"),
        gpu("0000:02:00.0"),
    )
    report = combine(topo, plat, NO_ACS, {}, POLICY)
    assert report["warnings"] == ["GPU0 (0000:01:00.0): the link runs at x4 where both ends support x16"]
    assert combine(topo, plat, NO_ACS, {}, {**POLICY, "fail_on_downtrained": True})["failures"] == report["warnings"]


def test_one_gpu_on_a_vms_root_bus_reads_as_such():
    """The H200 of the device check: one GPU passed through onto the VM's root bus, no bridge, no lspci."""
    topo = topology("1x_h200_driver580_ansi_underlined_header")
    plat = platform(gpu("0000:00:06.0", behind_chipset=None, root_port=None, pcie_gen_current=5, pcie_width_current=16))
    acs = judge_acs([], None, unreadable="lspci is not installed.")
    result = build("h200", topo, plat, {"mode": "unknown", "flags": ["pci=realloc=off"]}, acs, POLICY)
    assert result["verdict"] == "single_gpu"
    assert result["lines"][1:3] == [
        "Matrix: one GPU, no pair",
        "GPU0 0000:00:06.0: Gen5 x16 via the root bus, no PCIe bridge above it (as in a virtual machine); ok",
    ]
    assert (
        "| GPU0 | 0000:00:06.0 | Gen5 x16 | the root bus, no PCIe bridge above it (as in a virtual machine) | ok |"
        in (result["markdown"])
    )
    two = topology("2gpu_aws_PIX_header_without_leading_tab_excerpt")
    chipset = gpu("0000:04:00.0", behind_chipset=True, pcie_gen_current=4)
    plat = platform(gpu("0000:01:00.0", root_port="0000:00:01.1"), chipset)
    lines = build("box", two, plat, {}, NO_ACS, {**POLICY, "fail_on_chipset_gpu": False})["lines"]
    assert [line.split(": ", 1)[1].split(";")[0] for line in lines if line.startswith(("GPU0 ", "GPU1 "))] == [
        "link unknown via CPU root port 0000:00:01.1",
        "Gen4 via the chipset",
    ]


def test_no_gpu_builds_a_one_line_report():
    result = build("box", {}, platform(), {}, {}, POLICY)
    assert result["verdict"] == "no_gpu"
    assert result["lines"] == ["No NVIDIA GPU found on this host: nothing to check."]
    assert result["svg"] == ""
    assert "No NVIDIA GPU found" in result["markdown"]


@pytest.mark.parametrize("cap", capture_params("A_topo_m"))
def test_every_capture_renders_valid_svg_and_a_full_markdown_matrix(cap):
    topo = parse_topology(cap.text)
    topo = {**topo, **analyse(topo), "p2p": {}}
    result = build("box", topo, platform(), {"mode": "unknown", "flags": []}, NO_ACS, POLICY)
    svg = ET.fromstring(result["svg"])
    texts = [t.text for t in svg.iter("{http://www.w3.org/2000/svg}text")]
    for g in topo["gpus"]:
        assert g["name"] in texts
        assert f"| {g['name']} | " in result["markdown"]
    for n in topo["nics"]:
        assert (n["device"] or n["name"]) in texts
    assert len(result["lines"]) >= 3


def test_svg_draws_root_ports_switches_and_the_chipset():
    topo = topology("2gpu_aws_PIX_header_without_leading_tab_excerpt")
    plat = platform(
        gpu("0000:03:00.0", root_port="0000:00:01.1", bridges=["0000:02:00.0", "0000:01:00.0", "0000:00:01.1"]),
        gpu("0000:09:00.0", root_port="0000:00:01.2", bridges=["0000:08:04.0", "0000:00:01.2"], behind_chipset=True),
    )
    svg = ET.fromstring(build("box", topo, plat, {}, NO_ACS, POLICY)["svg"])
    texts = [t.text for t in svg.iter("{http://www.w3.org/2000/svg}text")]
    assert texts.count("PCIe switch") == 1
    assert texts.count("chipset") == 1
    assert {"0000:00:01.1", "0000:00:01.2"} <= set(texts)
