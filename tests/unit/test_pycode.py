"""tests/pycode/sitecustomize.py: code compiled from a zip is kept, given back under the new zip's name, never stale."""

from __future__ import annotations

import hashlib
import marshal
import os
import subprocess
import sys
import zipfile
from importlib.util import MAGIC_NUMBER
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

RUN = """
import sys, traceback
sys.path.insert(0, sys.argv[1])
import payload.mod as mod
print(mod.ANSWER)
try:
    mod.fail()
except ValueError:
    print(traceback.extract_tb(sys.exc_info()[2])[-1].filename)
"""


def payload(path: Path, answer: int) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("payload/__init__.py", "")
        archive.writestr("payload/mod.py", source(answer))
    return path


def source(answer: int) -> str:
    return f"ANSWER = {answer}\n\n\ndef fail():\n    raise ValueError('from the zip')\n"


def run(archive: Path, cache: Path | None) -> list[str]:
    env = {key: value for key, value in os.environ.items() if key != "GPUBOX_PYCODE_CACHE"}
    env["PYTHONPATH"] = str(ROOT / "tests" / "pycode")
    if cache is not None:
        env["GPUBOX_PYCODE_CACHE"] = str(cache)
    done = subprocess.run([sys.executable, "-c", RUN, str(archive)], env=env, capture_output=True, text=True, check=True)
    return done.stdout.split()


def entries(cache: Path) -> set[Path]:
    return {path for path in cache.rglob("*") if path.is_file()}


def test_the_code_is_compiled_once_and_named_after_the_zip_it_was_imported_from(tmp_path):
    cache = tmp_path / "cache"
    first = payload(tmp_path / "one.zip", 42)
    assert run(first, cache) == ["42", str(first / "payload" / "mod.py")]
    kept = entries(cache)
    assert len(kept) == 2, kept  # the package's __init__ and the module
    second = payload(tmp_path / "two.zip", 42)
    # The same sources from another zip: read from the cache, with the new zip's path in its tracebacks.
    assert run(second, cache) == ["42", str(second / "payload" / "mod.py")]
    assert entries(cache) == kept


def test_kept_code_is_what_the_cache_gives_back(tmp_path):
    cache = tmp_path / "cache"
    archive = payload(tmp_path / "one.zip", 42)
    run(archive, cache)
    # The module's entry replaced by other code: the next import runs that, so the entry is what is read.
    key = hashlib.sha256(MAGIC_NUMBER + source(42).encode()).hexdigest()
    entry = cache / key[:2] / key
    assert entry.is_file()
    entry.write_bytes(marshal.dumps(compile(source(7), "elsewhere.py", "exec")))
    assert run(archive, cache)[0] == "7"


def test_changed_source_is_compiled_again(tmp_path):
    cache = tmp_path / "cache"
    run(payload(tmp_path / "one.zip", 42), cache)
    assert run(payload(tmp_path / "two.zip", 43), cache)[0] == "43"
    assert len(entries(cache)) == 3


def test_without_the_cache_folder_nothing_is_kept(tmp_path):
    assert run(payload(tmp_path / "one.zip", 42), None)[0] == "42"
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("stored", [b"not marshal", marshal.dumps(42)], ids=["unreadable", "not-code"])
def test_an_entry_that_does_not_load_is_compiled_again(tmp_path, stored):
    cache = tmp_path / "cache"
    archive = payload(tmp_path / "one.zip", 42)
    run(archive, cache)
    for entry in entries(cache):
        entry.write_bytes(stored)
    assert run(archive, cache)[0] == "42"
