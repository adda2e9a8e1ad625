"""scripts/bench_proxy.py's verdicts on issue 8's targets: the interval for a median, and which side of a target it is."""

from __future__ import annotations

import importlib.util
import random
import statistics

import pytest
from conftest import ROOT

spec = importlib.util.spec_from_file_location("bench_proxy", ROOT / "scripts" / "bench_proxy.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


@pytest.mark.parametrize(("n", "ranks"), [(5, (1, 5)), (7, (1, 7)), (11, (2, 10)), (15, (4, 12)), (21, (6, 16))])
def test_median_interval_uses_the_sign_test_order_statistics(n, ranks):
    values = [float(v) for v in range(n, 0, -1)]  # any order
    assert bench.median_interval(values) == ranks


def test_median_interval_covers_the_true_median_at_least_95_percent_of_the_time():
    rng = random.Random(8)
    hits = 0
    for _trial in range(2000):
        sample = [rng.gauss(1.0, 0.1) for _value in range(11)]
        low, high = bench.median_interval(sample)
        hits += low <= 1.0 <= high
        assert low <= statistics.median(sample) <= high
    assert hits / 2000 >= 0.95


@pytest.mark.parametrize(
    ("interval", "bound", "at_most", "expected"),
    [
        ((0.90, 1.04), 1.05, True, "met"),
        ((1.06, 1.20), 1.05, True, "missed"),
        ((1.00, 1.10), 1.05, True, "undecided"),
        ((0.97, 1.02), 0.97, False, "met"),
        ((0.80, 0.96), 0.97, False, "missed"),
        ((0.90, 1.00), 0.97, False, "undecided"),
    ],
)
def test_verdict_needs_the_whole_interval_on_one_side(interval, bound, at_most, expected):
    assert bench.verdict(interval, bound, at_most) == expected


def test_fewer_than_six_rounds_decide_nothing():
    # From 5 values the interval is the minimum and maximum, which covers the median only ~94% of the time.
    assert bench.verdict((1.20, 1.30), 1.05, True, rounds=5) == "undecided (fewer than 6 rounds)"
    assert bench.verdict((1.20, 1.30), 1.05, True, rounds=6) == "missed"


def test_cpu_split_shows_medians_and_what_no_named_process_took(capsys):
    def run(busy, vllm, proxy, loadgen, softirq):
        return {"cpu_split": {"busy": busy, "vllm": vllm, "proxy": proxy, "loadgen": loadgen, "softirq": softirq}}

    results = {
        ("direct", 50): [run(250, 210, 0, 35, 5), run(240, 200, 0, 36, 4), run(260, 220, 0, 34, 6)],
        ("nginx (gpubox)", 50): [run(265, 214, 14, 33, 10), run(270, 216, 15, 34, 9), run(255, 212, 13, 32, 9)],
    }
    bench.print_cpu_split(results, [50], ["direct", "nginx (gpubox)"])
    rows = {line.split()[0]: line.split()[-6:] for line in capsys.readouterr().out.splitlines()[2:]}
    # machine, vLLM, proxy, load generator, rest (machine less the three), softirq: medians over the rounds
    assert rows["direct"] == ["250.0", "210.0", "0.0", "35.0", "5.0", "5.0"]
    assert rows["nginx"] == ["265.0", "214.0", "14.0", "33.0", "4.0", "9.0"]
