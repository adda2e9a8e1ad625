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
    no /sys tree is read, and a saved C(lspci -vvv) each GPU's link (LnkCap and LnkSta).
  - Accepted saved inputs, each with the command that produces it. O(nvidia_smi_q_src) takes C(nvidia-smi -q) (or
    C(nvidia-smi -q -d PCI), whole or the PCI part of one GPU). O(lspci_tree_src) takes C(lspci -tv). O(lspci_src)
    takes C(lspci -vvv), C(lspci -vvd 10de:), C(lspci -vv -s BUS_ID), or their C(LnkCap)/C(LnkSta) lines kept by
    grep under each device line; the LnkCap and LnkSta lines of one device without its device line work too.
  - An idle GPU (P8) drops its link to 2.5 GT/s to save power, so a lower generation is a fault only under load.
    nvidia-smi says the load (its performance state); a saved lspci does not, so say it with O(lspci_under_load),
    or C(downtrained) is null for such a link. A narrower width is a fault either way.
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
  lspci_src:
    description:
      - Path to a saved C(lspci -vvv) (or C(lspci -vvd 10de:)) output, for each GPU's current and maximum link
        generation and width where nvidia-smi and /sys do not give them. The upstream bridge's LnkCap, when the
        file has it and O(lspci_tree_src) names the bridge, is the host end's maximum.
    type: path
  lspci_under_load:
    description:
      - Whether the GPUs were busy when O(lspci_src) was saved. V(true) makes a generation below the maximum a
        downtrained link, V(false) power saving; unset, such a link is reported with C(downtrained) null.
    type: bool
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

- name: Read the links in an lspci -vvv attached to a bug report, saved while a job ran
  gpubox.inference.pcie_platform_info:
    sysfs_root: /tmp/empty
    lspci_src: /tmp/bug-report-lspci-vvv.txt
    lspci_under_load: true
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
          C(pcie_width_host_max), C(pcie_replays), C(performance_state), C(link_source) (V(nvidia-smi), V(sysfs) or
          V(lspci), where the current link came from), C(lspci_downgraded) (what lspci marked downgraded, V(speed)
          and V(width)), C(downtrained) (null when it cannot be told) and C(link_note).
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
    LspciParseError,
    analyse_platform,
    parse_lspci_links,
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
            "lspci_src": {"type": "path"},
            "lspci_under_load": {"type": "bool"},
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
    links = None
    if module.params["lspci_src"]:
        try:
            links = parse_lspci_links(read_src(module, "lspci_src"))
        except LspciParseError as exc:
            module.fail_json(msg=f"cannot read lspci_src={module.params['lspci_src']}: {exc}")
    elif module.params["lspci_under_load"] is not None:
        module.fail_json(msg="lspci_under_load is set but lspci_src is not: it describes the saved lspci")
    platform = analyse_platform(cpuinfo, read_sysfs_pci(root), smi_q, tree, links, module.params["lspci_under_load"])
    module.exit_json(changed=False, platform=platform)


if __name__ == "__main__":
    main()
