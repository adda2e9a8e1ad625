#!/usr/bin/python
# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: GPU inventory from NVML, with a fingerprint that changes when a GPU is swapped
version_added: 0.1.0
description:
  - Reads the NVIDIA GPUs through NVML (nvidia-ml-py), not by parsing nvidia-smi text, and returns them as
    C(ansible_facts.gpu) - driver and CUDA driver versions, and per GPU the index, UUID, serial, name, memory, PCI bus
    id and device id, PCIe generation and width (current and max), NUMA node, compute capability, and NVML's P2P
    status and topology common ancestor towards every other GPU.
  - C(fingerprint) is a stable hash of the sorted (UUID, bus id, PCI device id) of every GPU plus the driver version.
    Compared with the record stored on the host at O(fingerprint_path), C(changes) says in words what changed (GPU
    added, removed, moved slot, replaced, driver changed). Re-provisioning after a GPU swap keys on it.
  - A host without the NVIDIA driver or without a GPU gets C(present=false) and a C(reason); the module does not fail.
  - Usable as a task and through C(facts_modules) in C(ansible.cfg).
author:
  - gpubox maintainers (@gpubox)
extends_documentation_fragment:
  - gpubox.inference.attributes.info_module
options:
  fingerprint_path:
    description:
      - The record of the last provisioned GPU set, a JSON file written by the roles (this module only reads it).
    type: path
    default: /var/lib/gpubox/gpu.json
requirements:
  - nvidia-ml-py on the managed host, where the NVIDIA driver is installed
"""

EXAMPLES = r"""
- name: Read the GPUs
  gpubox.inference.gpu_facts:

- name: Say what changed since the last run
  ansible.builtin.debug:
    msg: "{{ ansible_facts.gpu.change_summary }}"

# ansible.cfg: gather GPU facts with the others
# [defaults]
# facts_modules = ansible.builtin.setup, gpubox.inference.gpu_facts
"""

RETURN = r"""
ansible_facts:
  description: Facts added under C(gpu).
  returned: always
  type: dict
  contains:
    gpu:
      description:
        - C(present), C(reason) (why not present, else null), C(driver_version), C(cuda_driver_version), C(count),
          C(devices) (one dict per GPU, see the description), C(fingerprint), C(fingerprint_stored) (null when
          nothing is stored), C(changed_since_stored), C(changes) (list of sentences), C(change_summary) and C(record)
          (what a role stores at O(fingerprint_path) once the host is provisioned for this GPU set).
      type: dict
      sample:
        present: true
        driver_version: "595.71.05"
        cuda_driver_version: "13.0"
        count: 2
        devices:
          - index: 0
            name: NVIDIA GeForce RTX 3090
            uuid: GPU-1b2c3d4e-0000-0000-0000-000000000001
            pci_bus_id: "0000:09:00.0"
            pci_device_id: "0x220410de"
            pcie_gen_current: 4
            pcie_width_current: 16
            p2p: {"GPU1": {"read": "OK", "write": "OK", "nvlink": "NS", "atomics": "NS", "pci": "OK"}}
            topology: {"GPU1": "SYS"}
        fingerprint: 3f0c...
        changes: ["GPU at 0000:41:00.0 replaced: NVIDIA GeForce RTX 3090 (GPU-...) -> NVIDIA GeForce RTX 4090 (GPU-...)"]
"""

import json
import os
import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.gpubox.inference.plugins.module_utils._gpu_inventory import changes, collect, record

try:
    import pynvml
except ImportError:
    pynvml = None
    PYNVML_IMPORT_ERROR = traceback.format_exc()
else:
    PYNVML_IMPORT_ERROR = None

DRIVER_MARKER = "/proc/driver/nvidia/version"


def build_module() -> AnsibleModule:
    return AnsibleModule(
        argument_spec={"fingerprint_path": {"type": "path", "default": "/var/lib/gpubox/gpu.json"}},
        supports_check_mode=True,
    )


def read_stored(module: AnsibleModule) -> dict | None:
    path = module.params["fingerprint_path"]
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            stored = json.load(handle)
    except (OSError, ValueError) as exc:
        module.warn(f"fingerprint_path={path!r} could not be read as JSON ({exc}); treating it as absent")
        return None
    return stored if isinstance(stored, dict) else None


def main() -> None:
    module = build_module()
    if pynvml is None:
        if os.path.exists(DRIVER_MARKER):
            module.fail_json(msg=missing_required_lib("nvidia-ml-py"), exception=PYNVML_IMPORT_ERROR)
        facts = {
            "present": False,
            "reason": f"no NVIDIA driver on this host ({DRIVER_MARKER} is absent)",
            "count": 0,
            "devices": [],
        }
    else:
        facts = collect(pynvml)
    facts.setdefault("fingerprint", None)
    current = record(facts)
    stored = read_stored(module)
    facts["fingerprint_stored"] = stored.get("fingerprint") if stored else None
    facts["changes"] = changes(stored, current)
    facts["changed_since_stored"] = bool(facts["changes"])
    if stored is None:
        facts["change_summary"] = "no fingerprint stored on this host yet"
    else:
        facts["change_summary"] = "; ".join(facts["changes"]) or "no change since the stored fingerprint"
    facts["record"] = current
    module.exit_json(changed=False, ansible_facts={"gpu": facts})


if __name__ == "__main__":
    main()
