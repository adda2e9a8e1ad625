# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Private: the correctness gate, judging a deployment by its greedy answers to fixed prompts.

Pure functions, no Ansible imports. A broken tensor-parallel all-reduce can serve at a
plausible speed while it answers ``!!!!``, NaN or the same token over and over; a P2P copy
test does not see it. The gate sends fixed prompts greedily (temperature 0, a fixed
seed, logprobs on) and judges two things:

- ``degenerate``: empty text, one token over most of the answer, runs of ``!`` or of the
  replacement character, a logprob that is NaN or infinite;
- ``agreement``: against the answers of a known-safe configuration of the same model,
  revision and image (the *reference*), how many prompts agree on their first tokens.
  Tensor parallelism changes the order of floating-point sums, so answers may drift
  apart late; a broken all-reduce differs from the first token.

``next_step`` and ``choose`` drive the fallback sequence the vLLM plan lays out (as
planned, then without custom all-reduce, then without P2P): which configuration to try
next from the results so far, and which one to keep. ``key`` names what a stored
reference and its verdicts are valid for.
"""

from __future__ import annotations

import math
from collections import Counter

# General prompts any base or chat model continues with varied text; vllm_gate_prompts replaces them.
DEFAULT_PROMPTS = [
    "The capital of France is",
    "Water boils at a temperature of",
    "Here is a Python function that returns the nth Fibonacci number:\n\ndef fib(n):",
    "The three primary colors are",
    "Photosynthesis is the process by which plants",
    "List the planets of the solar system in order from the Sun:",
    "Translate into French: The weather is nice today.",
    "A haiku about the sea:",
    "The largest ocean on Earth is",
    "In 1969, the Apollo 11 mission",
    "To make a cup of tea, first",
    "The chemical symbol for gold is",
    "Once upon a time, in a small village by the mountains,",
    "SELECT name, email FROM users WHERE",
    "The difference between TCP and UDP is that",
    "Counting from one to ten: one, two, three,",
]
# What the gate asks for and how it judges, unless the role says otherwise (vllm_gate_*).
DEFAULTS = {"max_tokens": 16, "agree_tokens": 8, "min_agreement": 0.875, "seed": 0}
# An answer is "one token over and over" when its most common token is more than this share.
REPEATED_SHARE = 0.6
# Broken all-reduce output: a run of this many "!" or replacement characters.
RUN = 8
REPLACEMENT = "\ufffd"


def request_body(model: str, prompt: str, max_tokens: int, seed: int) -> dict:
    """The greedy completion the gate sends for one prompt (OpenAI completions API, as vLLM serves it)."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": seed,
        "logprobs": 1,
        "stream": False,
    }


def answer(payload: dict) -> dict:
    """The text, tokens and their logprobs from one completions response."""
    choice = (payload.get("choices") or [{}])[0]
    logprobs = choice.get("logprobs") or {}
    return {
        "text": choice.get("text") or "",
        "tokens": [str(token) for token in logprobs.get("tokens") or []],
        "logprobs": [None if value is None else float(value) for value in logprobs.get("token_logprobs") or []],
    }


def degenerate(reply: dict) -> dict | None:
    """The first sign that an answer is broken, as a code with its fields; None for a sound answer."""
    text, tokens = reply.get("text") or "", reply.get("tokens") or []
    bad = [value for value in reply.get("logprobs") or [] if value is not None and not math.isfinite(value)]
    if bad:
        return {"code": "gate.bad_logprob", "value": str(bad[0])}
    if not text.strip():
        return {"code": "gate.empty"}
    if REPLACEMENT * RUN in text or text.count(REPLACEMENT) > len(text) / 2:
        return {"code": "gate.replacement"}
    if "!" * RUN in text or text.strip().strip("!") == "":
        return {"code": "gate.bang_run"}
    if len(tokens) >= 4:
        token, count = Counter(tokens).most_common(1)[0]
        if count / len(tokens) > REPEATED_SHARE:
            return {"code": "gate.repeated", "token": token, "count": count, "tokens": len(tokens)}
    return None


def first_divergence(expected: list[str], received: list[str]) -> int:
    """The index of the first token that differs (the shorter length when one is a prefix of the other)."""
    pairs = enumerate(zip(expected, received, strict=False))
    return next((i for i, (a, b) in pairs if a != b), min(len(expected), len(received)))


def agrees(expected: list[str], received: list[str], tokens: int) -> bool:
    """Whether the first ``tokens`` tokens are the same (an answer that ends early counts up to its end)."""
    needed = min(tokens, len(expected))
    return len(received) >= needed and first_divergence(expected, received) >= needed


