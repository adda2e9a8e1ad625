"""Benchmark gpu_p2p_facts' own cost: a full measurement of 2 and 8 GPUs (pairs and host links), and a cached run.

Runs the module through `ansible` against the stand-in libcuda (tests/fakes/libcuda.c),
so the numbers are the harness (child processes, watchdog, ctypes, verification, Ansible)
plus this machine's memcpy, not GPU bandwidth. Targets from issue 4: cached well under 1 s,
2 GPUs under about 15 s, 8 GPUs under 2 minutes. Prints numbers; asserts nothing.

Usage: make bench
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(args: dict, env: dict) -> tuple[float, dict]:
    argv = ["ansible", "localhost", "-c", "local", "-i", "localhost,", "-e", f"ansible_python_interpreter={sys.executable}"]
    argv += ["-m", "gpubox.inference.gpu_p2p_facts", "-a", json.dumps(args)]
    started = time.monotonic()
    out = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout
    elapsed = time.monotonic() - started
    facts = json.loads(out[out.index("{") : out.rindex("}") + 1])["ansible_facts"]["gpu_p2p"]
    return elapsed, facts


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        library = Path(tmp) / "libcuda.so.1"
        subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", library, ROOT / "tests/fakes/libcuda.c"], check=True)
        env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1", "GPUBOX_LIBCUDA": str(library)}
        env["ANSIBLE_CALLBACKS_ENABLED"] = "ansible.builtin.timer"
        cache = Path(tmp) / "p2p.fact"
        print(f"machine: {os.cpu_count()} CPUs, {os.uname().machine}; stand-in libcuda, default sizes (64 MiB x 10)")
        for gpus in (2, 8):
            env["FAKE_CUDA_DEVICES"] = str(gpus)
            seconds, facts = run({"fingerprint": f"bench-{gpus}", "cache_path": str(cache), "force": True}, env)
            measured = f"{len(facts['pairs'])} ordered pairs and {len(facts['host_links'])} host links"
            print(f"{gpus} GPUs, {measured} measured and verified: {seconds:.1f} s")
        seconds, facts = run({"fingerprint": "bench-8", "cache_path": str(cache)}, env)
        print(f"8 GPUs from the cache (cached={facts['cached']}): {seconds:.2f} s, of which Ansible's own start is most")


if __name__ == "__main__":
    main()
