"""_hub: the files vLLM needs from a Hub tree, the cache's state, the disk, HTTP answers, progress."""

from __future__ import annotations

import pytest

from ansible_collections.gpubox.inference.plugins.module_utils import _hub
from ansible_collections.gpubox.inference.plugins.module_utils._words import explain, say


def lfs(path: str, size: int, sha: str) -> dict:
    return {
        "type": "file",
        "oid": "f" * 40,
        "size": size,
        "lfs": {"oid": sha * 64, "size": size, "pointerSize": 135},
        "path": path,
    }


def plain(path: str, size: int = 100, oid: str = "a") -> dict:
    return {"type": "file", "oid": oid * 40, "size": size, "path": path}


# The layout of meta-llama/Llama-3.1-8B-Instruct's main branch: four safetensors shards and their index,
# the original checkpoint under original/, the tokenizer, and the repository's own documents.
LLAMA_TREE = [
    plain(".gitattributes"),
    plain("LICENSE"),
    plain("README.md"),
    plain("USE_POLICY.md"),
    plain("config.json", 855, "1"),
    plain("generation_config.json", 184, "2"),
    lfs("model-00001-of-00004.safetensors", 4976698672, "1"),
    lfs("model-00002-of-00004.safetensors", 4999802720, "2"),
    lfs("model-00003-of-00004.safetensors", 4915916176, "3"),
    lfs("model-00004-of-00004.safetensors", 1168138808, "4"),
    plain("model.safetensors.index.json", 23950, "3"),
    {"type": "directory", "oid": "d" * 40, "size": 0, "path": "original"},
    lfs("original/consolidated.00.pth", 16060617592, "5"),
    plain("original/params.json", 199, "4"),
    lfs("original/tokenizer.model", 2183982, "6"),
    plain("special_tokens_map.json", 296, "5"),
    lfs("tokenizer.json", 9085657, "7"),
    plain("tokenizer_config.json", 55351, "6"),
]


