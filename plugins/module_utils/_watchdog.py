# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Private: the vLLM engine watchdog's decisions, one probe at a time: what the box saw in, the next state out.

No Ansible imports and no I/O. The watchdog program on the box (roles/vllm/files/gpubox-vllm-watchdog,
run by a systemd timer) reads Docker and probes each server through loopback, calls ``tick`` with what
it saw, acts on the returned ``action`` (recreate the Compose project, or nothing), renders its ``code``
through ``_words.say`` into the journal, and keeps the state for the next tick.

What ``tick`` decides:

- A server is sound when ``/health`` answers 200 and a one-token completion answers in time. A completion
  that timed out while the server's token counters moved since the last probe is a busy engine, not a
  hung one, and is sound too.
- A container that (re)started less than ``start_grace_s`` ago and has not answered soundly since is
  starting (model loading can take minutes): not counted. That covers the role's own deploys and the
  watchdog's restarts.
- Containers that are stopped (by hand, or by the correctness gate) are left alone; one that Docker is
  restarting is Docker's to handle.
- ``failures`` consecutive unsound probes recreate the project, at most ``max_restarts`` times within
  ``window_s``; past that the watchdog gives up, leaves the server as it is and says so, until the
  window has room again.
"""

from __future__ import annotations

import math

POLICY = {"failures": 3, "max_restarts": 3, "window_s": 3600, "start_grace_s": 900}
# The token counters of a vLLM server's /metrics that move while its engine works.
PROGRESS_METRICS = ("vllm:generation_tokens_total", "vllm:prompt_tokens_total")
# Codes logged on every tick they happen; the others only when the code changes.
ALWAYS_LOGGED = {"watchdog.failing", "watchdog.restart"}
LEVELS = {
    "watchdog.failing": "warning",
    "watchdog.restart": "warning",
    "watchdog.gave_up": "error",
    "watchdog.restart_failed": "error",
}


def new_state() -> dict:
    """The state before the first tick."""
    return {
        "failures": 0,
        "restarts": [],
        "restarts_total": 0,
        "restarted_at": None,
        "healthy_start": {},
        "progress": {},
        "last_code": None,
        "last_tick": None,
        "sound": None,
        "ticks": 0,
    }


def metric_sum(metrics_text: str, names) -> float | None:
    """The sum of every sample of the metrics ``names`` in a Prometheus text exposition; None when none is there."""
    total, seen = 0.0, False
    for line in metrics_text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            try:
                value = float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
            if math.isfinite(value):
                total, seen = total + value, True
    return total if seen else None


def progress(metrics_text: str) -> float | None:
    """The sum of a vLLM server's prompt and generation token counters in its /metrics text; None when absent."""
    return metric_sum(metrics_text, PROGRESS_METRICS)


def judge(probe: dict, previous_progress: float | None) -> dict:
    """One server's probe -> ``{"sound": bool, "busy": bool, "problem": {"code", ...} | None}``.

    ``probe``: ``service``, ``health`` (``status``: the HTTP status or None, ``error``: why there is none),
    ``completion`` (``ok``, ``status``, ``error``, ``timed_out``) and ``progress`` (``progress`` of its /metrics).
    """
    service = probe["service"]
    health, completion = probe.get("health") or {}, probe.get("completion") or {}
    if health.get("status") != 200:
        if health.get("status") is None:
            return _unsound(service, "watchdog.health_unreachable", error=health.get("error") or "no answer")
        return _unsound(service, "watchdog.health_status", status=health["status"])
    if completion.get("ok"):
        return {"sound": True, "busy": False, "problem": None}
    moved = probe.get("progress") is not None and previous_progress is not None and probe["progress"] > previous_progress
    if completion.get("timed_out") and moved:
        return {"sound": True, "busy": True, "problem": None}
    if completion.get("timed_out"):
        return _unsound(service, "watchdog.completion_timeout", seconds=completion.get("timeout_s"))
    if completion.get("status") is not None:
        return _unsound(service, "watchdog.completion_status", status=completion["status"], error=completion.get("error") or "")
    return _unsound(service, "watchdog.completion_unreachable", error=completion.get("error") or "no answer")


def _unsound(service: str, code: str, **fields) -> dict:
    return {"sound": False, "busy": False, "problem": {"code": code, "service": service, **fields}}


def tick(state: dict | None, seen: dict, now: float, policy: dict | None = None) -> tuple[dict, dict]:
    """The next state and the action for one probe of the deployment.

    ``seen``: ``deployed`` (a deployment record exists), ``containers`` (``service``, ``name``, ``status`` as
    Docker says it: running, restarting, exited, ..., ``started_at`` in epoch seconds) and ``probes`` (one per
    running server, see ``judge``). ``now``: epoch seconds.

    The action: ``code`` (rendered by ``_words.say`` with the other fields), ``restart`` (recreate the Compose
    project now), ``log`` (write a line: on every failure and restart, else only when the code changes),
    ``level`` (info, warning or error) and ``sound`` (every running server answered).
    """
    policy = {**POLICY, **(policy or {})}
    state = {**new_state(), **(state or {})}
    state["ticks"] += 1
    state["last_tick"] = now
    state["restarts"] = [t for t in state["restarts"] if now - t < policy["window_s"]]
    action = _decide(state, seen, now, policy)
    action.setdefault("restart", False)
    action["level"] = LEVELS.get(action["code"], "info")
    action["log"] = action["code"] in ALWAYS_LOGGED or action["code"] != state["last_code"]
    state["last_code"] = action["code"]
    state["sound"] = action.get("sound")
    return state, action


