"""The base role refuses bad input with a message naming the variable, the value and the rule.

These run the real role with ansible-playbook against this machine in check
mode; the checks fail the play before any task that could change the host.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import yaml
from conftest import ROOT, run_ansible

FIRST_CHANGING_TASK = "Install the Python libraries the modules need"


def run_base(tmp_path, **extra_vars) -> subprocess.CompletedProcess:
    playbook = tmp_path / "play.yml"
    play = {"name": "base", "hosts": "localhost", "gather_facts": True, "roles": ["gpubox.inference.base"]}
    playbook.write_text(yaml.safe_dump([play]))
    # The Python libraries are installed in check mode too: none here, so that the test leaves this machine alone.
    extra = json.dumps({"ansible_python_interpreter": sys.executable, "_base_python_packages": [], **extra_vars})
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


# Every documented requirement of a module that the plays call (ansible-doc's `requirements`), and what puts it in
# the box's Python (/usr/bin/python3: the example inventory's interpreter for the box itself, and a remote box's):
#   ("package", NAME): the base role installs NAME on every OS it supports, in a dry run too
#     (_base_python_packages in roles/base/vars/<OS>.yml);
#   ("nvml", WHAT): nvidia_container_toolkit's nvml.yml, which the plays run first on a box with the NVIDIA driver,
#     installs python3-pip with apt (it depends on python3-setuptools), then nvidia_container_toolkit_nvml_python;
#   ("none", WHY): nothing to install on the box, and why.
# A module the plays start calling, or a requirement a new release documents, fails the test until it is listed here
# with its provider.
MODULE_REQUIREMENTS = {
    "ansible.builtin.apt": {
        "python3-apt": ("package", "python3-apt"),
        "aptitude (before 2.4)": ("none", "ansible-core 2.19 needs no aptitude"),
    },
    "ansible.builtin.deb822_repository": {"python3-debian / python-debian": ("package", "python3-debian")},
    "ansible.builtin.pip": {
        "pip": ("nvml", "python3-pip"),
        "virtualenv": ("none", "the roles install into the box's Python, never a virtualenv"),
        "setuptools or packaging": ("nvml", "python3-setuptools, a dependency of python3-pip"),
    },
    "ansible.builtin.systemd_service": {"A system managed by systemd.": ("none", "Debian 12 and Ubuntu 22.04+ boot it")},
    "community.crypto.openssl_csr": {"cryptography >= 3.3": ("package", "python3-cryptography")},
    "community.crypto.openssl_privatekey": {"cryptography >= 3.3": ("package", "python3-cryptography")},
    "community.crypto.x509_certificate": {
        "acme-tiny >= 4.0.0 (if using the V(acme) provider)": ("none", "the roles use the selfsigned provider"),
        "cryptography >= 3.3 (if using V(selfsigned) or V(ownca) provider)": ("package", "python3-cryptography"),
    },
    "community.docker.docker_compose_v2": {
        "Docker CLI with Docker compose plugin 2.18.0 or later": ("none", "the docker_engine role installs both"),
        "PyYAML if O(definition) is used": ("none", "the roles pass project_src, never definition"),
    },
    **{
        f"community.docker.{name}": {
            "Docker API >= 1.25": ("none", "the docker_engine role installs the engine"),
            "backports.ssl_match_hostname (when using TLS on Python 2)": ("none", "Python 3"),
            "paramiko (when using SSH with O(use_ssh_client=false))": ("none", "the local Unix socket"),
            "pyOpenSSL (when using TLS)": ("none", "the local Unix socket, no TLS"),
            "pywin32 (when using named pipes on Windows 32)": ("none", "Linux"),
            "requests": ("package", "python3-requests"),
        }
        for name in ("docker_container_exec", "docker_image", "docker_image_info")
    },
    "gpubox.inference.gpu_facts": {
        "nvidia-ml-py on the managed host, where the NVIDIA driver is installed": ("nvml", "nvidia-ml-py"),
    },
    "gpubox.inference.gpu_power": {
        "nvidia-ml-py on the managed host, where the NVIDIA driver is installed": ("nvml", "nvidia-ml-py"),
        "root, to set limits": ("none", "the plays that call it become root"),
    },
}

TASK_FILES = [*(ROOT / "roles").glob("*/tasks/*.yml"), *(ROOT / "roles").glob("*/handlers/*.yml")]
PLAYBOOKS = [ROOT / "site.yml", *(ROOT / "playbooks").glob("*.yml")]


def modules_called() -> set[str]:
    """The module of every task in the roles and playbooks, blocks and plays' pre/post tasks included."""
    found: set[str] = set()

    def walk(tasks) -> None:
        for task in tasks or []:
            for key in ("block", "rescue", "always", "tasks", "pre_tasks", "post_tasks", "handlers"):
                walk(task.get(key))
            found.update(key for key in task if key.count(".") == 2)

    for path in TASK_FILES + PLAYBOOKS:
        walk(yaml.safe_load(path.read_text()))
    return found