def judge(prompts: list[str], replies: list[dict], reference: list[dict] | None, settings: dict) -> dict:
    """The verdict for one configuration's replies, against the reference's when there is one.

    ``passed`` is false when any reply is degenerate or when fewer than ``min_agreement`` of the
    prompts agree with the reference on their first ``agree_tokens`` tokens. ``evidence`` holds the
    prompts that failed, with the expected and received text, for the message.
    """
    settings = {**DEFAULTS, **(settings or {})}
    findings = []
    for index, reply in enumerate(replies):
        finding = degenerate(reply)
        if finding:
            findings.append({"prompt": index, **finding})
    verdict = {"passed": not findings, "degenerate": findings, "agreement": None, "evidence": []}
    failed = {f["prompt"] for f in findings}
    if reference is not None:
        if len(reference) != len(replies):
            raise ValueError(f"{len(replies)} replies for a reference of {len(reference)} prompts")
        disagreeing = [
            index
            for index, (want, got) in enumerate(zip(reference, replies, strict=True))
            if not agrees(want["tokens"], got["tokens"], settings["agree_tokens"])
        ]
        share = 1 - len(disagreeing) / len(replies) if replies else 0.0
        verdict["agreement"] = {
            "agreeing": len(replies) - len(disagreeing),
            "prompts": len(replies),
            "share": round(share, 4),
            "tokens": settings["agree_tokens"],
            "min_share": settings["min_agreement"],
            "disagreeing": disagreeing,
        }
        if share < settings["min_agreement"]:
            verdict["passed"] = False
            failed |= set(disagreeing)
    for index in sorted(failed)[:3]:
        verdict["evidence"].append(
            {
                "prompt": prompts[index] if index < len(prompts) else "",
                "expected": reference[index]["text"] if reference is not None else None,
                "received": replies[index]["text"],
            }
        )
    return verdict


def key(fingerprint: str | None, model: str, revision: str | None, image: str) -> str:
    """What a reference and its verdicts are valid for: the GPUs, the model and its revision, the image."""
    return "|".join([fingerprint or "no-gpu", model, revision or "local", image])


def next_step(steps: list[dict], results: dict) -> str | None:
    """The name of the configuration to try next, or None when the sequence is done.

    Steps are tried in order until one passes. A step marked ``compare`` that passed is
    measured against the next ``compare`` step too (custom all-reduce on against off),
    so that one is tried even after a pass.
    """
    passed = [s for s in steps if (results.get(s["name"]) or {}).get("passed")]
    for step in steps:
        if step["name"] in results:
            continue
        if not passed or (step.get("compare") and all(s.get("compare") for s in passed)):
            return step["name"]
        return None
    return None


def choose(steps: list[dict], results: dict) -> dict | None:
    """The configuration to keep, with why; None when none passed.

    The first that passed, except among ``compare`` steps, where the faster one that passed
    is kept, and an earlier one (custom all-reduce on) only when it measured faster.
    """
    passed = [s for s in steps if (results.get(s["name"]) or {}).get("passed")]
    if not passed:
        return None
    first = passed[0]
    rivals = [s for s in passed if s.get("compare")] if first.get("compare") else []
    if len(rivals) > 1:
        speeds = {s["name"]: (results[s["name"]].get("tokens_per_s") or 0.0) for s in rivals}
        best = max(rivals[1:], key=lambda s: speeds[s["name"]])
        kept = first if speeds[first["name"]] > speeds[best["name"]] else best
        other = best if kept is first else first
        return {
            "step": kept["name"],
            "code": "gate.faster",
            "kept": kept["name"],
            "other": other["name"],
            "kept_tokens_per_s": speeds[kept["name"]],
            "other_tokens_per_s": speeds[other["name"]],
        }
    failed = [s["name"] for s in steps[: steps.index(first)]]
    if failed:
        return {"step": first["name"], "code": "gate.fallback", "failed": failed}
    return {"step": first["name"], "code": "gate.passed"}


def findings(verdict: dict) -> list[dict]:
    """Why a verdict failed, as codes with fields (``_words`` renders them): each degenerate reply, then the agreement."""
    out = [dict(f) for f in verdict.get("degenerate") or []]
    agreement = verdict.get("agreement")
    if agreement and agreement["share"] < agreement["min_share"]:
        needed = math.ceil(agreement["min_share"] * agreement["prompts"] - 1e-9)
        out.append(
            {"code": "gate.disagrees", "agreeing": agreement["agreeing"], "prompts": agreement["prompts"],
             "tokens": agreement["tokens"], "needed": needed}
        )  # fmt: skip
    return out
