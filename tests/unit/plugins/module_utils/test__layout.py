"""_layout: the layouts that fit, the measured numbers, the choice and its table."""

from __future__ import annotations

import pytest

from ansible_collections.gpubox.inference.plugins.module_utils import _layout, _words

METRICS = (
    "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
    "# TYPE vllm:cache_config_info gauge\n"
    'vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_cpu_blocks="None",'
    'num_gpu_blocks="1638",prefix_caching_hash_algo="sha256"} 1.0\n'
    'vllm:num_requests_running{engine="0",model_name="tiny"} 0.0\n'
)


def numbers(tokens_per_s: float, ttft_p99_ms: float, failed: int = 0) -> dict:
    return {"tokens_per_s": tokens_per_s, "ttft_p50_ms": ttft_p99_ms / 2, "ttft_p99_ms": ttft_p99_ms,
            "requests": 16, "succeeded": 16 - failed, "kv_cache_tokens": 52416}  # fmt: skip


def test_candidates_are_tp_over_all_then_replicas_of_each_size_that_fits():
    assert [c["name"] for c in _layout.candidates(4, lambda k: True)] == ["tp4", "2xtp2", "4xtp1"]
    assert [c["name"] for c in _layout.candidates(4, lambda k: k >= 2)] == ["tp4", "2xtp2"]
    assert [c["name"] for c in _layout.candidates(3, lambda k: True)] == ["tp3", "3xtp1"]
    assert _layout.candidates(1, lambda k: True) == [{"name": "tp1", "size": 1, "replicas": 1}]
    assert _layout.candidates(2, lambda k: True)[1] == {"name": "2xtp1", "size": 1, "replicas": 2}


def test_the_key_changes_with_the_load_and_the_units():
    load = {"concurrency": 8, "prompt_tokens": 512, "max_tokens": 128}
    base = _layout.key("fp|m|r|i:t", 2, load)
    assert base == "fp|m|r|i:t|units=2|load=8x512+128"
    assert _layout.key("fp|m|r|i:t", 2, {**load, "concurrency": 16}) != base
    assert _layout.key("fp|m|r|i:t", 4, load) != base


def test_kv_tokens_come_from_the_cache_config_metric():
    assert _layout.kv_tokens(METRICS) == 1638 * 16
    assert _layout.kv_tokens("vllm:num_requests_running 0\n") is None
    assert _layout.kv_tokens(METRICS.replace('num_gpu_blocks="1638"', 'num_gpu_blocks="None"')) is None


def test_a_measurement_sums_the_replicas_kv_cache():
    probe = {"output_tokens_per_s": 40.5, "ttft_ms": {"p50": 100.0, "p99": 250.0}, "requests": 16, "succeeded": 16}
    assert _layout.measurement(probe, [METRICS, METRICS]) == {
        "tokens_per_s": 40.5, "ttft_p50_ms": 100.0, "ttft_p99_ms": 250.0, "requests": 16, "succeeded": 16,
        "kv_cache_tokens": 2 * 1638 * 16,
    }  # fmt: skip
    assert _layout.measurement(probe, [METRICS, "nothing"])["kv_cache_tokens"] is None


LAYOUTS = _layout.candidates(2, lambda k: True)


def test_the_fastest_within_the_bound_is_kept():
    choice = _layout.choose(LAYOUTS, {"tp2": numbers(30.0, 400), "2xtp1": numbers(45.0, 500)})
    assert choice == {
        "code": "layout.measured", "layout": "2xtp1", "tokens_per_s": 45.0, "ttft_p99_ms": 500, "bound_ms": 800.0,
        "bound_from": "best", "other": "tp2", "other_tokens_per_s": 30.0, "other_ttft_p99_ms": 400,
    }  # fmt: skip
    assert _words.explain(choice) == (
        "2xtp1 measured 45.0 tokens/s at TTFT p99 500 ms against 30.0 at 400 ms with tp2: the fastest within the "
        "TTFT bound of 800 ms (twice the lowest TTFT p99 measured)"
    )


def test_a_forced_measurement_flips_the_choice():
    assert _layout.choose(LAYOUTS, {"tp2": numbers(30.0, 400), "2xtp1": numbers(45.0, 500)})["layout"] == "2xtp1"
    assert _layout.choose(LAYOUTS, {"tp2": numbers(50.0, 400), "2xtp1": numbers(45.0, 500)})["layout"] == "tp2"


def test_a_layout_beyond_the_bound_loses_however_fast():
    fast_but_slow_to_start = {"tp2": numbers(30.0, 400), "2xtp1": numbers(90.0, 900)}
    assert _layout.choose(LAYOUTS, fast_but_slow_to_start)["layout"] == "tp2"
    assert _layout.choose(LAYOUTS, fast_but_slow_to_start, max_ttft_ms=1000)["layout"] == "2xtp1"


def test_when_none_meets_an_absolute_bound_the_lowest_ttft_is_kept():
    choice = _layout.choose(LAYOUTS, {"tp2": numbers(30.0, 400), "2xtp1": numbers(45.0, 500)}, max_ttft_ms=100)
    assert choice == {"code": "layout.none_in_bound", "layout": "tp2", "ttft_p99_ms": 400, "bound_ms": 100.0,
                      "bound_from": "setting"}  # fmt: skip
    assert "vllm_tune_max_ttft_ms" in _words.explain(choice)


@pytest.mark.parametrize(
    "broken",
    [{"failed": "the server did not start"}, numbers(99.0, 100, failed=1)],
    ids=["did-not-start", "a-request-failed"],
)
def test_a_layout_that_failed_does_not_count(broken):
    choice = _layout.choose(LAYOUTS, {"tp2": numbers(30.0, 400), "2xtp1": broken})
    assert choice["code"] == "layout.only"
    assert choice["layout"] == "tp2"
    assert _layout.choose(LAYOUTS, {"2xtp1": broken}) is None


def test_the_table_marks_the_kept_layout():
    rows = _layout.table(LAYOUTS, {"tp2": numbers(30.0, 400), "2xtp1": {"failed": "exit code 1"}}, "tp2")
    assert rows[0].split() == ["layout", "TTFT", "p50", "ms", "TTFT", "p99", "ms", "tok/s", "KV", "tokens"]
    assert rows[1].split() == ["tp2*", "200.0", "400.0", "30.0", "52416"]
    assert rows[2].startswith("2xtp1")
    assert "did not start: exit code 1" in rows[2]
