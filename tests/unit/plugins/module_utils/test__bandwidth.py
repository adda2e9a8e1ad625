"""_bandwidth against every captured nvbandwidth and p2pBandwidthLatencyTest output (``# expected:`` is the truth)."""

from __future__ import annotations

import pytest
from conftest import capture_params, captures

from ansible_collections.gpubox.inference.plugins.module_utils._bandwidth import (
    BandwidthParseError,
    parse_nvbandwidth,
    parse_report,
    pcie_limit_gbps,
)

D = {c.path.stem: c for c in captures("D_p2p_bandwidth")}
P2PBLT_NAMES = {
    "connectivity",
    "unidirectional_p2p_disabled",
    "unidirectional_p2p_enabled",
    "bidirectional_p2p_disabled",
    "bidirectional_p2p_enabled",
    "latency_gpu_p2p_disabled_us",
    "latency_gpu_p2p_enabled_us",
    "latency_cpu_p2p_disabled_us",
    "latency_cpu_p2p_enabled_us",
}


def report(stem: str) -> dict:
    return parse_report(D[stem].text)


@pytest.mark.parametrize("cap", capture_params("D_p2p_bandwidth"))
def test_every_capture_parses_into_square_or_single_row_matrices(cap):
    result = parse_report(cap.text)
    assert result["source"] == ("nvbandwidth" if cap.path.stem.startswith("nvbandwidth") else "p2pBandwidthLatencyTest")
    for rows in result["matrices"].values():
        assert all(len(row) == result["gpus"] for row in rows)
        assert len(rows) in (1, result["gpus"])


def test_rtx4090_pair_without_p2p():
    r = report("2x_rtx4090_p2pBandwidthLatencyTest_p2p_unavailable_driver525")
    assert r["gpus"] == 2
    assert set(r["matrices"]) == P2PBLT_NAMES
    assert r["can_access_peer"] == {"0": {"1": False}, "1": {"0": False}}
    assert r["devices"][1]["pci_bus_id"] == "0000:61:00.0"
    m = r["matrices"]
    assert m["connectivity"] == [[1.0, 0.0], [0.0, 1.0]]
    assert (m["unidirectional_p2p_disabled"][0][1], m["unidirectional_p2p_disabled"][1][0]) == (22.02, 22.05)
    assert (m["unidirectional_p2p_enabled"][0][1], m["unidirectional_p2p_enabled"][1][0]) == (22.18, 22.45)
    assert (m["bidirectional_p2p_disabled"][0][1], m["bidirectional_p2p_disabled"][1][0]) == (30.92, 30.79)
    assert (m["bidirectional_p2p_enabled"][0][1], m["bidirectional_p2p_enabled"][1][0]) == (31.06, 30.84)
    assert (m["latency_gpu_p2p_disabled_us"][0][1], m["latency_gpu_p2p_disabled_us"][1][0]) == (10.83, 10.28)
    assert (m["latency_cpu_p2p_disabled_us"][0][1], m["latency_cpu_p2p_disabled_us"][1][0]) == (5.49, 5.48)
    assert (m["latency_gpu_p2p_enabled_us"][0][1], m["latency_gpu_p2p_enabled_us"][1][0]) == (10.49, 10.55)
    assert 912 <= m["unidirectional_p2p_enabled"][0][0] <= 923


def test_rtx6000ada_pair_with_p2p():
    m = report("2x_rtx6000ada_threadripper_p2pBandwidthLatencyTest_p2p_enabled")["matrices"]
    assert (m["unidirectional_p2p_enabled"][0][1], m["unidirectional_p2p_enabled"][1][0]) == (26.32, 26.32)
    assert (m["bidirectional_p2p_enabled"][0][1], m["bidirectional_p2p_enabled"][1][0]) == (52.11, 52.10)
    assert (m["latency_gpu_p2p_enabled_us"][0][1], m["latency_gpu_p2p_enabled_us"][1][0]) == (1.12, 1.14)


def test_a100_nvswitch_box():
    r = report("8x_a100_sxm4_80gb_nvswitch_p2pBandwidthLatencyTest_distserve")
    assert r["gpus"] == 8
    assert all(all(v for v in peers.values()) for peers in r["can_access_peer"].values())
    m = r["matrices"]
    off = [m["unidirectional_p2p_enabled"][i][j] for i in range(8) for j in range(8) if i != j]
    assert min(off) >= 265
    assert max(off) <= 276  # "~265-275"
    lat = [m["latency_gpu_p2p_enabled_us"][i][j] for i in range(8) for j in range(8) if i != j]
    assert min(lat) >= 2.9
    assert max(lat) <= 3.5


def test_nvbandwidth_waived_test_has_no_matrix():
    r = report("nvbandwidth_2x_rtx2080ti_d2d_write_ce_waived_no_p2p")
    assert r["waived"] == ["device_to_device_memcpy_write_ce"]
    assert r["matrices"] == {}
    assert r["gpus"] == 2
    assert r["versions"]["driver_version"] == "525.125.06"


def test_nvbandwidth_host_device_rows_and_sums():
    r = report("nvbandwidth_8x_rtx4090_h2d_d2h_ce_excerpt")
    h2d = r["matrices"]["host_to_device_memcpy_ce"]
    assert len(h2d) == 1
    assert (min(h2d[0]), max(h2d[0])) == (23.90, 26.38)
    assert r["sums"] == {"host_to_device_memcpy_ce": 205.04, "device_to_host_memcpy_ce": 214.28}


def test_nvbandwidth_old_format_zero_diagonal():
    rows = report("nvbandwidth_readme_example_8gpu_d2d_read_ce_old_format_zero_diagonal")["matrices"][
        "device_to_device_memcpy_read_ce"
    ]
    assert [rows[i][i] for i in range(8)] == [0.0] * 8
    off = [rows[i][j] for i in range(8) for j in range(8) if i != j]
    assert (min(off), max(off)) == (263.05, 265.38)


def test_new_format_with_na_diagonal_and_bus_ids():
    text = (
        "nvbandwidth Version: v0.7\nDevice 0: NVIDIA H100 80GB HBM3 (00000000:19:00)\n"
        "Device 1: NVIDIA H100 80GB HBM3 (00000000:3b:00)\n\nRunning device_to_device_memcpy_write_ce.\n"
        "memcpy CE GPU(row) <- GPU(column) bandwidth (GB/s)\n           0         1\n"
        " 0       N/A    389.12\n 1    390.02       N/A\n\nSUM device_to_device_memcpy_write_ce 779.14\n"
    )
    r = parse_nvbandwidth(text)
    assert r["matrices"]["device_to_device_memcpy_write_ce"] == [[None, 389.12], [390.02, None]]
    assert r["devices"][1]["pci_bus_id"] == "00000000:3b:00"


def test_garbage_cell_names_the_line():
    with pytest.raises(BandwidthParseError, match=r"line 4: '2x\.5' is not a number"):
        parse_nvbandwidth("Running a_ce.\ntitle\n   0   1\n0  N/A  2x.5\n")


def test_unknown_report_is_refused():
    with pytest.raises(BandwidthParseError, match="neither nvbandwidth nor p2pBandwidthLatencyTest"):
        parse_report("hello\n")


@pytest.mark.parametrize(("gen", "width", "limit"), [(4, 16, 31.5), (3, 16, 15.8), (5, 16, 63.0), (4, 8, 15.8), (None, 16, None)])
def test_pcie_limit(gen, width, limit):
    assert pcie_limit_gbps(gen, width) == limit
