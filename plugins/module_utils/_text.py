# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Private: what every parser of pasted command output strips first. Pure, no Ansible imports."""

from __future__ import annotations

import re

# Terminal control sequences (CSI: ESC [ parameters final-byte), e.g. ESC[4m ... ESC[0m around nvidia-smi's header.
ANSI_RE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


def strip_ansi(text: str) -> str:
    """The text without terminal colours and underlines, which drivers and scripts print even into a pipe."""
    return ANSI_RE.sub("", text)
