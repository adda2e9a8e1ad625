# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pull an image with ``docker pull`` on the box, printing the layers pulled every ``interval`` s.

community.docker.docker_image pulls through the API and shows nothing until the end, and
a vLLM image is about 10 GB. This plugin asks community.docker.docker_image_info whether
the image is there; if not, it starts ``docker pull`` in the background on the box,
reads what it prints every ``interval`` seconds (_docker_pull) and says how many layers
are done. The options are documented in the image_pull module.
"""

from __future__ import annotations

import shlex
import time
import uuid

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.gpubox.inference.plugins.module_utils import _docker_pull
from ansible_collections.gpubox.inference.plugins.module_utils._hub import human_seconds
from ansible_collections.gpubox.inference.plugins.module_utils._words import say

display = Display()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("name", "interval"))

    def _run(self, argv: list[str], task_vars: dict) -> dict:
        return self._execute_module(module_name="ansible.builtin.command", module_args={"argv": argv}, task_vars=task_vars)

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        image = self._task.args.get("name")
        if not image:
            raise AnsibleActionFail("image_pull needs name (NAME:TAG)")
        interval = float(self._task.args.get("interval", 30))
        info = self._execute_module(
            module_name="community.docker.docker_image_info", module_args={"name": image}, task_vars=task_vars
        )
        if info.get("failed"):
            raise AnsibleActionFail(f"community.docker.docker_image_info: {info.get('msg')}")
        result.update(changed=False, image=image)
        if info.get("images"):
            return result
        result["changed"] = True
        if self._task.check_mode:
            result["msg"] = f"would pull {image}"
            return result
        log = f"/tmp/gpubox-pull-{uuid.uuid4().hex[:12]}.log"
        started = time.monotonic()
        script = f"docker pull {shlex.quote(image)} >{log} 2>&1; echo $? >{log}.rc"
        # Detached from the module's process, which returns at once; the pull writes its exit code when it ends.
        started_pull = self._execute_module(
            module_name="ansible.builtin.command",
            module_args={"_raw_params": f"setsid sh -c {shlex.quote(script)} </dev/null >/dev/null 2>&1 &", "_uses_shell": True},
            task_vars=task_vars,
        )
        if started_pull.get("failed"):
            raise AnsibleActionFail(f"could not start docker pull {image}: {started_pull.get('msg')}")
        next_line = started + interval
        try:
            while True:
                time.sleep(max(0.0, min(next_line - time.monotonic(), 2.0)))
                # The exit code first: once it is there, the log read after it is whole.
                code = self._run(["cat", f"{log}.rc"], task_vars)
                finished = not code.get("failed") and code.get("stdout", "").strip()
                if not finished and time.monotonic() < next_line:
                    continue
                next_line += interval
                output = self._run(["cat", log], task_vars).get("stdout", "")
                line = _docker_pull.progress(output)
                display.display(
                    say("pull.progress", image=image, elapsed=human_seconds(time.monotonic() - started), **line), stderr=True
                )
                if finished:
                    rc = int(code["stdout"].strip())
                    break
        finally:
            self._run(["rm", "-f", log, f"{log}.rc"], task_vars)
        if rc != 0:
            raise AnsibleActionFail(say("pull.failed", image=image, rc=rc, log=output.strip().splitlines()[-5:]))
        result.update(elapsed_s=round(time.monotonic() - started, 1), **line)
        return result
