"""The engine watchdog's decisions, tick by tick (plugins/module_utils/_watchdog.py)."""

from __future__ import annotations

import pytest

from ansible_collections.gpubox.inference.plugins.module_utils import _watchdog
from ansible_collections.gpubox.inference.plugins.module_utils._words import say

POLICY = {"failures": 3, "max_restarts": 2, "window_s": 3600, "start_grace_s": 300}
STARTED = 1_000.0


def container(service="vllm", status="running", started_at=STARTED) -> dict:
    return {"service": service, "name": f"gpubox-vllm-{service}-1", "status": status, "started_at": started_at}


def sound(service="vllm", progress=10.0) -> dict:
    return {"service": service, "health": {"status": 200}, "completion": {"ok": True, "status": 200}, "progress": progress}


def dead(service="vllm") -> dict:
    """What vLLM answers once its engine process died and its API server stayed up."""
    return {"service": service, "health": {"status": 503}, "progress": None}


def hung(service="vllm", progress=10.0) -> dict:
    """/health answers while the engine is frozen: the completion times out and no token moves."""
    completion = {"ok": False, "status": None, "error": "timed out", "timed_out": True, "timeout_s": 5}
    return {"service": service, "health": {"status": 200}, "completion": completion, "progress": progress}


def seen(*probes, containers=None) -> dict:
    return {"deployed": True, "containers": containers or [container()], "probes": list(probes)}


def run(ticks, state=None, policy=None):
    """Tick through ``(now, seen)`` pairs; every action, and the last state."""
    policy, actions = policy or POLICY, []
    for now, observation in ticks:
        state, action = _watchdog.tick(state, observation, now, policy)
        actions.append(action)
    return actions, state


def codes(actions) -> list[str]:
    return [a["code"] for a in actions]


def test_a_healthy_server_is_never_restarted_and_logs_once():
    actions, state = run([(STARTED + 10 * i, seen(sound(progress=float(i)))) for i in range(1, 200)])
    assert set(codes(actions)) == {"watchdog.healthy"}
    assert not any(a["restart"] for a in actions)
    assert [a["log"] for a in actions].count(True) == 1
    assert state["restarts_total"] == 0
    assert state["failures"] == 0
    assert state["ticks"] == 199


def test_a_dead_engine_is_restarted_after_the_stated_number_of_failures():
    ticks = [(2_000.0, seen(sound()))] + [(2_000.0 + 10 * i, seen(dead())) for i in range(1, 4)]
    actions, state = run(ticks)
    assert codes(actions) == ["watchdog.healthy", "watchdog.failing", "watchdog.failing", "watchdog.restart"]
    assert [a["restart"] for a in actions] == [False, False, False, True]
    assert [a["level"] for a in actions[1:]] == ["warning", "warning", "warning"]
    assert all(a["log"] for a in actions[1:])
    assert state["restarts"] == [2_030.0]
    assert state["restarts_total"] == 1
    assert state["failures"] == 0
    assert say("watchdog.restart", **_watchdog.fields(actions[-1])) == (
        "3 probes in a row failed (vllm: /health answered HTTP 503): recreating the Compose project "
        "(restart 1 of at most 2 in 60 min)"
    )


def test_a_hung_engine_behind_a_healthy_api_server_is_restarted():
    ticks = [(2_000.0, seen(sound(progress=7.0)))] + [(2_000.0 + 10 * i, seen(hung(progress=7.0))) for i in range(1, 4)]
    actions, _state = run(ticks)
    assert codes(actions)[-1] == "watchdog.restart"
    assert actions[1]["problems"] == [{"code": "watchdog.completion_timeout", "service": "vllm", "seconds": 5}]
    assert say("watchdog.completion_timeout", service="vllm", seconds=5) == (
        "vllm: a one-token completion did not answer within 5 s and no token moved"
    )


def test_a_busy_engine_whose_tokens_move_is_not_a_failure():
    ticks = [(2_000.0 + 10 * i, seen(hung(progress=100.0 * i))) for i in range(1, 10)]
    actions, state = run(ticks)
    assert codes(actions) == ["watchdog.failing"] + ["watchdog.busy"] * 8  # no earlier count to compare the first with
    assert state["failures"] == 0
    assert state["restarts"] == []


def test_a_failure_between_sound_probes_starts_the_count_again():
    ticks = [(2_000.0, seen(dead())), (2_010.0, seen(dead())), (2_020.0, seen(sound())), (2_030.0, seen(dead()))]
    actions, state = run(ticks)
    assert codes(actions) == ["watchdog.failing", "watchdog.failing", "watchdog.healthy", "watchdog.failing"]
    assert actions[-1]["count"] == 1
    assert state["failures"] == 1


def test_a_starting_container_is_given_its_start_time():
    """A (re)started container that has not answered yet is loading its model: not counted until the grace ends."""
    fresh = [container(started_at=5_000.0)]
    ticks = [(5_000.0 + 30 * i, seen(dead(), containers=fresh)) for i in range(1, 10)]  # up to 270 s < 300 s
    actions, state = run(ticks)
    assert set(codes(actions)) == {"watchdog.starting"}
    assert [a["log"] for a in actions].count(True) == 1
    assert say("watchdog.starting", **{k: actions[0][k] for k in ("service", "seconds", "grace_s")}) == (
        "vllm is starting: 30 s of its 300 s to start (vllm_wait_timeout)"
    )
    actions, state = run([(5_310.0 + 10 * i, seen(dead(), containers=fresh)) for i in range(3)], state)
    assert codes(actions) == ["watchdog.failing", "watchdog.failing", "watchdog.restart"]


