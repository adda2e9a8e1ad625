"""_vllm_log.phase: the start-up phase from vLLM's own log lines, as real servers print them."""

from __future__ import annotations

import pytest

from ansible_collections.gpubox.inference.plugins.module_utils._vllm_log import phase, stopped, words, words_code

# vLLM 0.32.0 (the CPU build in the test image) serving the tiny model on this machine, 2026-12-01, in order
# (long lines cut at their end).
CPU_0_32 = [
    "(APIServer pid=1) INFO 12-01 12:44:26 [api_utils.py:286] non-default args: {'host': '127.0.0.1', 'port': 18190}",
    "(EngineCore pid=24) INFO 12-01 12:44:41 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config",
    "(EngineCore pid=24) INFO 12-01 12:44:42 [cpu_model_runner.py:68] Starting to load model /models/tiny-chat...",
    "Loading safetensors checkpoint shards:   0% Completed | 0/1 [00:00<?, ?it/s]",
    "Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00, 384.13it/s]",
    "(EngineCore pid=24) INFO 12-01 12:44:42 [default_loader.py:501] Loading weights took 0.00 seconds",
    "(EngineCore pid=24) INFO 12-01 12:44:43 [kv_cache_utils.py:2327] CPU KV cache size: 1,048,576 tokens, Maximum concurrency",
    "(APIServer pid=1) INFO 12-01 12:44:43 [entry.py:140] Starting vLLM server on http://127.0.0.1:18190",
]
# A GPU server (vllm-project/vllm#38820 and #29335, as posted): shards, the model loaded, torch.compile,
# the KV cache, then CUDA graphs.
GPU = [
    "Loading safetensors checkpoint shards:  56% Completed | 5/9 [00:13<00:11,  2.87s/it]",
    "(Worker_TP0 pid=34322) INFO 05-06 20:59:59 [gpu_model_runner.py:4879] Model loading took 12.66 GiB memory and 31.65 seconds",
    "(EngineCore_DP0 pid=441) INFO 11-24 11:44:01 [backends.py:708] Dynamo bytecode transform time: 6.07 s",
    "(EngineCore_DP0 pid=441) INFO 11-24 11:44:17 [gpu_worker.py:348] Available KV cache memory: 33.31 GiB",
    "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|██████████| 51/51 [00:01<00:00, 33.44it/s]",
]


@pytest.mark.parametrize(
    ("upto", "expected"),
    [
        (1, {"code": "start.container"}),
        (2, {"code": "start.engine"}),
        (3, {"code": "start.loading_weights"}),
        (4, {"code": "start.loading_weights", "percent": "0", "done": "0", "total": "1"}),
        (6, {"code": "start.weights_loaded", "seconds": "0.00"}),
        (7, {"code": "start.profiling"}),
        (8, {"code": "start.ready"}),
    ],
)
def test_each_step_of_a_real_cpu_start_is_named(upto, expected):
    assert phase(CPU_0_32[:upto]) == expected


@pytest.mark.parametrize(
    ("upto", "code", "said"),
    [
        (1, "start.loading_shards", "box: loading the weights (shard 5 of 9), 1m12s so far"),
        (2, "start.weights_loaded", "box: weights loaded, preparing the engine, 1m12s so far"),
        (3, "start.compiling", "box: compiling the model (torch.compile), 1m12s so far"),
        (4, "start.profiling", "box: profiling memory and sizing the KV cache, 1m12s so far"),
        (5, "start.cuda_graphs_percent", "box: capturing CUDA graphs (100%), 1m12s so far"),
    ],
)
def test_a_gpu_start_is_said_step_by_step(upto, code, said):
    found = phase(GPU[:upto])
    assert words_code(found) == code
    assert words(found, "box", "1m12s") == said


def test_a_progress_bar_rewritten_with_carriage_returns_reads_its_last_state():
    line = "Capturing CUDA graph shapes:  69%|███\rCapturing CUDA graph shapes:  71%|███\rCapturing CUDA graph shapes:  74%|███"
    assert phase([line]) == {"code": "start.cuda_graphs", "percent": "74"}


def test_lines_that_name_no_step_leave_the_last_one():
    assert (
        phase([*GPU[:1], "WARNING 05-06 21:00:09 [op.py:241] Priority not set for op rms_norm", ""])["code"]
        == "start.loading_weights"
    )


@pytest.mark.parametrize(
    ("container", "expected"),
    [
        (None, None),
        ({"status": "created", "exit_code": 0, "restarts": 0}, None),
        ({"status": "running", "exit_code": 0, "restarts": 0}, None),
        ({"status": "exited", "exit_code": 2, "restarts": 0}, {"status": "exited", "rc": 2}),
        ({"status": "dead", "exit_code": 137, "restarts": 0}, {"status": "exited", "rc": 137}),
        # Running again after a crash that its restart policy hid: a crash all the same.
        ({"status": "running", "exit_code": 1, "restarts": 2}, {"status": "restarted 2 time(s)", "rc": 1}),
        ({"status": "restarting", "exit_code": 1, "restarts": 1}, {"status": "restarted 1 time(s)", "rc": 1}),
    ],
)
def test_stopped(container, expected):
    assert stopped(container) == expected
