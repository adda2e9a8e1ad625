"""The fleet's gateway that site.yml puts up on its own host, in front of the box's TLS front door."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import testinfra

testinfra_hosts = ["gpubox-gateway"]

CLIENT_KEY = "molecule-key-0123456789abcdef"
BOX = "gpubox-debian12"

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


def box():
    return testinfra.get_host(f"ansible://{BOX}?ansible_inventory={os.environ['MOLECULE_INVENTORY_FILE']}")


def gateway_requests_on_the_box() -> int:
    log = box().file("/var/log/nginx/gpubox-openai.access.log").content_string
    return sum('key="gpubox-gateway"' in line for line in log.splitlines())


def test_the_gateway_site_balances_the_box_over_tls(host):
    assert host.run("nginx -t").rc == 0
    assert host.service("nginx").is_running
    assert host.socket("tcp://0.0.0.0:443").is_listening
    site = host.file("/etc/nginx/conf.d/gpubox-gateway.conf")
    assert (site.user, site.mode) == ("root", 0o640)
    text = site.content_string
    assert f"server {BOX}:443 max_fails=1 fail_timeout=10s;  # {BOX}" in text
    assert "proxy_ssl_verify on;" in text
    assert "proxy_ssl_name gpubox-fleet;" in text
    # No box of its own here: the gateway's Nginx serves the stub_status.
    assert "stub_status;" in text


def test_the_gateway_trusts_exactly_the_boxs_certificate(host):
    trusted = host.file("/etc/nginx/gpubox-gateway/boxes.pem").content_string
    assert trusted.strip() == box().file("/etc/nginx/gpubox-tls/selfsigned.crt").content_string.strip()
    names = host.check_output("python3 -c " + shlex.quote(NAMES))
    assert "('DNS', 'gpubox-fleet')" in names


def test_requests_through_the_gateway_reach_the_box_with_the_fleet_key(host):
    before = gateway_requests_on_the_box()
    models = ask(host, "/v1/models")
    assert models["status"] == 200, models
    assert [model["id"] for model in json.loads(models["body"])["data"]] == ["tiny"]
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "stream": True}
    streamed = ask(host, "/v1/chat/completions", body=chat)
    assert streamed["status"] == 200, streamed
    assert streamed["body"].rstrip().endswith("data: [DONE]")
    assert gateway_requests_on_the_box() == before + 2


def test_the_gateway_checks_client_keys_itself(host):
    before = gateway_requests_on_the_box()
    for key in ("", "molecule-fleet-key-9876543210"):  # none, and the boxes' key, which is no client key
        refused = ask(host, "/v1/models", key=key)
        assert refused["status"] == 401, refused
        assert json.loads(refused["body"])["error"]["code"] == "invalid_api_key"
    assert gateway_requests_on_the_box() == before


def test_the_gateway_records_its_members(host):
    record = json.loads(host.file("/var/lib/gpubox/gateway.json").content_string)
    assert record["model"] == "tiny"
    assert [(m["name"], m["upstream"], m["drained"]) for m in record["members"]] == [(BOX, f"{BOX}:443", False)]
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
    assert f"Fleet: 'tiny' balanced over 1 box(es): {BOX} ({BOX}:443) in rotation, answering" in lines
    assert any(line.startswith("Smoke test: 4/4 streams OK") for line in lines), lines
