"""The README tells the truth: its example inventory loads and plans, and every variable it names exists."""

from __future__ import annotations

import json
import re

import yaml
from conftest import ROOT, run_ansible

from ansible_collections.gpubox.inference.plugins.filter.vllm_plan import vllm_plan

README = (ROOT / "README.md").read_text()


def block_after(label: str) -> str:
    """The first ```yaml block after the line naming ``label``."""
    start = README.index(label)
    match = re.search(r"```yaml\n(.*?)```", README[start:], re.S)
    assert match, f"no yaml block after {label!r}"
    return match.group(1)


def options() -> dict[str, dict]:
    found = {}
    for spec in sorted((ROOT / "roles").glob("*/meta/argument_specs.yml")):
        found |= yaml.safe_load(spec.read_text())["argument_specs"]["main"]["options"]
    return found


def test_the_example_inventory_loads_and_plans(tmp_path):
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "hosts.yml").write_text(block_after("`inventory/hosts.yml`:"))
    (tmp_path / "group_vars" / "gpu_boxes.yml").write_text(block_after("`inventory/group_vars/gpu_boxes.yml`"))
    result = run_ansible("ansible-inventory", "-i", str(tmp_path / "hosts.yml"), "--host", "gpu-box")
    assert result.returncode == 0, result.stderr
    host = json.loads(result.stdout)
    assert host["ansible_host"] == "192.0.2.10"
    unknown = sorted(k for k in host if not k.startswith("ansible_") and k not in options())
    assert not unknown, f"the README's inventory sets variables no role declares: {unknown}"
    defaults = {k: v.get("default") for k, v in options().items() if k.startswith("vllm_")}
    settings = {**defaults, **host}
    planned = vllm_plan(
        {
            "model": settings["vllm_model"],
            "container_model": settings["vllm_model"],
            "served_model_name": settings["vllm_served_model_name"],
            **{key.removeprefix("vllm_"): value for key, value in settings.items() if key.startswith("vllm_")},
        },
        {"gpu": {"present": True, "count": 2, "devices": [{"memory_total_mib": 24576}] * 2}},
    )
    assert planned["errors"] == []
    assert planned["args"][planned["args"].index("--tensor-parallel-size") + 1] == "2"
    assert "--enable-prefix-caching" in planned["args"]


def test_every_variable_the_readme_names_is_declared():
    roles = "|".join(path.name for path in (ROOT / "roles").iterdir())
    named = set(re.findall(rf"`((?:{roles})_[a-z_]+)", README))
    named = {name.rstrip("_") for name in named}
    declared = set(options()) | {"nginx_proxy_tls_certificate_key"}
    # `nginx_proxy_tls_certificate(_key)` and `preflight_*_src` are written as patterns.
    patterns = {"preflight", "preflight_fail_on"}
    # Modules whose names start like a role's (`vllm_answer_check`) are not variables.
    modules = {path.stem for path in (ROOT / "plugins" / "modules").glob("*.py")}
    missing = sorted(name for name in named - declared - patterns - modules if not name.endswith("_src"))
    assert not missing, f"the README names variables no role declares: {missing}"
