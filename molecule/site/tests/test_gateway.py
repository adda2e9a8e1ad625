"""The fleet's gateway that site.yml puts up on its own host, in front of the two boxes' TLS front doors: what it
renders, a box stopped under it, and the rolling re-provision of both boxes under load (side_effect.yml)."""

from __future__ import annotations

import json
import os
import shlex
import time
from pathlib import Path

import testinfra

testinfra_hosts = ["gpubox-gateway"]

CLIENT_KEY = "molecule-key-0123456789abcdef"
BOX = "gpubox-debian12"
BOXES = (BOX, "gpubox-debian12-b")
EPHEMERAL = Path(os.environ.get("MOLECULE_EPHEMERAL_DIRECTORY", "."))

# From the gateway host itself (it has Python, not curl): a request through its own front door.
ASK = """
import json, ssl, sys, urllib.error, urllib.request
context = ssl.create_default_context(cafile="/etc/nginx/gpubox-tls/selfsigned.crt")
path, key, body = sys.argv[1], sys.argv[2], sys.argv[3]
headers = {"Content-Type": "application/json", **({"Authorization": "Bearer " + key} if key else {})}
request = urllib.request.Request("https://127.0.0.1" + path, data=body.encode() or None, headers=headers)
try:
    response = urllib.request.urlopen(request, timeout=60, context=context)
except urllib.error.HTTPError as error:
    response = error
print(json.dumps({"status": response.status, "body": response.read().decode()}))
"""


# The names in the certificate the gateway trusts.
NAMES = "import ssl; print(ssl._ssl._test_decode_cert('/etc/nginx/gpubox-gateway/boxes.pem')['subjectAltName'])"


def ask(host, path: str, key: str = CLIENT_KEY, body: dict | None = None) -> dict:
    argv = " ".join(shlex.quote(arg) for arg in (path, key, json.dumps(body) if body else ""))
    return json.loads(host.check_output(f"python3 -c {shlex.quote(ASK)} {argv}"))


def box(name: str = BOX):
    return testinfra.get_host(f"ansible://{name}?ansible_inventory={os.environ['MOLECULE_INVENTORY_FILE']}")


def gateway_requests_on(name: str) -> int:
    log = box(name).file("/var/log/nginx/gpubox-openai.access.log").content_string
    return sum('key="gpubox-gateway"' in line for line in log.splitlines())


def gateway_requests_on_the_boxes() -> int:
    return sum(gateway_requests_on(name) for name in BOXES)


CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "stream": True}


def streamed_whole(answer: dict) -> bool:
    return answer["status"] == 200 and answer["body"].rstrip().endswith("data: [DONE]")


def test_the_gateway_site_balances_the_box_over_tls(host):
    assert host.run("nginx -t").rc == 0
    assert host.service("nginx").is_running
    assert host.socket("tcp://0.0.0.0:443").is_listening
    site = host.file("/etc/nginx/conf.d/gpubox-gateway.conf")
    assert (site.user, site.mode) == ("root", 0o640)
    text = site.content_string
    for name in BOXES:
        assert f"server {name}:443 max_fails=1 fail_timeout=10s;  # {name}" in text
    assert "proxy_ssl_verify on;" in text
    assert "proxy_ssl_name gpubox-fleet;" in text
    # No box of its own here: the gateway's Nginx serves the stub_status.
    assert "stub_status;" in text


def test_the_gateway_trusts_exactly_the_boxes_certificates(host):
    trusted = host.file("/etc/nginx/gpubox-gateway/boxes.pem").content_string
    own = [box(name).file("/etc/nginx/gpubox-tls/selfsigned.crt").content_string.strip() for name in BOXES]
    assert len(set(own)) == 2
    # The boxes' certificates in the inventory's order, nothing else (whitespace between them aside).
    assert trusted.count("BEGIN CERTIFICATE") == 2
    assert "".join(trusted.split()) == "".join("".join(own).split())
    names = host.check_output("python3 -c " + shlex.quote(NAMES))
    assert "('DNS', 'gpubox-fleet')" in names


def test_requests_through_the_gateway_reach_both_boxes_with_the_fleet_key(host):
    before = {name: gateway_requests_on(name) for name in BOXES}
    models = ask(host, "/v1/models")
    assert models["status"] == 200, models
    assert [model["id"] for model in json.loads(models["body"])["data"]] == ["tiny"]
    for _stream in range(5):
        streamed = ask(host, "/v1/chat/completions", body=CHAT)
        assert streamed_whole(streamed), streamed
    after = {name: gateway_requests_on(name) for name in BOXES}
    assert sum(after.values()) == sum(before.values()) + 6
    # Least connections over two idle boxes takes turns: both served.
    assert all(after[name] > before[name] for name in BOXES), (before, after)


