"""The fleet's gateway in a real Nginx, in front of two boxes' real front doors (TLS, the fleet key), both in
front of the real vLLM that the vllm role deploys.

Every site is rendered by the nginx_proxy role itself (tasks_from render.yml): the boxes' as a box of a fleet
renders it, the gateway's with the members that module_utils/_fleet.py chose (tested there, and the whole
gateway entry point in Molecule). Each box's Nginx can be stopped and started again under the gateway.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
import yaml
from conftest import require, run_playbook_json
from nginx_server import BODY, event_times, nginx, paced_upstream, post, render_site
from vllm_server import KEY as VLLM_KEY
from vllm_server import PORT as VLLM_PORT

FLEET_KEY = "fleet-key-9a8b7c6d5e4f3g2h"
GATEWAY = 18500
# Each box: its HTTP port (the redirect) and its HTTPS front door.
BOXES = {"box-a": (18501, 18511), "box-b": (18502, 18512)}


def certificate(folder: Path, name: str) -> tuple[Path, Path]:
    """A self-signed pair naming ``name`` and 127.0.0.1, as the role makes one."""
    crt, key = folder / f"{name}.crt", folder / f"{name}.key"
    subprocess.run(
        [require("openssl"), "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
         "-addext", f"subjectAltName=DNS:{name},IP:127.0.0.1", "-keyout", str(key), "-out", str(crt)],
        capture_output=True, check=True,
    )  # fmt: skip
    return crt, key


def box_variables(crt: Path, key: Path, http: int, https: int, **extra) -> dict:
    return {"nginx_proxy_http_port": http, "nginx_proxy_https_port": https, "nginx_proxy_tls": True,
            "nginx_proxy_tls_certificate": str(crt), "nginx_proxy_tls_certificate_key": str(key),
            "nginx_proxy_fleet_key": FLEET_KEY, **extra}  # fmt: skip


def gateway_variables(trust: Path, members: list[dict], **extra) -> dict:
    fleet = {"model": "tiny", "members": members, "left_out": []}
    return {"nginx_proxy_http_port": GATEWAY, "nginx_proxy_fleet_key": FLEET_KEY, "_nginx_proxy_gateway": True,
            "_nginx_proxy_id": "gpubox_gateway", "_nginx_proxy_log_name": "gpubox-gateway",
            "_nginx_proxy_status_server": False, "_nginx_proxy_fleet": fleet,
            "_nginx_proxy_gateway_trust_path": str(trust), "nginx_proxy_gateway_fail_timeout": 2, **extra}  # fmt: skip


def member(name: str, https: int, drained: bool = False) -> dict:
    return {"name": name, "upstream": f"127.0.0.1:{https}", "drained": drained, "certificate": ""}


@contextmanager
def box(work: Path, crt: Path, key: Path, http: int, https: int, **extra):
    """A box's front door in a real Nginx; yields its folder (its access log, and its nginx.conf to restart it)."""
    work.mkdir(exist_ok=True)
    with nginx(work, **box_variables(crt, key, http, https, **extra)):
        yield work


def stop(work: Path) -> None:
    subprocess.run([require("nginx"), "-c", str(work / "nginx.conf"), "-s", "stop"], capture_output=True, check=True)
    for _try in range(50):
        if not (work / "nginx.pid").exists():
            return
        time.sleep(0.1)


def start_again(work: Path, fleet: dict) -> None:
    """Start a stopped box's Nginx again; the fixture stops it at the end."""
    fleet["restarted"].append(subprocess.Popen([require("nginx"), "-c", str(work / "nginx.conf")], stderr=subprocess.PIPE))
    time.sleep(0.5)


def gateway_lines(work: Path) -> list[str]:
    """The box's access log lines for the gateway's requests."""
    log = work / "gpubox-openai.access.log"
    return [line for line in log.read_text().splitlines() if 'key="gpubox-gateway"' in line] if log.exists() else []


