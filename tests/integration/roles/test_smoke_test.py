"""The smoke test role against small SSE servers on loopback: a "buffered" verdict is probed again before it fails the
play, so that one probe bunched by a scheduler stall on a busy box passes, and a proxy that buffers every stream fails."""

from __future__ import annotations

import asyncio
import json
import sys

import yaml
from conftest import run_playbook_json
from nginx_server import asyncio_server

EVENTS = 12
PROBE_REQUESTS = 4  # the role's smoke_test_requests
# How long a held response waits before all its events go at once: a stream is judged bunched when its events spread
# over under a tenth of the request, so only a stall of the client of a tenth of this could make a held one look spread.
HOLD = 1.0


def sse_server(buffered_requests: int):
    """Answers chat completions with EVENTS chunks: the first ``buffered_requests`` requests held back, then sent all
    at once (what a buffering proxy, or a stall, delivers); the later ones 20 ms apart (a stream)."""
    served = [0]

    async def handle(reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(h for h in head.decode().split("\r\n") if h.lower().startswith("content-length"))
        await reader.readexactly(int(length.split(":")[1]))
        served[0] += 1
        held = served[0] <= buffered_requests
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        await writer.drain()
        if held:
            await asyncio.sleep(HOLD)
        for index in range(EVENTS):
            chunk = {"choices": [{"index": 0, "delta": {"content": f" w{index}"}, "finish_reason": None}]}
            event = f"data: {json.dumps(chunk)}\n\n".encode()
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            if not held:
                await writer.drain()
                await asyncio.sleep(0.02)
        writer.write(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
        await writer.drain()
        writer.close()

    return handle


def run_smoke_test(tmp_path, port: int):
    play = {
        "hosts": "localhost",
        "gather_facts": False,
        "vars": {"ansible_python_interpreter": sys.executable},
        "roles": [
            {"role": "gpubox.inference.smoke_test", "smoke_test_url": f"http://127.0.0.1:{port}/v1", "smoke_test_model": "tiny"}
        ],
    }
    (tmp_path / "play.yml").write_text(yaml.safe_dump([play]))
    result, run = run_playbook_json("-i", "localhost,", "-c", "local", str(tmp_path / "play.yml"))
    assert run is not None, result.stdout[-2000:] + result.stderr[-2000:]
    # Named "<role> : <task>" by the json callback.
    tasks = {task["task"]["name"].rpartition(" : ")[2]: task["hosts"]["localhost"] for task in run["plays"][0]["tasks"]}
    return result, tasks


def test_one_bunched_probe_is_probed_again_and_passes(tmp_path):
    with asyncio_server(sse_server(buffered_requests=PROBE_REQUESTS)) as port:
        result, tasks = run_smoke_test(tmp_path, port)
    assert result.returncode == 0, result.stdout[-3000:]
    probe = tasks["Stream a few requests through the endpoint"]
    assert probe["attempts"] == 2
    assert probe["probe"]["buffering"]["verdict"] == "streaming"


def test_a_proxy_that_buffers_every_stream_fails_after_three_probes(tmp_path):
    with asyncio_server(sse_server(buffered_requests=1000)) as port:
        result, tasks = run_smoke_test(tmp_path, port)
    assert result.returncode == 2, sorted(tasks)
    check = tasks["Check that every stream worked and was not buffered"]
    assert "buffering verdict buffered" in check["msg"]
    assert "3 probe(s)" in check["msg"]
    assert tasks["Stream a few requests through the endpoint"]["attempts"] == 3
