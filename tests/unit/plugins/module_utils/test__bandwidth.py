"""_bandwidth against every captured nvbandwidth and p2pBandwidthLatencyTest output (``# expected:`` is the truth)."""

from __future__ import annotations

import re

import pytest
from conftest import capture_params, captures

from ansible_collections.gpubox.inference.plugins.module_utils._bandwidth import (
    BandwidthParseError,
    parse_nvbandwidth,
    parse_nvbandwidth_json,
    parse_report,
    pcie_limit_gbps,
)
from ansible_collections.gpubox.inference.plugins.module_utils._p2p import from_report

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
    assert result["format"] == ("json" if "_json_" in cap.path.stem else "text")
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
    with pytest.raises(BandwidthParseError, match=re.escape("neither nvbandwidth (text or -j JSON) nor p2pBandwidthLatencyTest")):
        parse_report("hello\n")


READS = "8x_titan_rtx_p2pBandwidthLatencyTest_p2p_read_no_peer_access_gpu_micro"
DGX2 = "12x_v100_dgx2_p2pBandwidthLatencyTest_p2p_read_two_digit_indices_excerpt"
ELIDED = "nvbandwidth_6x_rtxa6000_d2d_read_ce_running_line_elided_name_from_sum"
JSON = "nvbandwidth_json_1gpu_v0.5_verbose_d2d_waived_dcgm"


def test_p2p_read_run_keeps_writes_and_reads_apart():
    r = report(READS)
    m = r["matrices"]
    assert set(m) == P2PBLT_NAMES | {
        "unidirectional_p2p_enabled_reads",
        "latency_gpu_p2p_enabled_reads_us",
        "latency_cpu_p2p_enabled_reads_us",
    }
    assert r["p2p_method"] == "read"
    assert (
        m["unidirectional_p2p_enabled"][0][1],
        m["unidirectional_p2p_enabled"][1][0],
        m["unidirectional_p2p_enabled"][0][2],
    ) == (
        9.91,
        9.92,
        11.36,
    )
    reads = m["unidirectional_p2p_enabled_reads"]
    assert (reads[0][1], reads[1][0], reads[0][4]) == (9.96, 9.96, 11.42)
    assert m["unidirectional_p2p_disabled"][0][1] == 9.93
    assert m["bidirectional_p2p_enabled"][0][1] == 9.94
    assert (m["latency_gpu_p2p_enabled_us"][0][1], m["latency_gpu_p2p_enabled_reads_us"][0][1]) == (13.99, 12.75)
    assert m["latency_cpu_p2p_enabled_reads_us"][0][1] == 13.03
    assert r["gpus"] == 8
    assert not any(peer for peers in r["can_access_peer"].values() for peer in peers.values())


def test_p2p_decisions_use_the_writes_and_say_so():
    facts = from_report(report(READS))
    assert facts["decided_from"] == ["unidirectional_p2p_enabled", "unidirectional_p2p_disabled"]
    assert facts["matrices"]["unidirectional_p2p_enabled_reads"][0][1] == 9.96
    assert {pair["status"] for pair in facts["pairs"].values()} == {"no_peer_access"}
    assert facts["decisions"]["nccl_p2p_disable"] is True


def test_a_run_without_p2p_read_is_a_write_run():
    assert report("2x_rtx6000ada_threadripper_p2pBandwidthLatencyTest_p2p_enabled")["p2p_method"] == "write"


def test_two_digit_indices_in_a_p2p_read_excerpt():
    r = report(DGX2)
    m = r["matrices"]
    assert r["gpus"] == 12
    assert r["devices"] == []
    writes, reads = m["unidirectional_p2p_enabled"], m["unidirectional_p2p_enabled_reads"]
    assert {writes[i][j] for i in range(12) for j in range(12) if i != j} == {145.57}
    assert (writes[10][10], reads[0][0], reads[11][11], reads[1][8]) == (850.61, 850.59, 850.63, 145.51)
    assert {reads[i][j] for i in range(12) for j in range(12) if i != j} == {145.50, 145.51}
    assert (m["unidirectional_p2p_disabled"][0][1], m["unidirectional_p2p_disabled"][11][10]) == (9.28, 9.43)
    assert m["connectivity"] == [[1.0] * 12] * 12


