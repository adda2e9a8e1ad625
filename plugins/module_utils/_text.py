# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Private: the text handling the parsers share - what every parser of pasted command output strips first, and the
JSON object a stored file holds. Pure, no Ansible imports."""

from __future__ import annotations

import json
import re

# Terminal control sequences (CSI: ESC [ parameters final-byte), e.g. ESC[4m ... ESC[0m around nvidia-smi's header.
ANSI_RE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


def strip_ansi(text: str) -> str:
    """The text without terminal colours and underlines, which drivers and scripts print even into a pipe."""
    return ANSI_RE.sub("", text)


def json_object(text: str) -> dict:
    """The JSON object in ``text``; ValueError saying what it is instead (not JSON, or JSON of another kind)."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"it is not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ValueError(f"it holds a JSON {type(value).__name__}, not an object")
    return value
