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
  - Asks O(url) (vLLM's C(/v1/models)) every two seconds until it answers 200, for at most O(timeout) seconds.
  - Every O(interval) seconds it prints what the server's log says it is doing, with the time since the wait began,
    for example that it is loading the weights (shard 5 of 9) after 1m12s, then capturing CUDA graphs, and so on,
    so that a slow start is visible as slow and not as a hang.
  - A container that exits or restarts before it answers fails the task at once, with its last log lines; so does
    the timeout.
  - Runs through its action plugin, which drives M(ansible.builtin.uri), M(community.docker.docker_container_info)
    and C(docker logs) on the host.
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
    description: Seconds between progress lines.
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
"""
