#!/usr/bin/python
# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: pcie_platform_info
short_description: Report the CPU's PCIe class and each NVIDIA GPU's root port, chipset attachment and link training
version_added: 0.1.0
description:
  - Tells a server or workstation platform (EPYC, Xeon, Threadripper) from a consumer one (Ryzen, Core), with the CPU's
    PCIe lane budget where known.
  - For each NVIDIA GPU, finds the CPU root port it hangs off, whether the path runs through the chipset (AMD
    Promontory bridges, Intel PCH root ports) instead of a CPU root port, and whether its link trained below what both
    ends support. An idle link at a lower generation is power saving and is not reported as a fault.
  - Reads C(/sys/bus/pci/devices) and C(/proc/cpuinfo) under O(sysfs_root), and the GPU Link Info of
    C(nvidia-smi -q) (run on the host, or from O(nvidia_smi_q_src)). A saved C(lspci -tv) gives the bridge chain when
    no /sys tree is read.
author:
  - gpubox maintainers (@gpubox)
extends_documentation_fragment:
  - gpubox.inference.attributes.info_module
options:
  sysfs_root:
    description:
      - Folder holding C(sys/) and C(proc/cpuinfo); V(/) for the live host, or a captured tree.
    type: path
    default: /
  nvidia_smi_q_src:
    description:
      - Path to a saved C(nvidia-smi -q) output. Without it, and with O(sysfs_root=/), the module runs
        C(nvidia-smi -q) when the driver is installed.
    type: path
  lspci_tree_src:
    description:
      - Path to a saved C(lspci -tv) output, for the bridges above each GPU when the /sys tree does not have them.
    type: path
"""

EXAMPLES = r"""
- name: Read this host's PCIe platform
  gpubox.inference.pcie_platform_info:
  register: __platform

- name: Warn about GPUs behind the chipset
  ansible.builtin.debug:
    msg: "{{ item.bus_id }} hangs off the chipset"
  loop: "{{ __platform.platform.gpus | selectattr('behind_chipset') }}"

- name: Analyse saved outputs from another machine
  gpubox.inference.pcie_platform_info:
    sysfs_root: /tmp/empty
    nvidia_smi_q_src: /tmp/other-box-smi-q.txt
    lspci_tree_src: /tmp/other-box-lspci-tv.txt
"""

RETURN = r"""
platform:
  description: The CPU and one entry per NVIDIA GPU.
  returned: success
  type: dict
  contains:
    cpu:
      description:
        - C(vendor), C(model), C(family) (EPYC, Threadripper PRO, Threadripper, Xeon, Xeon W, Ryzen, Core),
          C(class) (server, workstation, consumer), C(sockets), C(pcie_lanes) per socket and C(pcie_lanes_total);
          null where not known.
      type: dict
      sample: {"vendor": "AMD", "model": "AMD EPYC 7763 64-Core Processor", "family": "EPYC", "class": "server",
               "sockets": 1, "pcie_lanes": 128, "pcie_lanes_total": 128}
    gpus:
      description:
        - Per GPU C(bus_id), C(root_port), C(bridges) (nearest first), C(behind_chipset),
          C(pcie_gen_current), C(pcie_gen_max), C(pcie_gen_host_max), C(pcie_width_current), C(pcie_width_max),
          C(pcie_width_host_max), C(pcie_replays), C(performance_state), C(downtrained) and C(link_note).
      type: list
      elements: dict
      sample: [{"bus_id": "0000:04:00.0", "root_port": "0000:00:01.2", "behind_chipset": true,
                "pcie_gen_current": 3, "pcie_gen_max": 4, "pcie_gen_host_max": 3, "pcie_width_current": 4,
                "pcie_width_max": 16, "pcie_width_host_max": 4, "downtrained": false,
                "link_note": "the link runs at what both ends support"}]
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpubox.inference.plugins.module_utils._module_io import C_LOCALE, read_src, run_checked
from ansible_collections.gpubox.inference.plugins.module_utils._pcie import (
    analyse_platform,
    parse_lspci_tree,
    parse_smi_q,
    read_sysfs_pci,
)


def build_module() -> AnsibleModule:
    return AnsibleModule(
        argument_spec={
            "sysfs_root": {"type": "path", "default": "/"},
            "nvidia_smi_q_src": {"type": "path"},
            "lspci_tree_src": {"type": "path"},
        },
        supports_check_mode=True,
    )


def main() -> None:
    module = build_module()
    module.run_command_environ_update = C_LOCALE
    root = module.params["sysfs_root"]
    if not os.path.isdir(root):
        module.fail_json(msg=f"sysfs_root={root!r}: not a directory")

    cpuinfo = None
    try:
        with open(os.path.join(root, "proc", "cpuinfo"), encoding="utf-8", errors="replace") as handle:
            cpuinfo = handle.read()
    except OSError:
        pass

    smi_q = None
    if module.params["nvidia_smi_q_src"]:
        smi_q = parse_smi_q(read_src(module, "nvidia_smi_q_src"))
    elif root == "/":
        nvidia_smi = module.get_bin_path("nvidia-smi")
        if nvidia_smi:
            smi_q = parse_smi_q(run_checked(module, [nvidia_smi, "-q"]))

    tree = parse_lspci_tree(read_src(module, "lspci_tree_src")) if module.params["lspci_tree_src"] else None
    platform = analyse_platform(cpuinfo, read_sysfs_pci(root), smi_q, tree)
    module.exit_json(changed=False, platform=platform)


if __name__ == "__main__":
    main()
