"""scripts/gpu-host-check.sh end to end on this machine: the real H200's captured nvidia-smi outputs from a
stand-in nvidia-smi, the stand-in pynvml and libcuda with one GPU, and this machine's own lspci and /sys."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

from conftest import ANSIBLE_ENV, FIXTURES, ROOT, parse_capture
from hardware import RTX3090_PAIR, nvml_machine

H200 = {
    "topo -m": FIXTURES / "A_topo_m" / "1x_h200_driver580_ansi_underlined_header.txt",
    "topo -p2p r": FIXTURES / "B_topo_p2p" / "1x_h200_driver580_p2p_r_ansi_underlined_header.txt",
    "topo -p2p w": FIXTURES / "B_topo_p2p" / "1x_h200_driver580_p2p_w_ansi_underlined_header.txt",
    "topo -p2p n": FIXTURES / "B_topo_p2p" / "1x_h200_driver580_p2p_n_ansi_underlined_header.txt",
    "-q": FIXTURES / "E_smi_q_pcie" / "h200_firecracker_vm_q_pci_gen5_x16_host_max_na_driver580.txt",
}


def test_the_check_runs_every_module_and_keeps_what_they_read(tmp_path: Path, fake_libcuda):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    cases = ""
    for argv, capture in H200.items():
        body = tmp_path / f"{capture.stem}.out"
        body.write_bytes(parse_capture(capture).text.encode())
        cases += f'  "{argv}") cat {body} ;;\n'
    (bindir / "nvidia-smi").write_text(f'#!/bin/sh\ncase "$*" in\n{cases}  *) echo "unsupported: $*" >&2; exit 2 ;;\nesac\n')
    (bindir / "nvidia-smi").chmod(0o755)
    machine = {**RTX3090_PAIR, "gpus": RTX3090_PAIR["gpus"][:1], "p2p": {}, "topology": {}}
    env = {
        **ANSIBLE_ENV,
        "PATH": f"{bindir}:{ANSIBLE_ENV['PATH']}",
        "PYTHONPATH": str(ROOT / "tests" / "fakes"),
        "GPUBOX_FAKE_NVML": str(nvml_machine(tmp_path / "machine.json", machine)),
        "GPUBOX_LIBCUDA": str(fake_libcuda),
        "FAKE_CUDA_DEVICES": "1",
        "CHECK_PAIR_MIB": "1",
    }
    out = tmp_path / "out"
    proc = subprocess.run(
        [ROOT / "scripts" / "gpu-host-check.sh", out], env=env, capture_output=True, text=True, check=False, timeout=300
    )
    log = (out / "check.log").read_text()
    assert proc.returncode == 0, log
    for module in ("gpu_facts", "gpu_topology_info", "pcie_platform_info", "iommu_acs_info", "gpu_p2p_facts"):
        assert f"module {module}: rc=0 in " in log
    assert '"verdict": "single_gpu"' in log  # the ANSI-wrapped header read
    assert '"host_links": {"0": {"bus_id": "0000:10:00.0"' in log
    assert "  1 MiB: pair=" in log
    assert "preflight: rc=0" in log
    assert log.rstrip().endswith("done: failed=0")
    with tarfile.open(out / "captures.tar.gz") as archive:
        names = set(archive.getnames())
        topo = archive.extractfile("captures/topo-m.txt").read()
        config = archive.extractfile("captures/sys-pci-config.txt").read().decode()
    assert {"captures/module-gpu_p2p_facts.json", "captures/cmdline.txt", "captures/sys-pci-links.txt"} <= names
    # This machine's configuration spaces, in the dump format `lspci -F` reads (the first device's first row).
    first = sorted(os.listdir("/sys/bus/pci/devices"))[0]
    row = " ".join(f"{b:02x}" for b in Path(f"/sys/bus/pci/devices/{first}/config").read_bytes()[:16])
    assert config.startswith(f"{first} class ")
    assert f"\n00: {row}\n" in config
    assert topo == parse_capture(H200["topo -m"]).text.encode()
    assert "\x1b[4m" in topo.decode()
