"""gpu_p2p_facts run as Ansible runs it, against the stand-in libcuda, and on imported reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ANSIBLE_ENV, FIXTURES, parse_capture, run_module

FAST = {"bandwidth_mib": 1, "repetitions": 2, "timeout": 10}


@pytest.fixture
def driver(fake_libcuda, monkeypatch):
    def configure(**env):
        monkeypatch.setitem(ANSIBLE_ENV, "GPUBOX_LIBCUDA", str(fake_libcuda))
        for key, value in env.items():
            monkeypatch.setitem(ANSIBLE_ENV, f"FAKE_CUDA_{key.upper()}", str(value))

    return configure


def p2p(result: dict) -> dict:
    assert result.get("failed") is not True, result
    return result["ansible_facts"]["gpu_p2p"]


def test_broken_pair_is_found_and_decides_the_settings(tmp_path: Path, driver):
    driver(devices=2, mode="corrupt", pair="1-0")
    facts = p2p(run_module("gpu_p2p_facts", {**FAST, "cache_path": str(tmp_path / "p2p.fact")}))
    assert facts["source"] == "measured"
    assert facts["pairs"]["1-0"]["status"] == "broken"
    assert facts["decisions"]["pairs"]["0-1"]["p2p_usable"] is False
    assert facts["decisions"]["nccl_p2p_disable"] is True
    assert not (tmp_path / "p2p.fact").exists(), "nothing is cached without a fingerprint"


def test_cache_is_keyed_by_fingerprint_and_skipped_in_check_mode(tmp_path: Path, driver):
    driver(devices=2)
    cache = tmp_path / "p2p.fact"
    args = {**FAST, "cache_path": str(cache), "fingerprint": "abc"}
    first = p2p(run_module("gpu_p2p_facts", args, check=True))
    assert first["cached"] is False
    assert not cache.exists()
    p2p(run_module("gpu_p2p_facts", args))
    assert json.loads(cache.read_text())["fingerprint"] == "abc"
    assert p2p(run_module("gpu_p2p_facts", args))["cached"] is True
    assert p2p(run_module("gpu_p2p_facts", {**args, "force": True}))["cached"] is False
    assert p2p(run_module("gpu_p2p_facts", {**args, "fingerprint": "def"}))["cached"] is False


def test_one_gpu_has_no_pair_but_its_host_link_is_measured(tmp_path: Path, driver):
    driver(devices=1)
    facts = p2p(run_module("gpu_p2p_facts", {**FAST, "cache_path": str(tmp_path / "c"), "fingerprint": "one"}))
    assert facts["source"] == "measured"
    assert facts["reason"] == "fewer than two GPUs: no pair to measure, only each GPU's copies to and from the host"
    assert facts["pairs"] == {}
    assert list(facts["host_links"]) == ["0"]
    assert facts["host_links"]["0"]["status"] == "ok"
    assert facts["host_links"]["0"]["host_to_device_gbps"] > 0
    assert facts["decisions"]["nccl_p2p_disable"] is False
    assert json.loads((tmp_path / "c").read_text())["host_links"]["0"]["verified"] is True


def test_no_driver_is_reported_not_failed(tmp_path: Path):
    facts = p2p(
        run_module("gpu_p2p_facts", {**FAST, "libcuda": str(tmp_path / "libcuda.so.1"), "cache_path": str(tmp_path / "c")})
    )
    assert facts["source"] == "none"
    assert facts["reason"].startswith("cannot load")


def test_import_saved_report(tmp_path: Path):
    saved = tmp_path / "p2p.txt"
    saved.write_text(
        parse_capture(FIXTURES / "D_p2p_bandwidth" / "2x_rtx4090_p2pBandwidthLatencyTest_p2p_unavailable_driver525.txt").text
    )
    facts = p2p(run_module("gpu_p2p_facts", {"src": str(saved)}))
    assert facts["source"] == "p2pBandwidthLatencyTest"
    assert facts["matrices"]["unidirectional_p2p_disabled"][0][1] == 22.02
    assert facts["decisions"]["nccl_p2p_disable"] is True


@pytest.mark.parametrize(
    ("capture", "fmt", "decided_from"),
    [
        (
            "nvbandwidth_json_1gpu_v0.5_verbose_d2d_waived_dcgm",
            "json",
            ["device_to_device_bidirectional_memcpy_read_ce", "device_to_device_bidirectional_memcpy_write_ce"],
        ),
        ("nvbandwidth_6x_rtxa6000_d2d_read_ce_running_line_elided_name_from_sum", "text", ["device_to_device_memcpy_read_ce"]),
        (
            "8x_titan_rtx_p2pBandwidthLatencyTest_p2p_read_no_peer_access_gpu_micro",
            "text",
            ["unidirectional_p2p_enabled", "unidirectional_p2p_disabled"],
        ),
    ],
)
def test_every_saved_format_imports_and_says_what_decided(tmp_path: Path, capture, fmt, decided_from):
    saved = tmp_path / "report.txt"
    saved.write_text(parse_capture(FIXTURES / "D_p2p_bandwidth" / f"{capture}.txt").text)
    facts = p2p(run_module("gpu_p2p_facts", {"src": str(saved)}))
    assert facts["format"] == fmt
    assert set(decided_from) <= set(facts["decided_from"])
    assert facts["cached"] is False


def test_unreadable_report_names_the_source(tmp_path: Path):
    saved = tmp_path / "junk.txt"
    saved.write_text("hello\n")
    result = run_module("gpu_p2p_facts", {"src": str(saved)})
    assert result["failed"] is True
    assert result["msg"] == f"cannot read src={saved}: neither nvbandwidth (text or -j JSON) nor p2pBandwidthLatencyTest output"


def test_bad_option_value_is_refused():
    result = run_module("gpu_p2p_facts", {"repetitions": 0})
    assert result["failed"] is True
    assert result["msg"] == "repetitions=0 must be at least 1"


def _stand_in_nvbandwidth(folder: Path, body: str, log: Path) -> Path:
    folder.mkdir()
    script = folder / "nvbandwidth"
    (folder / "out.txt").write_text(body)
    script.write_text(f'#!/bin/sh\necho "$*" >> {log}\ncat {folder / "out.txt"}\n')
    script.chmod(0o755)
    return folder


def test_nvbandwidth_runs_the_three_device_to_device_tests(tmp_path: Path, monkeypatch):
    capture = FIXTURES / "D_p2p_bandwidth" / "nvbandwidth_readme_example_8gpu_d2d_read_ce_old_format_zero_diagonal.txt"
    log = tmp_path / "calls.log"
    folder = _stand_in_nvbandwidth(tmp_path / "bin", parse_capture(capture).text, log)
    facts = p2p(run_module("gpu_p2p_facts", {"p2p_tool": "nvbandwidth", "cache_path": str(tmp_path / "c")}, path_prefix=folder))
    assert log.read_text().split() == [
        "-t",
        "device_to_device_memcpy_read_ce",
        "-t",
        "device_to_device_memcpy_write_ce",
        "-t",
        "device_to_device_bidirectional_memcpy_read_ce",
    ]
    assert facts["source"] == "nvbandwidth"
    assert facts["gpus"] == 8
    assert facts["decisions"]["nccl_p2p_level"] is None


def test_nvbandwidth_missing_falls_back_to_ctypes(tmp_path: Path, driver):
    driver(devices=2)
    result = run_module("gpu_p2p_facts", {**FAST, "p2p_tool": "nvbandwidth", "cache_path": str(tmp_path / "c")})
    assert p2p(result)["source"] == "measured"
    assert "nvbandwidth is not on the PATH" in " ".join(result["warnings"])
