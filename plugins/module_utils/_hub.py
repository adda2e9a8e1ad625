# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Private: a model on a Hugging Face Hub (or a mirror) and in the cache vLLM reads, as data.

Pure functions, data in and data out, no Ansible imports. ``hf_model_info`` asks the
Hub for a revision's commit and file tree and measures the cache; these functions
choose the files vLLM needs, say what is present and what is still to download, judge
the disk, turn an HTTP answer into a finding with its fields, and measure progress.

The cache is huggingface_hub's own layout, the one vLLM reads (``HF_HOME/hub``):
``models--ORG--NAME/blobs/ETAG`` holds a file's bytes (``ETAG.UUID.incomplete`` while it
downloads), ``snapshots/COMMIT/PATH`` links to it, ``refs/REVISION`` names the commit.
A file tracked by Git LFS has the SHA-256 of its content as ETag; any other file its
Git blob id.
"""

from __future__ import annotations

import fnmatch
import re
from urllib.parse import quote

DEFAULT_ENDPOINT = "https://huggingface.co"
GIB = 1024**3
# Room left free after the download: the larger of 1 GiB and 2% of it (logs, the tree cache, other writers).
MARGIN_MIN_BYTES = GIB
MARGIN_SHARE = 0.02

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
COMMIT = re.compile(r"^[0-9a-f]{40}$")

# What vLLM reads besides the weights: the model's and the generation config, the tokenizer
# in any of its formats, the chat template, and a processor's config for multimodal models.
METADATA = (
    "config.json",
    "generation_config.json",
    "params.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "*.tiktoken",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
    "processor_config.json",
)
# Weights in one format, safetensors first (what vLLM prefers), each with its shard index.
WEIGHT_FORMATS = (
    ("safetensors", "*.safetensors", "model.safetensors.index.json"),
    ("pytorch", "*.bin", "pytorch_model.bin.index.json"),
)


def repo_folder(repo_id: str) -> str:
    """The cache folder huggingface_hub keeps a model in: ``models--ORG--NAME``."""
    return "models--" + repo_id.replace("/", "--")


def check_repo_id(repo_id: str) -> str | None:
    """A message when ``repo_id`` cannot be a Hub model id, else None."""
    if not REPO_ID.match(repo_id or "") or ".." in repo_id or repo_id.endswith((".", "-")):
        return f"vllm_model={repo_id!r} is neither an absolute path on the host nor a Hub model id like ORG/NAME"
    return None


def urls(endpoint: str, repo_id: str, revision: str) -> dict:
    """The Hub API's URLs for a revision's info and file tree, and for one file at a commit (``{commit}``, ``{path}``)."""
    base = endpoint.rstrip("/")
    rev = quote(revision, safe="")
    return {
        "info": f"{base}/api/models/{repo_id}/revision/{rev}",
        "tree": f"{base}/api/models/{repo_id}/tree/{{commit}}?recursive=true",
        "file": f"{base}/{repo_id}/resolve/{{commit}}/{{path}}",
    }


def http_finding(status: int, error_code: str, token_given: bool) -> str:
    """The code for an HTTP answer that is not 200, from its status and the Hub's ``X-Error-Code``.

    The Hub answers 401 for a missing or refused token, 403 for a token that lacks access
    to a gated model, 404 for a model or revision that does not exist (401 without a token,
    so a private model is not revealed), and 429 or 5xx when it is busy or down.
    """
    if error_code == "GatedRepo":
        return "hub.gated_no_access" if token_given else "hub.gated_no_token"
    if error_code == "RevisionNotFound":
        return "hub.revision_not_found"
    if error_code == "RepoNotFound" or status == 404:
        return "hub.not_found"
    if status == 401:
        return "hub.token_refused" if token_given else "hub.not_found"
    if status == 403:
        return "hub.forbidden"
    return "hub.http_error"


def unreachable_reason(message: str) -> str:
    """The reason in an unreachable endpoint's message, without the URL library's wrapping.

    'Request failed: <url... error [Errno 111] Connection refused>' -> 'Connection refused'.
    """
    found = re.search(r"\[Errno -?\d+\] ([^>]+)", message or "") or re.search(r"<\w+ error ([^>]+)>", message or "")
    return (found.group(1) if found else (message or "no answer")).strip()


def select_files(entries: list[dict]) -> tuple[list[dict], str | None]:
    """The files vLLM needs from a revision's tree, and the weight format chosen (None when it has no weights).

    Only the repository's top level counts: folders such as ``original/`` or ``onnx/`` hold
    other formats of the same weights, which vLLM does not read.
    """
    top = [entry for entry in entries if entry.get("type", "file") == "file" and "/" not in entry["path"]]
    chosen, weight_format = [], None
    for name, pattern, index in WEIGHT_FORMATS:
        weights = [entry for entry in top if fnmatch.fnmatchcase(entry["path"], pattern)]
        if weights:
            weight_format = name
            chosen = weights + [entry for entry in top if entry["path"] == index]
            break
    metadata = [entry for entry in top if any(fnmatch.fnmatchcase(entry["path"], pattern) for pattern in METADATA)]
    files = sorted(chosen + metadata, key=lambda entry: entry["path"])
    return [file_record(entry) for entry in files], weight_format


def file_record(entry: dict) -> dict:
    """One file as the cache stores it: its path, size, and blob name (the ETag)."""
    lfs = entry.get("lfs") or {}
    return {
        "path": entry["path"],
        "size": int(lfs.get("size", entry.get("size", 0)) or 0),
        "blob": lfs.get("oid") or lfs.get("sha256") or entry["oid"],
        "lfs": bool(lfs),
    }


def cache_state(files: list[dict], blobs: dict, linked: set) -> dict:
    """What of ``files`` the cache holds: ``blobs`` maps a blob's file name to its size, ``linked`` the linked paths.

    A file counts as present when its blob has its full size; a partial
    ``BLOB.*.incomplete`` counts toward progress, not as present. The snapshot is
    complete when every file is present and linked in the revision's snapshot folder.
    """
    done = missing = 0
    present_files = 0
    for item in files:
        size = blobs.get(item["blob"])
        if size is not None and size == item["size"]:
            done += item["size"]
            present_files += 1
        else:
            partial = sum(
                length for name, length in blobs.items() if name.startswith(item["blob"] + ".") and name.endswith(".incomplete")
            )
            done += min(partial, item["size"])
            missing += item["size"]
    return {
        "total_bytes": sum(item["size"] for item in files),
        "done_bytes": done,
        "missing_bytes": missing,
        "file_count": len(files),
        "present_files": present_files,
        "complete": present_files == len(files) and all(item["path"] in linked for item in files),
    }


def margin_bytes(missing_bytes: int) -> int:
    return max(MARGIN_MIN_BYTES, int(missing_bytes * MARGIN_SHARE)) if missing_bytes else 0


def disk_finding(missing_bytes: int, free_bytes: int) -> dict | None:
    """A refusal with both numbers when what is still to download, plus the margin, does not fit, else None."""
    needed = missing_bytes + margin_bytes(missing_bytes)
    if not missing_bytes or needed <= free_bytes:
        return None
    return {
        "code": "hub.disk",
        "needed": human_bytes(needed),
        "missing": human_bytes(missing_bytes),
        "free": human_bytes(free_bytes),
    }


def human_bytes(count: float) -> str:
    """1536 -> '1.5 KiB'; binary units, as df -h and the Hub's file list show them."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"  # pragma: no cover