def test_safetensors_at_the_top_level_with_their_index_and_the_tokenizer_are_chosen():
    files, weight_format = _hub.select_files(LLAMA_TREE)
    assert weight_format == "safetensors"
    assert [f["path"] for f in files] == [
        "config.json",
        "generation_config.json",
        "model-00001-of-00004.safetensors",
        "model-00002-of-00004.safetensors",
        "model-00003-of-00004.safetensors",
        "model-00004-of-00004.safetensors",
        "model.safetensors.index.json",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    shard = files[2]
    assert shard == {"path": "model-00001-of-00004.safetensors", "size": 4976698672, "blob": "1" * 64, "lfs": True}
    assert files[0]["blob"] == "1" * 40, "a file outside LFS is stored under its Git blob id"


def test_bin_weights_are_taken_only_when_there_are_no_safetensors():
    tree = [plain("config.json"), lfs("pytorch_model.bin", 500, "1"), plain("pytorch_model.bin.index.json"), plain("vocab.json")]
    files, weight_format = _hub.select_files(tree)
    assert weight_format == "pytorch"
    assert [f["path"] for f in files] == ["config.json", "pytorch_model.bin", "pytorch_model.bin.index.json", "vocab.json"]
    both = [*tree, lfs("model.safetensors", 400, "2")]
    files, weight_format = _hub.select_files(both)
    assert weight_format == "safetensors"
    assert "pytorch_model.bin" not in [f["path"] for f in files]


def test_a_repository_without_weights_has_no_format():
    files, weight_format = _hub.select_files([plain("config.json"), lfs("model-q4_k_m.gguf", 10, "1")])
    assert weight_format is None
    assert [f["path"] for f in files] == ["config.json"]


@pytest.mark.parametrize("repo_id", ["meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-0.5B", "gpt2", "org/name.v2_x-y"])
def test_hub_ids_are_accepted(repo_id):
    assert _hub.check_repo_id(repo_id) is None


@pytest.mark.parametrize("repo_id", ["", "org/name/extra", "org//name", "../etc", "org/na me", "-org/x", "org/name.", "org/.."])
def test_what_cannot_be_a_hub_id_is_refused_naming_the_variable(repo_id):
    assert _hub.check_repo_id(repo_id) == (
        f"vllm_model={repo_id!r} is neither an absolute path on the host nor a Hub model id like ORG/NAME"
    )


def test_urls_quote_the_revision_and_keep_the_repo_id():
    urls = _hub.urls("https://hf-mirror.com/", "org/name", "refs/pr/1")
    assert urls["info"] == "https://hf-mirror.com/api/models/org/name/revision/refs%2Fpr%2F1"
    assert urls["tree"].format(commit="c" * 40) == f"https://hf-mirror.com/api/models/org/name/tree/{'c' * 40}?recursive=true"
    assert urls["file"].format(commit="c", path="config.json") == "https://hf-mirror.com/org/name/resolve/c/config.json"


@pytest.mark.parametrize(
    ("status", "error_code", "token", "code"),
    [
        (401, "GatedRepo", False, "hub.gated_no_token"),
        (403, "GatedRepo", True, "hub.gated_no_access"),
        (401, "RepoNotFound", False, "hub.not_found"),
        (404, "RepoNotFound", True, "hub.not_found"),
        (404, "RevisionNotFound", False, "hub.revision_not_found"),
        (404, "", False, "hub.not_found"),
        (401, "", True, "hub.token_refused"),
        (401, "", False, "hub.not_found"),
        (403, "", True, "hub.forbidden"),
        (429, "", False, "hub.http_error"),
        (503, "", False, "hub.http_error"),
    ],
)
def test_each_http_answer_names_its_cause(status, error_code, token, code):
    assert _hub.http_finding(status, error_code, token) == code
    words = say(code, model="m/x", endpoint="https://hf.example", status=status, revision="v1", detail="busy")
    assert words.startswith(f"m/x at https://hf.example answered HTTP {status}")


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ("Request failed: <urlopen error [Errno 111] Connection refused>", "Connection refused"),
        ("Request failed: <urlopen error [Errno -2] Name or service not known>", "Name or service not known"),
        ("Request failed: <urlopen error timed out>", "timed out"),
        ("", "no answer"),
    ],
)
def test_an_unreachable_endpoint_says_why_in_few_words(message, reason):
    assert _hub.unreachable_reason(message) == reason


FILES = [
    {"path": "config.json", "size": 700, "blob": "c" * 40, "lfs": False},
    {"path": "model.safetensors", "size": 10_000, "blob": "e" * 64, "lfs": True},
]


def test_an_empty_cache_misses_everything():
    assert _hub.cache_state(FILES, {}, set()) == {
        "total_bytes": 10_700,
        "done_bytes": 0,
        "missing_bytes": 10_700,
        "file_count": 2,
        "present_files": 0,
        "complete": False,
    }


def test_a_partial_download_counts_toward_progress_but_not_as_present():
    blobs = {"c" * 40: 700, "e" * 64 + ".3f2a9c1d.incomplete": 4000, "unrelated": 99}
    state = _hub.cache_state(FILES, blobs, {"config.json"})
    assert (state["done_bytes"], state["missing_bytes"], state["present_files"], state["complete"]) == (4700, 10_000, 1, False)


def test_a_blob_of_the_wrong_size_is_missing():
    state = _hub.cache_state(FILES, {"c" * 40: 700, "e" * 64: 9_999}, {"config.json", "model.safetensors"})
    assert state["missing_bytes"] == 10_000
    assert not state["complete"]


def test_complete_needs_every_blob_and_every_link_of_the_commit():
    blobs = {"c" * 40: 700, "e" * 64: 10_000}
    assert _hub.cache_state(FILES, blobs, {"config.json", "model.safetensors"})["complete"]
    # Blobs shared with another commit, not yet linked in this one's snapshot: nothing to download, not complete.
    unlinked = _hub.cache_state(FILES, blobs, {"config.json"})
    assert (unlinked["missing_bytes"], unlinked["complete"]) == (0, False)


