"""The base role refuses bad input with a message naming the variable, the value and the rule.

These run the real role with ansible-playbook against this machine in check
mode; the checks fail the play before any task that could change the host.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT


def run_base(tmp_path, **extra_vars) -> subprocess.CompletedProcess:
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        yaml.safe_dump(
            [{"name": "base", "hosts": "localhost", "gather_facts": True, "roles": ["gpubox.inference.base"]}]
        )
    )
    return subprocess.run(
        [
            "ansible-playbook",
            "-i",
            "localhost,",
            "-c",
            "local",
            "--check",
            "-e",
            json.dumps({"ansible_python_interpreter": sys.executable, **extra_vars}),
            str(playbook),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1", "PATH": VENV_PATH},
    )


VENV_PATH = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        ("var/lib/gpubox", "must be an absolute"),
        ("/var/lib", "not / or a system directory"),
        ("/", "not / or a system directory"),
    ],
)
def test_bad_state_dir_is_refused_with_name_value_and_rule(tmp_path, value, rule):
    result = run_base(tmp_path, base_state_dir=value)
    out = result.stdout + result.stderr
    assert result.returncode == 2, out
    assert f'base_state_dir="{value}"' in out
    assert rule in out
    assert "Install the base packages" not in out, "a changing task ran after the check failed"


def test_wrong_type_is_refused_by_the_argument_spec(tmp_path):
    result = run_base(tmp_path, base_allow_unsupported_os="maybe")
    out = result.stdout + result.stderr
    assert result.returncode == 2, out
    assert "base_allow_unsupported_os" in out
    assert "Install the base packages" not in out


def test_a_string_for_the_package_list_is_refused(tmp_path):
    # The argument spec lets a string through as a one-item list; the role must not.
    result = run_base(tmp_path, base_extra_packages="htop")
    out = result.stdout + result.stderr
    assert result.returncode == 2, out
    assert 'base_extra_packages="htop" must be a list' in out
    assert "Install the base packages" not in out


def test_good_input_passes_the_checks(tmp_path):
    result = run_base(tmp_path, base_state_dir="/srv/gpubox")
    out = result.stdout + result.stderr
    assert "Check base_state_dir" in out
    assert "must be an absolute" not in out
    assert "Install the base packages" in out
