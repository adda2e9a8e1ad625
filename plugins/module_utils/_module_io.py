# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Private: the few input steps every gpubox module shares (saved outputs, nvidia-smi, locale).

These take the running AnsibleModule as an argument and never import Ansible,
so the decision logic beside them stays importable without it.
"""

from __future__ import annotations

# Command output must parse the same on any locale.
C_LOCALE = {"LANG": "C", "LC_ALL": "C", "LC_MESSAGES": "C"}


def read_src(module, option: str) -> str:
    """The text of the file named by a module option, or fail naming the option, the path and the reason."""
    path = module.params[option]
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError as exc:
        module.fail_json(msg=f"{option}={path!r}: cannot read the file: {exc.strerror}")


def run_checked(module, argv: list[str]) -> str:
    """stdout of a read-only command, or fail with its rc, stdout and stderr."""
    rc, out, err = module.run_command(argv)
    if rc != 0:
        shown = " ".join(argv[1:])
        name = argv[0].rsplit("/", 1)[-1]
        module.fail_json(
            msg=f"'{name} {shown}' failed with rc={rc}: {(err or out).strip()}",
            rc=rc,
            stdout=out,
            stderr=err,
        )
    return out