def test_a_container_that_answered_since_its_start_gets_no_grace():
    fresh = [container(started_at=5_000.0)]
    actions, _state = run([(5_010.0, seen(sound(), containers=fresh)), (5_020.0, seen(dead(), containers=fresh))])
    assert codes(actions) == ["watchdog.healthy", "watchdog.failing"]


def test_after_a_restart_the_new_container_starts_then_recovery_is_said():
    ticks = [(2_000.0 + 10 * i, seen(dead())) for i in range(3)]
    actions, state = run(ticks)
    assert actions[-1]["restart"]
    new = [container(started_at=2_025.0)]
    actions, state = run([(2_030.0, seen(dead(), containers=new)), (2_060.0, seen(sound(), containers=new))], state)
    assert codes(actions) == ["watchdog.starting", "watchdog.recovered"]
    assert actions[1]["seconds"] == 40.0
    assert actions[1]["log"]
    assert state["restarted_at"] is None


def test_past_the_restart_limit_it_gives_up_once_then_restarts_when_the_window_has_room():
    state, now, gave_up = None, 10_000.0, []
    for _round in range(POLICY["max_restarts"]):
        actions, state = run([(now + 10 * i, seen(dead())) for i in range(3)], state)
        assert actions[-1]["restart"]
        now += 100
    actions, state = run([(now + 10 * i, seen(dead())) for i in range(6)], state)
    assert codes(actions) == ["watchdog.failing", "watchdog.failing"] + ["watchdog.gave_up"] * 4
    gave_up = [a for a in actions if a["code"] == "watchdog.gave_up"]
    assert [a["log"] for a in gave_up] == [True, False, False, False]
    assert gave_up[0]["level"] == "error"
    assert not any(a["restart"] for a in actions)
    assert gave_up[0]["next_at"] == 10_020.0 + 3600
    text = say("watchdog.gave_up", **_watchdog.fields(gave_up[0]))
    assert text.startswith("3 probes in a row failed (vllm: /health answered HTTP 503) and 2 restarts in the last 60 min")
    assert "until 1970-01-01 03:47:00 UTC" in text
    # An hour after the first restart the window has room again.
    actions, state = run([(10_020.0 + 3600 + 1, seen(dead()))], state)
    assert actions[-1]["code"] == "watchdog.restart"


@pytest.mark.parametrize(
    ("observation", "code"),
    [
        ({"deployed": False}, "watchdog.no_deployment"),
        ({"deployed": True, "containers": []}, "watchdog.stopped"),
        ({"deployed": True, "containers": [container(status="exited")]}, "watchdog.stopped"),
        ({"deployed": True, "containers": [container(status="restarting")]}, "watchdog.docker_restarting"),
    ],
)
def test_stopped_or_docker_handled_containers_are_left_alone(observation, code):
    actions, state = run([(2_000.0 + i, observation) for i in range(10)])
    assert set(codes(actions)) == {code}
    assert not any(a["restart"] for a in actions)
    assert state["failures"] == 0


def test_one_failing_replica_restarts_the_project():
    both = [container("vllm"), container("vllm-2")]
    ticks = [(2_000.0 + 10 * i, seen(sound("vllm"), dead("vllm-2"), containers=both)) for i in range(3)]
    actions, _state = run(ticks)
    assert codes(actions)[-1] == "watchdog.restart"
    assert actions[-1]["problems"] == [{"code": "watchdog.health_status", "service": "vllm-2", "status": 503}]


@pytest.mark.parametrize(
    ("probe", "problem"),
    [
        ({"health": {"status": None, "error": "Connection refused"}}, "vllm: /health did not answer (Connection refused)"),
        (
            {"health": {"status": 200}, "completion": {"ok": False, "status": 500, "error": "EngineDeadError"}},
            "vllm: a one-token completion answered HTTP 500 (EngineDeadError)",
        ),
        (
            {"health": {"status": 200}, "completion": {"ok": False, "status": None, "error": "Connection reset"}},
            "vllm: a one-token completion did not answer (Connection reset)",
        ),
    ],
)
def test_each_problem_in_words(probe, problem):
    verdict = _watchdog.judge({"service": "vllm", **probe}, None)
    assert not verdict["sound"]
    assert say(verdict["problem"]["code"], **{k: v for k, v in verdict["problem"].items() if k != "code"}) == problem


def test_progress_sums_the_token_counters_of_metrics():
    text = (
        "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.\n"
        'vllm:prompt_tokens_total{engine="0",model_name="tiny"} 12.0\n'
        'vllm:generation_tokens_total{engine="0",model_name="tiny"} 1.0\n'
        'vllm:generation_tokens_created{engine="0",model_name="tiny"} 1.7e+09\n'
        'vllm:num_requests_running{engine="0",model_name="tiny"} 0.0\n'
    )
    assert _watchdog.progress(text) == 13.0
    assert _watchdog.progress("# nothing\nhttp_requests_total 4\n") is None


def test_the_metrics_textfile():
    state, action = _watchdog.tick(None, seen(dead()), 1_796_195_882.5, POLICY)
    text = _watchdog.metrics(state, action)
    assert "gpubox_vllm_watchdog_sound 0\n" in text
    assert "gpubox_vllm_watchdog_consecutive_failures 1\n" in text
    assert "# TYPE gpubox_vllm_watchdog_restarts_total counter\ngpubox_vllm_watchdog_restarts_total 0\n" in text
    assert "gpubox_vllm_watchdog_last_probe_timestamp_seconds 1796195882.5\n" in text
    assert "gpubox_vllm_watchdog_gave_up 0\n" in text
