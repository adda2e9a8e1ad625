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


def test_only_settings_docker_reads_again_on_a_reload_spare_a_restart():
    from ansible_collections.gpubox.inference.plugins.module_utils._daemon_json import restart_needed

    base = {"log-driver": "local", "log-opts": {"max-size": "20m"}}
    nvidia = {"runtimes": {"nvidia": {"path": "nvidia-container-runtime", "args": []}}}
    assert restart_needed(base, base) is False
    assert restart_needed(base, {**base, "live-restore": True}) is False
    assert restart_needed(base, {**base, **nvidia, "default-runtime": "nvidia"}) is False
    assert restart_needed({**base, "live-restore": True}, {**base, "live-restore": False}) is False
    # The logging driver, its options, storage and networking are read at start only.
    assert restart_needed(base, {**base, "log-opts": {"max-size": "50m"}}) is True
    assert restart_needed({}, {**base, "live-restore": True}) is True
    assert restart_needed({**base, "bip": "10.9.0.1/24"}, base) is True
