"""_text: the terminal sequences pasted outputs carry (driver 580's underlined header, coloured script output)."""

from __future__ import annotations

from conftest import captures

from ansible_collections.gpubox.inference.plugins.module_utils._text import strip_ansi


def test_the_underline_driver_580_prints_around_the_header_is_removed():
    (cap,) = [c for c in captures("A_topo_m") if c.path.stem == "1x_h200_driver580_ansi_underlined_header"]
    header = cap.text.splitlines()[0]
    assert header.startswith("\t\x1b[4mGPU0")
    assert strip_ansi(header) == "\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"


def test_colours_go_and_everything_else_stays():
    assert strip_ansi("\x1b[1;31mLnkSta:\x1b[0m\tSpeed 8GT/s (ok)\x1b[K\r\n") == "LnkSta:\tSpeed 8GT/s (ok)\r\n"
    assert strip_ansi("no escapes [4m here") == "no escapes [4m here"