def gateway_requests(work: Path, at_least: int = 0) -> int:
    """Requests the gateway made to this box, from the box's access log (written just after each answer, so
    waited for up to 2 s while fewer than ``at_least``)."""
    for _try in range(20):
        count = len(gateway_lines(work))
        if count >= at_least:
            break
        time.sleep(0.1)
    return count


def complete(port: int, count: int, stream: bool = False) -> list[int]:
    """Statuses of ``count`` short requests through ``port``, one after the other."""
    statuses = []
    for _request in range(count):
        response = post(port, {**BODY, "max_tokens": 2, "stream": stream})
        body = response.read()
        statuses.append(response.status)
        if stream and response.status == 200:
            assert body.rstrip().endswith(b"data: [DONE]"), body[-200:]
    return statuses


@pytest.fixture(scope="module")
def fleet(vllm_server, tmp_path_factory):
    """Two boxes' front doors (each box's vLLM is the one real server) and the gateway in front of both."""
    work = tmp_path_factory.mktemp("fleet")
    pairs = {}
    for name in BOXES:
        (work / name).mkdir()
        pairs[name] = certificate(work / name, "gpubox-fleet")
    trust = work / "boxes.pem"
    trust.write_text("".join(pairs[name][0].read_text() for name in BOXES))
    members = [member(name, https) for name, (_http, https) in BOXES.items()]
    with ExitStack() as stack:
        folders = {
            name: stack.enter_context(box(work / name, *pairs[name], http, https, nginx_proxy_rate_per_key="1r/s",
                                          nginx_proxy_burst_per_key=1))
            for name, (http, https) in BOXES.items()
        }  # fmt: skip
        gateway = work / "gateway"
        gateway.mkdir()
        site = stack.enter_context(nginx(gateway, **gateway_variables(trust, members)))
        restarted: list[subprocess.Popen] = []
        yield {"work": work, "boxes": folders, "site": site, "pairs": pairs, "trust": trust, "restarted": restarted}
        for process in restarted:
            process.terminate()
            process.wait(10)


def test_the_gateway_balances_the_boxes_front_doors_over_verified_tls(fleet):
    site = fleet["site"]
    assert "least_conn;" in site
    for name, (_http, https) in BOXES.items():
        assert f"server 127.0.0.1:{https} max_fails=1 fail_timeout=2s;  # {name}" in site
    assert "proxy_pass https://gpubox_gateway_vllm;" in site
    assert "proxy_ssl_verify on;" in site
    assert f"proxy_ssl_trusted_certificate {fleet['trust']};" in site
    assert "proxy_ssl_name gpubox-fleet;" in site
    assert "proxy_next_upstream error timeout http_502 http_503 non_idempotent;" in site
    assert "proxy_next_upstream_tries 2;" in site
    # The fleet key goes upstream; vLLM's own key stays on the boxes.
    assert f'proxy_set_header Authorization "Bearer {FLEET_KEY}";' in site
    assert VLLM_KEY not in site
    # The same front door as a box's: streaming, keys, JSON errors.
    for line in ("proxy_buffering off;", "gzip off;", "limit_req zone=gpubox_gateway_per_key", "error_page 502"):
        assert line in site, line


def test_a_box_of_a_fleet_accepts_the_gateway_key_under_its_reserved_name_and_counts_it_in_no_limit(fleet):
    site = (fleet["boxes"]["box-a"] / "site.conf").read_text()
    assert '"~^Bearer fleet\\-key\\-9a8b7c6d5e4f3g2h$" "gpubox-gateway";' in site, site[:3000]
    assert "limit_req_zone $gpubox_limited_key zone=gpubox_per_key" in site
    assert "limit_req_zone $gpubox_limited_addr zone=gpubox_per_ip" in site
    assert "limit_conn_zone $gpubox_limited_addr zone=gpubox_conn_per_ip" in site
    assert "proxy_pass http://gpubox_vllm;" in site
    # A box outside a fleet renders as before: no gateway key, limits on the plain key and address.
    (fleet["work"] / "alone").mkdir()
    alone = render_site(fleet["work"] / "alone", nginx_proxy_http_port=18599).read_text()
    assert "gpubox-gateway" not in alone
    assert "limit_req_zone $gpubox_api_key_name zone=gpubox_per_key" in alone


