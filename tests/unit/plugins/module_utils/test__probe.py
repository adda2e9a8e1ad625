"""_probe on made-up timelines: the statistics, the buffering verdict, the prompts and the order of turns.
(Its transport against small real servers: tests/integration/plugins/module_utils/test__probe_transport.py.)"""

from __future__ import annotations

import pytest

from ansible_collections.gpubox.inference.plugins.module_utils._probe import (
    percentile,
    prompt,
    summarize,
    turns,
)


def record(start: float, first: float, gap: float, tokens: int, status: int = 200) -> dict:
    events = [first + i * gap for i in range(tokens)]
    return {"status": status, "start": start, "end": events[-1] + 0.001, "events": events, "tokens": tokens, "error": None}


def test_percentile():
    assert percentile([], 0.5) is None
    assert percentile([3, 1, 2], 0.5) == 2
    assert percentile([0, 10], 0.9) == pytest.approx(9)


def test_streaming_timeline():
    records = [record(0.0, 0.020, 0.010, 11), record(0.0, 0.030, 0.010, 11)]
    summary = summarize(records, wall_seconds=0.2)
    assert summary["succeeded"] == 2
    assert summary["ttft_ms"]["mean"] == pytest.approx(25)
    assert summary["ttft_ms"]["p50"] == pytest.approx(25)
    assert summary["itl_ms"]["p50"] == pytest.approx(10)
    assert summary["tpot_ms"]["mean"] == pytest.approx(10.1, abs=0.2)
    assert summary["output_tokens"] == 22
    assert summary["output_tokens_per_s"] == pytest.approx(110)
    assert summary["buffering"] == {"verdict": "streaming", "buffered_streams": 0, "streams_judged": 2}


def test_buffered_timeline_is_detected():
    # Every event at the very end, within a millisecond: what a buffering (or gzip-ing) proxy delivers.
    records = [record(0.0, 0.500, 0.00001, 32) for _index in range(3)]
    summary = summarize(records, wall_seconds=0.6)
    assert summary["buffering"]["verdict"] == "buffered"
    assert summary["buffering"]["buffered_streams"] == 3
    assert summary["ttft_ms"]["p50"] == pytest.approx(500)


@pytest.mark.parametrize("first", [3.0, 20.0])
def test_a_long_prefill_before_a_fast_answer_is_streaming(first):
    # A long prompt (or a busy CPU during the prefill), then 64 tokens a decode step (2 ms) apart: the events span a
    # few percent of the request, yet each came when the server made it.
    records = [record(0.0, first, 0.002, 64) for _index in range(3)]
    summary = summarize(records, wall_seconds=first + 0.2)
    assert summary["buffering"]["verdict"] == "streaming"
    assert summary["buffering"]["buffered_streams"] == 0


def test_a_held_response_with_a_few_late_reads_is_buffered():
    # Held, then sent in four writes that the client reads a little apart (a busy machine): most gaps are still
    # the microseconds between events parsed from one read.
    events = [2.0 + (i // 16) * 0.004 + (i % 16) * 0.00002 for i in range(64)]
    held = {"status": 200, "start": 0.0, "end": events[-1] + 0.001, "events": events, "tokens": 64, "error": None}
    assert summarize([held], wall_seconds=2.1)["buffering"]["verdict"] == "buffered"


def test_errors_are_counted_by_status():
    failed = {"status": 401, "start": 0, "end": 0.01, "events": [], "tokens": 0, "error": None}
    broken = {"status": None, "start": 0, "end": 0.01, "events": [], "tokens": 0, "error": "ConnectionRefusedError"}
    summary = summarize([record(0, 0.01, 0.01, 5), failed, failed, broken], wall_seconds=1)
    assert summary["succeeded"] == 1
    assert summary["errors"] == {"401": 2, "transport": 1}


def test_prompt_has_the_shared_prefix():
    a, b = prompt(20, 8, 1).split(), prompt(20, 8, 2).split()
    assert len(a) == len(b) == 20
    assert a[:8] == b[:8]
    assert a[8:] != b[8:]


def test_prompt_tokens_come_from_the_servers_usage():
    counted, uncounted = record(0, 0.01, 0.01, 5), record(0, 0.01, 0.01, 5)
    counted["prompt_tokens"] = 212
    assert summarize([counted, uncounted], wall_seconds=1)["prompt_tokens_mean"] == 212
    assert summarize([uncounted], wall_seconds=1)["prompt_tokens_mean"] is None


@pytest.mark.parametrize(("requests", "concurrency", "targets"), [(60, 10, 6), (24, 1, 5), (300, 50, 6), (12, 4, 2)])
def test_turns_give_every_target_every_place_in_a_wave_and_the_same_prompts(requests, concurrency, targets):
    order = turns(requests, concurrency, targets)
    assert len(order) == requests * targets
    places: dict = {}
    for index, (which, _nth) in enumerate(order):
        places.setdefault(which, set()).add(index % concurrency)
    # Sent i mod targets, two targets would split a wave's places by parity whenever both numbers are even.
    assert all(seen == set(range(concurrency)) for seen in places.values())
    for which in range(targets):
        assert [nth for target, nth in order if target == which] == list(range(requests))
