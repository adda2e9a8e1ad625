"""The captured outputs are intact: every file parses, and matches the shared copy when one is present."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import FIXTURES, ROOT, parse_capture

ALL = sorted(FIXTURES.glob("*/*.txt"))
SHARED = ROOT.parent / "shared" / "fixtures"


def test_fixture_folders_are_present():
    folders = {p.parent.name for p in ALL}
    assert folders >= {"A_topo_m", "B_topo_p2p", "C_lspci", "D_p2p_bandwidth", "E_smi_q_pcie", "F_nccl_log"}


@pytest.mark.parametrize("path", ALL, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_capture_has_header_and_output(path: Path):
    cap = parse_capture(path)
    assert cap.source
    assert cap.expected
    assert cap.text.strip(), "no command output after the header"


@pytest.mark.skipif(not SHARED.is_dir(), reason="no shared fixtures beside this checkout")
@pytest.mark.parametrize("path", ALL, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_capture_is_an_unedited_copy(path: Path):
    shared = SHARED / path.parent.name / path.name
    if not shared.exists():
        pytest.skip(f"{shared} is not in the shared set")
    assert path.read_bytes() == shared.read_bytes()


def test_parse_capture_rejects_a_file_without_separator(tmp_path: Path):
    bad = tmp_path / "bad.txt"
    bad.write_text("# source: x\n# machine: y\n# expected: z\nGPU0\tX\n")
    with pytest.raises(ValueError, match="no '# ---' line"):
        parse_capture(bad)


def test_parse_capture_rejects_a_missing_header_field(tmp_path: Path):
    bad = tmp_path / "bad.txt"
    bad.write_text("# source: x\n# expected: z\n# ---\nGPU0\tX\n")
    with pytest.raises(ValueError, match="header lacks machine"):
        parse_capture(bad)