def human_seconds(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def progress(total: int, done: int, started_at: int, elapsed: float) -> dict:
    """Bytes done of total, the rate since the download began (``started_at`` were there before) and the time left.

    The time left is ``unknown`` until 1% of the total has arrived: huggingface_hub writes in
    10 MB chunks, so the first seconds show only the small files and would give hours.
    """
    fetched = max(done - started_at, 0)
    rate = fetched / elapsed if elapsed > 0 else 0.0
    left = total - done
    known = rate > 0 and fetched * 100 >= total
    return {
        "done": human_bytes(done),
        "total": human_bytes(total),
        "percent": 100.0 * done / total if total else 100.0,
        "rate": human_bytes(rate) + "/s",
        "left": "0s" if left <= 0 else human_seconds(left / rate) if known else "unknown",
        "elapsed": human_seconds(elapsed),
    }


def fetch_outcome(container: dict | None, missing_bytes: int) -> dict:
    """What became of the fetch container, from ``docker_container_info``'s ``container`` and the cache's missing bytes.

    ``running`` while Docker says it runs. A container that exited 0 succeeded. One
    that is gone (``None``: removed by hand, or by an earlier run's clean-up) is judged
    by the cache alone: nothing missing is a finished download, anything missing is a
    failure with no exit code. Any other exit code is a failure.
    """
    if container is None:
        if missing_bytes == 0:
            return {"running": False, "ok": True, "rc": None}
        return {"running": False, "ok": False, "rc": None, "finding": "hub.fetch_vanished"}
    state = container.get("State") or {}
    if state.get("Running"):
        return {"running": True, "ok": None, "rc": None}
    rc = int(state.get("ExitCode", -1))
    if rc == 0:
        return {"running": False, "ok": True, "rc": 0}
    return {"running": False, "ok": False, "rc": rc, "finding": "hub.fetch_failed"}
