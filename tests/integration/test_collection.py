"""The collection as users and Galaxy see it: it resolves from the checkout, builds clean, documents every module."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
import yaml
from conftest import ROOT
from conftest import run_ansible as ansible

MODULES = sorted(p.stem for p in (ROOT / "plugins" / "modules").glob("*.py") if not p.name.startswith("_"))


def test_collection_resolves_from_the_checkout():
    result = ansible("ansible-galaxy", "collection", "list", "gpubox.inference", "--format", "json")
    assert result.returncode == 0, result.stderr
    found = {path: cols for path, cols in json.loads(result.stdout).items() if "gpubox.inference" in cols}
    assert found, result.stdout
    (path,) = found
    assert Path(path).resolve() == (ROOT / ".collections" / "ansible_collections").resolve()
    galaxy = yaml.safe_load((ROOT / "galaxy.yml").read_text())
    assert found[path]["gpubox.inference"]["version"] == galaxy["version"]


def test_site_yml_provisions_gpu_box_from_the_example_inventory():
    inventory = json.loads(ansible("ansible-inventory", "--list").stdout)
    assert "gpu-box" in inventory["gpu_boxes"]["hosts"]
    assert inventory["_meta"]["hostvars"]["gpu-box"]["ansible_connection"] == "local"
    result = ansible("ansible-playbook", "site.yml", "-l", "gpu-box", "--list-hosts", "--list-tasks")
    assert result.returncode == 0, result.stderr
    assert "gpu-box" in result.stdout
    assert "gpubox.inference.base : Install the base packages" in result.stdout


def test_ansible_doc_lists_exactly_the_modules_in_plugins():
    result = ansible("ansible-doc", "--list", "--json", "--type", "module", "gpubox.inference")
    assert result.returncode == 0, result.stderr
    listed = sorted(name.removeprefix("gpubox.inference.") for name in json.loads(result.stdout))
    assert listed == MODULES


@pytest.mark.parametrize("module", MODULES)
def test_ansible_doc_renders_each_module(module: str):
    result = ansible("ansible-doc", "--json", f"gpubox.inference.{module}")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)[f"gpubox.inference.{module}"]
    assert doc["doc"]["short_description"]
    assert doc["examples"].strip()
    assert doc["return"]
    # The text a user reads: rendering can fail where the JSON dump does not (e.g. a note parsed as a dict).
    text = ansible("ansible-doc", f"gpubox.inference.{module}")
    assert text.returncode == 0, text.stderr
    assert f"MODULE gpubox.inference.{module}" in text.stdout.replace("\x1b[1m", "").replace("\x1b[0m", "")


def test_built_tarball_has_no_test_or_cache_files(tmp_path: Path):
    result = ansible("ansible-galaxy", "collection", "build", "--output-path", str(tmp_path))
    assert result.returncode == 0, result.stderr
    (tarball,) = tmp_path.glob("gpubox-inference-*.tar.gz")
    with tarfile.open(tarball) as tar:
        names = tar.getnames()
    assert "MANIFEST.json" in names
    assert "roles/base/tasks/main.yml" in names
    assert "meta/runtime.yml" in names
    unwanted = ("tests", "molecule", ".collections", ".ci", "scripts", ".git", "build")
    leaked = [n for n in names if n.split("/")[0] in unwanted or "__pycache__" in n or n.endswith(".pyc")]
    assert not leaked, leaked


@pytest.mark.parametrize("playbook", sorted(p.name for p in (ROOT / "playbooks").glob("*.yml")))
def test_playbooks_pass_syntax_check(playbook: str):
    result = ansible("ansible-playbook", "--syntax-check", f"playbooks/{playbook}")
    assert result.returncode == 0, result.stderr


ROLE_ENTRY_POINTS = sorted(
    (role.name, entry)
    for role in (ROOT / "roles").iterdir()
    for entry in (yaml.safe_load((role / "meta" / "argument_specs.yml").read_text()) or {})["argument_specs"]
)
FILTERS = sorted(p.stem for p in (ROOT / "plugins" / "filter").glob("*.yml"))


@pytest.mark.parametrize(("role", "entry"), ROLE_ENTRY_POINTS, ids=lambda v: v if isinstance(v, str) else None)
def test_ansible_doc_renders_each_role_entry_point(role: str, entry: str):
    result = ansible("ansible-doc", "--type", "role", "--entry-point", entry, f"gpubox.inference.{role}")
    assert result.returncode == 0, result.stderr
    text = result.stdout.replace("\x1b[1m", "").replace("\x1b[0m", "").replace("*", "")
    assert f"ENTRY POINT: {entry} - " in text
    assert "Options" in text


def test_every_role_has_its_main_entry_point_and_the_vllm_plan():
    assert {role for role, entry in ROLE_ENTRY_POINTS if entry == "main"} == {p.name for p in (ROOT / "roles").iterdir()}
    assert ("vllm", "plan") in ROLE_ENTRY_POINTS


@pytest.mark.parametrize("name", FILTERS)
def test_ansible_doc_renders_each_filter(name: str):
    result = ansible("ansible-doc", "--json", "--type", "filter", f"gpubox.inference.{name}")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)[f"gpubox.inference.{name}"]
    assert doc["doc"]["short_description"]
    assert doc["examples"].strip()
    assert doc["return"]


def test_site_yml_has_a_tag_per_phase_in_order():
    result = ansible("ansible-playbook", "-i", "inventory/hosts.yml", "site.yml", "--list-tags")
    assert result.returncode == 0, result.stderr
    # A play's tags in sorted order (ansible-playbook lists a set).
    plays = [
        ",".join(sorted(line.split("TAGS: [")[1].rstrip("]").split(",")))
        for line in result.stdout.splitlines()
        if "\tTAGS: [" in line
    ]
    assert plays == [
        "base",
        "always",
        "preflight",
        "vllm",
        "docker",
        "toolkit",
        "gpubox",
        "vllm",
        "vllm",
        "vllm",
        "proxy",
        "smoke",
        "gpubox,vllm",
        "gateway",
        "monitoring",
        "always",
    ]
