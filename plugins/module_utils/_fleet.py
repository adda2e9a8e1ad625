# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Private: the fleet behind one gateway: which boxes it balances, and why the others are left out.

Pure functions, data in and data out, no Ansible imports. The gateway reads what each box stored of its
own last deploy (its vLLM deployment and its front door's endpoint, both under /var/lib/gpubox), so a run
limited to the gateway balances exactly the boxes a full run would.

A box is a member when it serves the gateway's model through its own TLS front door. Everything else is
left out with a reason code (``LEFT_OUT``), which the summary renders in words; a gateway with no member,
or with boxes that serve different models and no model chosen, is refused before anything changes.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from ansible_collections.gpubox.inference.plugins.module_utils._watchdog import metric_sum

# Why a box is not among the gateway's upstreams.
LEFT_OUT = {
    "not_deployed": "no vLLM deployment stored on the box (site.yml has not deployed it yet)",
    "no_front_door": "no front door stored on the box (set nginx_proxy_api_keys for it)",
    "no_tls": "its front door is plain HTTP; the fleet key only travels over TLS (set nginx_proxy_tls: true)",
    "no_certificate": "its front door's record names no certificate (written before fleets: run site.yml on the box)",
    "other_model": "it serves another model",
}
# A vLLM server's requests in flight: being generated, and queued for the engine.
IN_FLIGHT_METRICS = ("vllm:num_requests_running", "vllm:num_requests_waiting")


def _host_port(url: str) -> tuple[str, int] | None:
    parts = urlsplit(url or "")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    return parts.hostname, port


def upstream_address(host: str, port: int) -> str:
    """``host:port`` as Nginx's ``server`` takes it (an IPv6 address in brackets)."""
    try:
        if ipaddress.ip_address(host).version == 6:
            return f"[{host}]:{port}"
    except ValueError:
        pass
    return f"{host}:{port}"


def members(boxes: list[dict], model: str = "", drained: list[str] | tuple = ()) -> dict:
    """The gateway's upstreams from the boxes' stored records.

    ``boxes``: in inventory order, ``{"name", "address", "deployment": vllm.json or None, "endpoint":
    proxy.json or None}``; ``address`` is how the gateway reaches the box (its ``ansible_host``).
    ``model``: the served model name to balance; empty for the one every deployed box serves.
    ``drained``: box names kept in the upstream list but marked down (no new requests).
    A member's ``certificate`` is the path on the box of the certificate its front door shows (the gateway trusts it).

    Returns ``{"model", "members": [{"name", "upstream", "port", "drained", "certificate"}], "left_out": [{"name",
    "reason"}], "refusal": None | {"code", "models"?: {name: model}}}``.
    """
    serving = {}
    left_out = []
    for box in boxes:
        deployment, endpoint = box.get("deployment") or {}, box.get("endpoint") or {}
        if not deployment.get("served_model_name"):
            left_out.append({"name": box["name"], "reason": "not_deployed"})
        elif not _host_port(endpoint.get("url", "")):
            left_out.append({"name": box["name"], "reason": "no_front_door"})
        elif not endpoint.get("tls"):
            left_out.append({"name": box["name"], "reason": "no_tls"})
        elif not endpoint.get("certificate"):
            left_out.append({"name": box["name"], "reason": "no_certificate"})
        else:
            serving[box["name"]] = box
    served = {name: box["deployment"]["served_model_name"] for name, box in serving.items()}
    chosen = model
    if not chosen:
        distinct = sorted(set(served.values()))
        if len(distinct) > 1:
            return {"model": "", "members": [], "left_out": left_out, "refusal": {"code": "models_differ", "models": served}}
        chosen = distinct[0] if distinct else ""
    result = []
    for name, box in serving.items():
        if served[name] != chosen:
            left_out.append({"name": name, "reason": "other_model"})
            continue
        _url_host, port = _host_port(box["endpoint"]["url"])
        result.append({
            "name": name,
            "upstream": upstream_address(box.get("address") or name, port),
            "port": port,
            "drained": name in drained,
            "certificate": box["endpoint"]["certificate"],
        })  # fmt: skip
    refusal = None
    if not result:
        refusal = {"code": "no_member", "model": chosen}
    elif all(member["drained"] for member in result):
        refusal = {"code": "all_drained", "model": chosen}
    order = [box["name"] for box in boxes]
    left_out.sort(key=lambda entry: order.index(entry["name"]))
    return {"model": chosen, "members": result, "left_out": left_out, "refusal": refusal}


def in_flight(metrics_text: str) -> int | None:
    """The requests a vLLM server is generating or has queued, from its /metrics text; None when it does not say.

    A box being drained for a rolling re-provision waits for this to reach 0 on every server before its server is
    restarted, so that the streams in flight finish.
    """
    total = metric_sum(metrics_text or "", IN_FLIGHT_METRICS)
    return None if total is None else int(total)


def refusal_words(fleet: dict) -> str:
    """The refusal of ``members`` in words, naming the boxes and the variable that decides."""
    refusal = fleet.get("refusal") or {}
    code = refusal.get("code")
    if code == "models_differ":
        listed = ", ".join(f"{name} serves {model!r}" for name, model in refusal["models"].items())
        return f"the boxes serve different models ({listed}): set nginx_proxy_gateway_model to the one to balance"
    left = "; ".join(f"{entry['name']}: {LEFT_OUT[entry['reason']]}" for entry in fleet.get("left_out") or [])
    if code == "no_member":
        which = f"model {refusal['model']!r}" if refusal.get("model") else "a model"
        return f"no box serves {which} through a TLS front door" + (f" ({left})" if left else "")
    if code == "all_drained":
        return "every box serving the model would be drained at once: drain one at a time"
    return ""


def fleet_lines(fleet: dict, answers: dict | None = None) -> list[str]:
    """The summary's fleet lines: each box, its model, its state in the gateway.

    ``answers``: box name -> the HTTP status its front door gave the gateway's key on /v1/models (0: no answer).
    """
    answers = answers or {}
    parts = []
    for member in fleet.get("members") or []:
        if member["drained"]:
            state = "drained (finishing its streams, no new requests)"
        elif member["name"] not in answers:
            state = "in rotation"
        elif answers[member["name"]] == 200:
            state = "in rotation, answering"
        else:
            code = answers[member["name"]]
            state = f"in rotation, NOT answering ({f'HTTP {code}' if code else 'no connection'}); Nginx skips it while it fails"
        parts.append(f"{member['name']} ({member['upstream']}) {state}")
    parts += [f"{entry['name']} left out: {LEFT_OUT[entry['reason']]}" for entry in fleet.get("left_out") or []]
    if not parts:
        return []
    return [f"Fleet: {fleet.get('model')!r} balanced over {len(fleet.get('members') or [])} box(es): " + "; ".join(parts)]