def test_requests_through_the_gateway_reach_both_boxes_and_stream_unchanged(fleet):
    before = {name: gateway_requests(folder) for name, folder in fleet["boxes"].items()}
    body = {**BODY, "max_tokens": 24}

    def text(events):
        return "".join(json.loads(d)["choices"][0]["delta"].get("content") or "" for _t, d in events[:-1])

    direct = text(event_times(post(VLLM_PORT, body, key=VLLM_KEY)))
    for _request in range(6):
        events = event_times(post(GATEWAY, body))
        assert events[-1][1] == "[DONE]"
        assert text(events) == direct
    on_a = gateway_requests(fleet["boxes"]["box-a"]) - before["box-a"]
    gateway_requests(fleet["boxes"]["box-b"], at_least=before["box-b"] + 6 - on_a)  # the last lines written
    after = {name: gateway_requests(folder) for name, folder in fleet["boxes"].items()}
    served = {name: after[name] - before[name] for name in BOXES}
    assert sum(served.values()) == 6, served
    assert all(count > 0 for count in served.values()), served


def test_client_keys_are_checked_at_the_gateway_and_no_box_sees_a_request_without_one(fleet):
    before = {name: (folder / "gpubox-openai.access.log").read_text() for name, folder in fleet["boxes"].items()}
    response = post(GATEWAY, {**BODY, "stream": False}, key=None)
    assert response.status == 401
    assert json.loads(response.read())["error"]["code"] == "invalid_api_key"
    wrong = post(GATEWAY, {**BODY, "stream": False}, key=FLEET_KEY)
    assert wrong.status == 401, "the fleet key is the boxes' key, not a client key of the gateway"
    wrong.read()
    for name, folder in fleet["boxes"].items():
        assert (folder / "gpubox-openai.access.log").read_text() == before[name]


def test_the_boxes_limit_a_client_but_not_the_gateway(fleet):
    """Each box allows a client 1 request/s (burst 1); the gateway's requests, limited per client at the
    gateway, are not counted there."""
    assert complete(GATEWAY, 12) == [200] * 12
    _http, https = BOXES["box-a"]
    direct = []
    for _request in range(6):
        response = post(https, {**BODY, "max_tokens": 2, "stream": False}, tls=True)
        response.read()
        direct.append(response.status)
    assert 429 in direct, direct
    assert direct[0] == 200, direct


def test_a_box_that_goes_down_loses_no_request_and_is_used_again_when_it_returns(fleet):
    boxes = fleet["boxes"]
    stop(boxes["box-a"])
    before = gateway_requests(boxes["box-b"])
    # Streaming and not: each request that found box-a down went on to box-b before its first byte.
    assert complete(GATEWAY, 6) + complete(GATEWAY, 6, stream=True) == [200] * 12
    assert gateway_requests(boxes["box-b"], at_least=before + 12) - before == 12
    start_again(boxes["box-a"], fleet)
    time.sleep(2.5)  # the gateway's fail_timeout (2 s here): then box-a is tried again
    before = gateway_requests(boxes["box-a"])
    assert complete(GATEWAY, 8) == [200] * 8
    assert gateway_requests(boxes["box-a"], at_least=before + 1) > before


