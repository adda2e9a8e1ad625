# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Wait for a deployed vLLM to answer /v1/models, saying every ``interval`` s what its log says it is doing.

Each round asks /v1/models with ansible.builtin.uri on the box, reads the container's
state with community.docker.docker_container_info and its last log lines with
``docker logs``, and prints the start-up phase (_vllm_log). A container that exits or
restarts fails at once with its log, not after the whole timeout. The options are
documented in the wait_for_vllm module.
"""

from __future__ import annotations

import time

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.gpubox.inference.plugins.module_utils import _vllm_log
from ansible_collections.gpubox.inference.plugins.module_utils._hub import human_seconds
from ansible_collections.gpubox.inference.plugins.module_utils._words import say

display = Display()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("url", "api_key", "container", "project", "timeout", "interval", "log_lines"))

    def _logs(self, container: str, count: int, task_vars: dict) -> list[str]:
        logs = self._execute_module(
            module_name="ansible.builtin.command",
            module_args={"argv": ["docker", "logs", "--tail", str(count), container]},
            task_vars=task_vars,
        )
        return (logs.get("stdout", "") + "\n" + logs.get("stderr", "")).strip().splitlines()

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._task.args
        url, container = args.get("url"), args.get("container")
        if not url or not container:
            raise AnsibleActionFail("wait_for_vllm needs url and container")
        project = args.get("project") or container
        timeout, interval = float(args.get("timeout", 900)), float(args.get("interval", 30))
        tail = int(args.get("log_lines", 40))
        result["changed"] = False
        if self._task.check_mode:
            result["skipped"] = True
            return result
        headers = {"Authorization": "Bearer " + args["api_key"]} if args.get("api_key") else {}
        started = time.monotonic()
        next_line = started + interval
        while True:
            answer = self._execute_module(
                module_name="ansible.builtin.uri",
                module_args={"url": url, "headers": headers, "timeout": 5, "status_code": [200]},
                task_vars=task_vars,
            )
            elapsed = time.monotonic() - started
            if not answer.get("failed"):
                display.display(say("start.answered", project=project, elapsed=human_seconds(elapsed)), stderr=True)
                result.update(elapsed_s=round(elapsed, 1), status=answer.get("status"))
                return result
            info = self._execute_module(
                module_name="community.docker.docker_container_info", module_args={"name": container}, task_vars=task_vars
            )
            state = (info.get("container") or {}).get("State") or {}
            restarts = int((info.get("container") or {}).get("RestartCount") or 0)
            if info.get("exists") and (state.get("Status") in ("exited", "dead") or restarts > 0):
                status = "exited" if state.get("Status") in ("exited", "dead") else f"restarted {restarts} time(s)"
                log = self._logs(container, tail, task_vars)
                raise AnsibleActionFail(say("start.exited", status=status, rc=state.get("ExitCode"), url=url, log=log))
            if elapsed >= timeout:
                raise AnsibleActionFail(
                    say("start.timeout", url=url, timeout=int(timeout), log=self._logs(container, tail, task_vars))
                )
            if time.monotonic() >= next_line:
                found = _vllm_log.phase(self._logs(container, 200, task_vars))
                display.display(_vllm_log.words(found, project, human_seconds(elapsed)), stderr=True)
                next_line += interval
            time.sleep(max(0.0, min(next_line - time.monotonic(), 2.0)))
