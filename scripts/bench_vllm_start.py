"""Benchmark the test image's vLLM start on an empty vLLM cache folder against a folder another server started on.

Starts the vLLM test image (scripts/vllm-test-image.sh) with the tiny model, as the tests start it, and times it from
`docker run` to the first answer of /v1/completions, in turns: on an empty vLLM cache folder (a server of its own, as
every test server was), and on a folder another server already started on (the model info vLLM finds in a subprocess
is cached there; the tests' servers share one, as a box's share /var/lib/gpubox/vllm-cache). With the engine core
running the model (VLLM_ENABLE_V1_MULTIPROCESSING=0, the tests' usual server), and with a worker process (=1, as
Molecule's boxes and the replicas run). The variants of a round must answer the same greedy text. Prints the medians
and their ratios; asserts nothing else.

Usage: make bench-vllm-start [ROUNDS=3]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench_container import first_answer

ROOT = Path(__file__).resolve().parents[1]
PORT = 18190
ARGS = ["--model", "/models/tiny-chat", "--served-model-name", "tiny", "--max-model-len", "512", "--enforce-eager"]
ARGS += ["--dtype", "bfloat16"]
PROMPT = {"model": "tiny", "prompt": "the quick brown fox", "max_tokens": 16, "temperature": 0}


def answer() -> str | None:
    request = urllib.request.Request(
        f"http://127.0.0.1:{PORT}/v1/completions", json.dumps(PROMPT).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.load(response)["choices"][0]["text"]
    except OSError:
        return None


def start(image: str, multiprocessing: str, cache: str) -> tuple[float, str]:
    name = "gpubox-bench-start"
    env = ["-e", f"VLLM_ENABLE_V1_MULTIPROCESSING={multiprocessing}"]
    argv = ["docker", "run", "-d", "--name", name, "--shm-size", "1g", "-p", f"127.0.0.1:{PORT}:8000", *env]
    argv += ["-v", f"{cache}:/root/.cache/vllm", image, *ARGS]
    started = time.monotonic()
    subprocess.run(argv, check=True, capture_output=True)
    try:
        text = first_answer(name, answer, 0.25)
        return time.monotonic() - started, text
    finally:
        subprocess.run(["docker", "rm", "--force", name], check=False, capture_output=True)


# What vllm_cache_dir holds when a server starts: an empty folder (a test's own, as before), or the folder another
# server of the run already started on (tests/conftest.py shares one).
VARIANTS = ("empty", "warm")


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    image = subprocess.run([ROOT / "scripts" / "vllm-test-image.sh"], check=True, capture_output=True, text=True).stdout.strip()
    print(f"{image}: seconds from docker run to the first answer, median of {rounds}, the variants in turns")
    with tempfile.TemporaryDirectory() as tmp:
        warm = Path(tmp) / "warm"
        warm.mkdir()
        start(image, "0", str(warm))
        for multiprocessing, label in (("0", "engine core process"), ("1", "engine core and worker processes")):
            times: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
            for round_ in range(rounds):
                texts = set()
                for cache in VARIANTS:
                    folder = warm if cache == "warm" else Path(tempfile.mkdtemp(dir=tmp, prefix=f"empty-{round_}-"))
                    elapsed, text = start(image, multiprocessing, str(folder))
                    times[cache].append(elapsed)
                    texts.add(text)
                if len(texts) != 1:
                    sys.exit(f"the variants answered differently: {sorted(texts)}")
            base = statistics.median(times[VARIANTS[0]])
            print(f"VLLM_ENABLE_V1_MULTIPROCESSING={multiprocessing} ({label}):")
            for cache, runs in times.items():
                median = statistics.median(runs)
                each = " ".join(f"{t:.1f}" for t in runs)
                print(f"  cache {cache:5} {median:5.1f} s  x{median / base:.2f} of an empty cache  ({each})")


if __name__ == "__main__":
    main()
