#!/usr/bin/python
# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: docker_daemon_json
short_description: Merge settings into Docker's daemon.json, keeping every key it does not set
version_added: 0.1.0
description:
  - Lays O(settings) over the existing C(daemon.json), recursing into objects (so adding the C(nvidia) runtime keeps
    other runtimes), and writes the file only when the result differs. Keys nobody asked about are never dropped.
  - Reports the change as a diff of the JSON before and after; in check mode it writes nothing.
  - Does not restart Docker; notify a handler on C(changed), which restarts Docker when RV(restart) says so and
    reloads it otherwise.
author:
  - gpubox maintainers (@gpubox)
attributes:
  check_mode:
    support: full
    description: Predicts the change and writes nothing.
  diff_mode:
    support: full
    description: The file's JSON before and after.
options:
  path:
    description: The daemon configuration file.
    type: path
    default: /etc/docker/daemon.json
  settings:
    description: The keys to set, merged recursively into what the file holds.
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Register the nvidia runtime with Docker
  gpubox.inference.docker_daemon_json:
    settings:
      runtimes:
        nvidia:
          path: nvidia-container-runtime
          args: []
  register: daemon
  notify: Apply daemon.json

# In the handlers:
- name: Apply daemon.json
  ansible.builtin.systemd_service:
    name: docker
    state: "{{ 'restarted' if daemon.restart else 'reloaded' }}"
"""

RETURN = r"""
daemon:
  description: The settings in the file after the merge.
  returned: success
  type: dict
  sample: {"log-level": "warn", "runtimes": {"nvidia": {"path": "nvidia-container-runtime", "args": []}}}
restart:
  description:
    - Whether Docker must be restarted to apply the change. False when nothing changed, or when only settings that
      Docker reads again on C(systemctl reload docker) changed (C(live-restore), C(runtimes), C(default-runtime),
      C(debug), C(labels), the registry and download settings), so that no container stops.
  returned: success
  type: bool
  sample: false
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpubox.inference.plugins.module_utils._daemon_json import (
    DaemonJsonError,
    merge,
    parse,
    render,
    restart_needed,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "default": "/etc/docker/daemon.json"},
            "settings": {"type": "dict", "required": True},
        },
        supports_check_mode=True,
    )
    path = module.params["path"]
    before_text = None
    if os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            before_text = handle.read()
    try:
        current = parse(before_text)
    except DaemonJsonError as exc:
        module.fail_json(msg=f"path={path!r}: cannot merge into it: {exc}; fix or remove the file first")
    merged = merge(current, module.params["settings"])
    changed = merged != current or before_text is None
    result = {"changed": changed, "daemon": merged, "restart": changed and restart_needed(current, merged)}
    if module._diff:
        result["diff"] = {"before": render(current) if before_text is not None else "", "after": render(merged)}
        result["diff"].update(before_header=path, after_header=path)
    if changed and not module.check_mode:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        module.atomic_move(_write_temp(module, path, render(merged)), path)
        if before_text is None:
            os.chmod(path, 0o644)
    module.exit_json(**result)


def _write_temp(module: AnsibleModule, path: str, text: str) -> str:
    temp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.gpubox")
    with open(temp, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(temp, 0o644)
    return temp


if __name__ == "__main__":
    main()
