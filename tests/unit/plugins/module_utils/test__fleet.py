"""The fleet behind one gateway: members from the boxes' stored records, the reasons for the rest, the refusals."""

from __future__ import annotations

import pytest

from ansible_collections.gpubox.inference.plugins.module_utils import _fleet


def box(name: str, model: str | None = "llama", url: str | None = None, tls: bool = True, address: str = "") -> dict:
    deployment = {"served_model_name": model} if model else None
    endpoint = {"url": url or f"https://{name}.lan:443/v1", "tls": tls, "certificate": f"/etc/{name}.crt"}
    return {"name": name, "address": address or f"10.0.0.{len(name)}", "deployment": deployment, "endpoint": endpoint}


def test_every_box_serving_the_one_model_is_a_member_reached_at_its_address_and_front_door_port():
    fleet = _fleet.members([box("a", address="10.0.0.1"), box("bb", url="https://bb.lan:8443/v1", address="10.0.0.2")])
    assert fleet["refusal"] is None
    assert fleet["model"] == "llama"
    assert fleet["members"] == [
        {"name": "a", "upstream": "10.0.0.1:443", "port": 443, "drained": False, "certificate": "/etc/a.crt"},
        {"name": "bb", "upstream": "10.0.0.2:8443", "port": 8443, "drained": False, "certificate": "/etc/bb.crt"},
    ]
    assert fleet["left_out"] == []


def test_an_ipv6_address_is_bracketed_and_a_name_is_kept():
    assert _fleet.upstream_address("fd00::2", 443) == "[fd00::2]:443"
    assert _fleet.upstream_address("box.lan", 443) == "box.lan:443"
    assert _fleet.upstream_address("10.1.2.3", 8443) == "10.1.2.3:8443"


def test_boxes_without_a_deployment_a_front_door_or_tls_are_left_out_with_their_reason():
    old = box("f")
    del old["endpoint"]["certificate"]
    boxes = [box("a"), box("b", model=None), {**box("c"), "endpoint": None}, box("d", tls=False),
             box("e", url="https://e.lan:443/v1"), old]  # fmt: skip
    fleet = _fleet.members(boxes)
    assert [m["name"] for m in fleet["members"]] == ["a", "e"]
    assert fleet["left_out"] == [
        {"name": "b", "reason": "not_deployed"},
        {"name": "c", "reason": "no_front_door"},
        {"name": "d", "reason": "no_tls"},
        {"name": "f", "reason": "no_certificate"},
    ]
    assert "f left out: its front door's record names no certificate" in _fleet.fleet_lines(fleet)[0]
    lines = _fleet.fleet_lines(fleet)
    assert "d left out: its front door is plain HTTP" in lines[0]
    assert "nginx_proxy_tls: true" in lines[0]


def test_boxes_serving_different_models_are_refused_unless_one_is_chosen():
    boxes = [box("a"), box("b", model="qwen"), box("c")]
    refused = _fleet.members(boxes)
    assert refused["refusal"] == {"code": "models_differ", "models": {"a": "llama", "b": "qwen", "c": "llama"}}
    assert refused["members"] == []
    words = _fleet.refusal_words(refused)
    assert "a serves 'llama', b serves 'qwen', c serves 'llama'" in words
    assert "nginx_proxy_gateway_model" in words
    chosen = _fleet.members(boxes, model="llama")
    assert chosen["refusal"] is None
    assert [m["name"] for m in chosen["members"]] == ["a", "c"]
    assert chosen["left_out"] == [{"name": "b", "reason": "other_model"}]


@pytest.mark.parametrize(
    ("boxes", "model", "words"),
    [
        ([], "", "no box serves a model through a TLS front door"),
        ([box("a", tls=False)], "", "no box serves a model through a TLS front door (a: its front door is plain HTTP"),
        ([box("a")], "qwen", "no box serves model 'qwen' through a TLS front door (a: it serves another model)"),
    ],
    ids=["no-box", "no-tls", "no-box-serves-the-chosen-model"],
)
def test_a_gateway_with_no_member_is_refused_naming_why(boxes, model, words):
    fleet = _fleet.members(boxes, model=model)
    assert fleet["refusal"]["code"] == "no_member"
    assert _fleet.refusal_words(fleet).startswith(words), _fleet.refusal_words(fleet)


def test_a_drained_box_stays_an_upstream_marked_drained_but_not_every_box_at_once():
    fleet = _fleet.members([box("a"), box("b")], drained=["b"])
    assert fleet["refusal"] is None
    assert [(m["name"], m["drained"]) for m in fleet["members"]] == [("a", False), ("b", True)]
    assert "b (10.0.0.1:443) drained (finishing its streams, no new requests)" in _fleet.fleet_lines(fleet)[0]
    everyone = _fleet.members([box("a"), box("b")], drained=["a", "b"])
    assert everyone["refusal"] == {"code": "all_drained", "model": "llama"}
    assert "drain one at a time" in _fleet.refusal_words(everyone)


def test_the_fleet_lines_say_each_boxs_state_as_the_gateway_saw_it():
    fleet = _fleet.members([box("a"), box("b"), box("c"), box("d", model="qwen")], model="llama")
    (line,) = _fleet.fleet_lines(fleet, answers={"a": 200, "b": 0, "c": 401})
    assert line.startswith("Fleet: 'llama' balanced over 3 box(es): ")
    assert "a (10.0.0.1:443) in rotation, answering" in line
    assert "b (10.0.0.1:443) in rotation, NOT answering (no connection)" in line
    assert "c (10.0.0.1:443) in rotation, NOT answering (HTTP 401)" in line
    assert "d left out: it serves another model" in line
    assert _fleet.fleet_lines({"members": [], "left_out": []}) == []


def test_a_front_door_url_that_is_not_one_counts_as_no_front_door():
    for url in ("ftp://a/v1", "https:///v1", "https://a:notaport/v1"):
        fleet = _fleet.members([box("a", url=url)])
        assert fleet["left_out"] == [{"name": "a", "reason": "no_front_door"}], url


def test_in_flight_counts_running_and_waiting_requests_over_every_engine():
    # The shape of vLLM 0.x's /metrics (two engines of a data-parallel server, HELP/TYPE lines, _created samples).
    text = (
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="tiny"} 2.0\n'
        'vllm:num_requests_running{engine="1",model_name="tiny"} 1.0\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0",model_name="tiny"} 3.0\n'
        'vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 9.0\n'
        'vllm:generation_tokens_total{engine="0",model_name="tiny"} 120.0\n'
    )
    assert _fleet.in_flight(text) == 6
    idle = text.replace("} 2.0", "} 0.0").replace("} 1.0", "} 0.0").replace("} 3.0", "} 0.0")
    assert _fleet.in_flight(idle) == 0


def test_in_flight_is_unknown_where_the_text_does_not_say():
    assert _fleet.in_flight("") is None
    assert _fleet.in_flight("# HELP http_requests_total x\nhttp_requests_total 4\n") is None
    assert _fleet.in_flight('vllm:num_requests_running{engine="0"} NaN\n') is None
