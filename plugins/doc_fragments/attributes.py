# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Attributes shared by the collection's modules."""

from __future__ import annotations


class ModuleDocFragment:
    # The *_info modules: they read and report, and change nothing.
    INFO_MODULE = r"""
attributes:
  check_mode:
    support: full
    description: Reads only; runs the same in check mode.
  diff_mode:
    support: none
    description: Changes nothing, so there is no diff.
"""

    # Modules that run through their action plugin (the progress lines come from the controller).
    ACTION_PLUGIN = r"""
attributes:
  action:
    support: full
    description: Runs on the controller as an action plugin, which calls modules on the host.
  diff_mode:
    support: none
    description: Nothing it does has a diff to show.
"""
