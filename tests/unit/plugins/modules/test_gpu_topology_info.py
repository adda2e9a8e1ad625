"""gpu_topology_info, run as Ansible runs it: on saved outputs, and live against a stand-in nvidia-smi.

The stand-in is a shell script on PATH that prints captured outputs and logs
its arguments, so these tests state exactly which commands the module runs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from conftest import ANSIBLE_ENV, FIXTURES, parse_capture
from conftest import run_module as run_gpubox_module

TOPO = FIXTURES / "A_topo_m" / "2x_rtx5090_threadripper3975wx_PHB_gpu_numa_id.txt"
P2P = FIXTURES / "B_topo_p2p" / "2x_rtx5090_p2p_rw_GNS.txt"


def run_module(args: dict, path_prefix: Path | None = None, check: bool = False) -> dict:
    return run_gpubox_module("gpu_topology_info", args, path_prefix, check)


def body_file(tmp_path: Path, capture: Path) -> Path:
    """The command output alone, as a user would save it (without the fixture header)."""
    out = tmp_path / capture.name
    out.write_text(parse_capture(capture).text)
    return out


@pytest.fixture
def fake_nvidia_smi(tmp_path: Path):
    """A stand-in nvidia-smi that prints captured matrices and logs each call."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "calls.log"
    topo, p2p = body_file(tmp_path, TOPO), body_file(tmp_path, P2P)
    script = bindir / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {log}\n'
        'case "$*" in\n'
        f'  "topo -m") cat {topo} ;;\n'
        f'  "topo -p2p r"|"topo -p2p w") cat {p2p} ;;\n'
        '  *) echo "unexpected: $*" >&2; exit 3 ;;\n'
        "esac\n"
    )
    script.chmod(0o755)
    return bindir, log


def test_saved_outputs_are_analysed(tmp_path):
    result = run_module({"src": str(body_file(tmp_path, TOPO)), "p2p_src": str(body_file(tmp_path, P2P))})
    topo = result["topology"]
    assert result["changed"] is False
    assert topo["links"] == {"GPU0": {"GPU1": "PHB"}, "GPU1": {"GPU0": "PHB"}}
    assert topo["p2p"] == {"GPU0": {"GPU1": "GNS"}, "GPU1": {"GPU0": "GNS"}}
    assert topo["verdict"] == "slow"
    assert "GNS" in topo["reason"]
    assert topo["source"] == str(tmp_path / TOPO.name)


def test_a_fixture_file_with_its_header_still_reads(tmp_path):
    # The header lines before the matrix are like a prompt: skipped, not misread.
    result = run_module({"src": str(TOPO)})
    assert result["topology"]["gpus"][1]["cpu_affinity"] == "0-63"
    assert result["topology"]["p2p"] == {}


def test_live_host_runs_exactly_topo_m_and_both_p2p_matrices(fake_nvidia_smi):
    bindir, log = fake_nvidia_smi
    result = run_module({}, path_prefix=bindir)
    assert result["topology"]["source"] == "nvidia-smi"
    assert result["topology"]["worst_gpu_link"]["code"] == "PHB"
    assert result["topology"]["p2p"]["GPU0"]["GPU1"] == "GNS"
    assert log.read_text().splitlines() == ["topo -m", "topo -p2p r", "topo -p2p w"]


def test_check_mode_reads_the_same_and_changes_nothing(fake_nvidia_smi):
    bindir, _log = fake_nvidia_smi
    result = run_module({}, path_prefix=bindir, check=True)
    assert result["changed"] is False
    assert result["topology"]["verdict"] == "slow"


def test_no_nvidia_smi_gives_one_clear_message(monkeypatch):
    # PATH without any nvidia-smi: only the venv and the system's bin folders.
    monkeypatch.setitem(ANSIBLE_ENV, "PATH", os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"]))
    result = run_module({})
    assert result["failed"] is True
    assert "nvidia-smi was not found on the host" in result["msg"]
    assert "set src" in result["msg"]


def test_damaged_matrix_fails_naming_the_line(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("\tGPU0\tGPU1\nGPU0\t X \tPHB\nGPU1\tPHB\n")
    result = run_module({"src": str(bad)})
    assert result["failed"] is True
    assert result["msg"].startswith(f"cannot read src={bad}: line 3: row GPU1 has 1 cells")


def test_p2p_src_alone_is_read_with_its_own_gpu_names(tmp_path):
    result = run_module({"p2p_src": str(body_file(tmp_path, P2P))})
    topo = result["topology"]
    assert [g["name"] for g in topo["gpus"]] == ["GPU0", "GPU1"]
    assert topo["p2p"] == {"GPU0": {"GPU1": "GNS"}, "GPU1": {"GPU0": "GNS"}}
    assert (topo["verdict"], topo["links"], topo["worst_gpu_link"]) == ("slow", {}, None)
    assert topo["source"].endswith(P2P.name)


def test_p2p_src_alone_all_ok_says_the_links_are_unknown(tmp_path):
    ok = FIXTURES / "B_topo_p2p" / "4x_rtx_pro_6000_p2p_status_all_OK.txt"
    topo = run_module({"p2p_src": str(body_file(tmp_path, ok))})["topology"]
    assert topo["verdict"] == "unknown"
    assert "nvidia-smi topo -m" in topo["reason"]


def test_p2p_src_from_another_box_is_refused_naming_the_gpu(tmp_path):
    four = FIXTURES / "B_topo_p2p" / "4x_rtx5060ti_patched_open_driver_p2p_rw_all_OK.txt"
    result = run_module({"src": str(body_file(tmp_path, TOPO)), "p2p_src": str(body_file(tmp_path, four))})
    assert result["failed"] is True
    assert "names GPU2, which src=" in result["msg"]


def test_a_glued_nic_cell_is_read_around_with_a_warning_per_row(tmp_path):
    glued = FIXTURES / "A_topo_m" / "8x_a100_sxm4_40gb_NV12_8nic_last_nic_cell_glued_to_cpu_affinity.txt"
    result = run_module({"src": str(body_file(tmp_path, glued))})
    topo = result["topology"]
    assert topo["verdict"] == "fit"
    assert len(topo["unreadable"]) == 16
    assert len(result["warnings"]) == 8
    assert result["warnings"][0] == (
        "nvidia-smi topo -m printed row GPU0, column NIC7 run into the CPU Affinity as 'PH0-115' (line 3): "
        "both are left unread; every other cell was read"
    )


def test_missing_file_names_the_option(tmp_path):
    result = run_module({"src": str(tmp_path / "nope.txt")})
    assert result["failed"] is True
    assert result["msg"].startswith(f"src='{tmp_path / 'nope.txt'}': cannot read the file")


def test_nvidia_smi_failure_reports_rc_and_stderr(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "nvidia-smi"
    message = "NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver"
    script.write_text(f"#!/bin/sh\necho '{message}' >&2\nexit 9\n")
    script.chmod(0o755)
    result = run_module({}, path_prefix=bindir)
    assert result["failed"] is True
    assert result["rc"] == 9
    assert "'nvidia-smi topo -m' failed with rc=9: NVIDIA-SMI has failed" in result["msg"]
