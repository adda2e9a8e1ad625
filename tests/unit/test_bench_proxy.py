"""scripts/bench_proxy.py: the interval for a median, the verdicts, the CPU layout, the targets each path is held to.
(The recipe's Nginx configuration against the real Nginx: tests/integration/test_bench_proxy_recipe.py.)"""

from __future__ import annotations

import importlib.util
import random
import re
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


def test_rounds_to_decide_scale_with_the_spread_and_the_distance_to_the_bound():
    per_round = [0.90, 0.95, 0.97, 0.98, 0.99, 1.00, 1.00, 1.01, 1.02, 1.03, 1.10, 1.12]
    assert bench.median_interval(per_round) == (0.97, 1.03)  # median 1.00, half-width 0.03
    assert 47 <= bench.rounds_to_decide(per_round, 1.015) <= 49  # 0.015 from the bound: 4x the 12 rounds
    assert 26 <= bench.rounds_to_decide(per_round, 0.98) <= 28  # 0.02 below: 2.25x
    assert bench.rounds_to_decide(per_round, 1.10) == 12  # decided already: no fewer than were run
    assert bench.rounds_to_decide(per_round, 1.00) is None  # on the bound: no number of rounds decides


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


@pytest.mark.parametrize(
    ("available", "layout", "engine", "expected"),
    [
        ([0, 1], "split", None, ([0], [1])),
        ([3, 2, 1, 0], "split", None, ([0, 1], [2, 3])),
        ([0, 1, 2, 3], "split", "3", ([3], [0, 1, 2])),
        ([0, 1], "shared", None, ([0, 1], [0, 1])),
    ],
)
def test_the_engine_gets_its_own_cpus_unless_shared(available, layout, engine, expected):
    assert bench.cpu_layout(available, layout, engine) == expected


@pytest.mark.parametrize(
    ("available", "layout", "engine", "message"),
    [
        ([0], "split", None, "LAYOUT=split needs CPUs for the engine and for the rest"),
        ([0, 1], "split", "0,1", "LAYOUT=split needs CPUs for the engine and for the rest"),
        ([0, 1], "split", "5", "ENGINE_CPUS='5': CPUs [5] are not available"),
        ([0, 1], "apart", None, "LAYOUT='apart': use split"),
    ],
)
def test_a_layout_that_cannot_be_made_is_refused(available, layout, engine, message):
    with pytest.raises(SystemExit, match=re.escape(message)):
        bench.cpu_layout(available, layout, engine)


def _run(ttft, tps, ttft_p99, proxy):
    return {"ttft_ms": {"p50": ttft, "p99": ttft_p99}, "tok_s": tps, "cpu_split": {"proxy": proxy}}


def test_targets_hold_both_nginx_paths_to_direct_and_their_cpu_to_the_python_proxy_and_the_recipe():
    rounds = range(6)
    results = {
        ("direct", 10): [_run(100, 1000, 200, 0) for _round in rounds],
        (bench.NGINX, 10): [_run(102, 990, 210, 40) for _round in rounds],
        (bench.NGINX_TLS, 10): [_run(120, 900, 260, 50) for _round in rounds],
        (bench.RECIPE, 10): [_run(101, 995, 205, 45) for _round in rounds],
        (bench.PYTHON, 10): [_run(110, 980, 230, 200) for _round in rounds],
    }
    rows = {(r["path"], r["what"], r["against"]): r for r in bench.target_rows(results, [10], "split")}
    assert len(rows) == 10  # 2 paths x (3 against direct, CPU against the Python proxy and the recipe)
    for what in ("TTFT p50", "tok/s", "TTFT p99"):
        assert rows[(bench.NGINX, what, "direct")]["verdict"] == "met"
        assert rows[(bench.NGINX_TLS, what, "direct")]["verdict"] == "missed"
    assert rows[(bench.NGINX, "proxy CPU", bench.PYTHON)]["ratio"] == pytest.approx(0.2)
    assert rows[(bench.NGINX, "proxy CPU", bench.PYTHON)]["verdict"] == "met"
    assert rows[(bench.NGINX_TLS, "proxy CPU", bench.PYTHON)]["ratio"] == pytest.approx(0.25)
    assert rows[(bench.NGINX, "proxy CPU", bench.RECIPE)]["verdict"] == "met"  # 40 against 45
    assert rows[(bench.NGINX_TLS, "proxy CPU", bench.RECIPE)]["verdict"] == "missed"  # 50 against 45