@contextmanager
def slow_and_fast(tmp_path: Path, events: int, gateway_port: int, **slow_extra):
    """A gateway on ``gateway_port`` in front of two boxes: "slow", whose upstream streams ``events`` paced events,
    and "fast", in front of the real vLLM; yields both boxes' folders. The boxes' ports follow the gateway's."""
    slow_crt, slow_key = certificate(tmp_path, "gpubox-fleet")
    (tmp_path / "b").mkdir()
    fast_crt, fast_key = certificate(tmp_path / "b", "gpubox-fleet")
    trust = tmp_path / "boxes.pem"
    trust.write_text(slow_crt.read_text() + fast_crt.read_text())
    (tmp_path / "gateway").mkdir()
    port = gateway_port
    members = [member("slow", port + 11), member("fast", port + 12)]
    with (
        paced_upstream(events=events, gap=0.05) as upstream,
        box(tmp_path / "slow", slow_crt, slow_key, port + 1, port + 11, nginx_proxy_upstreams=[f"127.0.0.1:{upstream}"],
            **slow_extra) as slow,
        box(tmp_path / "fast", fast_crt, fast_key, port + 2, port + 12) as fast,
        nginx(tmp_path / "gateway", **gateway_variables(trust, members, nginx_proxy_http_port=port)),
    ):  # fmt: skip
        yield slow, fast


def stream_on_slow(gateway_port: int) -> tuple[http.client.HTTPResponse, bytes]:
    """A stream through the gateway that landed on the slow box, and its first bytes."""
    for _try in range(4):
        response = post(gateway_port, BODY)
        first = response.read1(65536)
        if b" w0" in first:
            return response, first
        response.read()
    pytest.fail("no stream reached the slow box in 4 tries")


def test_a_stream_that_has_begun_is_never_repeated_on_another_box(vllm_server, tmp_path):
    """A box that dies mid-stream ends that stream (the client sees it cut); the gateway does not replay it."""
    with slow_and_fast(tmp_path, events=200, gateway_port=18520) as (slow, fast):
        response, first = stream_on_slow(18520)
        served_by_fast = gateway_requests(fast)
        stop(slow)
        rest = b""
        with contextlib.suppress(http.client.IncompleteRead, ValueError):  # the cut chunked body
            while chunk := response.read1(65536):
                rest += chunk
        assert b"[DONE]" not in first + rest, "the stream was cut: it must not finish elsewhere"
        assert b"w199" not in rest
        time.sleep(0.5)
        assert gateway_requests(fast) == served_by_fast, "the cut stream was sent to the other box"


def test_a_drained_box_gets_no_new_requests(fleet):
    drained = [member("box-a", BOXES["box-a"][1], drained=True), member("box-b", BOXES["box-b"][1])]
    work = fleet["work"] / "drained"
    work.mkdir()
    with nginx(work, **gateway_variables(fleet["trust"], drained, nginx_proxy_http_port=18540)) as site:
        assert f"server 127.0.0.1:{BOXES['box-a'][1]} max_fails=1 fail_timeout=2s down;  # box-a" in site
        before = {name: gateway_requests(folder) for name, folder in fleet["boxes"].items()}
        assert complete(18540, 6) == [200] * 6
        assert gateway_requests(fleet["boxes"]["box-a"]) == before["box-a"]
        assert gateway_requests(fleet["boxes"]["box-b"], at_least=before["box-b"] + 6) - before["box-b"] == 6


def test_a_box_whose_certificate_is_not_trusted_is_not_used(fleet, tmp_path):
    """The gateway trusts only the boxes' own certificates: a front door showing another is refused."""
    stranger, _key = certificate(tmp_path, "gpubox-fleet")
    with nginx(tmp_path, **gateway_variables(stranger, [member("box-a", BOXES["box-a"][1])], nginx_proxy_http_port=18541)):
        response = post(18541, {**BODY, "max_tokens": 2, "stream": False})
        assert response.status == 502
        assert json.loads(response.read())["error"]["code"] == "bad_gateway"
    log = (tmp_path / "gpubox-gateway.error.log").read_text()
    assert re.search(r"upstream SSL certificate verify error", log), log[-2000:]


