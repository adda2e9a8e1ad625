"""vllm_answer_check run as Ansible runs it: against the real vLLM (sound answers, then judged against themselves and
against a reference from other weights), and against a stand-in endpoint that answers what a broken all-reduce does."""

from __future__ import annotations

import json

import pytest
from conftest import run_module
from nginx_server import asyncio_server
from vllm_server import GATE_PROMPTS, KEY, PORT

URL = f"http://127.0.0.1:{PORT}/v1"


def check(url: str = URL, **extra) -> dict:
    result = run_module("vllm_answer_check", {"url": url, "model": "tiny", "api_key": KEY, "prompts": GATE_PROMPTS, **extra})
    assert result.get("failed") is not True, result
    assert KEY not in json.dumps(result)
    return result


def test_the_real_server_answers_sound_text_and_agrees_with_itself(vllm_server):
    first = check()
    assert first["passed"] is True
    assert first["verdict"]["agreement"] is None
    assert len(first["replies"]) == 8
    assert all(len(reply["tokens"]) == 16 and len(reply["logprobs"]) == 16 for reply in first["replies"])
    again = check(reference=first["replies"])
    assert again["passed"] is True
    assert again["verdict"]["agreement"]["agreeing"] == 8
    assert again["findings"] == []


def test_answers_that_part_from_the_reference_fail_with_the_evidence(vllm_server):
    first = check()
    other = [{**reply, "text": " nine nine", "tokens": ["x", *reply["tokens"][1:]]} for reply in first["replies"]]
    verdict = check(reference=other)
    assert verdict["passed"] is False
    assert verdict["findings"] == ["0 of 8 prompts agree with the reference on their first 8 tokens (at least 7 must)"]
    assert verdict["verdict"]["evidence"][0] == {
        "prompt": GATE_PROMPTS[0],
        "expected": " nine nine",
        "received": first["replies"][0]["text"],
    }


def bang_server():
    """A stand-in for a server whose all-reduce is broken: plausible replies of nothing but '!'."""

    async def handle(reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(next(h for h in head.decode().split("\r\n") if h.lower().startswith("content-length")).split(":")[1])
        await reader.readexactly(length)
        body = json.dumps(
            {"choices": [{"text": "!" * 16, "logprobs": {"tokens": ["!"] * 16, "token_logprobs": [-0.01] * 16}}]}
        ).encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()
        writer.close()

    return asyncio_server(handle)


def test_a_run_of_bangs_fails():
    with bang_server() as port:
        verdict = check(f"http://127.0.0.1:{port}/v1", prompts=["one two three", "four five six"])
    assert verdict["passed"] is False
    assert verdict["findings"] == [
        "prompt 1: the answer is a run of '!' (what a broken all-reduce produces)",
        "prompt 2: the answer is a run of '!' (what a broken all-reduce produces)",
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"url": "127.0.0.1:1/v1"}, "must start with http:// or https://"),
        ({"min_agreement": 1.5}, "min_agreement=1.5 must be from 0 to 1"),
        ({"agree_tokens": 0}, "agree_tokens=0 must be at least 1"),
        ({"reference": [{"text": "a", "tokens": ["a"]}]}, "reference has 1 replies for 8 prompts"),
        ({}, "http://127.0.0.1:1/v1/completions could not be asked for a greedy completion"),
    ],
)
def test_bad_options_and_an_unreachable_server_fail_clearly(args, message):
    result = run_module(
        "vllm_answer_check", {"url": "http://127.0.0.1:1/v1", "model": "tiny", "prompts": GATE_PROMPTS, "timeout": 2, **args}
    )
    assert result["failed"] is True
    assert message in result["msg"]