@pytest.mark.parametrize(
    "variant",
    [
        pytest.param(lambda t: t.replace("\n", "\r\n"), id="windows-line-endings"),
        pytest.param(lambda t: t.replace("\n", "   \n"), id="trailing-spaces"),
        pytest.param(lambda t: t.replace("Matrix (GB/s)\n", "Matrix (GB/s)\n\n"), id="blank-line-after-titles"),
        pytest.param(
            lambda t: t.replace("\nUnidirectional", "\n\x1b[1mUnidirectional").replace("(GB/s)\n", "(GB/s)\x1b[0m\n"), id="ansi"
        ),
        pytest.param(lambda t: re.sub(r"(?m)^( +)(\d+) ", lambda m: m.group(1) + m.group(2) + "\t", t), id="tabs-after-index"),
    ],
)
def test_p2p_read_capture_reads_the_same_through_paste_damage(variant):
    plain = report(DGX2)
    varied = parse_report(variant(D[DGX2].text))
    assert varied["matrices"] == plain["matrices"]


def test_a_second_run_pasted_into_the_same_file_is_refused_with_both_lines():
    text = D["2x_rtx6000ada_threadripper_p2pBandwidthLatencyTest_p2p_enabled"].text
    with pytest.raises(BandwidthParseError, match=r"a second connectivity matrix \(the first is at line \d+\)"):
        parse_report(text + text)


def test_an_unknown_peer_enabled_title_is_refused_not_filed_under_a_near_name():
    text = D[DGX2].text.replace("(P2P Reads)", "(P2P Atomics)")
    with pytest.raises(BandwidthParseError, match=r"line \d+: a matrix title this parser does not know"):
        parse_report(text)


def test_nvbandwidth_text_without_its_running_line_is_named_by_sum():
    r = report(ELIDED)
    rows = r["matrices"]["device_to_device_memcpy_read_ce"]
    assert r["gpus"] == 6
    assert [rows[i][i] for i in range(6)] == [None] * 6
    assert (rows[0][1], rows[0][3], rows[3][0], rows[5][4]) == (26.34, 21.95, 21.82, 26.35)
    assert r["sums"] == {"device_to_device_memcpy_read_ce": 715.53}
    assert r["tests"] == {"device_to_device_memcpy_read_ce": "passed"}
    assert r["versions"]["driver_version"] == "580.95.05"
    assert {pair["status"] for pair in from_report(r)["pairs"].values()} == {"ok"}


def test_nvbandwidth_matrix_named_by_neither_line_is_refused_naming_it():
    text = D[ELIDED].text.replace("SUM device_to_device_memcpy_read_ce 715.53", "")
    with pytest.raises(BandwidthParseError, match=r"line 11: a matrix without a test name"):
        parse_nvbandwidth(text)
    twice = D[ELIDED].text.replace("SUM device_to_device_memcpy_read_ce 715.53", "") + D[ELIDED].text
    with pytest.raises(BandwidthParseError, match=r"line 11: a matrix without a test name .* and line \d+ starts another"):
        parse_nvbandwidth(twice)


def test_nvbandwidth_running_and_sum_that_disagree_are_refused():
    text = (
        "Running device_to_device_memcpy_write_ce.\n           0         1\n 0  N/A  1.0\n 1  2.0  N/A\n"
        "SUM device_to_device_memcpy_read_ce 3.0\n"
    )
    with pytest.raises(BandwidthParseError, match="SUM names device_to_device_memcpy_read_ce, but the matrix at line 2"):
        parse_nvbandwidth(text)


def test_nvbandwidth_text_with_crlf_and_ansi_reads_the_same():
    varied = D[ELIDED].text.replace("\n", "\r\n").replace("SUM", "\x1b[32mSUM")
    assert parse_report(varied)["matrices"] == report(ELIDED)["matrices"]


