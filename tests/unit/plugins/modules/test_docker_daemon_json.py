"""docker_daemon_json run as Ansible runs it, on a scratch file."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import run_module

NVIDIA = {"runtimes": {"nvidia": {"path": "nvidia-container-runtime", "args": []}}}


def test_merge_keeps_existing_keys_and_is_idempotent(tmp_path: Path):
    path = tmp_path / "daemon.json"
    path.write_text('{"log-level": "warn"}')
    first = run_module("docker_daemon_json", {"path": str(path), "settings": NVIDIA})
    assert first["changed"] is True
    assert json.loads(path.read_text()) == {"log-level": "warn", **NVIDIA}
    second = run_module("docker_daemon_json", {"path": str(path), "settings": NVIDIA})
    assert second["changed"] is False


def test_check_mode_predicts_and_writes_nothing(tmp_path: Path):
    path = tmp_path / "daemon.json"
    path.write_text('{"log-level": "warn"}')
    result = run_module("docker_daemon_json", {"path": str(path), "settings": {"default-runtime": "nvidia"}}, check=True)
    assert result["changed"] is True
    assert result["daemon"] == {"log-level": "warn", "default-runtime": "nvidia"}
    assert path.read_text() == '{"log-level": "warn"}'


def test_missing_file_is_created(tmp_path: Path):
    path = tmp_path / "docker" / "daemon.json"
    result = run_module("docker_daemon_json", {"path": str(path), "settings": NVIDIA})
    assert result["changed"] is True
    assert oct(path.stat().st_mode & 0o777) == "0o644"


def test_broken_file_is_refused_with_its_path(tmp_path: Path):
    path = tmp_path / "daemon.json"
    path.write_text("{not json")
    result = run_module("docker_daemon_json", {"path": str(path), "settings": NVIDIA})
    assert result["failed"] is True
    assert result["msg"].startswith(f"path='{path}': cannot merge into it: it is not valid JSON")
    assert path.read_text() == "{not json"


def test_it_says_whether_a_restart_is_needed_or_a_reload_applies_the_change(tmp_path: Path):
    path = tmp_path / "daemon.json"
    path.write_text('{"log-driver": "json-file"}')
    reload = run_module("docker_daemon_json", {"path": str(path), "settings": {**NVIDIA, "live-restore": True}})
    assert (reload["changed"], reload["restart"]) == (True, False)
    restart = run_module("docker_daemon_json", {"path": str(path), "settings": {"log-driver": "local"}})
    assert (restart["changed"], restart["restart"]) == (True, True)
    same = run_module("docker_daemon_json", {"path": str(path), "settings": {"log-driver": "local"}})
    assert (same["changed"], same["restart"]) == (False, False)
