#!/usr/bin/python
# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: iommu_acs_info
short_description: Report the IOMMU mode and the PCIe ACS settings that redirect GPU peer-to-peer traffic
version_added: 0.1.0
description:
  - Reads every PCIe Access Control Services capability from C(lspci -vvv) (run on the host as root, or from
    O(lspci_src), whole or just the C(ACSCtl) lines people grep), and the IOMMU settings from the kernel command
    line (C(/proc/cmdline) or O(cmdline_src)).
  - On a host without C(lspci), reads the ACS capabilities from each device's configuration space in
    C(/sys/bus/pci/devices/*/config) instead, which needs root too.
  - Says whether P2P traffic between GPUs is redirected up to the root complex, the classic cause of NCCL hangs and
    slow all-reduce on consumer and workstation boards. Read live, it follows each GPU's bridges in /sys to name the
    ones that sit between each GPU pair, and reports each GPU's IOMMU group.
author:
  - gpubox maintainers (@gpubox)
extends_documentation_fragment:
  - gpubox.inference.attributes.info_module
options:
  lspci_src:
    description:
      - Path to a saved C(lspci -vvv) output (or its C(grep ACSCtl) lines). Without it the module runs C(lspci -vvv).
    type: path
  cmdline_src:
    description:
      - Path to a saved C(/proc/cmdline). Without it the module reads C(/proc/cmdline) under O(sysfs_root).
    type: path
  sysfs_root:
    description:
      - Folder holding C(sys/) and C(proc/); V(/) for the live host. The GPU paths and IOMMU groups come from here.
    type: path
    default: /
notes:
  - "Without root, C(lspci) prints C(Capabilities: <access denied>) and no ACS; run it with C(become)."
  - Without root, or without both C(lspci) (package pciutils) and a readable configuration space in /sys, the ACS
    verdict is V(unknown) with the reason, and the module warns; the IOMMU settings and the bridges between GPUs are
    still read.
"""

EXAMPLES = r"""
- name: Read IOMMU and ACS state
  gpubox.inference.iommu_acs_info:
  become: true
  register: __acs

- name: Explain the verdict
  ansible.builtin.debug:
    msg: "{{ __acs.acs_verdict.verdict }}: {{ __acs.acs_verdict.reason }}"

- name: Analyse a grep of another machine's ACSCtl lines
  gpubox.inference.iommu_acs_info:
    lspci_src: /tmp/acsctl.txt
    cmdline_src: /tmp/cmdline.txt
"""

RETURN = r"""
iommu:
  description: IOMMU state.
  returned: success
  type: dict
  contains:
    enabled:
      description: Whether the IOMMU is on; null when neither the command line nor /sys says.
      type: bool
    mode:
      description: V(passthrough), V(translated), V(off) or V(unknown).
      type: str
      sample: passthrough
    flags:
      description: The IOMMU-related kernel flags seen, as written.
      type: list
      elements: str
      sample: ["amd_iommu=on", "iommu=pt"]
    pci_noacs:
      description: Whether C(pci=noacs) is on the command line.
      type: bool
    groups:
      description: GPU bus id -> IOMMU group number, read live.
      type: dict
      sample: {"0000:01:00.0": "14"}
acs:
  description: One entry per ACS capability, in input order.
  returned: success
  type: list
  elements: dict
  sample: [{"bdf": "40:01.1", "description": "PCI bridge: ...", "cap": {"SrcValid": true},
            "ctl": {"SrcValid": true, "TransBlk": false, "ReqRedir": true, "CmpltRedir": true,
                    "UpstreamFwd": true, "EgressCtrl": false, "DirectTrans": false}}]
acs_source:
  description:
    - Where the ACS capabilities were read; V(lspci -vvv), V(lspci_src), or V(sysfs) (each device's configuration
      space in /sys, on a host without C(lspci)).
  returned: success
  type: str
  sample: lspci -vvv
acs_verdict:
  description:
    - C(verdict) (V(redirected), V(clear), V(unknown)) and C(reason) in one sentence; C(redirecting) lists the bridges
      whose ACS redirects P2P; C(gpu_pairs) lists, per GPU pair, the bridges between them and which of those redirect.
  returned: success
  type: dict
  sample: {"verdict": "redirected", "reason": "ACS on 40:01.1 redirects peer-to-peer traffic ...",
           "redirecting": [{"bdf": "40:01.1", "flags": ["ReqRedir", "CmpltRedir"]}], "gpu_pairs": []}
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpubox.inference.plugins.module_utils._acs import (
    AcsParseError,
    judge_acs,
    parse_cmdline,
    parse_lspci_acs,
    read_configs,
    sysfs_acs,
)
from ansible_collections.gpubox.inference.plugins.module_utils._module_io import C_LOCALE, read_src, run_checked
from ansible_collections.gpubox.inference.plugins.module_utils._pcie import nvidia_gpus, read_sysfs_pci


def build_module() -> AnsibleModule:
    return AnsibleModule(
        argument_spec={
            "lspci_src": {"type": "path"},
            "cmdline_src": {"type": "path"},
            "sysfs_root": {"type": "path", "default": "/"},
        },
        supports_check_mode=True,
    )


def _iommu_groups(root: str, bus_ids: list[str]) -> dict[str, str]:
    groups = {}
    for bdf in bus_ids:
        link = os.path.join(root, "sys", "bus", "pci", "devices", bdf, "iommu_group")
        if os.path.islink(link):
            groups[bdf] = os.path.basename(os.readlink(link))
    return groups


NO_LSPCI = "Install pciutils (the gpubox.inference.base role does) or give a saved output in lspci_src."


def main() -> None:
    module = build_module()
    module.run_command_environ_update = C_LOCALE
    root = module.params["sysfs_root"]

    sysfs = read_sysfs_pci(root) if not module.params["lspci_src"] or root != "/" else {}
    unreadable = None
    lspci = None if module.params["lspci_src"] else module.get_bin_path("lspci")
    # Where the capabilities are read: a saved output, lspci, or (no pciutils, as on the
    # device check's H200 VM) each device's raw configuration space in /sys.
    if module.params["lspci_src"]:
        source, what = "lspci_src", f"lspci_src={module.params['lspci_src']}"
    elif lspci is None:
        source, what = "sysfs", f"the PCI configuration space under {os.path.join(root, 'sys')}"
    else:
        source = what = "lspci -vvv"
    try:
        if source == "lspci_src":
            entries = parse_lspci_acs(read_src(module, "lspci_src"))
        elif source == "sysfs":
            entries, why = sysfs_acs(read_configs(root, sysfs))
            if why:
                unreadable = f"lspci is not installed and {why}, so ACS is unknown. {NO_LSPCI}"
        else:
            lspci_text = run_checked(module, [lspci, "-vvv"])
            if "<access denied>" in lspci_text:
                unreadable = "lspci could not read the capabilities (not root?), so ACS is unknown; run with become."
            entries = parse_lspci_acs(lspci_text)
    except AcsParseError as exc:
        module.fail_json(msg=f"cannot read {what}: {exc}")
    if unreadable:
        module.warn(unreadable)

    if module.params["cmdline_src"]:
        cmdline = read_src(module, "cmdline_src")
    else:
        try:
            with open(os.path.join(root, "proc", "cmdline"), encoding="utf-8", errors="replace") as handle:
                cmdline = handle.read()
        except OSError:
            cmdline = ""
    iommu = parse_cmdline(cmdline)

    gpus = nvidia_gpus(sysfs)
    iommu["groups"] = _iommu_groups(root, gpus)
    if iommu["enabled"] is None and sysfs:
        iommu["enabled"] = bool(iommu["groups"]) or os.path.isdir(os.path.join(root, "sys", "class", "iommu"))
    gpu_paths = {b: sysfs[b]["parents"] for b in gpus}
    verdict = judge_acs(entries, gpu_paths or None, unreadable, complete=source == "sysfs")
    module.exit_json(changed=False, iommu=iommu, acs=entries, acs_source=source, acs_verdict=verdict)


if __name__ == "__main__":
    main()
