#!/usr/bin/python
# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_topology_info
short_description: Read the NVIDIA GPU topology matrix and judge it for tensor parallelism
version_added: 0.1.0
description:
  - Reads C(nvidia-smi topo -m) and the peer-to-peer read and write matrices (C(nvidia-smi topo -p2p r), C(-p2p w))
    on the host, or saved outputs of those commands, so that a matrix pasted from another machine can be analysed too.
  - Returns every GPU and NIC, each link code exactly as printed, the peer-to-peer status per GPU pair, a normalised
    view (C(SOC) from old drivers is today's C(SYS)), the worst GPU-GPU link, the NVLink pairs, and a
    tensor-parallel verdict with its reason in one sentence.
  - Survives what people paste (prompts before the header, tabs turned into spaces, cut legends, empty affinity
    fields, Windows line endings, the ANSI underline driver 580 prints). Input it cannot read fails with a message
    naming the line; it never returns a guessed matrix.
  - Accepted inputs, each with the command that produces it. In O(src) the output of C(nvidia-smi topo -m) (also
    C(topo -mp) and C(topo --matrix)). In O(p2p_src) the output of C(nvidia-smi topo -p2p r), C(-p2p w),
    C(-p2p rw), C(-p2p n), C(-p2p a) or C(-p2p p), with or without O(src).
  - On boxes with many NICs nvidia-smi can print the last NIC cell of a GPU row run into the CPU Affinity
    (C(PH0-115) for C(PHB) and C(0-115)). Such a matrix is read, not refused. The damaged cell and that row's CPU
    Affinity are left out and listed in RV(topology.unreadable), with a warning naming the row and the column.
    A damaged GPU-GPU cell is still refused.
author:
  - gpubox maintainers (@gpubox)
extends_documentation_fragment:
  - gpubox.inference.attributes.info_module
options:
  src:
    description:
      - Path on the managed host to a saved C(nvidia-smi topo -m) output (C(-mp) and C(--matrix) outputs work too).
      - When neither O(src) nor O(p2p_src) is set, the module runs C(nvidia-smi) on the host.
      - Without it and with O(p2p_src), only the P2P matrix is read; the verdict is then V(slow) where a pair is
        not V(OK) and V(unknown) where every pair is, since the links themselves are not known.
    type: path
  p2p_src:
    description:
      - Path on the managed host to a saved C(nvidia-smi topo -p2p r|w|rw|n|a|p) output.
      - Read on its own, or with O(src); then every GPU it names must be in the topology matrix.
      - Without it, and with O(src) set, RV(topology.p2p) is empty.
    type: path
notes:
  - Needs the NVIDIA driver's C(nvidia-smi) only when it reads the live host.
seealso:
  - name: nvidia-smi documentation
    description: The topology matrix and its legend.
    link: https://docs.nvidia.com/deploy/nvidia-smi/index.html
"""

EXAMPLES = r"""
- name: Read this host's GPU topology
  gpubox.inference.gpu_topology_info:
  register: __topo

- name: Say what it means for tensor parallelism
  ansible.builtin.debug:
    msg: "{{ __topo.topology.verdict }}: {{ __topo.topology.reason }}"

- name: Analyse a matrix pasted from another machine
  gpubox.inference.gpu_topology_info:
    src: /tmp/other-box-topo.txt
    p2p_src: /tmp/other-box-p2p.txt
  register: __other

- name: Read a saved nvidia-smi topo -p2p rw on its own
  gpubox.inference.gpu_topology_info:
    p2p_src: /tmp/other-box-p2p-rw.txt
"""

RETURN = r"""
topology:
  description: The matrix as read, and what it means.
  returned: success
  type: dict
  contains:
    gpus:
      description:
        - One entry per GPU column, in matrix order.
        - Affinity values are strings as printed; null where absent or V(N/A).
      type: list
      elements: dict
      sample: [{"name": "GPU0", "index": 0, "cpu_affinity": "0-15", "numa_affinity": "0", "gpu_numa_id": null}]
    nics:
      description:
        - One entry per NIC column.
        - C(device) comes from the NIC Legend, or is the column name when the output names NICs directly.
      type: list
      elements: dict
      sample: [{"name": "NIC0", "device": "mlx5_0"}]
    links:
      description: Row -> column -> link code exactly as printed, both directions, no self entries.
      type: dict
      sample: {"GPU0": {"GPU1": "NV12"}, "GPU1": {"GPU0": "NV12"}}
    links_normalized:
      description: The same with old codes replaced by today's (V(SOC) becomes V(SYS)).
      type: dict
      sample: {"GPU0": {"GPU1": "SYS"}, "GPU1": {"GPU0": "SYS"}}
    p2p:
      description:
        - GPU -> GPU -> peer-to-peer status (V(OK), V(CNS), V(GNS), V(TNS), V(NS), V(DR), V(U)); empty without p2p data.
        - Read live, a pair is V(OK) only when both the read and the write matrices say so.
      type: dict
      sample: {"GPU0": {"GPU1": "OK"}, "GPU1": {"GPU0": "OK"}}
    unreadable:
      description:
        - Cells nvidia-smi printed run together, left out of RV(topology.links) and never guessed; C(row),
          C(column) (a NIC, or V(CPU Affinity)), C(text) as printed and C(line).
      type: list
      elements: dict
      sample: [{"row": "GPU0", "column": "NIC7", "text": "PH0-115", "line": 3}]
    worst_gpu_link:
      description: The slowest GPU-GPU link (normalised code and its class); null with one GPU or P2P data alone.
      type: dict
      sample: {"gpus": ["GPU0", "GPU2"], "code": "SYS", "class": "SYS"}
    nvlink_pairs:
      description: GPU pairs joined by NVLink, with the number of bonded links.
      type: list
      elements: dict
      sample: [{"gpus": ["GPU0", "GPU1"], "links": 4}]
    verdict:
      description:
        - V(fit) when every GPU pair is joined by NVLink or PCIe switches and P2P is not reported broken;
          V(slow) when traffic crosses the CPU's host bridge, NUMA nodes, or host memory; V(single_gpu) with one GPU;
          V(unknown) when only a P2P matrix was read and it reports every pair V(OK).
      type: str
      sample: slow
    reason:
      description: The verdict's reason, in one sentence a person can act on.
      type: str
      sample: >-
        GPU0 and GPU1 are meeting only at the CPU's PCIe host bridge (PHB), so tensor-parallel
        all-reduce works but is slower than over NVLink or a PCIe switch.
    source:
      description: Where the matrix came from (V(nvidia-smi), or the O(src) path, or the O(p2p_src) path alone).
      type: str
      sample: nvidia-smi
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpubox.inference.plugins.module_utils._module_io import C_LOCALE, read_src, run_checked
from ansible_collections.gpubox.inference.plugins.module_utils._topology import (
    TopologyParseError,
    analyse,
    check_p2p_matches,
    combine_p2p,
    parse_p2p,
    parse_topology,
    topology_from_p2p,
)


def build_module() -> AnsibleModule:
    return AnsibleModule(
        argument_spec={
            "src": {"type": "path"},
            "p2p_src": {"type": "path"},
        },
        supports_check_mode=True,
    )


def _parse(module: AnsibleModule, what: str, parser, text: str):
    try:
        return parser(text)
    except TopologyParseError as exc:
        module.fail_json(msg=f"cannot read {what}: {exc}")


def _row_order(name: str) -> tuple[str, int]:
    """GPU2 before GPU10."""
    prefix = name.rstrip("0123456789")
    return prefix, int(name[len(prefix) :] or 0)


def main() -> None:
    module = build_module()
    module.run_command_environ_update = C_LOCALE

    if module.params["src"] or module.params["p2p_src"]:
        p2p = {}
        if module.params["p2p_src"]:
            p2p = _parse(module, f"p2p_src={module.params['p2p_src']}", parse_p2p, read_src(module, "p2p_src"))
        if module.params["src"]:
            source = module.params["src"]
            topology = _parse(module, f"src={source}", parse_topology, read_src(module, "src"))
            stranger = check_p2p_matches(topology, p2p)
            if stranger:
                module.fail_json(
                    msg=f"p2p_src={module.params['p2p_src']} names {stranger}, which src={source} does not have: "
                    "the two outputs come from different boxes or different CUDA_VISIBLE_DEVICES"
                )
        else:
            source = module.params["p2p_src"]
            topology = topology_from_p2p(p2p)
    else:
        source = "nvidia-smi"
        nvidia_smi = module.get_bin_path("nvidia-smi")
        if not nvidia_smi:
            module.fail_json(
                msg="nvidia-smi was not found on the host: no NVIDIA driver is installed, "
                "or this host has no NVIDIA GPU. To analyse a saved matrix instead, set src."
            )
        matrix = run_checked(module, [nvidia_smi, "topo", "-m"])
        topology = _parse(module, "nvidia-smi topo -m", parse_topology, matrix)
        matrices = []
        for kind in ("r", "w"):
            text = run_checked(module, [nvidia_smi, "topo", "-p2p", kind])
            matrices.append(_parse(module, f"nvidia-smi topo -p2p {kind}", parse_p2p, text))
        p2p = combine_p2p(*matrices)

    for row in sorted({cell["row"] for cell in topology["unreadable"]}, key=_row_order):
        columns = [cell for cell in topology["unreadable"] if cell["row"] == row]
        module.warn(
            f"nvidia-smi topo -m printed row {row}, column {columns[0]['column']} run into the {columns[-1]['column']} "
            f"as {columns[0]['text']!r} (line {columns[0]['line']}): both are left unread; every other cell was read"
        )
    result = {**topology, "p2p": p2p, **analyse(topology, p2p), "source": source}
    result.pop("legend_nics", None)
    module.exit_json(changed=False, topology=result)


if __name__ == "__main__":
    main()
