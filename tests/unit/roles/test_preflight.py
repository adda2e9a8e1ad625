"""The preflight role, run for real with ansible-playbook on this machine (which has no GPU) and on captured outputs.

Captured outputs stand in for the GPU box: the role runs unchanged, only its
``preflight_*_src`` and ``preflight_sysfs_root`` point at the captures.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from conftest import FIXTURES, ROOT, parse_capture, run_ansible
from hardware import RYZEN_CHIPSET, make_sysfs

SYS_3090 = FIXTURES / "A_topo_m" / "2x_rtx3090_SYS_numa_affinity_NA_on_gpu0_club3090_178.txt"
PHB_5090 = FIXTURES / "A_topo_m" / "2x_rtx5090_threadripper3975wx_PHB_gpu_numa_id.txt"
NV12 = FIXTURES / "A_topo_m" / "8x_a100_aws_p4d_NV12_no_nic_gpu_numa_id.txt"
EPYC_ACS = FIXTURES / "C_lspci" / "amd_epyc_gpp_bridge_40_01_1_acs_enabled_elided_plus_tv_subtree_rccl547.txt"
ACS_OFF = FIXTURES / "C_lspci" / "puget_wrx90_lspci_vvv_grep_ACSCtl_all_disabled.txt"


def saved(tmp_path: Path, capture: Path) -> str:
    path = tmp_path / capture.name
    path.write_text(parse_capture(capture).text)
    return str(path)


def run_preflight(tmp_path: Path, *flags: str, **extra) -> tuple[int, str, Path]:
    reports = tmp_path / "reports"
    playbook = tmp_path / "play.yml"
    play = {"name": "preflight", "hosts": "localhost", "gather_facts": False, "roles": ["gpubox.inference.preflight"]}
    playbook.write_text(yaml.safe_dump([play]))
    extra = {"ansible_python_interpreter": sys.executable, "preflight_report_dir": str(reports), **extra}
    args = ["ansible-playbook", "-i", "localhost,", "-c", "local", *flags, "-e", json.dumps(extra), str(playbook)]
    result = run_ansible(*args)
    return result.returncode, result.stdout + result.stderr, reports / "localhost"


def captured(tmp_path: Path, topology: Path, lspci: Path, cmdline: str = "ro quiet\n", root: Path | None = None) -> dict:
    (tmp_path / "cmdline").write_text(cmdline)
    if root is None:
        root = tmp_path / "empty-root"
        root.mkdir(exist_ok=True)
    return {
        "preflight_topology_src": saved(tmp_path, topology),
        "preflight_lspci_src": saved(tmp_path, lspci),
        "preflight_cmdline_src": str(tmp_path / "cmdline"),
        "preflight_sysfs_root": str(root),
    }


def test_host_without_gpu_gets_one_clear_message(tmp_path):
    rc, out, reports = run_preflight(tmp_path)
    assert rc == 0, out
    assert "No NVIDIA GPU found on this host: nothing to check." in out
    assert "Traceback" not in out
    assert (reports / "preflight.md").read_text().splitlines()[2] == "No NVIDIA GPU found on this host: nothing to check."
    assert not (reports / "preflight.svg").exists()


def test_host_without_gpu_fails_when_one_is_required(tmp_path):
    rc, out, _reports = run_preflight(tmp_path, preflight_require_gpu=True)
    assert rc == 2
    assert "No NVIDIA GPU found on localhost" in out
    assert "preflight_require_gpu is true" in out


def test_acs_redirect_is_reported_and_decides_nccl_p2p_disable(tmp_path):
    rc, out, reports = run_preflight(tmp_path, **captured(tmp_path, SYS_3090, EPYC_ACS))
    assert rc == 0, out
    assert "GPU0-GPU1 SYS: will hang or corrupt (SYS link; ACS redirects P2P on 40:01.1)" in out
    assert "Decision: NCCL_P2P_DISABLE=1 because ACS redirects P2P on 40:01.1" in out
    markdown = (reports / "preflight.md").read_text()
    assert "| GPU0-GPU1 | SYS | will hang or corrupt |" in markdown
    assert "- NCCL_P2P_DISABLE=1 because ACS redirects P2P on 40:01.1" in markdown
    svg = (reports / "preflight.svg").read_text()
    assert svg.startswith("<svg")
    assert ">SYS</text>" in svg


def test_acs_redirect_fails_the_play_by_policy(tmp_path):
    rc, out, reports = run_preflight(tmp_path, **captured(tmp_path, SYS_3090, EPYC_ACS), preflight_fail_on_acs_redirect=True)
    assert rc == 2
    assert "Preflight failed on localhost: GPU0-GPU1: will hang or corrupt" in out
    assert (reports / "preflight.md").exists(), "the report is written before the policy fails the play"


def test_nvlink_box_is_fit(tmp_path):
    rc, out, _reports = run_preflight(tmp_path, **captured(tmp_path, NV12, ACS_OFF, "ro iommu=pt\n"))
    assert rc == 0, out
    assert "GPU6-GPU7 NV12: fit for tensor parallelism" in out
    assert "Decision: NCCL keeps P2P on (nothing redirects it)" in out
    assert "Preflight: fit (0 warnings)" in out


def test_chipset_gpu_in_a_tensor_parallel_group_fails_by_default(tmp_path):
    root = make_sysfs(tmp_path / "root", RYZEN_CHIPSET)
    rc, out, _reports = run_preflight(tmp_path, **captured(tmp_path, PHB_5090, ACS_OFF, root=root))
    assert rc == 2
    assert "GPU1 (0000:04:00.0) hangs off the chipset, not a CPU root port, in a tensor-parallel group" in out


def test_chipset_gpu_outside_the_group_is_fine(tmp_path):
    root = make_sysfs(tmp_path / "root", RYZEN_CHIPSET)
    settings = captured(tmp_path, PHB_5090, ACS_OFF, root=root)
    rc, out, _reports = run_preflight(tmp_path, **settings, vllm_tensor_parallel_size=1)
    assert rc == 0, out
    assert "hangs off the chipset" not in out


def test_check_mode_writes_no_report(tmp_path):
    rc, out, reports = run_preflight(tmp_path, "--check", **captured(tmp_path, SYS_3090, EPYC_ACS))
    assert rc == 0, out
    assert "will hang or corrupt" in out
    assert not reports.exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"preflight_remediate_acs": True, "preflight_lspci_src": "/tmp/x"},
            "remediation (preflight_remediate_acs=True",
        ),
        ({"preflight_p2p_src": "/tmp/p2p.txt"}, 'preflight_p2p_src="/tmp/p2p.txt" needs preflight_topology_src'),
        ({"vllm_tensor_parallel_size": -1}, "vllm_tensor_parallel_size=-1 must be 0 or more"),
    ],
)
def test_bad_settings_are_refused_before_reading_anything(tmp_path, extra, message):
    rc, out, _reports = run_preflight(tmp_path, **extra)
    assert rc == 2
    assert message in " ".join(out.split())
    assert "Read the PCIe platform" not in out


def test_acs_unit_clears_each_redirecting_bridge(tmp_path):
    template = ROOT / "roles" / "preflight" / "templates" / "gpubox-acs-disable.service.j2"
    playbook = tmp_path / "render.yml"
    task = {"ansible.builtin.debug": {"msg": f"{{{{ lookup('ansible.builtin.template', '{template}') }}}}"}}
    playbook.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": [task]}]))
    extra = json.dumps({"_preflight_acs_bridges": ["0000:40:01.1", "0000:00:03.2"]})
    result = run_ansible("ansible-playbook", "-i", "localhost,", "-c", "local", "-e", extra, str(playbook))
    assert result.returncode == 0, result.stderr
    assert "ExecStart=/usr/bin/setpci -s 0000:40:01.1 ECAP_ACS+0x6.w=0000" in result.stdout
    assert "ExecStart=/usr/bin/setpci -s 0000:00:03.2 ECAP_ACS+0x6.w=0000" in result.stdout


def test_acs_remediation_needs_setpci(tmp_path):
    """ACS read from /sys (no pciutils): the unit would run a setpci that is not there, so nothing is written."""
    playbook = tmp_path / "remediate.yml"
    task = {"ansible.builtin.include_role": {"name": "gpubox.inference.preflight", "tasks_from": "remediate.yml"}}
    playbook.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": [task]}]))
    redirecting = [{"bdf": "0000:40:01.1", "flags": ["ReqRedir", "CmpltRedir"]}]
    extra = {
        "ansible_python_interpreter": sys.executable,
        "preflight_remediate_acs": True,
        "__preflight_acs": {"acs_source": "sysfs", "acs_verdict": {"redirecting": redirecting}},
    }
    argv = ["ansible-playbook", "-i", "localhost,", "-c", "local", "--check", "-e", json.dumps(extra), str(playbook)]
    result = run_ansible(*argv)
    out = " ".join((result.stdout + result.stderr).split())
    assert result.returncode != 0
    assert "writes a unit that runs setpci, from pciutils, which this host lacks" in out
    assert "Install the unit that clears ACS control at boot" not in out
    # With lspci's reading the same remediation goes on to the unit (check mode: nothing is written;
    # enabling it then needs a systemd this machine lacks, which the Molecule host has).
    extra["__preflight_acs"]["acs_source"] = "lspci -vvv"
    result = run_ansible(*argv[:-3], "-e", json.dumps(extra), str(playbook))
    assert "TASK [gpubox.inference.preflight : Install the unit that clears ACS control at boot]" in result.stdout
    assert "which this host lacks" not in result.stdout + result.stderr


def test_iommu_pt_remediation_edits_grub_once_and_leaves_the_reboot_to_the_user(tmp_path):
    grub = tmp_path / "grub"
    grub.write_text('GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet splash"\nGRUB_CMDLINE_LINUX=""\n')
    playbook = tmp_path / "remediate.yml"
    play = {
        "hosts": "localhost",
        "gather_facts": False,
        "tasks": [
            {
                "name": "Remediate",
                "ansible.builtin.include_role": {"name": "gpubox.inference.preflight", "tasks_from": "remediate.yml"},
            }
        ],
    }
    playbook.write_text(yaml.safe_dump([play]))
    extra = {
        "ansible_python_interpreter": sys.executable,
        "preflight_remediate_iommu_pt": True,
        "__preflight_acs": {"acs_verdict": {"redirecting": []}},
        "_preflight_grub_file": str(grub),
        "_preflight_update_grub": "true",
        "ansible_become": False,
    }
    argv = ["ansible-playbook", "-i", "localhost,", "-c", "local", "-e", json.dumps(extra), str(playbook)]
    first = run_ansible(*argv)
    assert first.returncode == 0, first.stdout + first.stderr
    assert 'GRUB_CMDLINE_LINUX_DEFAULT="quiet splash iommu=pt"' in grub.read_text()
    assert "RUNNING HANDLER [gpubox.inference.preflight : Update GRUB]" in first.stdout
    assert "it takes effect at the next reboot" in first.stdout
    second = run_ansible(*argv)
    assert second.returncode == 0
    assert "changed=0" in second.stdout
    assert grub.read_text().count("iommu=pt") == 1


FAH_X8 = FIXTURES / "C_lspci" / "2x_rtx2060_lspci_vv_grep_gt_card_prefix_width_x8_downgraded_fah.txt"
A6000_GEN1 = FIXTURES / "C_lspci" / "4x_rtxa6000_lspci_vvd_10de_first_gpu_and_audio_gen1_idle_excerpt.txt"
ONE_GPU = FIXTURES / "A_topo_m" / "1x_h200_driver580_ansi_underlined_header.txt"


def test_a_saved_lspci_gives_the_links_and_a_narrow_one_fails_by_policy(tmp_path):
    settings = captured(tmp_path, PHB_5090, FAH_X8)
    rc, out, _reports = run_preflight(tmp_path, **settings)
    assert rc == 0, out
    assert "GPU0 (0000:01:00.0): the link runs at x8 where both ends support x16" in out
    rc, out, _reports = run_preflight(tmp_path, **settings, preflight_fail_on_downtrained=True)
    assert rc == 2
    assert "GPU1 (0000:02:00.0): the link runs at x8 where both ends support x16" in out


@pytest.mark.parametrize(("under_load", "said"), [(None, "cannot tell power saving"), (True, "under load (as saved)")])
def test_a_gen1_link_in_a_saved_lspci_is_a_warning_only_when_the_load_is_known(tmp_path, under_load, said):
    extra = {} if under_load is None else {"preflight_lspci_under_load": under_load}
    rc, out, _reports = run_preflight(tmp_path, **captured(tmp_path, ONE_GPU, A6000_GEN1), **extra)
    assert rc == 0, out
    assert said in out
