# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpubox-gpu-power: persistence mode and the power limit on every GPU (run at boot by gpubox-gpu-power.service).

Installed by the gpubox.inference.gpubox role. Reads what to set (gpu-power.json: the limit, watts or
a share of each card's default, and persistence mode), reads each GPU through NVML, checks the limit
against each card's constraints with _power.plan (the gpu_power module's logic) and sets what differs.
A limit a card refuses is said, and nothing is set on any GPU. Lines go to the journal.

Usage: python3 gpubox-gpu-power.py [CONFIG]   (default /etc/gpubox/gpu-power.json)
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.environ.get("GPUBOX_LIB", "/usr/local/lib/gpubox/gpu-power"))

from ansible_collections.gpubox.inference.plugins.module_utils import _power


def main(argv: list[str]) -> int:
    path = argv[1] if len(argv) > 1 else "/etc/gpubox/gpu-power.json"
    try:
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError) as exc:
        print(f"<3>cannot read {path}: {exc}", flush=True)
        return 2
    try:
        import pynvml

        gpus = _power.read(pynvml)
    except ImportError:
        print("<3>nvidia-ml-py (pynvml) is not installed for this Python; run site.yml again", flush=True)
        return 2
    except pynvml.NVMLError as exc:
        print(f"<3>NVML could not read the GPUs: {exc}", flush=True)
        return 1
    planned = _power.plan(config.get("limit"), config.get("persistence", True), gpus)
    if planned["errors"]:
        for error in planned["errors"]:
            print(f"<3>{error}; nothing was set", flush=True)
        return 1
    errors = _power.apply(pynvml, planned["gpus"]) if any(g["changes"] for g in planned["gpus"]) else []
    for error in errors:
        print(f"<3>{error}", flush=True)
    for gpu in planned["gpus"]:
        limit = gpu["target_w"] if gpu["target_w"] is not None else gpu["limit_w"]
        done = ", ".join(gpu["changes"]) or "nothing"
        print(f"<6>GPU{gpu['index']} {gpu['name']}: power limit {limit} W, persistence mode "
              f"{'on' if gpu['persistence_target'] else 'off'} (set: {done})", flush=True)  # fmt: skip
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
