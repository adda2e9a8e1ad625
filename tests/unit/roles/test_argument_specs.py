"""Each role's meta/argument_specs.yml is its contract: it must list exactly the role's defaults."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import ROOT

ROLES = sorted(p for p in (ROOT / "roles").iterdir() if (p / "tasks" / "main.yml").exists())


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


def test_there_are_roles():
    assert ROLES, "no roles found under roles/"


def _owned(role: Path) -> dict:
    """The role's own variables: its defaults."""
    return _load(role / "defaults" / "main.yml")


def _shared(role: Path) -> dict:
    """Options a role reads from another role (one concept, one variable): ``name -> the owner's default``."""
    options = _load(role / "meta" / "argument_specs.yml")["argument_specs"]["main"]["options"]
    owners = {name: value for other in ROLES if other != role for name, value in _owned(other).items()}
    return {name: owners[name] for name in options if name not in _owned(role) and name in owners}


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_defaults_and_argument_specs_name_the_same_variables(role: Path):
    """Every option is the role's own default, or another role's variable it reads (declared, never redefined)."""
    defaults = _owned(role)
    options = _load(role / "meta" / "argument_specs.yml")["argument_specs"]["main"]["options"]
    mine = set(options) - set(_shared(role))
    assert set(defaults) == mine, (
        f"only in defaults: {sorted(set(defaults) - mine)}; only in argument_specs: {sorted(mine - set(defaults))}"
    )


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_argument_spec_defaults_match_defaults_file(role: Path):
    defaults = {**_owned(role), **_shared(role)}
    options = _load(role / "meta" / "argument_specs.yml")["argument_specs"]["main"]["options"]
    for name, spec in options.items():
        assert spec.get("default") == defaults.get(name), f"{name}: argument_specs says {spec.get('default')!r}"
        assert spec.get("description"), f"{name} has no description"


def test_the_shared_variables_are_the_ones_meant():
    """One tensor-parallel size, one vLLM key, one Compose project and one Nginx status port for the user, read by the
    roles that need them."""
    shared = {role.name: sorted(_shared(role)) for role in ROLES if _shared(role)}
    assert shared == {
        "gpubox": ["vllm_project_name"],
        "monitoring": ["nginx_proxy_status_port"],
        "nginx_proxy": ["vllm_api_key", "vllm_max_model_len"],
        "preflight": ["vllm_tensor_parallel_size"],
    }


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_public_variables_carry_the_role_prefix(role: Path):
    defaults = _load(role / "defaults" / "main.yml")
    bad = [name for name in defaults if not name.startswith(f"{role.name}_")]
    assert not bad, f"defaults without the '{role.name}_' prefix: {bad}"


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_private_variables_carry_the_underscore_prefix(role: Path):
    bad = [
        f"{path.name}:{name}"
        for path in sorted((role / "vars").glob("*.yml"))
        for name in _load(path)
        if not name.startswith(f"_{role.name}_")
    ]
    assert not bad, f"vars/ entries without the '_{role.name}_' prefix: {bad}"
