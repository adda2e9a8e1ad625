#!/usr/bin/python
# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_p2p_facts
short_description: Measure and verify GPU peer-to-peer bandwidth, and decide the NCCL and vLLM settings it allows
version_added: 0.1.0
description:
  - For every ordered GPU pair, measures unidirectional and bidirectional bandwidth with peer access enabled and
    through host staging (peer access disabled), and latency; compares each pair with the PCIe limit of its link.
  - For every GPU, measures its copies to and from pinned host memory (C(host_links)), compares the faster direction
    with the PCIe limit of its link and checks a round trip bit for bit. One GPU gets these numbers only.
  - Verifies correctness, copying a known pattern (a small and a large buffer) across every pair and comparing it bit
    for bit. A pair whose P2P copy loses or corrupts data is V(broken); one slower than the host-staged copy is
    V(slower_than_staged); one whose copy does not return within O(timeout) is V(hang), and the play goes on.
  - Talks to the CUDA driver API (C(libcuda.so.1)) through ctypes, so the host needs only the NVIDIA driver. Every
    measurement runs in a child process under a watchdog.
  - Or imports a saved report (O(src)) instead of measuring. Accepted, each with the command that produces it.
    C(nvbandwidth) text output (C(nvbandwidth), C(nvbandwidth -t device_to_device_memcpy_read_ce) and so on, the old
    and new matrix layouts; a matrix whose C(Running) line was cut takes its test name from its C(SUM) line).
    C(nvbandwidth -j) JSON (tests V(Passed), V(Waived), V(Not Found), V(Error); C(N/A) cells). cuda-samples
    C(p2pBandwidthLatencyTest) output, also with C(--p2p_read), whose read matrices are kept beside the write ones
    (C(unidirectional_p2p_enabled_reads), C(latency_gpu_p2p_enabled_reads_us), C(latency_cpu_p2p_enabled_reads_us)).
  - The pair statuses of an imported report are decided from the matrices named in C(decided_from). For
    p2pBandwidthLatencyTest these are the write matrices (C(unidirectional_p2p_enabled) against
    C(unidirectional_p2p_disabled)), which every run prints; the reads of a C(--p2p_read) run are reported, not
    judged. For nvbandwidth they are its device-to-device tests, a waived one meaning no peer access.
  - Returns C(ansible_facts.gpu_p2p), with a C(decisions) section (per pair C(p2p_usable) and its worst C(status),
    and for all GPUs C(nccl_p2p_disable) with its C(cause) and the C(unusable) pairs, and C(nccl_p2p_level)) that later
    roles only read; the vLLM plan narrows them to the GPUs it deploys.
  - B(Writes one file.) With O(fingerprint) (from M(gpubox.inference.gpu_facts)), outside check mode, the result is
    cached at O(cache_path), in the collection's state folder on the host; the module measures again only when the
    fingerprint (or the cache's format) changed or O(force=true). Without O(fingerprint), or in check mode, it writes
    nothing.
author:
  - gpubox maintainers (@gpubox)
extends_documentation_fragment:
  - gpubox.inference.attributes.info_module
options:
  src:
    description:
      - A saved C(nvbandwidth) (text or C(-j) JSON) or C(p2pBandwidthLatencyTest) output to import instead of
        measuring; the formats are listed above.
    type: path
  p2p_tool:
    description:
      - V(ctypes) measures and verifies through the CUDA driver API.
      - V(nvbandwidth) runs NVIDIA's C(nvbandwidth) (device-to-device read, write and bidirectional copy-engine
        tests) when it is on the PATH, and falls back to V(ctypes) with a warning when it is not. nvbandwidth does not
        check the data, so pairs are not C(verified) in this mode and C(nccl_p2p_level) is not raised.
    type: str
    choices: [ctypes, nvbandwidth]
    default: ctypes
  timeout:
    description:
      - Seconds one pair's measurement may take before it is reported as V(hang). With O(p2p_tool=nvbandwidth), the
        whole run may take this times the number of ordered pairs.
    type: float
    default: 60
  fingerprint:
    description: The GPU set's fingerprint; the cache key. Without it nothing is cached.
    type: str
  force:
    description: Measure even when the cache holds a result for O(fingerprint).
    type: bool
    default: false
  cache_path:
    description: Where the result is cached (written only with O(fingerprint) and outside check mode).
    type: path
    default: /var/lib/gpubox/p2p.json
  libcuda:
    description: The CUDA driver library to load; defaults to C(GPUBOX_LIBCUDA) from the environment, else C(libcuda.so.1).
    type: path
  bandwidth_mib:
    description: Size of each bandwidth copy, in MiB; also the large verification buffer.
    type: int
    default: 64
  repetitions:
    description: Copies per bandwidth figure.
    type: int
    default: 10
