"""vllm_state_info run as Ansible runs it, on a scratch model folder and scratch records."""

from __future__ import annotations

import json
import os
from pathlib import Path

from conftest import run_module


def model_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "models" / "tiny"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "num_attention_heads": 4}))
    (folder / "model.safetensors").write_bytes(b"w" * 1000)
    (folder / "tokenizer.json").write_bytes(b"t" * 50)
    return folder


def test_the_model_folder_the_records_the_cpus_and_the_paths_in_one_run(tmp_path: Path):
    folder = model_folder(tmp_path)
    # A folder of links into a cache (as a Hugging Face snapshot is): the linked files are the weights.
    blob = tmp_path / "blobs" / "abc"
    blob.parent.mkdir()
    blob.write_bytes(b"x" * 24)
    os.symlink(blob, folder / "extra.bin")
    stored = tmp_path / "vllm.json"
    stored.write_text('{"gate_step": "reference"}\n')
    there = tmp_path / "gpubox-vllm-watchdog.timer"
    there.write_text("[Timer]\n")
    result = run_module(
        "vllm_state_info",
        {
            "model_dir": str(folder),
            "records": {"previous": str(stored), "gate_store": str(tmp_path / "gate.json")},
            "paths": [str(tmp_path / "not-there"), str(there)],
        },
    )
    assert result["changed"] is False
    assert result["model"] == {
        "exists": True,
        "config": {"architectures": ["LlamaForCausalLM"], "num_attention_heads": 4},
        "weights_bytes": 1024,
    }
    assert result["records"] == {"previous": {"gate_step": "reference"}, "gate_store": {}}
    assert result["cpu_count"] == len(os.sched_getaffinity(0))
    assert result["existing"] == [str(there)]


def test_check_mode_reads_the_same(tmp_path: Path):
    folder = model_folder(tmp_path)
    result = run_module("vllm_state_info", {"model_dir": str(folder)}, check=True)
    assert result["model"]["weights_bytes"] == 1000
    assert result["records"] == {}
    assert result["existing"] == []


def test_a_model_from_the_hub_reads_no_folder_and_a_missing_folder_says_so(tmp_path: Path):
    assert run_module("vllm_state_info", {})["model"] == {}
    missing = run_module("vllm_state_info", {"model_dir": str(tmp_path / "nope")})
    assert missing["model"] == {"exists": False, "config": {}, "weights_bytes": 0}


def test_a_folder_without_config_json_reads_an_empty_config(tmp_path: Path):
    folder = model_folder(tmp_path)
    (folder / "config.json").unlink()
    assert run_module("vllm_state_info", {"model_dir": str(folder)})["model"]["config"] == {}


def test_a_damaged_record_fails_naming_it_and_the_file(tmp_path: Path):
    stored = tmp_path / "gate.json"
    stored.write_text('{"key": ')
    result = run_module("vllm_state_info", {"records": {"gate_store": str(stored)}})
    assert result["failed"] is True
    assert result["msg"].startswith(f"the stored record 'gate_store': {stored}: it is not valid JSON (")
    assert result["msg"].endswith("; remove the file to start over")


def test_a_model_whose_config_json_is_damaged_is_refused(tmp_path: Path):
    folder = model_folder(tmp_path)
    (folder / "config.json").write_text("{")
    result = run_module("vllm_state_info", {"model_dir": str(folder)})
    assert result["failed"] is True
    assert result["msg"].startswith(f"the model's {folder}/config.json: it is not valid JSON (")
