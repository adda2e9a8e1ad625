# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpubox-drift: the box read again and compared with what the last deployment recorded.

Reads the GPUs through NVML (fingerprint, driver, each link's generation and width, the performance
state), ACS on every bridge from its configuration space in /sys, the IOMMU mode from the kernel
command line and the image each container of the vLLM project runs, with the collection's own
readers (_gpu_inventory, _pcie, _acs), and compares them with _drift.

  record [--check]   keep this reading as the deployment's (site.yml runs it after a deploy);
                     prints {"changed": ...}; --check says what it would do and writes nothing
  check              say each difference in the journal (warning priority) and write the
                     Prometheus textfile (gpubox-drift.timer runs it); it never changes the box

Usage: python3 gpubox-drift.py record|check [CONFIG]   (default /etc/gpubox/drift.json)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.environ.get("GPUBOX_LIB", "/usr/local/lib/gpubox/drift"))

from ansible_collections.gpubox.inference.plugins.module_utils import _acs, _drift, _gpu_inventory, _pcie, _words
from ansible_collections.gpubox.inference.plugins.module_utils._box_files import read_json, write_atomically


def read_box(config: dict) -> dict:
    import pynvml

    gpu = _gpu_inventory.collect(pynvml)
    root = config.get("sysfs_root", "/")
    sysfs = _pcie.read_sysfs_pci(root)
    entries, why = _acs.sysfs_acs(_acs.read_configs(root, sysfs))
    paths = {bdf: sysfs[bdf]["parents"] for bdf in _pcie.nvidia_gpus(sysfs)}
    acs = _acs.judge_acs(entries, paths or None, why, complete=True)
    try:
        with open(os.path.join(root, "proc", "cmdline"), encoding="utf-8", errors="replace") as handle:
            iommu = _acs.parse_cmdline(handle.read())
    except OSError:
        iommu = _acs.parse_cmdline("")
    return _drift.reading(gpu, acs, iommu, images(config.get("project", "")), time.time())


def images(project: str) -> list[str]:
    """The image ids the project's running containers run ([] without Docker or containers)."""
    try:
        ids = subprocess.run(
            ["docker", "ps", "--quiet", "--filter", f"label=com.docker.compose.project={project}"],
            capture_output=True, text=True, timeout=60, check=False,
        ).stdout.split()  # fmt: skip
        if not ids:
            return []
        inspected = subprocess.run(["docker", "inspect", "--format", "{{.Image}}", *ids],
                                   capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        return inspected.stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return []


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[1] not in ("record", "check"):
        print(__doc__, file=sys.stderr)
        return 2
    args = [a for a in argv[2:] if not a.startswith("--")]
    config = read_json(args[0] if args else "/etc/gpubox/drift.json")
    if config is None:
        print("<3>cannot read the drift watch's configuration", flush=True)
        return 2
    now = read_box(config)
    recorded = read_json(config["baseline"])
    if argv[1] == "record":
        baseline = _drift.baseline(now)
        changed = recorded is None or _drift.baseline(recorded) != baseline
        if changed and "--check" not in argv:
            write_atomically(config["baseline"], json.dumps(now, indent=1, sort_keys=True) + "\n")
        print(json.dumps({"changed": changed}))
        return 0
    if recorded is None:
        print(f"<4>nothing recorded at {config['baseline']} yet: run site.yml", flush=True)
        return 0
    findings = _drift.compare(recorded, now)
    for finding in findings:
        print("<4>" + _words.say(finding["code"], **{k: v for k, v in finding.items() if k != "code"}), flush=True)
    if not findings:
        print("<6>" + _words.say("drift.none"), flush=True)
    if config.get("metrics"):
        write_atomically(config["metrics"], _drift.metrics(findings, now))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