notes:
  - One GPU has no pair to measure; the facts say so in C(reason) and hold its host link only.
"""

EXAMPLES = r"""
- name: Read the GPU set
  gpubox.inference.gpu_facts:

- name: Measure the host links and P2P once per GPU set (one GPU gets its host link)
  gpubox.inference.gpu_p2p_facts:
    fingerprint: "{{ ansible_facts.gpu.fingerprint }}"
  become: true
  when: ansible_facts.gpu.count | int > 0

- name: Import a saved p2pBandwidthLatencyTest run
  gpubox.inference.gpu_p2p_facts:
    src: /tmp/p2pBandwidthLatencyTest.txt

- name: Import the JSON a script kept from nvbandwidth -j
  gpubox.inference.gpu_p2p_facts:
    src: /tmp/nvbandwidth.json
"""

RETURN = r"""
ansible_facts:
  description: Facts added under C(gpu_p2p).
  returned: always
  type: dict
  contains:
    gpu_p2p:
      description:
        - C(source) (V(measured), V(nvbandwidth), V(p2pBandwidthLatencyTest), or V(none) with a C(reason)),
          C(gpus) (count), C(devices), C(matrices) (test name -> rows of floats in GB/s or us, null for N/A),
          for an imported report C(format) (V(text) or V(json)) and C(decided_from) (the matrices the pair statuses
          come from), for nvbandwidth also C(tests) (name -> V(passed), V(waived), V(not_found) or V(error)),
          C(waived), C(errors) (name -> message) and C(sums),
          C(pairs) (C("i-j") -> C(status), C(can_access_peer), C(verified), C(detail), C(pcie_limit_gbps),
          C(ratio_to_limit)), C(host_links) (GPU index -> C(bus_id), C(status) V(ok), V(broken) or V(hang),
          C(host_to_device_gbps), C(device_to_host_gbps), C(verified), C(detail), C(pcie_limit_gbps),
          C(ratio_to_limit) of the faster direction), C(decisions), C(fingerprint) and C(cached).
      type: dict
      sample:
        source: measured
        gpus: 2
        pairs: {"0-1": {"status": "broken", "verified": false, "detail": "4096-byte copy: nothing arrived"}}
        decisions:
          nccl_p2p_disable: true
          cause: measured
          unusable: [{"pair": "GPU0-GPU1", "status": "broken"}]
          nccl_p2p_level: null
          verified: true
          tool_hang_s: null
          pairs: {"0-1": {"p2p_usable": false, "status": "broken"}}
"""

import json
import os
import subprocess

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpubox.inference.plugins.module_utils._bandwidth import BandwidthParseError, parse_report
from ansible_collections.gpubox.inference.plugins.module_utils._cuda_p2p import MIB, default_settings, library_path, measure
from ansible_collections.gpubox.inference.plugins.module_utils._module_io import read_src
from ansible_collections.gpubox.inference.plugins.module_utils._p2p import SCHEMA, decide, from_measurement, from_report
from ansible_collections.gpubox.inference.plugins.module_utils._pcie import read_sysfs_pci, speed_to_gen


def build_module() -> AnsibleModule:
    return AnsibleModule(
        argument_spec={
            "src": {"type": "path"},
            "p2p_tool": {"type": "str", "choices": ["ctypes", "nvbandwidth"], "default": "ctypes"},
            "timeout": {"type": "float", "default": 60},
            "fingerprint": {"type": "str"},
            "force": {"type": "bool", "default": False},
            "cache_path": {"type": "path", "default": "/var/lib/gpubox/p2p.json"},
            "libcuda": {"type": "path"},
            "bandwidth_mib": {"type": "int", "default": 64},
            "repetitions": {"type": "int", "default": 10},
        },
        supports_check_mode=True,
    )


def _links() -> dict[str, dict]:
    """Each PCI device's link for the PCIe limit: the narrower generation of its two ends, its trained width."""
    sysfs = read_sysfs_pci("/")
    links = {}
    for bdf, info in sysfs.items():
        parent = sysfs.get(info["parents"][0], {}) if info["parents"] else {}
        gens = [g for g in (speed_to_gen(info.get("max_link_speed")), speed_to_gen(parent.get("max_link_speed"))) if g]
        width = info.get("current_link_width")
        links[bdf] = {"gen": min(gens) if gens else None, "width": int(width) if width and width.isdigit() else None}
    return links