def test_every_module_requirement_is_installed_on_the_box():
    called = modules_called()
    assert {"community.docker.docker_image", "ansible.builtin.deb822_repository", "gpubox.inference.gpu_facts"} <= called
    result = run_ansible("ansible-doc", "--json", "-t", "module", *sorted(called))
    assert result.returncode == 0, result.stderr
    documented = {name: entry["doc"].get("requirements") or [] for name, entry in json.loads(result.stdout).items()}
    assert set(documented) == called, f"ansible-doc found no module for {sorted(called - set(documented))}"
    needing = {name: requirements for name, requirements in documented.items() if requirements}
    listed = {name: sorted(provided) for name, provided in MODULE_REQUIREMENTS.items()}
    assert {name: sorted(reqs) for name, reqs in needing.items()} == listed, (
        "a module the plays call documents requirements that MODULE_REQUIREMENTS does not list (or no longer does)"
    )
    for os_vars in ("Debian.yml", "Ubuntu.yml"):
        packages = yaml.safe_load((ROOT / "roles" / "base" / "vars" / os_vars).read_text())["_base_python_packages"]
        wanted = {what for provided in MODULE_REQUIREMENTS.values() for kind, what in provided.values() if kind == "package"}
        assert wanted <= set(packages), f"roles/base/vars/{os_vars} lacks {sorted(wanted - set(packages))}"
    defaults = yaml.safe_load((ROOT / "roles" / "nvidia_container_toolkit" / "defaults" / "main.yml").read_text())
    assert defaults["nvidia_container_toolkit_nvml_python"].startswith("nvidia-ml-py")
    apt, pip = yaml.safe_load((ROOT / "roles" / "nvidia_container_toolkit" / "tasks" / "nvml.yml").read_text())
    assert apt["ansible.builtin.apt"]["name"] == "python3-pip"
    assert pip["ansible.builtin.pip"]["name"] == "{{ nvidia_container_toolkit_nvml_python }}"


def test_the_roles_call_docker_compose_with_project_src_only():
    """PyYAML is listed as not needed because no task passes docker_compose_v2 a definition."""
    calls = [
        (path, task)
        for path in TASK_FILES
        for task in re.findall(r"community\.docker\.docker_compose_v2:\n((?:\s{4,}.*\n)+)", path.read_text())
    ]
    assert len(calls) >= 5, "no docker_compose_v2 task found: the pattern no longer reads the task files"
    for path, task in calls:
        assert "project_src:" in task, path
        assert "definition:" not in task, path


def test_the_example_inventory_runs_the_modules_in_the_box_python():
    """The box itself (local connection) runs the modules in the same Python as a remote box, which base provisions."""
    hosts = yaml.safe_load((ROOT / "inventory" / "hosts.yml").read_text())
    box = hosts["all"]["children"]["gpu_boxes"]["hosts"]["gpu-box"]
    assert box == {"ansible_connection": "local", "ansible_python_interpreter": "/usr/bin/python3"}
