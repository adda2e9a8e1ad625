"""The base role refuses bad input with a message naming the variable, the value and the rule.

These run the real role with ansible-playbook against this machine in check
mode; the checks fail the play before any task that could change the host.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from conftest import run_ansible

FIRST_CHANGING_TASK = "Install the base packages"


def run_base(tmp_path, **extra_vars) -> subprocess.CompletedProcess:
    playbook = tmp_path / "play.yml"
    play = {"name": "base", "hosts": "localhost", "gather_facts": True, "roles": ["gpubox.inference.base"]}
    playbook.write_text(yaml.safe_dump([play]))
    extra = json.dumps({"ansible_python_interpreter": sys.executable, **extra_vars})
    return run_ansible("ansible-playbook", "-i", "localhost,", "-c", "local", "--check", "-e", extra, str(playbook))


@pytest.mark.parametrize(
    ("extra_vars", "message"),
    [
        # The argument spec lets a string through as a one-item list; the role must not.
        ({"base_extra_packages": "htop"}, 'base_extra_packages="htop" must be a list of package names'),
        # Type errors come from meta/argument_specs.yml.
        ({"base_allow_unsupported_os": "maybe"}, "base_allow_unsupported_os"),
    ],
    ids=["string-package-list", "not-a-bool"],
)
def test_bad_input_is_refused_before_anything_changes(tmp_path, extra_vars, message):
    result = run_base(tmp_path, **extra_vars)
    out = result.stdout + result.stderr
    assert result.returncode == 2, out
    assert message in " ".join(out.split()), out
    assert FIRST_CHANGING_TASK not in out, "a changing task ran after the check failed"


def test_good_input_passes_the_checks(tmp_path):
    result = run_base(tmp_path, base_extra_packages=["htop"])
    out = result.stdout + result.stderr
    assert "Check base_extra_packages" in out
    assert "must be" not in out
    assert FIRST_CHANGING_TASK in out
