# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Private: how far a ``docker pull`` has come, read from what it prints without a terminal.

Pure functions, no Ansible imports. Without a TTY, ``docker pull`` prints one line per
layer and state (``ID: Pulling fs layer``, ``ID: Download complete``, ``ID: Pull
complete``, ``ID: Already exists``) and no byte counts, so progress is counted in layers.
"""

from __future__ import annotations

import re

LAYER = re.compile(r"^(?P<layer>[0-9a-f]{12}): (?P<state>.+?)\s*$")
DONE = ("Pull complete", "Already exists")


def progress(output: str) -> dict:
    """Layers seen, pulled (or already here), downloaded, and the final ``Status:`` line if it came."""
    states: dict[str, str] = {}
    status = None
    for line in output.replace("\r", "\n").splitlines():
        match = LAYER.match(line.strip())
        if match:
            states[match.group("layer")] = match.group("state")
        elif line.startswith("Status: "):
            status = line[len("Status: ") :].strip()
    pulled = sum(1 for state in states.values() if state in DONE)
    downloaded = sum(1 for state in states.values() if state in DONE or state == "Download complete")
    return {"layers": len(states), "pulled": pulled, "downloaded": downloaded, "status": status}
