"""The Molecule site scenario's stand-in GPU machines stay the ones the unit tests use."""

from __future__ import annotations

import json

from conftest import ROOT
from hardware import RTX3090_PAIR

FILES = ROOT / "molecule" / "site" / "files"


def test_the_box_starts_as_the_unit_tests_2x_rtx_3090():
    assert json.loads((FILES / "gpus-before.json").read_text()) == RTX3090_PAIR


def test_the_swap_replaces_gpu1_in_the_same_slot_and_nothing_else():
    before = json.loads((FILES / "gpus-before.json").read_text())
    after = json.loads((FILES / "gpus-after.json").read_text())
    assert after["gpus"][0] == before["gpus"][0]
    assert after["gpus"][1]["uuid"] != before["gpus"][1]["uuid"]
    assert {**after["gpus"][1], "uuid": None} == {**before["gpus"][1], "uuid": None}
    assert {k: v for k, v in after.items() if k != "gpus"} == {k: v for k, v in before.items() if k != "gpus"}