def test_the_shared_layout_holds_throughput_to_the_recipe_only():
    rounds = range(6)
    results = {
        ("direct", 50): [_run(100, 1000, 200, 0) for _round in rounds],
        (bench.NGINX, 50): [_run(150, 980, 300, 40) for _round in rounds],
        (bench.RECIPE, 50): [_run(100, 1000, 200, 45) for _round in rounds],
    }
    rows = bench.target_rows(results, [50], "shared")
    assert [(r["path"], r["what"], r["against"], r["verdict"]) for r in rows] == [(bench.NGINX, "tok/s", bench.RECIPE, "met")]
    results[(bench.NGINX, 50)] = [_run(100, 900, 200, 40) for _round in rounds]
    assert [r["verdict"] for r in bench.target_rows(results, [50], "shared")] == ["missed"]
    del results[(bench.RECIPE, 50)]
    assert bench.target_rows(results, [50], "shared") == []  # RECIPE=0: nothing to hold it to


def test_a_variant_adds_one_directive_to_the_serving_server_block():
    site = (
        "server {\n    listen 80;\n    server_tokens off;\n    return 301 x;\n}\n"
        "server {\n    listen 443 ssl;\n    server_tokens off;\n    default_type application/json;\n}\n"
    )
    changed = bench.with_directive(site, "ssl_buffer_size 4k;")
    assert "    default_type application/json;\n    ssl_buffer_size 4k;\n}" in changed
    assert changed.count("ssl_buffer_size") == 1
    with pytest.raises(SystemExit, match="no single 'default_type application/json;' line"):
        bench.with_directive(site.replace("default_type application/json", "default_type text/plain"), "ssl_buffer_size 4k")


def test_a_mixed_round_shares_the_machine_out_per_token_and_gives_each_path_its_own_proxy(monkeypatch):
    """Machine 1.0 s busy over 1000 tokens, 0.1 s of it the Nginx's and 0.3 s the Python proxy's; each path 250 tokens."""
    clock = iter([{"busy": 0.0, "softirq": 0.0}, {"busy": 1.0, "softirq": 0.02}])
    monkeypatch.setattr(bench, "machine_seconds", lambda: next(clock))
    vllm, nginx, python = iter([0.0, 0.5]), iter([0.0, 0.1]), iter([0.0, 0.3])
    summary = {"output_tokens": 250, "per_stream_tokens_per_s": {"mean": 40.0}}
    monkeypatch.setattr(bench, "run_mixed", lambda settings, endpoints: [dict(summary) for _endpoint in endpoints])
    turn = [(label, ("http://x/v1", None)) for label in ("direct", bench.NGINX, bench.PYTHON, bench.RECIPE)]
    proxies = {bench.NGINX: lambda: next(nginx), bench.PYTHON: lambda: next(python), bench.RECIPE: lambda: 0.0}
    results = bench.measure(turn, 10, "mixed", [lambda: next(vllm)], proxies, {})
    direct, nginx_path, python_path = results["direct"], results[bench.NGINX], results[bench.PYTHON]
    assert direct["tok_s"] == 400.0  # c x the mean speed of the path's own streams
    assert direct["cpu_split"]["vllm"] == pytest.approx(500.0)  # 0.5 s over all 1000 tokens, in us per token
    assert direct["cpu_split"]["proxy"] == 0.0
    assert direct["cpu_us_per_token"] == pytest.approx(600.0)  # (1.0 - 0.4 s of proxies) over 1000 tokens
    assert nginx_path["cpu_split"]["proxy"] == pytest.approx(400.0)  # its 0.1 s over its own 250 tokens
    assert nginx_path["cpu_us_per_token"] == pytest.approx(1000.0)
    assert python_path["cpu_split"]["proxy"] == pytest.approx(1200.0)
