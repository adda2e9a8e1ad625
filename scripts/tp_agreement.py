"""Measure how far tensor parallelism moves greedy answers: TP=1 against TP=2 of the same model, image and prompts.

The correctness gate's bar (vllm_gate_agree_tokens, vllm_gate_min_agreement) comes from this: a correct
TP=2 must agree with TP=1 on nearly every prompt, since only the order of floating-point sums differs.
Starts both servers from the vLLM test image (scripts/vllm-test-image.sh, the CPU backend, the tiny
model; TP=2 as two workers, one CPU each), sends PROMPTS prompts of each kind (runs of the model's own text,
and words in random order, where its next token is least sure), and prints for 4, 8, 16 and 32 tokens the
share of prompts whose first tokens are the same, and where the answers first part. Prints numbers,
asserts nothing.

Usage: PATH="$(scripts/venv.sh test)/bin:$PATH" python scripts/tp_agreement.py   (PROMPTS=64 by default)
"""

from __future__ import annotations

import ast
import json
import os
import random
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / ".collections"))
from ansible_collections.gpubox.inference.plugins.module_utils import _gate  # noqa: E402


def model_words() -> list[str]:
    """The text the tiny model was trained on: WORDS in tests/vllm-image/make_tiny_model.py (which needs torch to import)."""
    tree = ast.parse((ROOT / "tests" / "vllm-image" / "make_tiny_model.py").read_text())
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "WORDS")
    return ast.literal_eval(node.value.func.value).split()


SERVER = ["--model", "/models/tiny-chat", "--served-model-name", "tiny", "--dtype", "bfloat16", "--enforce-eager",
          "--max-model-len", "512", "--host", "127.0.0.1"]  # fmt: skip
SERVERS = {
    "tp1": (18211, [], ["--distributed-executor-backend", "uni"]),
    "tp2": (
        18212,
        ["-e", "VLLM_CPU_OMP_THREADS_BIND=0|1"],
        ["--tensor-parallel-size", "2", "--distributed-executor-backend", "mp"],
    ),
}


def complete(port: int, prompt: str) -> list[str]:
    body = json.dumps(_gate.request_body("tiny", prompt, 32, 0)).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return _gate.answer(json.load(response))["tokens"]


def main() -> None:
    image = subprocess.run([ROOT / "scripts" / "vllm-test-image.sh"], capture_output=True, text=True, check=True).stdout.strip()
    count = int(os.environ.get("PROMPTS", "64"))
    try:
        for name, (port, env, args) in SERVERS.items():
            subprocess.run(["docker", "rm", "-f", f"gpubox-agree-{name}"], capture_output=True, check=False)
            subprocess.run(["docker", "run", "-d", "--name", f"gpubox-agree-{name}", "--network", "host", "--ipc", "host", *env,
                            image, *SERVER, "--port", str(port), *args], check=True, capture_output=True)  # fmt: skip
        for port, _env, _args in SERVERS.values():
            for _attempt in range(120):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2)
                    break
                except OSError:
                    time.sleep(2)
        rng, words = random.Random(0), model_words()
        kinds: dict[str, list[str]] = {"own text": [], "shuffled": []}
        for _index in range(count):
            start, length = rng.randrange(len(words)), rng.randrange(12, 25)  # 12+ words: see tests/vllm_server.py
            kinds["own text"].append(" ".join((words * 2)[start : start + length]))
            kinds["shuffled"].append(" ".join(rng.choice(words) for _word in range(length)))
        print(f"image {image}; TP=1 (one worker) against TP=2 (two workers, one CPU each); greedy, 32 tokens")
        for kind, prompts in kinds.items():
            parted = [_gate.first_divergence(complete(SERVERS["tp1"][0], p), complete(SERVERS["tp2"][0], p)) for p in prompts]
            shares = ", ".join(f"first {k}: {sum(d >= k for d in parted) / len(parted):.3f}" for k in (4, 8, 16, 32))
            print(f"{kind:9s} {len(prompts)} prompts, share identical for the {shares}; first parting at {sorted(parted)[:5]}...")
    finally:
        for name in SERVERS:
            subprocess.run(["docker", "rm", "-f", f"gpubox-agree-{name}"], capture_output=True, check=False)


if __name__ == "__main__":
    main()