def test_a_box_drained_at_its_front_door_finishes_its_streams_while_the_gateway_sends_new_ones_elsewhere(vllm_server, tmp_path):
    """A rolling re-provision drains a box with a flag file on the box, read per request (no reload): the
    gateway's new requests get a 503 before any byte and go to another box; the stream in flight finishes; a
    client of the box itself is still served; without the flag the box takes the gateway's requests again."""
    # Where Nginx's workers (nobody, under a root test run) can look, as they can in the box's /run.
    flags = Path(tempfile.mkdtemp(prefix="gpubox-drain-"))
    flags.chmod(0o755)
    flag = flags / "drained"
    with slow_and_fast(tmp_path, events=60, gateway_port=18550, _nginx_proxy_drain_flag_path=str(flag)) as (slow, fast):
        site = (slow / "site.conf").read_text()
        assert f'"gpubox-gateway" "{flag}";' in site
        response, first = stream_on_slow(18550)
        flag.write_text("")
        slow_before, fast_before = len(gateway_lines(slow)), len(gateway_lines(fast))
        # New requests through the gateway: every one answered, none by the drained box.
        assert complete(18550, 4) + complete(18550, 4, stream=True) == [200] * 8
        gateway_requests(fast, at_least=fast_before + 8)  # the last lines written
        assert len(gateway_lines(fast)) - fast_before == 8
        refused = gateway_lines(slow)[slow_before:]
        assert all('" 503 ' in line for line in refused), refused
        # The box says why, to the gateway's key only; its own clients are served.
        answer = post(18561, {**BODY, "stream": False}, key=FLEET_KEY, tls=True)
        assert answer.status == 503
        assert json.loads(answer.read())["error"]["code"] == "draining"
        direct = post(18561, BODY, tls=True)
        assert direct.status == 200
        assert direct.read().rstrip().endswith(b"data: [DONE]")
        # The stream in flight when the box was drained ends whole.
        rest = first + response.read()
        assert b"w59" in rest, rest[-300:]
        assert rest.rstrip().endswith(b"data: [DONE]"), rest[-300:]
        # Back in rotation: once the flag is gone and the gateway's fail_timeout (2 s) has passed.
        flag.unlink()
        time.sleep(2.5)
        slow_before = len(gateway_lines(slow))
        assert complete(18550, 6) == [200] * 6
        assert any('" 200 ' in line for line in gateway_lines(slow)[slow_before:]), gateway_lines(slow)[slow_before:]
    shutil.rmtree(flags)


def test_boxes_put_back_one_at_a_time_wait_for_the_gateway_between_them_and_print_nothing_into_json(tmp_path):
    """put_back.yml as site.yml's vLLM play runs it (serial: 1): the flag removed; the wait for the gateway's
    fail_timeout after each box but the last; silent, so that a run with the json callback stays one JSON document."""
    hosts = {}
    for name in ("box-1", "box-2"):
        flag = tmp_path / f"{name}.drained"
        flag.write_text("")
        hosts[name] = {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "nginx_proxy_endpoint": {"drain_flag": str(flag)},
        }
    inventory = {
        "all": {
            "children": {
                "gpu_boxes": {"hosts": hosts},
                "gpu_gateways": {"hosts": {"gateway": {"nginx_proxy_gateway_fail_timeout": 3}}},
            }
        }
    }
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    play = [{
        "hosts": "gpu_boxes", "serial": 1, "gather_facts": False,
        "tasks": [{"ansible.builtin.include_role": {"name": "gpubox.inference.nginx_proxy", "tasks_from": "put_back.yml"}}],
    }]  # fmt: skip
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    result, run = run_playbook_json("-i", str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert run is not None, f"standard output is not one JSON document: {result.stdout[-1500:]}"
    waits = {
        host: outcome
        for play in run["plays"]
        for task in play["tasks"]
        if task["task"]["name"].endswith("Wait until the gateway tries the box again, before the next box is drained")
        for host, outcome in task["hosts"].items()
    }
    assert not waits["box-1"].get("skipped"), waits
    assert waits["box-1"]["elapsed"] >= 3, waits
    assert waits["box-2"].get("skipped"), "the last box has no next box to wait for"
    assert not any(Path(host["nginx_proxy_endpoint"]["drain_flag"]).exists() for host in hosts.values())
