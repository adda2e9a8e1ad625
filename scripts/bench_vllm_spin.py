"""Benchmark what the test image's vLLM costs in CPU with upstream's 1 s spin after each queue read, and with 0.05 s.

vLLM 0.32 has each reader of the shared-memory queue between its engine core and its workers spin for a second
after every read (tests/vllm-image/shm_spin.py). The test image makes that GPUBOX_TEST_SHM_BUSY_LOOP_S (0.05 s there;
1 is upstream's). Here the image serves the tiny model with a worker process, as Molecule's boxes run it, once with
one worker and once with tensor parallel 2, each with the spin at 1 s and at 0.05 s in turns. Each server gets the
same load: streamed greedy completions of 64 tokens, 3 s apart, as a test sends them. Prints, per layout and
spin, the server's CPU-s over the load (its cgroup's usage), the mean request time, and the ratios to upstream's
spin. The variants must answer the same text; asserts nothing else.

Usage: make bench-vllm-spin [ROUNDS=1]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from bench_container import first_answer

ROOT = Path(__file__).resolve().parents[1]
PORT = 18191
NAME = "gpubox-bench-spin"
ARGS = ["--model", "/models/tiny-chat", "--served-model-name", "tiny", "--max-model-len", "512", "--enforce-eager"]
ARGS += ["--dtype", "bfloat16"]
PROMPT = {
    "model": "tiny",
    "prompt": "the quick brown fox jumps over a lazy dog while gpus share",
    "max_tokens": 64,
    "temperature": 0,
    "ignore_eos": True,
    "stream": True,
}
REQUESTS, GAP_S = 10, 3.0
SPINS = ("1", "0.05")
LAYOUTS = ((1, "0", "one worker"), (2, "0|1", "tensor parallel 2"))


def completion() -> str | None:
    """The streamed text of one completion, or None while the server does not answer."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{PORT}/v1/completions", json.dumps(PROMPT).encode(), {"Content-Type": "application/json"}
    )
    text = []
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            for line in response:
                data = line.decode().strip().removeprefix("data: ")
                if data and data != "[DONE]":
                    text.append(json.loads(data)["choices"][0]["text"])
    except OSError:
        return None
    return "".join(text)


def cpu_seconds() -> float:
    """The server container's CPU time so far, from its own cgroup (v1 cpuacct, or v2 cpu.stat)."""
    script = "cat /sys/fs/cgroup/cpuacct/cpuacct.usage 2>/dev/null || grep ^usage_usec /sys/fs/cgroup/cpu.stat"
    out = subprocess.run(["docker", "exec", NAME, "sh", "-c", script], capture_output=True, text=True, check=True).stdout
    if out.startswith("usage_usec"):
        return int(out.split()[1]) / 1e6
    return int(out) / 1e9


def serve(image: str, tp: int, bind: str, spin: str) -> tuple[float, float, str]:
    """Start a server, load it, stop it: (CPU-s over the load, mean request s, the text it answered)."""
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_CPU_OMP_THREADS_BIND": bind, "GPUBOX_TEST_SHM_BUSY_LOOP_S": spin}
    argv = ["docker", "run", "-d", "--name", NAME, "--ipc", "host", "-p", f"127.0.0.1:{PORT}:8000"]
    argv += [arg for key, value in env.items() for arg in ("-e", f"{key}={value}")]
    argv += [image, *ARGS, "--tensor-parallel-size", str(tp)]
    subprocess.run(["docker", "rm", "--force", NAME], check=False, capture_output=True)
    subprocess.run(argv, check=True, capture_output=True)
    try:
        first_answer(NAME, completion, 1)
        time.sleep(GAP_S)
        before = cpu_seconds()
        took, texts = [], set()
        for index in range(REQUESTS):
            started = time.monotonic()
            text = completion()
            took.append(time.monotonic() - started)
            if text is None:
                sys.exit(f"{NAME} did not answer request {index + 1} of {REQUESTS}")
            texts.add(text)
            print(f"    {tp=} spin={spin}s: request {index + 1}/{REQUESTS} in {took[-1]:.2f} s", flush=True)
            time.sleep(GAP_S)
        if len(texts) != 1:
            sys.exit(f"one server answered the same prompt differently: {sorted(texts)}")
        return cpu_seconds() - before, statistics.mean(took), texts.pop()
    finally:
        subprocess.run(["docker", "rm", "--force", NAME], check=False, capture_output=True)


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    image = subprocess.run([ROOT / "scripts" / "vllm-test-image.sh"], check=True, capture_output=True, text=True).stdout.strip()
    print(f"{image}: {REQUESTS} streamed 64-token completions {GAP_S:.0f} s apart per server, median of {rounds}")
    for tp, bind, label in LAYOUTS:
        cpu: dict[str, list[float]] = {spin: [] for spin in SPINS}
        took: dict[str, list[float]] = {spin: [] for spin in SPINS}
        texts = set()
        for spin in SPINS * rounds:  # the spins in turns, round after round
            seconds, mean, text = serve(image, tp, bind, spin)
            cpu[spin].append(seconds)
            took[spin].append(mean)
            texts.add(text)
        if len(texts) != 1:
            sys.exit(f"the spins answered differently ({label}): {sorted(texts)}")
        base_cpu, base_took = statistics.median(cpu[SPINS[0]]), statistics.median(took[SPINS[0]])
        print(f"{label} (tensor parallel {tp}):")
        for spin in SPINS:
            median_cpu, median_took = statistics.median(cpu[spin]), statistics.median(took[spin])
            print(
                f"  spin {spin:>4} s: {median_cpu:6.2f} CPU-s  x{median_cpu / base_cpu:.2f};"
                f"  a request {median_took:.3f} s  x{median_took / base_took:.2f}"
            )


if __name__ == "__main__":
    main()
