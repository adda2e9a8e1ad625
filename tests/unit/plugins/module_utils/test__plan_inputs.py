"""_plan_inputs: what the vllm role's plan reads from the box, from text and file listings to data."""

from __future__ import annotations

import re

import pytest

from ansible_collections.gpubox.inference.plugins.module_utils import _plan_inputs


def test_a_record_that_is_not_there_was_never_stored():
    assert _plan_inputs.record("/var/lib/gpubox/gate.json", None) == {}


def test_a_stored_record_is_its_json_object():
    assert _plan_inputs.record("/var/lib/gpubox/vllm.json", '{"gate_step": "reference", "tp": 2}\n') == {
        "gate_step": "reference",
        "tp": 2,
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "/var/lib/gpubox/vllm.json: it is not valid JSON (Expecting value: line 1 column 1 (char 0))"),
        ('{"gate_step": "refer', "/var/lib/gpubox/vllm.json: it is not valid JSON (Unterminated string"),
        ("[1, 2]", "/var/lib/gpubox/vllm.json: it holds a JSON list, not an object"),
        ("null", "/var/lib/gpubox/vllm.json: it holds a JSON NoneType, not an object"),
    ],
)
def test_a_damaged_record_is_an_error_naming_the_file_never_an_empty_one(text, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        _plan_inputs.record("/var/lib/gpubox/vllm.json", text)


def test_a_model_folder_without_config_json_reads_as_empty_and_a_broken_one_is_refused():
    assert _plan_inputs.record("/srv/models/m/config.json", None) == {}
    assert _plan_inputs.record("/srv/models/m/config.json", '{"architectures": ["X"]}') == {"architectures": ["X"]}
    with pytest.raises(ValueError, match=r"^/srv/models/m/config.json: it is not valid JSON"):
        _plan_inputs.record("/srv/models/m/config.json", "{")


def test_only_the_weight_files_count_towards_the_weights():
    files = [
        ("model-00001-of-00002.safetensors", 4_000_000_000),
        ("model-00002-of-00002.safetensors", 1_500_000_000),
        ("pytorch_model.bin", 7),
        ("config.json", 700),
        ("tokenizer.json", 9_000_000),
        ("model.safetensors.index.json", 30_000),
    ]
    assert _plan_inputs.weights_bytes(files) == 5_500_000_007
    assert _plan_inputs.weights_bytes([]) == 0
