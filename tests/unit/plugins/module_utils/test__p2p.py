"""_p2p: pair status, facts from captured reports, and the NCCL/vLLM decisions they imply."""

from __future__ import annotations

import pytest
from conftest import captures

from ansible_collections.gpubox.inference.plugins.module_utils._bandwidth import parse_report
from ansible_collections.gpubox.inference.plugins.module_utils._p2p import (
    decide,
    for_group,
    from_measurement,
    from_report,
    pair_status,
)

D = {c.path.stem: c for c in captures("D_p2p_bandwidth")}


def facts(stem: str) -> dict:
    return from_report(parse_report(D[stem].text))


@pytest.mark.parametrize(
    ("result", "status"),
    [
        ({"hang": True}, "hang"),
        ({"can_access_peer": True, "verified": False}, "broken"),
        ({"can_access_peer": False, "verified": True}, "no_peer_access"),
        ({"can_access_peer": True, "unidirectional_p2p_enabled": 9.0, "unidirectional_p2p_disabled": 20.0}, "slower_than_staged"),
        (
            {"can_access_peer": True, "verified": True, "unidirectional_p2p_enabled": 26.3, "unidirectional_p2p_disabled": 22.2},
            "ok",
        ),
    ],
)
def test_pair_status(result, status):
    assert pair_status(result) == status


def test_rtx4090_without_peer_access_disables_p2p():
    f = facts("2x_rtx4090_p2pBandwidthLatencyTest_p2p_unavailable_driver525")
    assert f["source"] == "p2pBandwidthLatencyTest"
    assert {k: v["status"] for k, v in f["pairs"].items()} == {"0-1": "no_peer_access", "1-0": "no_peer_access"}
    assert f["decisions"]["nccl_p2p_disable"] is True
    assert f["decisions"]["cause"] == "measured"
    assert f["decisions"]["unusable"] == [{"pair": "GPU0-GPU1", "status": "no_peer_access"}]
    assert f["decisions"]["pairs"]["0-1"] == {"p2p_usable": False, "status": "no_peer_access"}


def test_rtx6000ada_with_working_p2p_keeps_it_but_sets_no_level_without_verification():
    f = facts("2x_rtx6000ada_threadripper_p2pBandwidthLatencyTest_p2p_enabled")
    assert {v["status"] for v in f["pairs"].values()} == {"ok"}
    assert f["decisions"]["nccl_p2p_disable"] is False
    assert f["decisions"]["nccl_p2p_level"] is None  # an imported report was not verified bit for bit
    assert f["matrices"]["bidirectional_p2p_enabled"][0][1] == 52.11


def test_a100_nvswitch_all_pairs_usable():
    f = facts("8x_a100_sxm4_80gb_nvswitch_p2pBandwidthLatencyTest_distserve")
    assert len(f["pairs"]) == 56
    assert len(f["decisions"]["pairs"]) == 28
    assert all(v["p2p_usable"] for v in f["decisions"]["pairs"].values())


def test_nvbandwidth_waived_d2d_means_no_peer_access():
    f = facts("nvbandwidth_2x_rtx2080ti_d2d_write_ce_waived_no_p2p")
    assert {k: v["status"] for k, v in f["pairs"].items()} == {"0-1": "no_peer_access", "1-0": "no_peer_access"}
    assert f["decisions"]["nccl_p2p_disable"] is True


def test_nvbandwidth_d2d_matrix_means_p2p_works():
    f = facts("nvbandwidth_readme_example_8gpu_d2d_read_ce_old_format_zero_diagonal")
    assert len(f["pairs"]) == 56
    assert f["decisions"]["nccl_p2p_disable"] is False


def test_nvbandwidth_host_device_only_says_nothing_about_pairs():
    f = facts("nvbandwidth_8x_rtx4090_h2d_d2h_ce_excerpt")
    assert f["pairs"] == {}
    assert f["decisions"]["pairs"] == {}
    assert f["decisions"]["nccl_p2p_disable"] is False


def test_measurement_facts_carry_matrices_limits_and_ratios():
    ok = {
        "can_access_peer": True,
        "verified": True,
        "verify_detail": "fine",
        "unidirectional_p2p_enabled": 25.2,
        "unidirectional_p2p_disabled": 20.0,
    }
    measured = {"devices": ["0000:01:00.0", "0000:02:00.0"], "pairs": {(0, 1): ok, (1, 0): ok}, "error": None}
    links = {"0000:01:00.0": {"gen": 4, "width": 16}, "0000:02:00.0": {"gen": 4, "width": 8}}
    f = from_measurement(measured, links)
    assert f["matrices"]["unidirectional_p2p_enabled"] == [[None, 25.2], [25.2, None]]
    assert f["pairs"]["0-1"]["pcie_limit_gbps"] == 15.8
    assert f["pairs"]["0-1"]["ratio_to_limit"] == 1.59
    assert f["decisions"]["nccl_p2p_level"] == "SYS"


