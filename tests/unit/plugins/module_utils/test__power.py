"""GPU power: the setting, each card's constraints, the sweep's steps and knee (plugins/module_utils/_power.py)."""

from __future__ import annotations

import pytest

from ansible_collections.gpubox.inference.plugins.module_utils import _power
from ansible_collections.gpubox.inference.plugins.module_utils._words import say


def gpu(index=0, limit=350.0, default=350.0, low=100.0, high=400.0, persistence=False, name="NVIDIA GeForce RTX 3090"):
    return {"index": index, "name": name, "persistence": persistence, "limit_w": limit, "default_w": default,
            "min_w": low, "max_w": high}  # fmt: skip


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        (290, {"watts": 290.0}),
        ("290", {"watts": 290.0}),
        ("290W", {"watts": 290.0}),
        ("287.5 W", {"watts": 287.5}),
        ("85%", {"share": 0.85}),
        ("100%", {"share": 1.0}),
        ("", None),
        (None, None),
    ],
)
def test_the_setting_is_watts_or_a_share(value, parsed):
    assert _power.limit(value) == (parsed, None)


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (
            "fast",
            "gpubox_gpu_power_limit_w='fast' must be watts (290, or '290W') or a share of each card's default limit ('85%')",
        ),
        ("0", "gpubox_gpu_power_limit_w='0' must be above 0 W"),
        ("120%", "gpubox_gpu_power_limit_w='120%': a share of the default limit must be above 0% and at most 100%"),
        ("0%", "gpubox_gpu_power_limit_w='0%': a share of the default limit must be above 0% and at most 100%"),
        (True, "gpubox_gpu_power_limit_w=True must be watts"),
        ("-5", "gpubox_gpu_power_limit_w='-5' must be watts"),
    ],
)
def test_a_bad_setting_is_refused_naming_it(value, error):
    parsed, problem = _power.limit(value)
    assert parsed is None
    assert problem.startswith(error)


def test_watts_are_set_where_they_differ_and_persistence_turned_on():
    result = _power.plan("290", True, [gpu(0), gpu(1, limit=290.0, persistence=True)])
    assert result["errors"] == []
    assert [(g["target_w"], g["changes"]) for g in result["gpus"]] == [(290.0, ["power_limit", "persistence"]), (290.0, [])]


def test_a_share_is_of_each_cards_own_default():
    """After a swap, the new card gets its own share: 85% of 350 W and of 450 W."""
    cards = [gpu(0), gpu(1, limit=450.0, default=450.0, low=150.0, high=600.0, name="NVIDIA GeForce RTX 4090")]
    result = _power.plan("85%", False, cards)
    assert [g["target_w"] for g in result["gpus"]] == [298.0, 382.0]
    assert [g["changes"] for g in result["gpus"]] == [["power_limit"], ["power_limit"]]


def test_a_limit_outside_a_cards_constraints_is_refused_with_both_named():
    result = _power.plan("450", True, [gpu(0), gpu(1)])
    assert result["errors"] == [
        "gpubox_gpu_power_limit_w='450': 450 W is outside the power limits of GPU0 (NVIDIA GeForce RTX 3090), "
        "100 W to 400 W (NVML)",
        "gpubox_gpu_power_limit_w='450': 450 W is outside the power limits of GPU1 (NVIDIA GeForce RTX 3090), "
        "100 W to 400 W (NVML)",
    ]
    low = _power.plan("20%", True, [gpu(0)])
    assert low["errors"] == [
        "gpubox_gpu_power_limit_w='20%': 20% of its default 350 W is 70 W, outside the power limits of "
        "GPU0 (NVIDIA GeForce RTX 3090), 100 W to 400 W (NVML)"
    ]


def test_a_card_without_constraints_is_refused_not_guessed():
    result = _power.plan("290", True, [gpu(0, low=None, high=None)])
    assert result["errors"] == [
        "gpubox_gpu_power_limit_w='290': GPU0 (NVIDIA GeForce RTX 3090) does not report its power limit constraints (NVML), "
        "so none is set"
    ]
    share = _power.plan("85%", True, [gpu(0, default=None)])
    assert "does not report its default power limit, so set watts instead" in share["errors"][0]


def test_no_setting_leaves_the_limits_and_can_leave_persistence():
    result = _power.plan("", False, [gpu(0, limit=300.0)])
    assert result["errors"] == []
    assert result["gpus"][0]["target_w"] is None
    assert result["gpus"][0]["changes"] == []


def test_the_sweep_steps_go_from_the_default_down_to_what_every_gpu_takes():
    assert _power.sweep_steps([gpu(0), gpu(1, low=150.0)], 5) == [350.0, 300.0, 250.0, 200.0, 150.0]
    assert _power.sweep_steps([gpu(0)], 1) == [350.0]
    assert _power.sweep_steps([gpu(0, default=None)], 4) == []


def point(limit, tokens_per_s, watts, seconds=10.0, **extra):
    return {"limit_w": limit, "tokens": tokens_per_s * seconds, "seconds": seconds, "joules": watts * seconds, **extra}


def test_the_knee_is_the_most_tokens_per_joule_that_keeps_the_speed():
    """Published on air-cooled 3090s: about 290 W kept ~93% of the speed for ~22% less power."""
    points = [point(350, 100, 340), point(290, 93, 265), point(230, 75, 215), point(170, 50, 165)]
    result = _power.sweep(points, keep=0.9)
    assert result["knee"] == 290
    assert [round(r["tokens_per_joule"], 3) for r in result["rows"]] == [0.294, 0.351, 0.349, 0.303]
    fields = result["fields"]
    assert say(result["code"], **fields) == (
        "290 W keeps 93% of the fastest speed (at 350 W) with 0.351 tokens per joule against 0.294, drawing 265 W "
        "against 340 W: set gpubox_gpu_power_limit_w: 290"
    )
    lines = _power.table(result)
    assert lines[0] == "limit W | tok/s  | avg W  | tok/J  | speed"
    assert lines[2] == "    290 |   93.0 |  265.0 |  0.351 | 0.93"


def test_a_step_that_lost_requests_or_energy_does_not_count():
    points = [point(350, 100, 340), point(290, 99, 200, failed=1), {"limit_w": 230, "tokens": 500, "seconds": 10, "joules": None}]
    result = _power.sweep(points, keep=0.9)
    assert result["knee"] == 350
    assert _power.table(result)[2] == "    290 | failed or no energy reading"
    assert _power.sweep([points[1]], keep=0.9)["code"] == "power.none"
