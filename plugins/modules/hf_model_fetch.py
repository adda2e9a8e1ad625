#!/usr/bin/python
# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: hf_model_fetch
short_description: Download a model from a Hugging Face Hub or mirror into vLLM's cache, showing progress
version_added: 0.2.0
description:
  - Downloads O(files) of O(model) at O(commit) (as M(gpubox.inference.hf_model_info) returns them) into the Hub
    cache at O(cache_dir), the one vLLM's container reads, with huggingface_hub's C(snapshot_download).
  - The download runs in a container of O(image), vLLM's own image, which ships huggingface_hub; the host needs
    nothing new. The container reads the Hub token from O(env_file) (C(HF_TOKEN)), so the token is never an argument.
  - Every O(interval) seconds it prints a line with the bytes done of the total, the rate and the time left.
  - Files already in the cache are not downloaded again. A download killed half way resumes with the files it had
    not finished; a new commit that shares files with an old one downloads only what differs.
  - A failed download fails the task with the container's exit code and its last log lines.
  - Runs through its action plugin, which drives M(community.docker.docker_container) and M(ansible.builtin.find).
author:
  - gpubox maintainers (@gpubox)
extends_documentation_fragment:
  - gpubox.inference.attributes.action_plugin
options:
  model:
    description: The Hub id, C(ORG/NAME).
    type: str
    required: true
  commit:
    description: The commit to download (C(commit) from M(gpubox.inference.hf_model_info)).
    type: str
    required: true
  files:
    description: The files to download, each with C(path), C(size) and C(blob) (C(files) from M(gpubox.inference.hf_model_info)).
    type: list
    elements: dict
    required: true
  endpoint:
    description: The Hub or the mirror (C(HF_ENDPOINT)).
    type: str
    default: https://huggingface.co
  cache_dir:
    description: The host folder mounted as C(/root/.cache/huggingface) in the container.
    type: path
    required: true
  image:
    description: The image to download with, C(NAME:TAG); it must have C(python3) and huggingface_hub.
    type: str
    required: true
  env_file:
    description: A file of C(NAME=value) lines given to the container; C(HF_TOKEN) there authenticates.
    type: path
  name:
    description: The download container's name; it is removed when the download ends.
    type: str
    default: gpubox-model-fetch
  interval:
    description: Seconds between progress lines.
    type: float
    default: 30
attributes:
  check_mode:
    support: full
    description: Reports what would be downloaded and changes nothing.
"""

EXAMPLES = r"""
- name: Resolve the model
  gpubox.inference.hf_model_info:
    model: Qwen/Qwen2.5-7B-Instruct
    cache_dir: /var/lib/gpubox/huggingface
  register: model

- name: Download what is missing
  gpubox.inference.hf_model_fetch:
    model: Qwen/Qwen2.5-7B-Instruct
    commit: "{{ model.commit }}"
    files: "{{ model.files }}"
    cache_dir: /var/lib/gpubox/huggingface
    image: vllm/vllm-openai:v0.32.0
    env_file: /opt/gpubox/vllm/vllm.env
  when: not model.complete
"""

RETURN = r"""
snapshot:
  description: The commit's snapshot folder on the host.
  returned: always
  type: str
downloaded_bytes:
  description: Bytes this run added to the cache.
  returned: success, not in check mode
  type: int
total_bytes:
  description: Bytes of all the files.
  returned: success, not in check mode
  type: int
elapsed_s:
  description: Seconds the download took.
  returned: success, not in check mode
  type: float
rate:
  description: The average rate, for example C(110.2 MiB/s).
  returned: success, not in check mode
  type: str
"""