def test_the_gateway_checks_client_keys_itself(host):
    before = gateway_requests_on_the_boxes()
    for key in ("", "molecule-fleet-key-9876543210"):  # none, and the boxes' key, which is no client key
        refused = ask(host, "/v1/models", key=key)
        assert refused["status"] == 401, refused
        assert json.loads(refused["body"])["error"]["code"] == "invalid_api_key"
    assert gateway_requests_on_the_boxes() == before


def test_the_gateway_records_its_members(host):
    record = json.loads(host.file("/var/lib/gpubox/gateway.json").content_string)
    assert record["model"] == "tiny"
    assert [(m["name"], m["upstream"], m["drained"]) for m in record["members"]] == [(n, f"{n}:443", False) for n in BOXES]
    assert record["left_out"] == []
    assert record["url"] == "https://gpubox-gateway:443/v1"


def test_the_summary_shows_the_fleet():
    run = json.loads((Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "swap-run.json").read_text())
    assert run["stats"]["gpubox-gateway"]["failures"] == 0
    (task,) = [
        task
        for play in run["plays"]
        for task in play["tasks"]
        if task["task"]["name"].endswith("Say what was found, what was decided and why, and what was measured")
    ]
    lines = task["hosts"]["gpubox-gateway"]["msg"]
    assert lines[0] == "gpubox-gateway:"
    assert "Gateway: https://gpubox-gateway:443/v1 (OpenAI-compatible; API key required), in front of the fleet" in lines
    members = "; ".join(f"{name} ({name}:443) in rotation, answering" for name in BOXES)
    assert f"Fleet: 'tiny' balanced over 2 box(es): {members}" in lines
    assert any(line.startswith("Smoke test: 4/4 streams OK") for line in lines), lines


def test_a_stopped_box_loses_no_request_and_is_used_again_once_back(host):
    """The second box's vLLM stopped: its front door fails the gateway's requests before any byte (502), which the
    gateway passes to the first box; started again, it takes requests again once fail_timeout (10 s) has passed."""
    other = box(BOXES[1])
    log_path = "/var/log/nginx/gpubox-openai.access.log"
    seen = len(other.file(log_path).content_string.splitlines())
    other.check_output("docker compose --project-name gpubox-vllm stop vllm")
    try:
        answers = [ask(host, "/v1/chat/completions", body=CHAT) for _stream in range(6)]
        failed_there = [line for line in other.file(log_path).content_string.splitlines()[seen:] if '" 502 ' in line]
    finally:
        other.check_output("docker compose --project-name gpubox-vllm start vllm")
    assert all(streamed_whole(answer) for answer in answers), answers
    # Some went to the stopped box and failed there, before any byte: the gateway gave them to the other.
    assert failed_there, "no request reached the stopped box"
    served = gateway_requests_on(BOXES[1])
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and gateway_requests_on(BOXES[1]) == served:
        answer = ask(host, "/v1/chat/completions", body=CHAT)
        assert streamed_whole(answer), answer
        time.sleep(2)
    # The box's log counts what reached it; a request it answered 502 while its server started is counted too, so
    # the box must also have answered one whole.
    assert gateway_requests_on(BOXES[1]) > served
    log = other.file(log_path).content_string.splitlines()
    assert any('key="gpubox-gateway"' in line and '"POST /v1/chat/completions' in line and " 200 " in line for line in log[-5:])


DRAIN_TASK = "Take the box out of the fleet's rotation (its front door refuses the gateway's new requests)"


def test_a_rolling_re_provision_of_both_boxes_drops_no_stream():
    """side_effect.yml swapped a GPU on both boxes and ran site.yml while a load streamed through the gateway without
    a pause: each box was drained, recreated and put back in turn, and every stream of the load finished whole."""
    run = json.loads((EPHEMERAL / "swap-run.json").read_text())
    drained = {
        name
        for play in run["plays"]
        for task in play["tasks"]
        if task["task"]["name"].endswith(DRAIN_TASK)
        for name, result in task["hosts"].items()
        if result.get("changed")
    }
    assert drained == set(BOXES)
    load = [json.loads(line) for line in (EPHEMERAL / "load.jsonl").read_text().splitlines()]
    broken = [record for record in load if record["status"] != 200 or not record["done"]]
    assert broken == [], broken[:5]
    # Streams all through the run, not a handful before it.
    assert len(load) >= 30, len(load)
