"""The box's own programs (roles/*/files/*.py) import the collection's module_utils from their own folder on the box.

Each role copies there the files its vars list; a file a program imports, directly or through another,
that is not on the list would fail only on a real box, at its first tick or boot. Here every import is
followed and the lists are checked against them.
"""

from __future__ import annotations

import re

import pytest
import yaml
from conftest import ROOT

MODULE_UTILS = ROOT / "plugins" / "module_utils"
_IMPORT_RE = re.compile(r"from ansible_collections\.gpubox\.inference\.plugins\.module_utils(?:\.(\w+))? import ([\w, ]+)")
# Program -> (its role, the vars entry that lists what the role copies beside it).
PROGRAMS = {
    "vllm/files/gpubox-vllm-watchdog.py": ("vllm", "_vllm_watchdog_modules"),
    "gpubox/files/gpubox-gpu-power.py": ("gpubox", "_gpubox_power_modules"),
    "gpubox/files/gpubox-drift.py": ("gpubox", "_gpubox_drift_modules"),
    "monitoring/files/gpubox-gpu-metrics.py": ("monitoring", "_monitoring_gpu_modules"),
}


def imported(text: str) -> set[str]:
    """The module_utils files a source file imports: ``from ...module_utils import _a, _b`` or ``from ..._a import x``."""
    names = set()
    for module, what in _IMPORT_RE.findall(text):
        names |= {f"{module}.py"} if module else {f"{name.strip()}.py" for name in what.split(",")}
    return names


def needed(program: str) -> set[str]:
    todo, seen = imported((ROOT / "roles" / program).read_text()), set()
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo |= imported((MODULE_UTILS / name).read_text())
    return seen


def test_every_program_of_the_roles_is_listed_here():
    programs = {str(path.relative_to(ROOT / "roles")) for path in (ROOT / "roles").glob("*/files/*.py")}
    assert programs == set(PROGRAMS)


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_the_role_copies_every_module_the_program_imports(program):
    role, entry = PROGRAMS[program]
    copied = yaml.safe_load((ROOT / "roles" / role / "vars" / "main.yml").read_text())[entry]
    assert needed(program) <= set(copied), f"{role}'s {entry} lacks {sorted(needed(program) - set(copied))}"
    assert set(copied) <= needed(program), f"{role}'s {entry} copies what {program} never imports"
