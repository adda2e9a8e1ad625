# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Private: a streaming load probe for OpenAI-compatible endpoints, and the statistics people publish.

``run`` drives streamed requests with asyncio over plain HTTP/1.1 (standard library
only, so the probe runs on any host with Python, controller or box) and records when
every Server-Sent Event arrived. ``summarize`` turns those records into TTFT,
inter-token latency, time per output token, throughput and a buffering verdict; it
is pure and tested on made-up timelines. No Ansible imports.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
import zlib
from itertools import pairwise
from urllib.parse import urlsplit

# A stream is "buffered" when its content events arrive packed together at the end: their spread is under this share
# of the request's duration (a proxy that buffers delivers them at the end), and they came out of the same reads, one
# after the other, the typical gap between two under PACKED_GAP_S. The gap tells a held response from a long prefill
# before a fast answer (a long prompt, a short reply, or a busy CPU during the prefill): that answer's tokens still come
# a decode step apart, while a held one's are parsed from memory, microseconds apart.
BUFFERED_SPREAD_SHARE = 0.1
PACKED_GAP_S = 0.0005
WORDS = [
    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
    "india", "juliet", "kilo", "lima", "mike", "november", "oscar", "papa",
]  # fmt: skip


def percentile(values: list[float], share: float) -> float | None:
    """Linear-interpolated percentile (share in 0..1) of a list; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * share
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _spread(values: list[float]) -> dict:
    if not values:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    return {
        "mean": sum(values) / len(values),
        "p50": percentile(values, 0.5),
        "p90": percentile(values, 0.9),
        "p99": percentile(values, 0.99),
    }


def summarize(records: list[dict], wall_seconds: float) -> dict:
    """Statistics over request records.

    A record: ``status`` (int, or None for a transport error), ``start``, ``end``,
    ``events`` (arrival times of content events), ``tokens`` (completion tokens, from
    usage when the server sent it, else the number of content events), ``prompt_tokens``
    (optional, from usage), ``error``.
    Times in seconds; results in milliseconds and tokens per second.
    """
    ok = [r for r in records if r["status"] == 200 and r["events"] and not r.get("error")]
    errors: dict[str, int] = {}
    for record in records:
        if record not in ok:
            key = str(record["status"]) if record["status"] is not None else "transport"
            errors[key] = errors.get(key, 0) + 1
    ttft = [(r["events"][0] - r["start"]) * 1e3 for r in ok]
    itl = [(b - a) * 1e3 for r in ok for a, b in zip(r["events"], r["events"][1:], strict=False)]
    tpot = [(r["end"] - r["events"][0]) * 1e3 / (r["tokens"] - 1) for r in ok if r["tokens"] > 1]
    per_stream = [r["tokens"] / (r["end"] - r["start"]) for r in ok if r["end"] > r["start"]]
    tokens = sum(r["tokens"] for r in ok)
    prompts = [r["prompt_tokens"] for r in ok if r.get("prompt_tokens")]
    verdicts = [_buffered(r) for r in ok if len(r["events"]) >= 4]
    buffered_share = sum(verdicts) / len(verdicts) if verdicts else None
    return {
        "requests": len(records),
        "succeeded": len(ok),
        "errors": errors,
        "wall_s": wall_seconds,
        "ttft_ms": _spread(ttft),
        "itl_ms": _spread(itl),
        "tpot_ms": _spread(tpot),
        "output_tokens": tokens,
        # What the server counted (chat template included), when it sent usage.
        "prompt_tokens_mean": sum(prompts) / len(prompts) if prompts else None,
        "output_tokens_per_s": tokens / wall_seconds if wall_seconds > 0 else None,
        "per_stream_tokens_per_s": _spread(per_stream),
        "requests_per_s": len(ok) / wall_seconds if wall_seconds > 0 else None,
        "buffering": {
            "verdict": None if buffered_share is None else ("buffered" if buffered_share > 0.5 else "streaming"),
            "buffered_streams": sum(verdicts),
            "streams_judged": len(verdicts),
        },
    }


def _buffered(record: dict) -> bool:
    duration = record["end"] - record["start"]
    events = record["events"]
    spread = events[-1] - events[0]
    packed = percentile([b - a for a, b in pairwise(events)], 0.5) < PACKED_GAP_S
    return duration > 0 and spread < BUFFERED_SPREAD_SHARE * duration and packed


def prompt(tokens: int, shared_prefix: int, index: int) -> str:
    """About ``tokens`` words, the first ``shared_prefix`` the same for every request."""
    shared = [WORDS[i % len(WORDS)] for i in range(min(shared_prefix, tokens))]
    own = [WORDS[(index * 7 + i) % len(WORDS)] + str(index % 10) for i in range(tokens - len(shared))]
    return " ".join(shared + own)


class _Connections:
    """Idle keep-alive connections to one target, reused the way HTTP client libraries reuse them."""

    def __init__(self, target: dict):
        self.target = target
        self.idle: list = []

    @staticmethod
    async def _exchange(reader, writer, request: bytes, timeout: float) -> bytes:
        """Write the request on one connection and read the status line back."""
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.readline(), timeout)

    async def send(self, request: bytes, timeout: float) -> tuple:
        """Write the request and read the status line: on an idle connection when one is left open, else a new one."""
        while self.idle:
            reader, writer = self.idle.pop()
            try:
                status_line = await self._exchange(reader, writer, request, timeout)
            except ConnectionError:
                status_line = b""
            if status_line:
                return reader, writer, status_line
            writer.close()  # the server had closed it meanwhile
        target = self.target
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(target["host"], target["port"], ssl=target["ssl"], server_hostname=target["sni"]),
            timeout,
        )
        try:
            return reader, writer, await self._exchange(reader, writer, request, timeout)
        except BaseException:
            writer.close()
            raise

    def close(self) -> None:
        for _reader, writer in self.idle:
            writer.close()
        self.idle = []


async def _request(connections: _Connections, body: bytes, timeout: float) -> dict:
    record: dict = {"status": None, "start": time.monotonic(), "end": None, "events": [], "tokens": 0, "error": None}
    target = connections.target
    writer = None
    reusable = False
    try:
        head = (
            f"POST {target['path']} HTTP/1.1\r\nHost: {target['host_header']}\r\nContent-Type: application/json\r\n"
            f"Accept: text/event-stream\r\nAccept-Encoding: gzip\r\nContent-Length: {len(body)}\r\n"
        )
        if target["api_key"]:
            head += f"Authorization: Bearer {target['api_key']}\r\n"
        reader, writer, status_line = await connections.send(head.encode() + b"\r\n" + body, timeout)
        record["status"] = int(status_line.split()[1])
        headers = {}
        while (line := await asyncio.wait_for(reader.readline(), timeout)) not in (b"\r\n", b""):
            key, _sep, value = line.decode("latin-1").partition(":")
            headers[key.strip().lower()] = value.strip()
        if record["status"] != 200:
            return record
        usage = None
        body_end = {"complete": False}
        events = _events(reader, headers, timeout, body_end)
        async for data in events:
            if data == "[DONE]":
                record["done"] = True
                record["end"] = time.monotonic()
                break
            payload = json.loads(data)
            if payload.get("usage"):
                usage = payload["usage"].get("completion_tokens")
                record["prompt_tokens"] = payload["usage"].get("prompt_tokens")
            for choice in payload.get("choices") or []:
                text = (choice.get("delta") or {}).get("content") or choice.get("text")
                if text:
                    record["events"].append(time.monotonic())
        record["tokens"] = usage if usage is not None else len(record["events"])
        if not record.get("done"):
            record["error"] = "stream ended without [DONE]"
        else:
            # The rest of the body (the end of the chunked encoding), so the connection can carry the next request.
            try:
                async for _data in events:
                    pass
            except (TimeoutError, OSError, ValueError, EOFError):
                pass
            reusable = body_end["complete"] and headers.get("connection", "").lower() != "close"
    except (TimeoutError, OSError, ValueError, IndexError, EOFError) as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        if record["end"] is None:
            record["end"] = time.monotonic()
        if writer is not None:
            if reusable:
                connections.idle.append((reader, writer))
            else:
                writer.close()
    return record


async def _events(reader, headers: dict, timeout: float, body_end: dict):
    """SSE ``data:`` payloads as they arrive, over a chunked, sized or close-delimited, gzip-encoded or plain body.

    The probe asks for gzip like common HTTP clients do, so a proxy that compresses event
    streams (and so holds them back) shows up in the arrival times. ``body_end["complete"]``
    turns true once a chunked or sized body has been read to its end.
    """
    chunked = headers.get("transfer-encoding", "").lower() == "chunked"
    left = int(headers["content-length"]) if not chunked and "content-length" in headers else None
    pending = b""
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS) if headers.get("content-encoding") == "gzip" else None
    while True:
        if chunked:
            size_line = await asyncio.wait_for(reader.readline(), timeout)
            if not size_line:
                return
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while (trailer := await asyncio.wait_for(reader.readline(), timeout)) not in (b"\r\n", b""):
                    pass
                body_end["complete"] = trailer == b"\r\n"
                return
            piece = (await asyncio.wait_for(reader.readexactly(size + 2), timeout))[:-2]
        elif left is not None:
            if left == 0:
                body_end["complete"] = True
                return
            piece = await asyncio.wait_for(reader.read(min(left, 65536)), timeout)
            if not piece:
                return
            left -= len(piece)
        else:
            piece = await asyncio.wait_for(reader.read(65536), timeout)
            if not piece:
                return
        pending += inflate.decompress(piece) if inflate else piece
        while b"\n\n" in pending:
            event, pending = pending.split(b"\n\n", 1)
            for line in event.decode().splitlines():
                if line.startswith("data:"):
                    yield line[5:].strip()


def target_for(url: str, api_key: str | None, verify: bool, ca_path: str | None, endpoint: str) -> dict:
    parts = urlsplit(url.rstrip("/"))
    context = None
    if parts.scheme == "https":
        context = ssl.create_default_context(cafile=ca_path)
        if not verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return {
        "host": parts.hostname,
        "port": port,
        "ssl": context,
        "sni": parts.hostname if context else None,
        "host_header": parts.netloc,
        "path": parts.path + ("/chat/completions" if endpoint == "chat" else "/completions"),
        "api_key": api_key,
    }


def turns(requests: int, concurrency: int, targets: int) -> list[tuple[int, int]]:
    """(target, its prompt's index) for each of ``requests`` x ``targets`` requests, in the order they are sent.

    Streams of one length started together end together, so requests go out in waves of ``concurrency``,
    and a request's place in its wave changes its time to first token. Request ``i`` (place ``i`` mod
    ``concurrency`` in wave ``i`` // ``concurrency``) goes to target (place + wave) mod ``targets``: each
    target takes every place in turn, not only those of one parity. Each target's prompts are 0, 1, 2...
    """
    order, sent = [], [0] * targets
    for index in range(requests * targets):
        which = (index % concurrency + index // concurrency) % targets
        order.append((which, sent[which]))
        sent[which] += 1
    return order


async def _run(settings: dict, targets: list[dict]) -> tuple[list[list[dict]], float]:
    """The records of each target, and the wall time; the requests are sent in the order of ``turns``.

    With several targets their requests interleave under the one concurrency gate, so every target
    meets the same server load at the same moments; each gets the same prompts, in the same order.
    """
    gate = asyncio.Semaphore(settings["concurrency"])
    deadline = time.monotonic() + settings["max_seconds"]
    pools = [_Connections(target) for target in targets]
    order = turns(settings["requests"], settings["concurrency"], len(pools))

    async def one(index: int) -> tuple[int, dict] | None:
        async with gate:
            if time.monotonic() > deadline:
                return None
            which, nth = order[index]
            text = prompt(settings["prompt_tokens"], settings["shared_prefix_tokens"], nth)
            body: dict = {"model": settings["model"], "max_tokens": settings["max_tokens"], "temperature": 0, "stream": True}
            body["stream_options"] = {"include_usage": True}
            if settings.get("ignore_eos"):
                body["ignore_eos"] = True
            if settings["endpoint"] == "chat":
                body["messages"] = [{"role": "user", "content": text}]
            else:
                body["prompt"] = text
            return which, await _request(pools[which], json.dumps(body).encode(), settings["timeout"])

    started = time.monotonic()
    try:
        done = await asyncio.gather(*(one(i) for i in range(settings["requests"] * len(pools))))
    finally:
        for pool in pools:
            pool.close()
    records: list[list[dict]] = [[] for _pool in pools]
    for which, record in (item for item in done if item is not None):
        records[which].append(record)
    return records, time.monotonic() - started


def _target(settings: dict) -> dict:
    return target_for(
        settings["url"], settings.get("api_key"), settings["validate_certs"], settings.get("ca_path"), settings["endpoint"]
    )


def run(settings: dict) -> dict:
    """Send ``requests`` streamed requests at ``concurrency``; return the summary and the raw counts."""
    records, wall = asyncio.run(_run(settings, [_target(settings)]))
    return summarize(records[0], wall)


def run_spread(settings: dict, urls: list[str]) -> dict:
    """``requests`` streamed requests spread over the servers at ``urls`` in turn, under one ``concurrency``,
    as a load balancer in front of them would: one summary over all of them (``requests`` rounds up to a
    multiple of the servers)."""
    each = -(-settings["requests"] // len(urls))
    targets = [_target({**settings, "url": url}) for url in urls]
    records, wall = asyncio.run(_run({**settings, "requests": each}, targets))
    return summarize([record for own in records for record in own], wall)


def run_mixed(settings: dict, endpoints: list[dict]) -> list[dict]:
    """``requests`` streamed requests to each endpoint (``url``, ``api_key``, ``ca_path``), interleaved under one
    ``concurrency``: one summary per endpoint, in order.

    Their times are comparable request by request (same load, same moments, same prompts). Each
    summary's ``wall_s`` is the whole run's, so its ``output_tokens_per_s`` is the endpoint's share
    of the run's throughput; ``per_stream_tokens_per_s`` is the speed its own streams got.
    """
    records, wall = asyncio.run(_run(settings, [_target({**settings, **endpoint}) for endpoint in endpoints]))
    return [summarize(own, wall) for own in records]


def table(label: str, summary: dict) -> str:
    """One row of the kind published in deployment write-ups."""

    def ms(value):
        return f"{value:8.1f}" if value is not None else "       -"

    tps = summary["output_tokens_per_s"]
    return (
        f"{label:<24} ok {summary['succeeded']:>4}/{summary['requests']:<4} TTFT p50 {ms(summary['ttft_ms']['p50'])} ms "
        f"p99 {ms(summary['ttft_ms']['p99'])} ms  ITL p50 {ms(summary['itl_ms']['p50'])} ms  "
        f"{tps if tps is not None else 0:8.1f} tok/s  buffering: {summary['buffering']['verdict']}"
    )
