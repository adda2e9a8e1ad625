#!/usr/bin/python
# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: wait_for_vllm
short_description: Wait for a vLLM server to answer, saying what its log says it is doing
version_added: 0.2.0
description:
  - Asks O(url) (vLLM's C(/v1/models)) every second until it answers 200, for at most O(timeout) seconds.
  - Every O(interval) seconds it prints what the server's log says it is doing, with the time since the wait began,
    for example that it is loading the weights (shard 5 of 9) after 1m12s, then capturing CUDA graphs, and so on,
    so that a slow start is visible as slow and not as a hang.
  - A container that exits or restarts before it answers fails the task at once, with its last log lines; so does
    the timeout.
  - Needs the C(docker) CLI on the host, as the vllm role's Compose project does.
  - Runs through its action plugin, which runs this module on the host once per O(interval); the module asks O(url)
    and reads the container's state (C(docker inspect)) every second, and returns at the answer, at the container's
    exit, or after O(interval) seconds with the container's last log lines (C(docker logs)), which the action plugin
    reads the phase from. One module run per interval, not several every second, so that the wait does not compete
    for the CPU with the server it waits for.
author:
  - gpubox maintainers (@gpubox)
extends_documentation_fragment:
  - gpubox.inference.attributes.action_plugin
options:
  url:
    description: The URL that answers 200 once the server is up.
    type: str
    required: true
  api_key:
    description: The key the server checks (sent as a bearer token). Never shown.
    type: str
  container:
    description: The server's container name.
    type: str
    required: true
  project:
    description: The name the progress lines start with; the container's by default.
    type: str
  timeout:
    description: Seconds to wait for the answer.
    type: int
    default: 900
  interval:
    description:
      - Seconds between progress lines.
      - The longest one module run on the host waits before it returns with the log (the action plugin passes what is
        left of O(timeout) when that is less).
    type: float
    default: 30
  log_lines:
    description: How many of the server's last log lines a failure shows.
    type: int
    default: 40
attributes:
  check_mode:
    support: full
    description: Skipped in check mode, where nothing was started.
"""

EXAMPLES = r"""
- name: Wait until the server lists its model
  gpubox.inference.wait_for_vllm:
    url: http://127.0.0.1:8000/v1/models
    api_key: "{{ vllm_api_key }}"
    container: gpubox-vllm-vllm-1
    timeout: 900
"""

RETURN = r"""
elapsed_s:
  description: Seconds until the server answered.
  returned: success, not in check mode
  type: float
status:
  description: The HTTP status of the answer (200).
  returned: success, not in check mode
  type: int
answered:
  description: Whether O(url) answered 200 (a module run of one interval, as the action plugin runs it).
  returned: a module run
  type: bool
container:
  description:
    - The container's C(status), C(exit_code) and C(restarts) as Docker reported them last; null before it exists.
    - Returned by a module run, as the action plugin runs it.
  returned: a module run
  type: dict
log:
  description: The container's last log lines (at least 200), when O(url) did not answer within the run.
  returned: a module run that did not get the answer
  type: list
  elements: str
"""

import json
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url

from ansible_collections.gpubox.inference.plugins.module_utils._vllm_log import stopped


def answer(url: str, headers: dict) -> int | None:
    """The HTTP status ``url`` answers with, None when it does not answer."""
    try:
        with open_url(url, headers=headers, timeout=5) as response:
            return response.status
    except Exception as error:  # connection refused, reset, timeouts and HTTP errors alike
        return getattr(error, "code", None)


def inspect(module: AnsibleModule, docker: str, container: str) -> dict | None:
    """The container's state, None while Docker does not know it (the wait can begin before Compose created it)."""
    rc, out, _err = module.run_command([docker, "inspect", "--format", "{{json .State}} {{.RestartCount}}", container])
    if rc != 0:
        return None
    state, _sep, restarts = out.strip().rpartition(" ")
    state = json.loads(state)
    return {"status": state.get("Status"), "exit_code": state.get("ExitCode"), "restarts": int(restarts)}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "api_key": {"type": "str", "no_log": True},
            "container": {"type": "str", "required": True},
            "project": {"type": "str"},
            "timeout": {"type": "int", "default": 900},
            "interval": {"type": "float", "default": 30},
            "log_lines": {"type": "int", "default": 40},
        },
        supports_check_mode=True,
    )
    params = module.params
    if module.check_mode:
        module.exit_json(changed=False, skipped=True, msg="Nothing was started in check mode")
    docker = module.get_bin_path("docker", required=True)
    headers = {"Authorization": "Bearer " + params["api_key"]} if params["api_key"] else {}
    deadline = time.monotonic() + max(params["interval"], 1.0)
    while True:
        status = answer(params["url"], headers)
        if status == 200:
            module.exit_json(changed=False, answered=True, status=status)
        container = inspect(module, docker, params["container"])
        if stopped(container) or time.monotonic() + 1 >= deadline:
            break
        time.sleep(1)
    _rc, out, err = module.run_command([docker, "logs", "--tail", str(max(params["log_lines"], 200)), params["container"]])
    log = (out + "\n" + err).strip().splitlines()
    module.exit_json(changed=False, answered=False, status=status, container=container, log=log)


if __name__ == "__main__":
    main()
