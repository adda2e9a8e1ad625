# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Private: what the vllm role's plan reads from the box besides the GPUs, from text and file listings to data.

No Ansible imports. The module vllm_state_info reads the files and lists the folder; these decide what they mean:
a stored record that is missing is empty (nothing was stored yet), one that is there but not a JSON object is an
error naming the file, never a plausible empty answer.
"""

from __future__ import annotations

from ansible_collections.gpubox.inference.plugins.module_utils._text import json_object

# The files a model folder's weights are in (what vLLM loads: safetensors, or PyTorch's .bin).
WEIGHT_SUFFIXES = (".safetensors", ".bin")


def record(path: str, text: str | None) -> dict:
    """The JSON object stored in ``path`` (``text`` None: there is no such file, so nothing was stored: {}); a model
    folder's config.json reads the same way (none: {}, which the plan refuses by name).

    Raises ValueError naming the file when the text is not a JSON object.
    """
    if text is None:
        return {}
    try:
        return json_object(text)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def weights_bytes(files: list[tuple[str, int]]) -> int:
    """The bytes of a model folder's weights, from its files' names and sizes (other files do not count)."""
    return sum(size for name, size in files if name.endswith(WEIGHT_SUFFIXES))