def _cached(module: AnsibleModule) -> dict | None:
    fingerprint, path = module.params["fingerprint"], module.params["cache_path"]
    if not fingerprint or module.params["force"] or not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            cached = json.load(handle)
    except (OSError, ValueError):
        return None
    if not isinstance(cached, dict) or cached.get("schema") != SCHEMA:
        return None
    return cached if cached.get("fingerprint") == fingerprint else None


def _store(module: AnsibleModule, facts: dict) -> None:
    path = module.params["cache_path"]
    if not module.params["fingerprint"] or module.check_mode or facts["source"] == "none":
        return
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w", encoding="utf-8") as handle:
            json.dump(facts, handle, indent=1, sort_keys=True)
        os.replace(path + ".tmp", path)
    except OSError as exc:
        module.warn(f"cache_path={path!r}: could not write the cache ({exc.strerror})")


def _validate(module: AnsibleModule) -> None:
    for option, low in (("timeout", 0.1), ("bandwidth_mib", 1), ("repetitions", 1)):
        if module.params[option] < low:
            module.fail_json(msg=f"{option}={module.params[option]} must be at least {low}")


NVBANDWIDTH_TESTS = (
    "device_to_device_memcpy_read_ce",
    "device_to_device_memcpy_write_ce",
    "device_to_device_bidirectional_memcpy_read_ce",
)


def _nvbandwidth(module: AnsibleModule, binary: str) -> dict:
    """Run nvbandwidth's device-to-device tests; a run that outlasts its budget is a hang of every pair."""
    argv = [binary]
    for test in NVBANDWIDTH_TESTS:
        argv += ["-t", test]
    try:  # the driver lists one folder per GPU; without it, allow for 8 GPUs
        count = len(os.listdir("/proc/driver/nvidia/gpus")) or 8
    except OSError:
        count = 8
    budget = module.params["timeout"] * max(count * (count - 1), 1)
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=budget, check=False, env={**os.environ, "LC_ALL": "C"}
        )
    except subprocess.TimeoutExpired:
        return {"source": "nvbandwidth", "reason": f"nvbandwidth did not finish within {budget:.0f} s", "hang": budget}
    if proc.returncode != 0 and "Running" not in proc.stdout:
        module.fail_json(
            msg=f"'{' '.join(argv)}' failed with rc={proc.returncode}", rc=proc.returncode, stdout=proc.stdout, stderr=proc.stderr
        )
    try:
        return from_report(parse_report(proc.stdout))
    except BandwidthParseError as exc:
        module.fail_json(msg=f"cannot read the output of nvbandwidth: {exc}", stdout=proc.stdout)


def main() -> None:
    module = build_module()
    _validate(module)
    if module.params["src"]:
        try:
            facts = from_report(parse_report(read_src(module, "src")))
        except BandwidthParseError as exc:
            module.fail_json(msg=f"cannot read src={module.params['src']}: {exc}")
    elif (cached := _cached(module)) is not None:
        module.exit_json(changed=False, ansible_facts={"gpu_p2p": {**cached, "cached": True}})
    elif module.params["p2p_tool"] == "nvbandwidth" and (binary := module.get_bin_path("nvbandwidth")):
        facts = _nvbandwidth(module, binary)
        if (budget := facts.pop("hang", None)) is not None:
            facts.update(gpus=None, pairs={}, decisions=decide({}, 0, verified=False, tool_hang_s=budget))
    else:
        if module.params["p2p_tool"] == "nvbandwidth":
            module.warn("p2p_tool=nvbandwidth, but nvbandwidth is not on the PATH; measuring with ctypes instead")
        settings = {**default_settings(), "bandwidth_bytes": module.params["bandwidth_mib"] * MIB}
        settings["repetitions"] = module.params["repetitions"]
        measured = measure(library_path(module.params["libcuda"]), settings, module.params["timeout"])
        if measured["error"] and not measured["pairs"] and not measured["host"]:
            facts = {"source": "none", "reason": measured["error"], "gpus": len(measured["devices"]), "pairs": {}}
            facts["decisions"] = decide({}, 0, verified=False)
        else:
            facts = from_measurement(measured, _links())
            if measured["error"]:
                facts["error"] = measured["error"]
    facts["fingerprint"] = module.params["fingerprint"]
    facts["schema"] = SCHEMA
    facts["cached"] = False
    _store(module, facts)
    module.exit_json(changed=False, ansible_facts={"gpu_p2p": facts})


if __name__ == "__main__":
    main()
