#!/usr/bin/python
# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: hf_model_info
short_description: Resolve a model on a Hugging Face Hub or mirror, and say what of it the cache already holds
version_added: 0.2.0
description:
  - Asks the Hub (or the mirror in O(endpoint)) for the commit of O(revision) of O(model) and its file tree, and
    chooses the files vLLM needs, weights in one format (safetensors first, else C(.bin)), with the configs, the
    tokenizer and the chat template.
  - Measures the cache at O(cache_dir) (huggingface_hub's layout, the one vLLM reads in its container), which of
    those files are present, the bytes still to download, and the free space on its disk, with a C(disk_problem)
    when what is missing plus a margin (the larger of 1 GiB and 2%) does not fit.
  - Reads the model's C(config.json), from the cache when it is there, else from the Hub into memory, so that the
    checks that need the attention heads and the context length run before anything is downloaded.
  - A typo, a gated model without a token or with a token that lacks access, a missing revision and an unreachable
    endpoint each fail with a message naming the model, the endpoint and the HTTP status, and what to do.
  - Changes nothing on the host; runs the same in check mode. M(gpubox.inference.hf_model_fetch) downloads.
author:
  - gpubox maintainers (@gpubox)
extends_documentation_fragment:
  - gpubox.inference.attributes.info_module
options:
  model:
    description: The Hub id, C(ORG/NAME).
    type: str
    required: true
  revision:
    description: A branch, a tag or a commit.
    type: str
    default: main
  endpoint:
    description: The Hub or a mirror that answers its API (what C(HF_ENDPOINT) names for huggingface_hub).
    type: str
    default: https://huggingface.co
  token:
    description: A Hub token for gated or private models. Never returned or logged.
    type: str
  cache_dir:
    description: The folder mounted as C(/root/.cache/huggingface) in vLLM's container (C(HF_HOME)); it need not exist.
    type: path
    required: true
  timeout:
    description: Seconds to wait for each answer from the Hub.
    type: int
    default: 30
  validate_certs:
    description: Check the endpoint's TLS certificate.
    type: bool
    default: true
notes:
  - Only the Python standard library and Ansible's own URL code run on the host.
"""

EXAMPLES = r"""
- name: Resolve the model and measure the cache
  gpubox.inference.hf_model_info:
    model: meta-llama/Llama-3.1-8B-Instruct
    revision: main
    token: "{{ vllm_hf_token }}"
    cache_dir: /var/lib/gpubox/huggingface
  register: model

- name: Refuse a model the disk cannot hold
  ansible.builtin.assert:
    that: model.disk_problem is none
"""

RETURN = r"""
commit:
  description: The commit O(revision) resolves to.
  returned: always
  type: str
  sample: 0e9e39f249a16976918f6564b8830bc894c89659
files:
  description: The files vLLM needs, each with its C(path), C(size), C(blob) (its ETag in the cache) and C(lfs).
  returned: always
  type: list
  elements: dict
weight_format:
  description: C(safetensors) or C(pytorch).
  returned: always
  type: str
total_bytes:
  description: Bytes of all those files.
  returned: always
  type: int
done_bytes:
  description: Bytes of them in the cache already (partial downloads included).
  returned: always
  type: int
missing_bytes:
  description: Bytes of the files not yet complete in the cache.
  returned: always
  type: int
complete:
  description: Every file is in the cache and linked in the commit's snapshot folder; nothing to download.
  returned: always
  type: bool
free_bytes:
  description: Free bytes on the disk that holds O(cache_dir) (its nearest existing folder).
  returned: always
  type: int
disk_problem:
  description:
    - When the missing bytes plus the margin do not fit, a finding with C(code), C(model), C(path), C(missing), C(needed)
      and C(free); else null.
  returned: always
  type: dict
config:
  description: The model's C(config.json).
  returned: always
  type: dict
config_source:
  description: C(cache) or C(hub).
  returned: always
  type: str
snapshot:
  description: The commit's snapshot folder on the host.
  returned: always
  type: str
weights_bytes:
  description: Bytes of the weight files alone.
  returned: always
  type: int
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import fetch_url

from ansible_collections.gpubox.inference.plugins.module_utils import _hub
from ansible_collections.gpubox.inference.plugins.module_utils._words import say


class HubError(Exception):
    def __init__(self, code: str, **fields):
        super().__init__(code)
        self.code = code
        self.fields = fields


def get_json(module, url: str, context: dict) -> tuple[object, dict]:
    """The JSON at ``url``, with the answer's headers; a HubError naming the status on anything but 200."""
    headers = {"Accept": "application/json"}
    if module.params["token"]:
        headers["Authorization"] = "Bearer " + module.params["token"]
    response, info = fetch_url(module, url, headers=headers, timeout=module.params["timeout"], method="GET")
    status = info.get("status", -1)
    if status == 200 and response is not None:
        body = response.read()
        try:
            return json.loads(body), info
        except ValueError as exc:
            raise HubError("hub.bad_answer", url=url, reason=str(exc), **context) from exc
    if status == -1:
        raise HubError("hub.unreachable", reason=_hub.unreachable_reason(str(info.get("msg", ""))), **context)
    code = _hub.http_finding(status, info.get("x-error-code", ""), bool(module.params["token"]))
    detail = info.get("x-error-message") or str(info.get("msg", "")).strip()
    raise HubError(code, status=status, detail=detail, **context)


def tree(module, url: str, context: dict) -> list[dict]:
    """Every entry of a revision's tree, following the API's ``Link: <...>; rel="next"`` pages."""
    entries = []
    while url:
        page, info = get_json(module, url, context)
        entries += list(page or [])
        link = info.get("link", "")
        url = ""
        for part in link.split(","):
            if 'rel="next"' in part:
                url = part.split(";")[0].strip().strip("<>")
    return entries


def measure(storage: str, commit: str, files: list[dict]) -> dict:
    """The cache's blob sizes and linked paths for ``commit``, measured with stat only."""
    blobs = {}
    blob_dir = os.path.join(storage, "blobs")
    if os.path.isdir(blob_dir):
        for name in os.listdir(blob_dir):
            path = os.path.join(blob_dir, name)
            if os.path.isfile(path):
                blobs[name] = os.path.getsize(path)
    snapshot = os.path.join(storage, "snapshots", commit)
    linked = {item["path"] for item in files if os.path.exists(os.path.join(snapshot, item["path"]))}
    return _hub.cache_state(files, blobs, linked)


def free_bytes(path: str) -> int:
    """Free bytes on the disk that holds ``path`` or, when it does not exist yet, its nearest existing parent."""
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def main():
    module = AnsibleModule(
        argument_spec={
            "model": {"type": "str", "required": True},
            "revision": {"type": "str", "default": "main"},
            "endpoint": {"type": "str", "default": _hub.DEFAULT_ENDPOINT},
            "token": {"type": "str", "no_log": True},
            "cache_dir": {"type": "path", "required": True},
            "timeout": {"type": "int", "default": 30},
            "validate_certs": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    model, endpoint, revision = module.params["model"], module.params["endpoint"].rstrip("/"), module.params["revision"]
    problem = _hub.check_repo_id(model)
    if problem:
        module.fail_json(msg=problem)
    context = {"model": model, "endpoint": endpoint, "revision": revision}
    urls = _hub.urls(endpoint, model, revision)
    try:
        info, _headers = get_json(module, urls["info"], context)
        commit = (info or {}).get("sha") if isinstance(info, dict) else None
        if not commit or not _hub.COMMIT.match(commit):
            raise HubError("hub.bad_answer", url=urls["info"], reason="no 40-digit commit in 'sha'", **context)
        files, weight_format = _hub.select_files(tree(module, urls["tree"].format(commit=commit), context))
        if weight_format is None:
            raise HubError("hub.no_weights", commit=commit, **context)
        storage = os.path.join(module.params["cache_dir"], "hub", _hub.repo_folder(model))
        snapshot = os.path.join(storage, "snapshots", commit)
        state = measure(storage, commit, files)
        config, config_source = {}, "hub"
        entry = next((item for item in files if item["path"] == "config.json"), None)
        # By its blob, so that a new commit with the same config.json reads it from the cache too.
        cached_config = os.path.join(storage, "blobs", entry["blob"]) if entry else ""
        if entry and os.path.isfile(cached_config) and os.path.getsize(cached_config) == entry["size"]:
            with open(cached_config, encoding="utf-8") as handle:
                config, config_source = json.load(handle), "cache"
        elif entry:
            config, _headers = get_json(module, urls["file"].format(commit=commit, path="config.json"), context)
    except HubError as exc:
        module.fail_json(msg=say(exc.code, **exc.fields), finding={"code": exc.code, **exc.fields})
    free = free_bytes(module.params["cache_dir"])
    disk = _hub.disk_finding(state["missing_bytes"], free)
    if disk:
        disk = {**disk, "model": model, "path": module.params["cache_dir"]}
    module.exit_json(
        changed=False,
        model=model,
        revision=revision,
        endpoint=endpoint,
        commit=commit,
        files=files,
        weight_format=weight_format,
        weights_bytes=sum(item["size"] for item in files if item["path"].endswith((".safetensors", ".bin"))),
        free_bytes=free,
        disk_problem=disk,
        config=config if isinstance(config, dict) else {},
        config_source=config_source,
        storage=storage,
        snapshot=snapshot,
        **state,
    )


if __name__ == "__main__":
    main()
