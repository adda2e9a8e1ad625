# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Private: merge settings into Docker's daemon.json without dropping what others put there.

Pure functions, text in and data out, no Ansible imports.
"""

from __future__ import annotations

import json

from ansible_collections.gpubox.inference.plugins.module_utils._text import json_object


class DaemonJsonError(ValueError):
    """The existing daemon.json is not a JSON object."""


def parse(text: str | None) -> dict:
    """The current settings; an absent or empty file is ``{}``."""
    if text is None or not text.strip():
        return {}
    try:
        return json_object(text)
    except ValueError as exc:
        raise DaemonJsonError(str(exc)) from None


def merge(current: dict, settings: dict) -> dict:
    """``settings`` laid over ``current``, recursing into objects; keys nobody asked about stay."""
    merged = dict(current)
    for key, value in settings.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


# What dockerd reads again on SIGHUP (systemctl reload docker), per its documentation ("Configuration reload
# behavior"): a change to these alone is applied without a restart, so no container stops.
RELOADABLE = frozenset({
    "debug", "labels", "live-restore", "max-concurrent-downloads", "max-concurrent-uploads", "max-download-attempts",
    "default-runtime", "runtimes", "authorization-plugins", "allow-nondistributable-artifacts", "insecure-registries",
    "registry-mirrors", "shutdown-timeout", "features",
})  # fmt: skip


def restart_needed(before: dict, after: dict) -> bool:
    """Whether going from ``before`` to ``after`` needs dockerd restarted, or a reload applies it."""
    changed = {key for key in set(before) | set(after) if before.get(key) != after.get(key)}
    return bool(changed - RELOADABLE)


def render(settings: dict) -> str:
    return json.dumps(settings, indent=2, sort_keys=True) + "\n"
