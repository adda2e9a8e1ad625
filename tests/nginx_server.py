"""A real Nginx running the nginx_proxy role's own site (rendered by the role), for the proxy and probe tests."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import ssl
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import yaml
from conftest import require, run_ansible
from vllm_server import KEY as VLLM_KEY
from vllm_server import PORT as VLLM_PORT

CLIENT_KEY = "client-key-0123456789abcdef"
# An Nginx of the tests serves its stub_status on its HTTP port + this.
STATUS_PORT_OFFSET = 10000
BODY = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "temperature": 0, "stream": True}


def render_site(work: Path, **variables) -> Path:
    site = work / "site.conf"
    playbook = work / "render.yml"
    task = {"ansible.builtin.include_role": {"name": "gpubox.inference.nginx_proxy", "tasks_from": "render.yml"}}
    playbook.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": [task]}]))
    extra = {
        "ansible_python_interpreter": sys.executable,
        "nginx_proxy_site_path": str(site),
        "nginx_proxy_log_dir": str(work),
        "nginx_proxy_upstreams": [f"127.0.0.1:{VLLM_PORT}"],
        "vllm_api_key": VLLM_KEY,
        "nginx_proxy_api_keys": [{"name": "tests", "key": CLIENT_KEY}],
        "nginx_proxy_listen_ipv6": False,
        # Each Nginx of the tests its own status port: several run at once.
        "nginx_proxy_status_port": STATUS_PORT_OFFSET + variables.get("nginx_proxy_http_port", 0),
        **variables,
    }
    (work / "vars.json").write_text(json.dumps(extra))
    result = run_ansible("ansible-playbook", "-i", "localhost,", "-c", "local", "-e", f"@{work / 'vars.json'}", str(playbook))
    assert result.returncode == 0, result.stdout[-3000:]
    assert CLIENT_KEY not in result.stdout + result.stderr
    return site


@contextmanager
def nginx(work: Path, worker_processes: int = 2, worker_connections: int = 4096, **variables):
    """Run a real Nginx with the role's site; yields the site's text."""
    site = render_site(work, **variables)
    conf = work / "nginx.conf"
    conf.write_text(
        f"worker_processes {worker_processes};\npid {work}/nginx.pid;\nerror_log {work}/error.log warn;\ndaemon off;\n"
        f"worker_rlimit_nofile {2 * worker_connections};\nevents {{ worker_connections {worker_connections}; }}\n"
        f"http {{\n  client_body_temp_path {work}/body;\n  proxy_temp_path {work}/proxy;\n"
        f"  access_log off;\n  include {site};\n}}\n"
    )
    test = subprocess.run([require("nginx"), "-t", "-c", str(conf)], capture_output=True, text=True, check=False)
    assert test.returncode == 0, test.stderr
    process = subprocess.Popen([require("nginx"), "-c", str(conf)], stderr=subprocess.PIPE)
    try:
        port = variables.get("nginx_proxy_https_port") if variables.get("nginx_proxy_tls") else variables["nginx_proxy_http_port"]
        for _try in range(50):
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        yield site.read_text()
    finally:
        process.terminate()
        process.wait(10)


def post(port: int, body: dict, key: str | None = CLIENT_KEY, tls: bool = False) -> http.client.HTTPResponse:
    if tls:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        connection = http.client.HTTPSConnection("127.0.0.1", port, timeout=120, context=context)
    else:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    connection.request("POST", "/v1/chat/completions", body=json.dumps(body), headers=headers)
    return connection.getresponse()


def event_times(response) -> list[tuple[float, str]]:
    """(arrival time, data) of every SSE event, read as it arrives."""
    events = []
    buffer = b""
    while True:
        chunk = response.read1(65536)
        if not chunk:
            break
        now = time.monotonic()
        buffer += chunk
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            events.append((now, event.decode().removeprefix("data: ")))
    return events


@contextmanager
def paced_upstream(events: int, gap: float):
    """An SSE upstream that sends ``events`` chat chunks ``gap`` seconds apart, then ``[DONE]``; yields its port.

    Real vLLM on this machine can emit a token every millisecond, and events that close
    together are legitimately coalesced on the way (one read returns several). A known pace
    makes "each event is forwarded when it is sent" something a test can check exactly.
    """

    async def handle(reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(h for h in head.decode().split("\r\n") if h.lower().startswith("content-length"))
        await reader.readexactly(int(length.split(":")[1]))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for index in range(events):
            chunk = {"choices": [{"index": 0, "delta": {"content": f" w{index}"}, "finish_reason": None}]}
            event = f"data: {json.dumps(chunk)}\n\n".encode()
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
            await asyncio.sleep(gap)
        writer.write(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
        await writer.drain()
        writer.close()

    with asyncio_server(handle) as port:
        yield port


@contextmanager
def asyncio_server(handle):
    """Serve ``handle(reader, writer)`` on a free loopback port from a thread; yields the port."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", port))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


@contextmanager
def recording_upstream():
    """A stand-in for vLLM that answers every request 200 with JSON and records what reached it.

    Yields ``(port, seen)``; ``seen`` gets ``{"method", "path", "headers", "body_bytes"}`` per request.
    Its answers carry an ``X-Powered-By`` header, as web frameworks' do, which clients must not see.
    """
    seen: list[dict] = []

    async def handle(reader, writer):
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                method, path, _version = head[0].split(" ", 2)
                headers = {}
                for line in head[1:]:
                    if ":" in line:
                        name, value = line.split(":", 1)
                        headers[name.strip().lower()] = value.strip()
                size = 0
                if headers.get("transfer-encoding", "").lower() == "chunked":
                    while True:
                        length = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                        await reader.readexactly(length + 2)
                        size += length
                        if not length:
                            break
                elif "content-length" in headers:
                    size = len(await reader.readexactly(int(headers["content-length"])))
                seen.append({"method": method, "path": path, "headers": headers, "body_bytes": size})
                body = b'{"object": "list", "data": []}'
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Powered-By: stand-in\r\n"
                    + b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    with asyncio_server(handle) as port:
        yield port, seen
