#!/usr/bin/python
# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_state_info
short_description: Read what the vllm role's plan needs from the box in one module run
version_added: 0.3.0
description:
  - Reads, in one run on the host, what the vllm role plans a deployment from besides the GPUs - the local model
    folder (whether it is there, its C(config.json), the size of its weights), the records the role stored (the last
    deployment, the correctness gate's verdicts, the layouts measured), the number of CPUs this process may run on -
    and which of O(paths) exist.
  - One run in place of a stat, a slurp, a find, one slurp per record and C(nproc), each of which costs a module run.
  - A record that is missing reads as V({}) (nothing stored yet). One that is there but is not a JSON object fails the
    task naming the file, so that a damaged record is never taken for an empty one; remove it to start over.
author:
  - gpubox maintainers (@gpubox)
extends_documentation_fragment:
  - gpubox.inference.attributes.info_module
options:
  model_dir:
    description:
      - A local model folder, as C(vllm_model) names it. Empty (a model from the Hub) reads no folder.
      - Its weights are the C(*.safetensors) and C(*.bin) files directly in it; links are followed, so a folder of
        links into a Hugging Face cache counts the files they point to.
    type: path
    default: ""
  records:
    description: The stored records to read, by name; each value is a path to a JSON file.
    type: dict
    default: {}
  paths:
    description: Paths to look for; RV(existing) lists those that are there.
    type: list
    elements: path
    default: []
"""

EXAMPLES = r"""
- name: Read what the plan needs
  gpubox.inference.vllm_state_info:
    model_dir: /srv/models/Qwen2.5-7B-Instruct
    records:
      previous: /var/lib/gpubox/vllm.json
      gate_store: /var/lib/gpubox/gate.json
    paths:
      - /etc/systemd/system/gpubox-vllm-watchdog.timer
  register: __state

- name: Show the model's architecture and the size of its weights
  ansible.builtin.debug:
    msg: "{{ __state.model.config.architectures }}, {{ __state.model.weights_bytes }} bytes"
"""

RETURN = r"""
model:
  description:
    - The local model folder - C(exists), C(config) (its C(config.json); V({}) when it has none) and C(weights_bytes).
      V({}) when O(model_dir) is empty.
  returned: success
  type: dict
  sample: {"exists": true, "config": {"architectures": ["Qwen2ForCausalLM"]}, "weights_bytes": 15231233024}
records:
  description: Each of O(records) by its name, as stored; V({}) for one that is not there.
  returned: success
  type: dict
  sample: {"previous": {"gate_step": "reference"}, "gate_store": {}}
cpu_count:
  description: The CPUs this process may run on (what C(nproc) prints).
  returned: success
  type: int
  sample: 16
existing:
  description: The entries of O(paths) that exist, in the order given.
  returned: success
  type: list
  elements: str
  sample: ["/etc/systemd/system/gpubox-vllm-watchdog.timer"]
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpubox.inference.plugins.module_utils import _plan_inputs


def _text(module: AnsibleModule, path: str) -> str | None:
    """The file's text; None when there is no such file; fail on any other error, naming the file."""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        module.fail_json(msg=f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}")


def _model(module: AnsibleModule, folder: str) -> dict:
    if not folder:
        return {}
    if not os.path.exists(folder):
        return {"exists": False, "config": {}, "weights_bytes": 0}
    files = []
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.is_file():  # follows links, as vLLM does when it loads them
                    files.append((entry.name, entry.stat().st_size))
    except OSError as exc:
        module.fail_json(msg=f"cannot list the model folder {folder}: {exc.strerror}")
    config_path = os.path.join(folder, "config.json")
    try:
        config = _plan_inputs.record(config_path, _text(module, config_path))
    except ValueError as exc:
        module.fail_json(msg=f"the model's {exc}: vLLM cannot read it either")
    return {"exists": True, "config": config, "weights_bytes": _plan_inputs.weights_bytes(files)}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "model_dir": {"type": "path", "default": ""},
            "records": {"type": "dict", "default": {}},
            "paths": {"type": "list", "elements": "path", "default": []},
        },
        supports_check_mode=True,
    )
    records = {}
    for name, path in module.params["records"].items():
        try:
            records[name] = _plan_inputs.record(path, _text(module, path))
        except ValueError as exc:
            module.fail_json(msg=f"the stored record {name!r}: {exc}; remove the file to start over")
    module.exit_json(
        changed=False,
        model=_model(module, module.params["model_dir"]),
        records=records,
        cpu_count=len(os.sched_getaffinity(0)),
        existing=[path for path in module.params["paths"] if os.path.lexists(path)],
    )


if __name__ == "__main__":
    main()
