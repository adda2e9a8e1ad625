#!/usr/bin/python
# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_answer_check
short_description: Judge an OpenAI-compatible server by its greedy answers to fixed prompts (the correctness gate)
version_added: 0.2.0
description:
  - Sends each of O(prompts) to O(url)'s C(/completions) greedily (temperature 0, seed O(seed), logprobs on), one at a
    time, and judges the answers. A broken tensor-parallel all-reduce serves at a plausible speed while it answers
    C(!!!!), NaN or one token over and over, which a P2P copy test or a streaming probe does not see.
  - An answer is degenerate when it is empty, when one token is most of it, when it is a run of C(!) or of replacement
    characters, or when a logprob is NaN or infinite.
  - With O(reference), the answers of a known-safe configuration of the same model, revision and image, it also counts
    the prompts whose first O(agree_tokens) tokens agree; fewer than O(min_agreement) of them fails the verdict.
  - Returns the verdict; it does not fail on it (the vllm role decides what to try next). It fails only when the server
    cannot be asked, naming the URL and the error.
  - Changes nothing; runs the same in check mode.
author:
  - gpubox maintainers (@gpubox)
extends_documentation_fragment:
  - gpubox.inference.attributes.info_module
options:
  url:
    description: The OpenAI-compatible base URL, ending in C(/v1).
    type: str
    required: true
  model:
    description: The served model name.
    type: str
    required: true
  api_key:
    description: Sent as a bearer token. Never returned or logged.
    type: str
  prompts:
    description: The prompts, sent as they are (no chat template). Empty for the collection's sixteen general prompts.
    type: list
    elements: str
    default: []
  reference:
    description: The C(replies) of an earlier run with the same prompts on the known-safe configuration.
    type: list
    elements: dict
  max_tokens:
    description: Tokens to generate per prompt.
    type: int
    default: 16
  agree_tokens:
    description: How many first tokens must be the same as the reference's for a prompt to agree.
    type: int
    default: 8
  min_agreement:
    description: The share of the prompts that must agree, from 0 to 1.
    type: float
    default: 0.875
  seed:
    description: The sampling seed sent with every request.
    type: int
    default: 0
  timeout:
    description: Seconds to wait for each answer.
    type: float
    default: 60
  validate_certs:
    description: Check the server's TLS certificate.
    type: bool
    default: true
notes:
  - Only the Python standard library and Ansible's own URL code run on the host.
"""

EXAMPLES = r"""
- name: Record the answers of the known-safe configuration
  gpubox.inference.vllm_answer_check:
    url: http://127.0.0.1:8000/v1
    model: llama
  register: reference

- name: Judge the tensor-parallel deployment against them
  gpubox.inference.vllm_answer_check:
    url: http://127.0.0.1:8000/v1
    model: llama
    reference: "{{ reference.replies }}"
  register: gate
"""

RETURN = r"""
passed:
  description: Whether no answer is degenerate and enough of them agree with O(reference).
  returned: always
  type: bool
verdict:
  description: The judgement, with C(degenerate) (per prompt, a code), C(agreement) (null without O(reference)) and
    C(evidence) (up to three failed prompts with the expected and received text).
  returned: always
  type: dict
findings:
  description: Why the verdict failed, in words; empty when it passed.
  returned: always
  type: list
  elements: str
replies:
  description: Per prompt, the C(text), the C(tokens) and their C(logprobs); pass them as O(reference) later.
  returned: always
  type: list
  elements: dict
prompts:
  description: The prompts that were sent.
  returned: always
  type: list
  elements: str
"""

import json

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url

from ansible_collections.gpubox.inference.plugins.module_utils import _gate
from ansible_collections.gpubox.inference.plugins.module_utils._words import explain


def ask(module: AnsibleModule, body: dict) -> dict:
    params = module.params
    headers = {"Content-Type": "application/json"}
    if params["api_key"]:
        headers["Authorization"] = f"Bearer {params['api_key']}"
    url = params["url"].rstrip("/") + "/completions"
    try:
        response = open_url(
            url, data=json.dumps(body), headers=headers, method="POST", timeout=params["timeout"],
            validate_certs=params["validate_certs"],
        )  # fmt: skip
        return json.loads(response.read())
    # Any failure to ask is the same failure: the server cannot be judged.
    except Exception as exc:
        detail = getattr(exc, "read", None)
        text = detail().decode(errors="replace")[:300] if callable(detail) else ""
        module.fail_json(msg=f"{url} could not be asked for a greedy completion: {exc} {text}".strip())


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "model": {"type": "str", "required": True},
            "api_key": {"type": "str", "no_log": True},
            "prompts": {"type": "list", "elements": "str", "default": []},
            "reference": {"type": "list", "elements": "dict"},
            "max_tokens": {"type": "int", "default": 16, "no_log": False},
            "agree_tokens": {"type": "int", "default": 8, "no_log": False},
            "min_agreement": {"type": "float", "default": 0.875},
            "seed": {"type": "int", "default": 0},
            "timeout": {"type": "float", "default": 60},
            "validate_certs": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    params = module.params
    if not params["url"].startswith(("http://", "https://")):
        module.fail_json(msg=f"url={params['url']!r} must start with http:// or https://")
    if not 0 <= params["min_agreement"] <= 1:
        module.fail_json(msg=f"min_agreement={params['min_agreement']} must be from 0 to 1")
    for option in ("max_tokens", "agree_tokens"):
        if params[option] < 1:
            module.fail_json(msg=f"{option}={params[option]} must be at least 1")
    prompts = params["prompts"] or list(_gate.DEFAULT_PROMPTS)
    reference = params["reference"]
    if reference is not None and len(reference) != len(prompts):
        module.fail_json(msg=f"reference has {len(reference)} replies for {len(prompts)} prompts: it is from other prompts")
    replies = [
        _gate.answer(ask(module, _gate.request_body(params["model"], text, params["max_tokens"], params["seed"])))
        for text in prompts
    ]
    settings = {"agree_tokens": params["agree_tokens"], "min_agreement": params["min_agreement"]}
    verdict = _gate.judge(prompts, replies, reference, settings)
    module.exit_json(
        changed=False,
        passed=verdict["passed"],
        verdict=verdict,
        findings=[
            (f"prompt {finding['prompt'] + 1}: " if "prompt" in finding else "") + explain(finding)
            for finding in _gate.findings(verdict)
        ],
        replies=replies,
        prompts=prompts,
    )


if __name__ == "__main__":
    main()
