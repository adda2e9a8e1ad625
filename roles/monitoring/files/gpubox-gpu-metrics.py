# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpubox-gpu-metrics: each GPU's sensors and this boot's Xid errors, for Prometheus.

Reads every GPU through NVML (temperature, fan, power and its limit, memory, utilisation, the PCIe link now and
at best, the clocks event reasons) and counts the driver's Xid errors in this boot's kernel log (journalctl),
with the collection's own _gpu_metrics, and writes the node exporter's textfile atomically. The monitoring
role's gpubox-gpu-metrics.timer runs it. It reads; it never changes the box.

Usage: python3 gpubox-gpu-metrics.py [TEXTFILE]   (default /var/lib/gpubox/metrics/gpu.prom)
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

sys.path.insert(0, os.environ.get("GPUBOX_LIB", "/usr/local/lib/gpubox/gpu-metrics"))

from ansible_collections.gpubox.inference.plugins.module_utils import _gpu_metrics, _words
from ansible_collections.gpubox.inference.plugins.module_utils._box_files import write_atomically


def kernel_log() -> tuple[str | None, str | None]:
    """This boot's kernel lines (the journal keeps them under the identifier ``kernel``), or None and why not."""
    command = ["journalctl", "--boot", "--identifier", "kernel", "--output", "cat", "--no-pager", "--quiet"]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    if result.returncode != 0:
        return None, result.stderr.strip() or f"exit {result.returncode}"
    return result.stdout, None


def main(argv: list[str]) -> int:
    path = argv[1] if len(argv) > 1 else "/var/lib/gpubox/metrics/gpu.prom"
    import pynvml

    status = 0
    try:
        gpus = _gpu_metrics.read(pynvml)
    except pynvml.NVMLError as exc:
        print("<3>" + _words.say("gpu_metrics.nvml", error=exc, path=path), flush=True)
        gpus, status = [], 1
    log, why = kernel_log()
    if log is None:
        print("<4>" + _words.say("gpu_metrics.no_kernel_log", error=why), flush=True)
    write_atomically(path, _gpu_metrics.metrics(gpus, _gpu_metrics.xids(log) if log is not None else None, time.time()))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
