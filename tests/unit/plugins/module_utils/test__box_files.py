"""How the box's programs read and write their files (plugins/module_utils/_box_files.py)."""

from __future__ import annotations

from ansible_collections.gpubox.inference.plugins.module_utils._box_files import read_json, write_atomically


def test_a_missing_or_broken_file_reads_as_none(tmp_path):
    assert read_json(str(tmp_path / "missing.json")) is None
    (tmp_path / "broken.json").write_text("{not json")
    assert read_json(str(tmp_path / "broken.json")) is None


def test_a_file_is_written_whole_in_a_folder_made_for_it_and_read_back(tmp_path):
    path = tmp_path / "metrics" / "state.json"
    write_atomically(str(path), '{"ticks": 1}\n')
    write_atomically(str(path), '{"ticks": 2}\n')
    assert read_json(str(path)) == {"ticks": 2}
    assert sorted(p.name for p in path.parent.iterdir()) == ["state.json"]
