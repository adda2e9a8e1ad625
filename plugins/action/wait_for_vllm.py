# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Wait for a deployed vLLM to answer /v1/models, saying every ``interval`` s what its log says it is doing.

Each round is one run of the wait_for_vllm module on the box, for one ``interval``: it
asks /v1/models and reads the container's state every second, and returns at the answer,
at the container's exit, or with the container's last log lines, from which the round
prints the start-up phase (_vllm_log). A container that exits or restarts fails at once
with its log, not after the whole timeout. The options are documented in the module.
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
        started = time.monotonic()
        while True:
            left = timeout - (time.monotonic() - started)
            module_args = {"url": url, "container": container, "interval": max(1.0, min(interval, left)), "log_lines": tail}
            if args.get("api_key"):
                module_args["api_key"] = args["api_key"]
            watched = self._execute_module(
                module_name="gpubox.inference.wait_for_vllm", module_args=module_args, task_vars=task_vars
            )
            if watched.get("failed"):
                raise AnsibleActionFail(watched.get("msg", "wait_for_vllm failed on the host"))
            elapsed = time.monotonic() - started
            if watched["answered"]:
                display.display(say("start.answered", project=project, elapsed=human_seconds(elapsed)), stderr=True)
                result.update(elapsed_s=round(elapsed, 1), status=watched["status"])
                return result
            log = watched.get("log") or []
            gone = _vllm_log.stopped(watched.get("container"))
            if gone:
                raise AnsibleActionFail(say("start.exited", **gone, url=url, log=log[-tail:]))
            if elapsed >= timeout:
                raise AnsibleActionFail(say("start.timeout", url=url, timeout=int(timeout), log=log[-tail:]))
            display.display(_vllm_log.words(_vllm_log.phase(log), project, human_seconds(elapsed)), stderr=True)