def _decide(state: dict, seen: dict, now: float, policy: dict) -> dict:
    if not seen.get("deployed"):
        state["failures"] = 0
        return {"code": "watchdog.no_deployment", "sound": None}
    containers = seen.get("containers") or []
    if any(c.get("status") == "restarting" for c in containers):
        state["failures"] = 0
        names = [c["name"] for c in containers if c.get("status") == "restarting"]
        return {"code": "watchdog.docker_restarting", "containers": names, "sound": False}
    running = {c["service"]: c for c in containers if c.get("status") == "running"}
    if not running:
        state["failures"] = 0
        return {"code": "watchdog.stopped", "sound": None}

    verdicts = {}
    for probe in seen.get("probes") or []:
        service = probe["service"]
        verdicts[service] = judge(probe, state["progress"].get(service))
        if probe.get("progress") is not None:
            state["progress"][service] = probe["progress"]
    for service, verdict in verdicts.items():
        if verdict["sound"] and service in running:
            state["healthy_start"][service] = running[service].get("started_at")

    problems = [v["problem"] for s, v in sorted(verdicts.items()) if not v["sound"]]
    if not problems:
        state["failures"] = 0
        busy = sorted(s for s, v in verdicts.items() if v["busy"])
        if state["restarted_at"] is not None:
            after = now - state["restarted_at"]
            state["restarted_at"] = None
            return {"code": "watchdog.recovered", "seconds": after, "sound": True}
        if busy:
            return {"code": "watchdog.busy", "busy": busy, "sound": True}
        return {"code": "watchdog.healthy", "servers": len(verdicts), "sound": True}

    starting = [
        (service, now - running[service]["started_at"])
        for service in sorted(verdicts)
        if not verdicts[service]["sound"]
        and service in running
        and running[service].get("started_at") is not None
        and running[service]["started_at"] != state["healthy_start"].get(service)
        and now - running[service]["started_at"] < policy["start_grace_s"]
    ]
    if len(starting) == len(problems):
        state["failures"] = 0
        service, elapsed = starting[0]
        grace = policy["start_grace_s"]
        return {"code": "watchdog.starting", "service": service, "seconds": elapsed, "grace_s": grace, "sound": False}

    state["failures"] += 1
    fields = {"problems": problems, "count": state["failures"], "failures": policy["failures"], "sound": False}
    if state["failures"] < policy["failures"]:
        return {"code": "watchdog.failing", **fields}
    if len(state["restarts"]) >= policy["max_restarts"]:
        state["failures"] = policy["failures"]
        return {
            "code": "watchdog.gave_up",
            **fields,
            "restarts": len(state["restarts"]),
            "window_s": policy["window_s"],
            "next_at": min(state["restarts"]) + policy["window_s"],
        }
    state["failures"] = 0
    state["restarts"].append(now)
    state["restarts_total"] += 1
    state["restarted_at"] = now
    return {
        "code": "watchdog.restart",
        **fields,
        "restart": True,
        "restarts": len(state["restarts"]),
        "max_restarts": policy["max_restarts"],
        "window_s": policy["window_s"],
    }


def fields(action: dict) -> dict:
    """The fields ``_words.say`` renders an action's code with (all but the control keys)."""
    return {key: value for key, value in action.items() if key not in ("code", "restart", "log", "level", "sound")}


def restart_failed(state: dict, rc: int, output: str) -> dict:
    """The action when recreating the project failed; the restart still counts against the limit."""
    state["last_code"] = "watchdog.restart_failed"
    return {"code": "watchdog.restart_failed", "rc": rc, "output": output, "restart": False, "log": True, "level": "error"}


def metrics(state: dict, action: dict) -> str:
    """The watchdog's state for Prometheus (node exporter's textfile collector)."""
    rows = [
        ("gpubox_vllm_watchdog_sound", "gauge", "1 when every running vLLM server answered at the last probe",
         1 if action.get("sound") else 0),
        ("gpubox_vllm_watchdog_consecutive_failures", "gauge", "unsound probes in a row", state["failures"]),
        ("gpubox_vllm_watchdog_restarts_total", "counter", "Compose project recreations by the watchdog",
         state["restarts_total"]),
        ("gpubox_vllm_watchdog_gave_up", "gauge", "1 when the restart limit is reached and the server is left as it is",
         1 if action["code"] == "watchdog.gave_up" else 0),
        ("gpubox_vllm_watchdog_last_probe_timestamp_seconds", "gauge", "when the watchdog last probed", state["last_tick"] or 0),
    ]  # fmt: skip
    lines = []
    for name, kind, text, value in rows:
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name} {_number(value)}"]
    return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    """A sample value as Prometheus reads it, whole numbers (timestamps included) without an exponent."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))
