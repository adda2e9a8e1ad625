"""_probe's transport against small real servers on loopback: connections kept alive like HTTP clients keep them,
replaced when the server closed them, and the mixed and spread runs' order of requests."""

from __future__ import annotations

import asyncio
import json

import pytest
from nginx_server import asyncio_server, paced_upstream

from ansible_collections.gpubox.inference.plugins.module_utils._probe import run, run_mixed, run_spread


def _settings(port: int, requests: int, concurrency: int) -> dict:
    return {
        "url": f"http://127.0.0.1:{port}/v1", "model": "m", "api_key": None, "endpoint": "chat",
        "concurrency": concurrency, "requests": requests, "prompt_tokens": 4, "shared_prefix_tokens": 0,
        "max_tokens": 3, "ignore_eos": False, "timeout": 10, "max_seconds": 60, "validate_certs": True, "ca_path": None,
    }  # fmt: skip


def _keep_alive_server(chunked: bool, opened: list, seen: list | None = None, name: str = ""):
    """An SSE server that answers any number of requests on one connection, chunked or with a Content-Length;
    with ``seen``, it appends (``name``, the prompt) for every request, in the order they came."""

    async def handle(reader, writer):
        opened.append(writer)
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                break
            length = next(h for h in head.decode().split("\r\n") if h.lower().startswith("content-length"))
            request = json.loads(await reader.readexactly(int(length.split(":")[1])))
            if seen is not None:
                seen.append((name, request["messages"][0]["content"]))
            events = [{"choices": [{"index": 0, "delta": {"content": f" w{i}"}}]} for i in range(3)]
            body = b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"
            if chunked:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
                writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
            else:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n" % len(body))
                writer.write(body)
            await writer.drain()
        writer.close()

    return handle


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "content-length"])
def test_connections_are_kept_alive_like_http_clients_keep_them(chunked):
    opened: list = []
    with asyncio_server(_keep_alive_server(chunked, opened)) as port:
        summary = run(_settings(port, requests=12, concurrency=3))
    assert summary["succeeded"] == 12, summary["errors"]
    assert summary["output_tokens"] == 36
    assert len(opened) == 3


def test_a_connection_the_server_closed_is_replaced_without_an_error():
    """Servers may close a kept-alive connection after any response; the next request goes on a new one."""
    with paced_upstream(events=3, gap=0.001) as port:
        summary = run(_settings(port, requests=6, concurrency=2))
    assert summary["succeeded"] == 6, summary["errors"]
    assert summary["errors"] == {}


def test_a_mixed_run_interleaves_the_endpoints_with_the_same_prompts():
    """run_mixed: each endpoint gets ``requests`` requests, the same prompts in the same order, taking turns."""
    seen: list = []
    with (
        asyncio_server(_keep_alive_server(True, [], seen, "a")) as a,
        asyncio_server(_keep_alive_server(False, [], seen, "b")) as b,
    ):
        settings = _settings(a, requests=5, concurrency=1)
        summaries = run_mixed(settings, [{"url": f"http://127.0.0.1:{port}/v1"} for port in (a, b)])
    assert [s["succeeded"] for s in summaries] == [5, 5]
    assert [s["output_tokens"] for s in summaries] == [15, 15]
    assert [name for name, _text in seen] == ["a", "b"] * 5  # one stream: they take turns
    assert [text for name, text in seen if name == "a"] == [text for name, text in seen if name == "b"]
    assert len({text for _name, text in seen}) == 5
    assert summaries[0]["wall_s"] == summaries[1]["wall_s"]  # one run, one wall clock


def test_a_spread_run_shares_the_requests_out_like_a_load_balancer():
    """run_spread: replicas of one layout; ``requests`` in all, in turns, one summary over all of them."""
    seen: list = []
    with (
        asyncio_server(_keep_alive_server(True, [], seen, "a")) as a,
        asyncio_server(_keep_alive_server(False, [], seen, "b")) as b,
    ):
        summary = run_spread(_settings(a, requests=7, concurrency=2), [f"http://127.0.0.1:{port}/v1" for port in (a, b)])
    assert summary["requests"] == summary["succeeded"] == 8  # 7 rounds up to 4 per server
    assert sorted(name for name, _text in seen) == ["a"] * 4 + ["b"] * 4
    assert summary["output_tokens"] == 24
