# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Private: what a starting vLLM server is doing, read from its log.

Pure functions, no Ansible imports. ``phase`` takes the server's log lines and
returns the last phase they show, with its fields (shards loaded, CUDA graph
progress), so that the wait after a deploy can say "loading weights (shard 5 of 9)"
instead of going quiet for minutes. The patterns are vLLM's own log lines (V1
engine, 0.8 to 0.32): each names a step of the start-up, in order.
"""

from __future__ import annotations

import re

from ansible_collections.gpubox.inference.plugins.module_utils._words import say

# (phase, pattern): a line takes the first pattern it matches, so the ones with progress come
# first; a later line wins, whatever its phase.
PATTERNS = (
    ("engine", re.compile(r"Initializing a V1 LLM engine|Initializing an LLM engine")),
    (
        "loading_weights",
        re.compile(r"Loading safetensors checkpoint shards:\s+(?P<percent>\d+)% Completed \| (?P<done>\d+)/(?P<total>\d+)"),
    ),
    ("loading_weights", re.compile(r"Starting to load model|Loading model from scratch|Loading weights from")),
    ("weights_loaded", re.compile(r"Model loading took (?P<gib>[\d.]+) GiB|Loading weights took (?P<seconds>[\d.]+) seconds")),
    (
        "compiling",
        re.compile(r"Dynamo bytecode transform|Compiling a graph|torch\.compile t(?:akes|ook)|for vLLM's torch\.compile"),
    ),
    (
        "profiling",
        re.compile(r"Memory profiling|profiling/warmup|Available KV cache memory|KV cache size|Profiling CUDA graph memory"),
    ),
    ("cuda_graphs", re.compile(r"Capturing CUDA graph[^:]*:\s+(?P<percent>\d+)%")),
    ("cuda_graphs", re.compile(r"Capturing CUDA graph|Graph capturing finished")),
    ("ready", re.compile(r"Starting vLLM (?:API )?server on|Application startup complete|Uvicorn running on")),
)


def phase(lines: list[str]) -> dict:
    """The last start-up phase the log shows, as ``{"code": "start.<phase>", ...fields}``."""
    found: dict = {"code": "start.container"}
    for line in lines:
        # tqdm bars rewrite themselves with carriage returns: the last piece is the current state.
        for piece in line.replace("\r", "\n").split("\n"):
            for name, pattern in PATTERNS:
                match = pattern.search(piece)
                if match:
                    found = {"code": f"start.{name}", **{k: v for k, v in match.groupdict().items() if v is not None}}
                    break
    return found


def words_code(found: dict) -> str:
    """The template to say ``found`` with: shard and graph progress have their own."""
    if found["code"] == "start.loading_weights" and "done" in found:
        return "start.loading_shards"
    if found["code"] == "start.cuda_graphs" and "percent" in found:
        return "start.cuda_graphs_percent"
    return found["code"]


def words(found: dict, project: str, elapsed: str) -> str:
    """``found`` in words, for the line the wait prints."""
    fields = {key: value for key, value in found.items() if key != "code"}
    return say(words_code(found), project=project, elapsed=elapsed, **fields)


def stopped(container: dict | None) -> dict | None:
    """Whether a starting server's container has stopped for good: ``{"status": ..., "rc": ...}`` when it exited or
    Docker restarted it (a restart is a crash its policy hides), None while it runs or is not created yet.

    ``container`` is ``{"status", "exit_code", "restarts"}`` as the wait_for_vllm module reads it from Docker."""
    if not container:
        return None
    if container["status"] in ("exited", "dead"):
        return {"status": "exited", "rc": container["exit_code"]}
    if container["restarts"] > 0:
        return {"status": f"restarted {container['restarts']} time(s)", "rc": container["exit_code"]}
    return None
