#!/usr/bin/python
# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_power
short_description: GPU persistence mode and power limits through NVML, each limit checked against the card's constraints
version_added: 0.3.0
description:
  - Reads every GPU's persistence mode and power limits through NVML (nvidia-ml-py) - the limit now, the card's default,
    and the minimum and maximum the card accepts - and sets what differs from O(limit) and O(persistence).
  - O(limit) is watts (V(290), V(290W)) or a share of each card's own default limit (V(85%)), so that after a GPU swap
    the new card gets its own share. A limit outside a card's NVML constraints is refused, naming both constraints,
    and nothing is set on any GPU.
  - Also returns what the sweep in C(playbooks/power.yml) reads - each GPU's draw and its energy counter - so it is
    the module to read power with as well (O(limit) empty and O(persistence=false) change nothing).
  - The limits and persistence mode last until the driver unloads or the box reboots; the gpubox role's boot unit
    applies them again at every boot.
author:
  - gpubox maintainers (@gpubox)
attributes:
  check_mode:
    support: full
    description: Reads, checks and predicts; sets nothing.
  diff_mode:
    support: full
    description: Each GPU's persistence mode and power limit before and after.
options:
  limit:
    description:
      - The power limit for every GPU - watts, or a share of each card's default limit with V(%). Empty leaves the limits
        as they are.
    type: str
    default: ""
  persistence:
    description: Turn persistence mode on (the driver stays loaded, so the limits stay set); V(false) leaves it as it is.
    type: bool
    default: true
requirements:
  - nvidia-ml-py on the managed host, where the NVIDIA driver is installed
  - root, to set limits
"""

EXAMPLES = r"""
- name: Limit every GPU to 85% of its default power, persistence mode on
  gpubox.inference.gpu_power:
    limit: 85%

- name: Read each GPU's power limits, draw and energy counter, changing nothing
  gpubox.inference.gpu_power:
    persistence: false
  register: power
"""

RETURN = r"""
gpus:
  description:
    - One entry per GPU, as read before any change - C(index), C(name), C(uuid), C(persistence), C(limit_w),
      C(default_w), C(min_w), C(max_w), C(power_w) (the draw now), C(energy_mj) (NVML's energy counter, mJ; null
      where the card has none), C(read_at) (when, in epoch seconds) - with C(target_w) (null - left as it is),
      C(persistence_target) and C(changes).
  returned: success
  type: list
  elements: dict
  sample: [{"index": 0, "name": "NVIDIA GeForce RTX 3090", "limit_w": 350.0, "default_w": 350.0, "min_w": 100.0,
            "max_w": 400.0, "target_w": 298.0, "persistence": false, "persistence_target": true,
            "changes": ["power_limit", "persistence"]}]
"""

import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.gpubox.inference.plugins.module_utils import _power

try:
    import pynvml
except ImportError:
    pynvml = None
    PYNVML_IMPORT_ERROR = traceback.format_exc()
else:
    PYNVML_IMPORT_ERROR = None


def build_module() -> AnsibleModule:
    return AnsibleModule(
        argument_spec={"limit": {"type": "str", "default": ""}, "persistence": {"type": "bool", "default": True}},
        supports_check_mode=True,
    )


def _shown(gpus: list[dict], after: bool) -> str:
    lines = []
    for gpu in gpus:
        limit = gpu["target_w"] if after and gpu["target_w"] is not None else gpu["limit_w"]
        persistence = gpu["persistence_target"] if after else gpu["persistence"]
        lines.append(
            f"GPU{gpu['index']} {gpu['name']}: power limit {limit} W, persistence mode {'on' if persistence else 'off'}\n"
        )
    return "".join(lines)


def main() -> None:
    module = build_module()
    if pynvml is None:
        module.fail_json(msg=missing_required_lib("nvidia-ml-py"), exception=PYNVML_IMPORT_ERROR)
    try:
        gpus = _power.read(pynvml)
    except pynvml.NVMLError as exc:
        module.fail_json(msg=f"NVML could not read the GPUs: {exc}")
    planned = _power.plan(module.params["limit"], module.params["persistence"], gpus)
    if planned["errors"]:
        module.fail_json(msg="; ".join(planned["errors"]), gpus=planned["gpus"])
    changed = any(gpu["changes"] for gpu in planned["gpus"])
    if changed and not module.check_mode:
        errors = _power.apply(pynvml, planned["gpus"])
        if errors:
            module.fail_json(msg="; ".join(errors), gpus=planned["gpus"])
    diff = {"before": _shown(planned["gpus"], False), "after": _shown(planned["gpus"], True)}
    module.exit_json(changed=changed, gpus=planned["gpus"], diff=diff)


if __name__ == "__main__":
    main()
