# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpubox-vllm-watchdog: one probe of the vLLM servers this box deployed (run by gpubox-vllm-watchdog.timer).

Installed by the gpubox.inference.vllm role (vllm_watchdog). Each run reads the deployment record
(vllm.json: the servers' loopback addresses and the served model), asks Docker for the project's
containers, sends each running server GET /health and a one-token completion, and reads its token
counters; _watchdog.tick decides, and this program acts: it recreates the Compose project when the
decision says so, after writing the servers' last log lines to the journal. Lines go to stdout with
the journal's priority prefixes (<3> error, <4> warning, <6> info); the state between runs is a JSON
file, the Prometheus metrics a textfile for node exporter's collector.

Usage: python3 gpubox-vllm-watchdog.py [CONFIG]   (default /etc/gpubox/vllm-watchdog.json)
"""

from __future__ import annotations

import calendar
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.environ.get("GPUBOX_LIB", "/usr/local/lib/gpubox/vllm-watchdog"))

from ansible_collections.gpubox.inference.plugins.module_utils import _watchdog, _words
from ansible_collections.gpubox.inference.plugins.module_utils._box_files import read_json, write_atomically

PRIORITY = {"error": "<3>", "warning": "<4>", "info": "<6>"}
PROMPT = "The watchdog asks for one token to check that the engine of this vLLM server still answers requests."
# Loopback only, whatever proxy the environment names.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def say(level: str, text: str) -> None:
    for line in text.splitlines() or [""]:
        print(f"{PRIORITY[level]}{line}", flush=True)


def api_key(env_file: str) -> str:
    """VLLM_API_KEY from the project's 0600 env file, or empty."""
    try:
        with open(env_file, encoding="utf-8") as handle:
            for line in handle:
                key, sep, value = line.strip().partition("=")
                if sep and key == "VLLM_API_KEY":
                    return value
    except OSError:
        pass
    return ""


def request(url: str, timeout: float, body: dict | None = None, key: str = "") -> tuple[int | None, str, bool]:
    """(HTTP status or None, the body or why there is none, timed out)."""
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    try:
        with OPENER.open(urllib.request.Request(url, data=data, headers=headers), timeout=timeout) as response:
            return response.status, response.read().decode(errors="replace"), False
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")[:300], False
    except TimeoutError:
        return None, "timed out", True
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        timed_out = isinstance(reason, TimeoutError) or "timed out" in str(reason)
        return None, str(reason), timed_out


def docker(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *argv], capture_output=True, text=True, timeout=timeout, check=False)


def epoch(docker_time: str) -> float | None:
    """Docker's 2026-12-02T07:17:16.920120493Z -> epoch seconds."""
    match = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?Z$", docker_time or "")
    if not match or docker_time.startswith("0001-"):
        return None
    return calendar.timegm(time.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S")) + float(match.group(2) or 0)


def containers(project: str) -> list[dict]:
    ids = docker("ps", "--all", "--quiet", "--filter", f"label=com.docker.compose.project={project}").stdout.split()
    if not ids:
        return []
    inspected = docker("inspect", *ids)
    found = []
    for item in json.loads(inspected.stdout or "[]"):
        state = item.get("State") or {}
        found.append(
            {
                "service": (item.get("Config") or {}).get("Labels", {}).get("com.docker.compose.service", "?"),
                "name": item.get("Name", "").lstrip("/"),
                "status": "restarting" if state.get("Restarting") else state.get("Status"),
                "started_at": epoch(state.get("StartedAt", "")),
            }
        )
    return sorted(found, key=lambda c: c["name"])


def probe(service: str, address: str, model: str, key: str, config: dict) -> dict:
    base = f"http://{address}"
    status, text, _timed_out = request(f"{base}/health", config["health_timeout_s"])
    result = {"service": service, "health": {"status": status, "error": None if status else text}}
    if status == 200:
        body = {"model": model, "prompt": PROMPT, "max_tokens": 1, "temperature": 0}
        status, text, timed_out = request(f"{base}/v1/completions", config["timeout_s"], body, key)
        result["completion"] = {
            "ok": status == 200,
            "status": status,
            "error": None if status == 200 else text[:200],
            "timed_out": timed_out,
            "timeout_s": config["timeout_s"],
        }
        metrics_status, metrics_text, _timed_out = request(f"{base}/metrics", config["health_timeout_s"])
        result["progress"] = _watchdog.progress(metrics_text) if metrics_status == 200 else None
    return result


def restart(config: dict, seen: dict, state: dict, action: dict) -> dict:
    """The servers' last log lines to the journal, then the Compose project recreated."""
    for container in seen["containers"]:
        logs = docker("logs", "--tail", str(config["log_lines"]), container["name"])
        say("warning", f"last {config['log_lines']} log lines of {container['name']}:")
        say("warning", "\n".join(f"  | {line}" for line in (logs.stdout + logs.stderr).splitlines()))
    up = docker(
        "compose", "--project-directory", config["project_dir"], "--project-name", config["project_name"],
        "up", "--detach", "--force-recreate", timeout=600,
    )  # fmt: skip
    if up.returncode != 0:
        return _watchdog.restart_failed(state, up.returncode, (up.stderr or up.stdout).strip()[-500:])
    return action


def main(argv: list[str]) -> int:
    config_path = argv[1] if len(argv) > 1 else "/etc/gpubox/vllm-watchdog.json"
    config = read_json(config_path)
    if config is None:
        say("error", f"cannot read the watchdog's configuration {config_path}")
        return 2
    record = read_json(config["record"]) or {}
    seen = {"deployed": bool(record.get("upstreams")), "containers": [], "probes": []}
    if seen["deployed"]:
        seen["containers"] = containers(config["project_name"])
        running = {c["service"] for c in seen["containers"] if c["status"] == "running"}
        key = api_key(os.path.join(config["project_dir"], "vllm.env"))
        for service, address in zip(record.get("services") or ["vllm"], record["upstreams"], strict=False):
            if service in running:
                seen["probes"].append(probe(service, address, record.get("served_model_name", ""), key, config))
    state, action = _watchdog.tick(read_json(config["state"]), seen, time.time(), config["policy"])
    if action["log"]:
        say(action["level"], _words.say(action["code"], **_watchdog.fields(action)))
    if action["restart"]:
        action = restart(config, seen, state, action)
        if action["code"] == "watchdog.restart_failed":
            say("error", _words.say(action["code"], **_watchdog.fields(action)))
    write_atomically(config["state"], json.dumps(state, indent=1, sort_keys=True) + "\n")
    if config.get("metrics"):
        write_atomically(config["metrics"], _watchdog.metrics(state, action))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