def test_one_bad_direction_makes_the_pair_unusable():
    pairs = {"0-1": {"status": "ok"}, "1-0": {"status": "broken"}, "0-2": {"status": "ok"}, "2-0": {"status": "ok"}}
    pairs |= {"1-2": {"status": "ok"}, "2-1": {"status": "ok"}}
    d = decide(pairs, 3, verified=True)
    assert d["pairs"]["0-1"]["p2p_usable"] is False
    assert d["pairs"]["0-2"]["p2p_usable"] is True
    assert d["nccl_p2p_disable"] is True
    assert d["nccl_p2p_level"] is None
    assert d["unusable"] == [{"pair": "GPU0-GPU1", "status": "broken"}]
    assert "reasons" not in d, "decisions are fields; _words says them"


def test_a_group_without_the_bad_pair_keeps_p2p_and_gets_the_level():
    """GPU1 is bad; a deployment on GPU0 and GPU2 only is not, and one on GPU0-GPU1 is."""
    pairs = {"0-1": {"status": "ok"}, "1-0": {"status": "broken"}, "0-2": {"status": "ok"}, "2-0": {"status": "ok"}}
    pairs |= {"1-2": {"status": "hang"}, "2-1": {"status": "ok"}}
    d = decide(pairs, 3, verified=True)
    assert for_group(d, [0, 2]) == {"nccl_p2p_disable": False, "cause": None, "unusable": [], "nccl_p2p_level": "SYS"}
    assert for_group(d, [0, 1])["unusable"] == [{"pair": "GPU0-GPU1", "status": "broken"}]
    assert for_group(d, [0, 1, 2])["unusable"] == [
        {"pair": "GPU0-GPU1", "status": "broken"},
        {"pair": "GPU1-GPU2", "status": "hang"},
    ]
    assert for_group(d, [0]) == {"nccl_p2p_disable": False, "cause": None, "unusable": [], "nccl_p2p_level": None}


def test_a_group_with_an_unmeasured_pair_gets_no_level():
    d = decide({"0-1": {"status": "ok"}, "1-0": {"status": "ok"}}, 3, verified=True)
    assert for_group(d, [0, 1])["nccl_p2p_level"] == "SYS"
    assert for_group(d, [0, 1, 2])["nccl_p2p_level"] is None


def test_a_hung_measuring_tool_turns_p2p_off_for_any_group():
    d = decide({}, 0, verified=False, tool_hang_s=120.0)
    assert d["nccl_p2p_disable"] is True
    assert for_group(d, [0, 1]) == {"nccl_p2p_disable": True, "cause": "tool_hang", "unusable": [], "nccl_p2p_level": None}
    assert for_group(d, [0])["nccl_p2p_disable"] is False


def test_host_links_compare_the_faster_direction_with_the_gpus_link():
    measured = {
        "devices": ["0000:01:00.0", "0000:04:00.0", "0000:05:00.0"],
        "host": {
            0: {"host_to_device_gbps": 24.81, "device_to_host_gbps": 26.33, "verified": True, "verify_detail": "fine"},
            1: {"host_to_device_gbps": 3.1, "device_to_host_gbps": 2.9, "verified": True, "verify_detail": "fine"},
            2: {"hang": True, "timeout_s": 5},
        },
        "pairs": {},
        "error": None,
    }
    links = {"0000:01:00.0": {"gen": 4, "width": 16}, "0000:04:00.0": {"gen": 3, "width": 4}}
    f = from_measurement(measured, links)
    assert f["host_links"]["0"] == {
        "bus_id": "0000:01:00.0",
        "status": "ok",
        "host_to_device_gbps": 24.81,
        "device_to_host_gbps": 26.33,
        "verified": True,
        "detail": "fine",
        "pcie_limit_gbps": 31.5,
        "ratio_to_limit": 0.84,
    }
    assert (f["host_links"]["1"]["pcie_limit_gbps"], f["host_links"]["1"]["ratio_to_limit"]) == (3.9, 0.79)
    assert f["host_links"]["2"]["status"] == "hang"
    assert f["host_links"]["2"]["detail"] == "no answer within 5 s"
    assert f["host_links"]["2"]["ratio_to_limit"] is None
    assert f["decisions"]["pairs"] == {}


def test_one_gpu_gives_its_host_link_and_says_there_is_no_pair():
    bad = {"host_to_device_gbps": 50.0, "device_to_host_gbps": 51.0, "verified": False, "verify_detail": "3 bytes differ"}
    f = from_measurement({"devices": ["0000:18:00.0"], "host": {0: bad}, "pairs": {}, "error": None}, {})
    assert f["gpus"] == 1
    assert f["reason"] == "fewer than two GPUs: no pair to measure, only each GPU's copies to and from the host"
    assert f["host_links"]["0"]["status"] == "broken"
    assert f["host_links"]["0"]["pcie_limit_gbps"] is None
    assert f["host_links"]["0"]["ratio_to_limit"] is None
    assert f["decisions"]["nccl_p2p_disable"] is False
