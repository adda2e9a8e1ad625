#!/usr/bin/python
# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llm_stream_probe
short_description: Measure TTFT, token throughput and streaming smoothness of an OpenAI-compatible endpoint
version_added: 0.1.0
description:
  - Sends streamed chat (or completion) requests at a given concurrency, prompt length (with an optional shared prefix
    that exercises prefix caching) and output length, and times every Server-Sent Event as it arrives.
  - Returns TTFT, inter-token latency and time per output token (mean, p50, p90, p99), output tokens per second
    (aggregate and per stream), requests per second, errors by status, and a C(buffering) verdict from the events'
    arrival times (a proxy that buffers delivers them packed together at the end).
  - Uses asyncio over plain HTTP/1.1 from Python's standard library, so it runs on the controller
    (delegated to localhost) or on the box with no extra package. Bounded by O(requests) and O(max_seconds).
  - Asks for gzip like common HTTP clients, so a proxy that compresses event streams shows in the arrival times.
  - Keeps connections alive between requests, as HTTP client libraries such as the C(openai) client and C(vllm bench
    serve) do, with at most O(concurrency) of them; a connection the server has closed is replaced without an error.
author:
  - gpubox maintainers (@gpubox)
extends_documentation_fragment:
  - gpubox.inference.attributes.info_module
options:
  url:
    description: The API base, e.g. C(http://127.0.0.1:8000/v1) or C(https://gpu-box/v1).
    type: str
    required: true
  urls:
    description:
      - More servers of the same model (replicas behind one load balancer), e.g. C(http://127.0.0.1:8001/v1).
      - The requests go to O(url) and these in turn, under the one O(concurrency), and the statistics are over all
        of them; O(requests) rounds up to a multiple of the servers.
    type: list
    elements: str
    default: []
  model:
    description: The served model name.
    type: str
    required: true
  api_key:
    description: "Sent as an C(Authorization) bearer token; never returned."
    type: str
  endpoint:
    description: C(/chat/completions) or C(/completions).
    type: str
    choices: [chat, completion]
    default: chat
  concurrency:
    description: Requests in flight at once.
    type: int
    default: 1
  requests:
    description: Requests in all.
    type: int
    default: 10
  prompt_tokens:
    description: About this many prompt tokens (words) per request.
    type: int
    default: 200
  shared_prefix_tokens:
    description: How many of them every request shares, to exercise prefix caching.
    type: int
    default: 0
  max_tokens:
    description: Output tokens asked for per request.
    type: int
    default: 128
  ignore_eos:
    description: Ask vLLM to generate exactly O(max_tokens) (vLLM's C(ignore_eos)), for comparable runs.
    type: bool
    default: true
  timeout:
    description: Seconds to wait for any one read before a request counts as failed.
    type: float
    default: 120
  max_seconds:
    description: Requests not started after this many seconds are not sent.
    type: float
    default: 600
  validate_certs:
    description: Check the server's TLS certificate.
    type: bool
    default: true
  ca_path:
    description: CA bundle for the server's certificate.
    type: path
"""

EXAMPLES = r"""
- name: Probe through Nginx from the controller
  gpubox.inference.llm_stream_probe:
    url: "https://{{ inventory_hostname }}/v1"
    model: "{{ vllm_served_model_name }}"
    api_key: "{{ vault_gpubox_agents_key }}"
    concurrency: 10
    requests: 50
    validate_certs: false
  delegate_to: localhost
  register: __probe

- name: Show the row
  ansible.builtin.debug:
    msg: "{{ __probe.table }}"
"""

RETURN = r"""
probe:
  description:
    - The statistics (times in ms, rates per second).
    - C(prompt_tokens_mean) is what the server counted per prompt (chat template included), from the usage it sends;
      compare it with O(prompt_tokens), which counts words.
    - C(buffering.verdict) is C(buffered) when most streams' content events came packed together at the end (their
      spread under a tenth of the request, and most of them under half a millisecond apart), as a proxy that holds
      the response delivers them; a long prefill before a fast answer is still C(streaming).
  returned: success
  type: dict
  sample:
    requests: 50
    succeeded: 50
    errors: {}
    ttft_ms: {"mean": 21.4, "p50": 19.8, "p90": 30.1, "p99": 41.0}
    itl_ms: {"mean": 2.1, "p50": 1.9, "p90": 3.0, "p99": 6.2}
    output_tokens_per_s: 1830.5
    prompt_tokens_mean: 212.0
    buffering: {"verdict": "streaming", "buffered_streams": 0, "streams_judged": 50}
table:
  description: The result as one table row.
  returned: success
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpubox.inference.plugins.module_utils._probe import run, run_spread, table


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "urls": {"type": "list", "elements": "str", "default": []},
            "model": {"type": "str", "required": True},
            "api_key": {"type": "str", "no_log": True},
            "endpoint": {"type": "str", "choices": ["chat", "completion"], "default": "chat"},
            "concurrency": {"type": "int", "default": 1},
            "requests": {"type": "int", "default": 10},
            "prompt_tokens": {"type": "int", "default": 200, "no_log": False},
            "shared_prefix_tokens": {"type": "int", "default": 0, "no_log": False},
            "max_tokens": {"type": "int", "default": 128, "no_log": False},
            "ignore_eos": {"type": "bool", "default": True},
            "timeout": {"type": "float", "default": 120},
            "max_seconds": {"type": "float", "default": 600},
            "validate_certs": {"type": "bool", "default": True},
            "ca_path": {"type": "path"},
        },
        supports_check_mode=True,
    )
    params = module.params
    for option in ("concurrency", "requests", "prompt_tokens", "max_tokens"):
        if params[option] < 1:
            module.fail_json(msg=f"{option}={params[option]} must be at least 1")
    if not 0 <= params["shared_prefix_tokens"] <= params["prompt_tokens"]:
        module.fail_json(msg=f"shared_prefix_tokens={params['shared_prefix_tokens']} must be between 0 and prompt_tokens")
    for option, url in [("url", params["url"])] + [("urls", url) for url in params["urls"]]:
        if not url.startswith(("http://", "https://")):
            module.fail_json(msg=f"{option}: {url!r} must start with http:// or https://")
    summary = run_spread(params, [params["url"], *params["urls"]]) if params["urls"] else run(params)
    label = f"c={params['concurrency']} {params['url']}" + (f" (+{len(params['urls'])} more)" if params["urls"] else "")
    module.exit_json(changed=False, probe=summary, table=table(label, summary))


if __name__ == "__main__":
    main()