def test_the_disk_must_hold_what_is_missing_plus_the_margin():
    assert _hub.disk_finding(0, 0) is None
    assert _hub.disk_finding(10 * _hub.GIB, 11 * _hub.GIB) is None
    assert _hub.disk_finding(10 * _hub.GIB, 11 * _hub.GIB - 1) == {
        "code": "hub.disk",
        "needed": "11.0 GiB",
        "missing": "10.0 GiB",
        "free": "11.0 GiB",
    }
    # Past 50 GiB the margin is 2% of the download.
    assert _hub.margin_bytes(100 * _hub.GIB) == 2 * _hub.GIB
    finding = _hub.disk_finding(100 * _hub.GIB, 101 * _hub.GIB)
    assert finding["needed"] == "102.0 GiB"
    assert explain({**finding, "model": "m/x", "path": "/srv/hf"}) == (
        "m/x does not fit in vllm_hf_cache_dir=/srv/hf: 100.0 GiB still to download plus the margin needs 102.0 GiB, "
        "and 101.0 GiB is free there. Free some space, or set vllm_hf_cache_dir to a larger disk"
    )


@pytest.mark.parametrize(("count", "shown"), [(0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"), (15 * _hub.GIB, "15.0 GiB")])
def test_bytes_are_shown_in_binary_units(count, shown):
    assert _hub.human_bytes(count) == shown


def test_progress_gives_the_rate_since_the_download_began_and_the_time_left():
    line = _hub.progress(total=1000 * 1024**2, done=600 * 1024**2, started_at=100 * 1024**2, elapsed=50)
    assert line == {
        "done": "600.0 MiB",
        "total": "1000.0 MiB",
        "percent": 60.0,
        "rate": "10.0 MiB/s",
        "left": "40s",
        "elapsed": "50s",
    }
    assert say("hub.progress", model="m/x", **line) == "m/x: 600.0 MiB of 1000.0 MiB (60%) at 10.0 MiB/s, 40s left, 50s so far"
    assert _hub.progress(100, 0, 0, 30)["left"] == "unknown", "no bytes yet: no estimate, not a division by zero"
    # The config files only (the first weight chunk not written yet): no estimate of 3549 hours.
    assert _hub.progress(60 * 1024**2, 28, 0, 6) == {
        "done": "28 B",
        "total": "60.0 MiB",
        "percent": 28 / (60 * 1024**2) * 100,
        "rate": "5 B/s",
        "left": "unknown",
        "elapsed": "6s",
    }
    assert _hub.progress(100, 100, 0, 30)["left"] == "0s"
    assert _hub.human_seconds(3725) == "1h02m"


def test_the_cache_folder_is_huggingface_hubs():
    assert _hub.repo_folder("meta-llama/Llama-3.1-8B-Instruct") == "models--meta-llama--Llama-3.1-8B-Instruct"


@pytest.mark.parametrize(
    ("container", "missing", "outcome"),
    [
        ({"State": {"Running": True, "ExitCode": 0}}, None, {"running": True, "ok": None, "rc": None}),
        ({"State": {"Running": False, "ExitCode": 0}}, None, {"running": False, "ok": True, "rc": 0}),
        (
            {"State": {"Running": False, "ExitCode": 137}},
            None,
            {"running": False, "ok": False, "rc": 137, "finding": "hub.fetch_failed"},
        ),
        ({"State": {}}, None, {"running": False, "ok": False, "rc": -1, "finding": "hub.fetch_failed"}),
        # Gone (removed while it ran): the cache alone says whether the download finished.
        (None, 0, {"running": False, "ok": True, "rc": None}),
        (None, 5, {"running": False, "ok": False, "rc": None, "finding": "hub.fetch_vanished"}),
    ],
)
def test_the_fetch_container_is_judged_by_its_exit_or_by_the_cache_once_it_is_gone(container, missing, outcome):
    assert _hub.fetch_outcome(container, missing) == outcome


def test_a_vanished_fetch_says_what_is_missing_and_how_to_resume():
    text = say(
        "hub.fetch_vanished", model="org/m", commit="abc", endpoint="http://hub", name="gpubox-model-fetch", missing="1.0 GiB"
    )
    assert "gpubox-model-fetch is gone" in text
    assert "1.0 GiB still missing" in text
    assert "run again" in text
