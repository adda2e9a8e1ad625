"""_daemon_json: merge without dropping anyone's keys."""

from __future__ import annotations

import pytest

from ansible_collections.gpubox.inference.plugins.module_utils._daemon_json import DaemonJsonError, merge, parse, render


def test_merge_keeps_unrelated_keys_and_recurses():
    current = {"log-level": "warn", "runtimes": {"crun": {"path": "/usr/bin/crun"}}}
    merged = merge(current, {"runtimes": {"nvidia": {"path": "nvidia-container-runtime", "args": []}}})
    assert merged == {
        "log-level": "warn",
        "runtimes": {"crun": {"path": "/usr/bin/crun"}, "nvidia": {"path": "nvidia-container-runtime", "args": []}},
    }
    assert current == {"log-level": "warn", "runtimes": {"crun": {"path": "/usr/bin/crun"}}}, "input left alone"


def test_merge_replaces_scalars_and_lists():
    assert merge({"a": 1, "b": [1]}, {"a": 2, "b": [2]}) == {"a": 2, "b": [2]}


@pytest.mark.parametrize(("text", "parsed"), [(None, {}), ("", {}), ("  \n", {}), ('{"a": 1}', {"a": 1})])
def test_parse(text, parsed):
    assert parse(text) == parsed


@pytest.mark.parametrize(("text", "message"), [("{oops", "not valid JSON"), ("[1]", "holds a JSON list, not an object")])
def test_parse_refuses_what_it_cannot_merge_into(text, message):
    with pytest.raises(DaemonJsonError, match=message):
        parse(text)


def test_render_is_stable():
    assert render({"b": 1, "a": {"d": 2, "c": 3}}) == '{\n  "a": {\n    "c": 3,\n    "d": 2\n  },\n  "b": 1\n}\n'
