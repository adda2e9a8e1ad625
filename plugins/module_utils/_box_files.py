# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Private: how the box's own programs (the engine watchdog, the drift watch, the GPU metrics) read and write their files.

No Ansible imports. A file is written whole or not at all (a reader, such as node exporter's textfile collector,
never sees half of one); a file that is missing or not JSON reads as None.
"""

from __future__ import annotations

import json
import os


def read_json(path: str) -> dict | None:
    """The JSON in ``path``; None when it is missing or unreadable."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def write_atomically(path: str, text: str) -> None:
    """``text`` into ``path`` through a file beside it, renamed over it (its folder made first)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = f"{path}.partial"
    with open(partial, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(partial, path)
