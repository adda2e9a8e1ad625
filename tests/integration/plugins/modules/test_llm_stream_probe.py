"""llm_stream_probe run as Ansible runs it against the real vLLM: direct, through the project's Nginx, and through a
proxy that holds each response until it is complete, which must be called buffered."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_module
from nginx_server import CLIENT_KEY, asyncio_server, nginx
from vllm_server import KEY as VLLM_KEY
from vllm_server import PORT as VLLM_PORT

# How long the buffering proxy holds each whole response before it sends it.
STALL = 1.0
PROBE = {"model": "tiny", "concurrency": 4, "requests": 8, "prompt_tokens": 50, "max_tokens": 64}


def probe(url: str, key: str, **extra) -> dict:
    result = run_module("llm_stream_probe", {**PROBE, "url": url, "api_key": key, **extra})
    assert result.get("failed") is not True, result
    assert key not in str(result)
    return result


def test_direct_stream_is_measured_and_not_buffered(vllm_server):
    result = probe(f"http://127.0.0.1:{VLLM_PORT}/v1", VLLM_KEY)
    summary = result["probe"]
    assert summary["succeeded"] == 8
    assert summary["output_tokens"] == 8 * 64
    assert summary["prompt_tokens_mean"] > 50  # 50 words, and the chat template around them
    assert summary["ttft_ms"]["p50"] > 0
    assert summary["buffering"]["verdict"] == "streaming"
    assert "TTFT p50" in result["table"]


def test_completion_endpoint_is_measured(vllm_server):
    summary = probe(f"http://127.0.0.1:{VLLM_PORT}/v1", VLLM_KEY, endpoint="completion", requests=4, concurrency=2)["probe"]
    assert summary["succeeded"] == 4
    assert summary["output_tokens"] == 4 * 64
    # No chat template: the server counts the prompt's own tokens, at least one per word.
    assert summary["prompt_tokens_mean"] >= 50
    assert summary["buffering"]["verdict"] == "streaming"


def test_through_the_projects_nginx_is_not_buffered(vllm_server, tmp_path: Path):
    with nginx(tmp_path, nginx_proxy_http_port=18190):
        summary = probe("http://127.0.0.1:18190/v1", CLIENT_KEY)["probe"]
    assert summary["succeeded"] == 8
    assert summary["buffering"]["verdict"] == "streaming"


def test_a_buffering_proxy_is_detected(vllm_server):
    """The detector must detect: a proxy that holds the whole response, then sends it (what buffering is)."""
    import asyncio

    async def handle(reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(next(h for h in head.decode().split("\r\n") if h.lower().startswith("content-length")).split(":")[1])
        body = await reader.readexactly(length)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", VLLM_PORT)
        head = head.replace(b"Bearer " + CLIENT_KEY.encode(), b"Bearer " + VLLM_KEY.encode())
        up_writer.write(head[:-2] + b"Connection: close\r\n\r\n" + body)
        await up_writer.drain()
        whole = await up_reader.read()  # everything, once the upstream is done
        # A controlled stall, as a proxy that waits for its buffer to fill: the request lasts at least this long,
        # while its events still arrive together, so a busy machine's scheduling cannot make them look spread out.
        await asyncio.sleep(STALL)
        writer.write(whole)
        await writer.drain()
        writer.close()
        up_writer.close()

    with asyncio_server(handle) as port:
        summary = probe(f"http://127.0.0.1:{port}/v1", CLIENT_KEY)["probe"]
    assert summary["succeeded"] == 8
    assert summary["buffering"]["verdict"] == "buffered"
    # Each stream's events came in one write after the stall: only a read that the client took longer than a tenth of
    # the request over (BUFFERED_SPREAD_SHARE) would look spread out; the verdict counts a majority.
    assert summary["buffering"]["buffered_streams"] > 4
    assert summary["ttft_ms"]["p50"] >= STALL * 1000


def test_wrong_key_is_counted_as_errors(vllm_server):
    summary = probe(f"http://127.0.0.1:{VLLM_PORT}/v1", "not-the-key", requests=3)["probe"]
    assert summary["succeeded"] == 0
    assert summary["errors"] == {"401": 3}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"concurrency": 0}, "concurrency=0 must be at least 1"),
        ({"url": "127.0.0.1:1/v1"}, "must start with http:// or https://"),
    ],
)
def test_bad_options(args, message):
    result = run_module("llm_stream_probe", {**PROBE, "url": "http://127.0.0.1:1/v1", **args})
    assert result["failed"] is True
    assert message in result["msg"]


def test_benchmark_playbook_prints_the_table_and_ratios(vllm_server, tmp_path: Path):
    import json
    import sys

    from conftest import ROOT, run_ansible

    inventory = tmp_path / "inventory.yml"
    host = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "vllm_model": "/models/tiny",
        "vllm_served_model_name": "tiny",
        "vllm_port": VLLM_PORT,
        "vllm_api_key": VLLM_KEY,
        "nginx_proxy_http_port": 18192,
        "nginx_proxy_api_keys": [{"name": "tests", "key": CLIENT_KEY}],
    }
    inventory.write_text(json.dumps({"all": {"children": {"gpu_boxes": {"hosts": {"bench": host}}}}}))
    with nginx(tmp_path, nginx_proxy_http_port=18192):
        result = run_ansible(
            "ansible-playbook", "-i", str(inventory), str(ROOT / "playbooks" / "benchmark.yml"),
            "-e", '{"benchmark_concurrency": [1, 2], "benchmark_requests_per_stream": 2, "benchmark_max_tokens": 16}',
        )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:]
    assert result.stdout.count("TTFT p50") >= 4
    assert "c=1: TTFT p50" in result.stdout
    assert "c=2: TTFT p50" in result.stdout
    assert "x direct" in result.stdout
    assert CLIENT_KEY not in result.stdout