def test_nvbandwidth_json_reads_into_the_text_shape_with_waived_tests():
    r = report(JSON)
    assert r["format"] == "json"
    assert r["gpus"] == 1
    assert r["matrices"]["host_to_device_memcpy_ce"] == [[12.3964]]
    assert r["matrices"]["device_to_host_memcpy_ce"] == [[13.2001]]
    assert r["matrices"]["host_device_latency_sm"] == [[649.879]]
    assert r["versions"] == {"nvbandwidth_version": "v0.5", "cuda_runtime_version": "12070", "driver_version": "565.02"}
    assert len(r["tests"]) == 32
    assert sum(status == "waived" for status in r["tests"].values()) == 17
    assert sum(status == "passed" for status in r["tests"].values()) == 15
    assert "device_to_device_memcpy_read_ce" in r["waived"]
    assert r["sums"]["host_to_device_memcpy_ce"] == 12.396361291250001
    facts = from_report(r)
    assert facts["waived"] == r["waived"]
    assert facts["pairs"] == {}
    assert "device_to_device_memcpy_write_ce" in facts["decided_from"]


def _json(cases: list, **extra) -> str:
    import json

    return "$ ./nvbandwidth -j\n" + json.dumps({"nvbandwidth": {"testcases": cases, **extra}}, indent="\t")


def test_nvbandwidth_json_multi_gpu_cells_and_statuses():
    cases = [
        {
            "name": "device_to_device_memcpy_read_ce",
            "status": "Passed",
            "bandwidth_matrix": [["N/A", "26.3"], ["26.1", "N/A"]],
            "sum": 52.4,
        },
        {"name": "device_to_device_memcpy_write_ce", "status": "Error", "error": "cuMemcpyAsync failed"},
        {"name": "host_to_device_memcpy_sm", "status": "Not Found"},
        {"name": "device_to_device_latency_sm", "status": "Running"},
    ]
    r = parse_report(_json(cases).replace("\n", "\r\n"))
    assert r["matrices"] == {"device_to_device_memcpy_read_ce": [[None, 26.3], [26.1, None]]}
    assert r["tests"] == {
        "device_to_device_memcpy_read_ce": "passed",
        "device_to_device_memcpy_write_ce": "error",
        "host_to_device_memcpy_sm": "not_found",
        "device_to_device_latency_sm": "error",
    }
    assert r["errors"]["device_to_device_memcpy_write_ce"] == "cuMemcpyAsync failed"
    assert "never finished" in r["errors"]["device_to_device_latency_sm"]
    facts = from_report(r)
    assert facts["decided_from"] == ["device_to_device_memcpy_read_ce"]
    assert {pair["status"] for pair in facts["pairs"].values()} == {"ok"}


@pytest.mark.parametrize(
    ("cases", "message"),
    [
        ([{"name": "a_ce", "status": "Passed", "bandwidth_matrix": [["N/A", "fast"]]}], "testcase a_ce, row 0, column 1: 'fast'"),
        ([{"name": "a_ce", "status": "Done"}], "testcase a_ce: status 'Done' is not one nvbandwidth writes"),
        ([{"status": "Passed"}], "testcase 1: no 'name'"),
        ([{"name": "a_ce", "status": "Passed"}], "testcase a_ce: passed without a bandwidth_matrix"),
    ],
)
def test_nvbandwidth_json_that_could_be_misread_is_refused(cases, message):
    with pytest.raises(BandwidthParseError, match=re.escape(message)):
        parse_nvbandwidth_json(_json(cases))


def test_broken_json_names_the_line():
    with pytest.raises(BandwidthParseError, match=r"line 4: not valid JSON"):
        parse_report('$ nvbandwidth -j\n{\n "nvbandwidth": {\n  "testcases": [,]\n}}\n')


@pytest.mark.parametrize(("gen", "width", "limit"), [(4, 16, 31.5), (3, 16, 15.8), (5, 16, 63.0), (4, 8, 15.8), (None, 16, None)])
def test_pcie_limit(gen, width, limit):
    assert pcie_limit_gbps(gen, width) == limit
