#!/usr/bin/python
# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: image_pull
short_description: Pull a container image when it is missing, printing the layers pulled as it goes
version_added: 0.2.0
description:
  - Does nothing when O(name) is already on the host (M(community.docker.docker_image_info)).
  - Else runs C(docker pull) on the host and every O(interval) seconds prints how many of the image's layers are
    pulled and downloaded, with the time so far, so that a 10 GB vLLM image never looks like a hang.
    M(community.docker.docker_image) pulls the same image but shows nothing until it ends.
  - A failed pull fails the task with the exit code and the last lines C(docker pull) printed.
  - Runs through its action plugin.
author:
  - gpubox maintainers (@gpubox)
extends_documentation_fragment:
  - gpubox.inference.attributes.action_plugin
options:
  name:
    description: The image, C(NAME:TAG).
    type: str
    required: true
  interval:
    description: Seconds between progress lines.
    type: float
    default: 30
attributes:
  check_mode:
    support: full
    description: Says whether it would pull, and pulls nothing.
"""

EXAMPLES = r"""
- name: Pull the vLLM image, showing its progress
  gpubox.inference.image_pull:
    name: vllm/vllm-openai:v0.32.0
"""

RETURN = r"""
layers:
  description: The image's layers C(docker pull) listed.
  returned: when it pulled, not in check mode
  type: int
pulled:
  description: Layers pulled or already on the host.
  returned: when it pulled, not in check mode
  type: int
elapsed_s:
  description: Seconds the pull took.
  returned: when it pulled, not in check mode
  type: float
"""
