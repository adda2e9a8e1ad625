"""_topology against every captured matrix; each file's ``# expected:`` header is the ground truth."""

from __future__ import annotations

import re

import pytest
from conftest import capture_params

from ansible_collections.gpubox.inference.plugins.module_utils._topology import (
    TopologyParseError,
    analyse,
    check_p2p_matches,
    combine_p2p,
    parse_p2p,
    parse_topology,
    topology_from_p2p,
)

GLUED = "8x_a100_sxm4_40gb_NV12_8nic_last_nic_cell_glued_to_cpu_affinity"

PAIR_RE = re.compile(r"\b(GPU\d+)-(GPU\d+)=([A-Z]+\d*)\b")


def expected_pairs(expected: str) -> dict[tuple[str, str], str]:
    return {(a, b): code for a, b, code in PAIR_RE.findall(expected)}


def expected_count(expected: str, noun: str) -> int | None:
    match = re.search(rf"\b(\d+|SINGLE) ?(?:x )?{noun}", expected)
    if not match:
        return None
    return 1 if match.group(1) == "SINGLE" else int(match.group(1))


@pytest.mark.parametrize("cap", capture_params("A_topo_m"))
def test_every_gpu_pair_named_in_expected_matches_both_directions(cap):
    topo = parse_topology(cap.text)
    pairs = expected_pairs(cap.expected)
    for (a, b), code in pairs.items():
        assert topo["links"][a][b] == code, f"{a}-{b}"
        assert topo["links"][b][a] == code, f"{b}-{a}"


@pytest.mark.parametrize("cap", capture_params("A_topo_m"))
def test_gpu_and_nic_counts_match_expected(cap):
    topo = parse_topology(cap.text)
    gpus = expected_count(cap.expected, "GPU")
    if gpus is not None:
        assert len(topo["gpus"]) == gpus
    nics = re.search(r"\b(\d+) NICs?\b", cap.expected)
    assert len(topo["nics"]) == (int(nics.group(1)) if nics else 0)
    assert [g["index"] for g in topo["gpus"]] == list(range(len(topo["gpus"])))


@pytest.mark.parametrize("cap", capture_params("A_topo_m"))
def test_links_cover_every_device_pair_and_never_self(cap):
    topo = parse_topology(cap.text)
    names = [g["name"] for g in topo["gpus"]] + [n["name"] for n in topo["nics"]]
    damaged = {(cell["row"], cell["column"]) for cell in topo["unreadable"]}
    for row in names:
        assert row not in topo["links"][row]
        assert set(topo["links"][row]) == set(names) - {row} - {column for r, column in damaged if r == row}
    assert bool(damaged) == (cap.path.stem == GLUED)


ALL_PAIRS_RE = re.compile(r"all (\d+) GPU pairs = (\w+)")


@pytest.mark.parametrize("cap", [p for p in capture_params("A_topo_m") if ALL_PAIRS_RE.search(p.values[0].expected)])
def test_pair_counts_are_complete(cap):
    """Files that sum up their pairs ('all 28 GPU pairs = NV12') agree with the parsed matrix."""
    topo = parse_topology(cap.text)
    match = ALL_PAIRS_RE.search(cap.expected)
    n, code = int(match.group(1)), match.group(2)
    gpus = [g["name"] for g in topo["gpus"]]
    assert n == len(gpus) * (len(gpus) - 1) // 2
    assert {topo["links"][a][b] for a in gpus for b in gpus if a != b} == {code}


def _by_name(topo, name):
    return next(d for d in topo["gpus"] + topo["nics"] if d["name"] == name)


@pytest.mark.parametrize(
    ("stem", "gpu", "cpu", "numa", "gpu_numa_id"),
    [
        ("2x_rtx3090_SYS_numa_affinity_NA_on_gpu0_club3090_178", "GPU0", "0-7,16-23", None, None),
        ("2x_rtx3090_SYS_numa_affinity_NA_on_gpu0_club3090_178", "GPU1", "8-15,24-31", "1", None),
        ("8x_h100_della_NV18_6nic_empty_cpu_affinity_slurm_cgroup", "GPU0", None, "0", None),
        ("8x_h100_della_NV18_6nic_empty_cpu_affinity_slurm_cgroup", "GPU7", "1", "1", None),
        ("1gpu_6nic_della_single_gpu_job_PIX_SYS", "GPU0", "0", "0", None),
        ("1x_h200_driver580_ansi_underlined_header", "GPU0", "0-15", "0", None),
        ("8x_v100_hybrid_cube_mesh_vm_PHB_numa_range_0-1", "GPU3", "0-63", "0-1", None),
        ("8x_p40_SOC_PIX_PXB_mlx5_cpu_affinity_only_old", "GPU5", "0-13", None, None),
        ("8gpu_PIX_PHB_SYS_no_affinity_columns_transitional_legend", "GPU7", None, None, None),
        ("8x_a100_sxm4_80gb_NV12_4nic_spaces_odd_cpu_range_192-254", "GPU4", "64-127,192-254", "1", None),
        ("8x_a100_dgx_a100_NV12_12nic_named_mlx5_no_nic_legend", "GPU4", "112-127,240-255", "7", None),
        ("2gpu_NODE_reindented_wrapped_legend_pahi", "GPU1", "0-15", "0", None),
    ],
)
def test_affinity_fields(stem, gpu, cpu, numa, gpu_numa_id):
    (cap,) = [p.values[0] for p in capture_params("A_topo_m") if p.id == stem]
    found = _by_name(parse_topology(cap.text), gpu)
    assert (found["cpu_affinity"], found["numa_affinity"], found["gpu_numa_id"]) == (cpu, numa, gpu_numa_id)


@pytest.mark.parametrize(
    ("stem", "devices"),
    [
        ("4x_a100_sxm4_80gb_NV12_1nic_roce_nic_legend", {"NIC0": "rocep49s0"}),
        ("8x_h100_della_NV18_6nic_empty_cpu_affinity_slurm_cgroup", {f"NIC{i}": f"mlx5_{i}" for i in range(6)}),
        ("8x_a100_dgx_a100_NV12_12nic_named_mlx5_no_nic_legend", {f"mlx5_{i}": f"mlx5_{i}" for i in range(12)}),
        ("8x_v100_sxm2_hybrid_cube_mesh_NV1_NV2_SYS_1nic_vastai", {"NIC0": "mlx5_2"}),
        ("8x_p40_SOC_PIX_PXB_mlx5_cpu_affinity_only_old", {"mlx5_0": "mlx5_0"}),
    ],
)
def test_nic_devices_come_from_the_legend_or_the_column_name(stem, devices):
    (cap,) = [p.values[0] for p in capture_params("A_topo_m") if p.id == stem]
    assert {n["name"]: n["device"] for n in parse_topology(cap.text)["nics"]} == devices


def test_gpu_nic_and_nic_nic_links_are_read():
    (cap,) = [p.values[0] for p in capture_params("A_topo_m") if p.id.startswith("8x_h100_della")]
    links = parse_topology(cap.text)["links"]
    assert [links["GPU0"][f"NIC{i}"] for i in range(6)] == ["PIX", "PIX", "NODE", "NODE", "NODE", "NODE"]
    assert links["NIC3"]["NIC4"] == "PIX"
    assert links["NIC0"]["NIC5"] == "NODE"
    assert links["NIC2"]["GPU3"] == "PIX"


def test_old_soc_is_kept_as_printed_and_normalised_to_sys():
    (cap,) = [p.values[0] for p in capture_params("A_topo_m") if p.id.startswith("8x_p40_SOC")]
    topo = parse_topology(cap.text)
    assert topo["links"]["GPU0"]["mlx5_0"] == "SOC"
    assert analyse(topo)["links_normalized"]["GPU0"]["mlx5_0"] == "SYS"


# Verdicts: what an expert would say about each capture.
VERDICTS = {
    "1gpu_6nic_della_single_gpu_job_PIX_SYS": ("single_gpu", None),
    "2gpu_NODE_reindented_wrapped_legend_pahi": ("slow", "NODE"),
    "2gpu_aws_PIX_header_without_leading_tab_excerpt": ("fit", "PIX"),
    "2x_rtx3090_SYS_numa_affinity_NA_on_gpu0_club3090_178": ("slow", "SYS"),
    "2x_rtx5090_threadripper3975wx_PHB_gpu_numa_id": ("slow", "PHB"),
    "3x_rtxa6000_NV4_pair_plus_NODE": ("slow", "NODE"),
    "1x_h200_driver580_ansi_underlined_header": ("single_gpu", None),
    "4gpu_PXB_PIX_SYS_dual_socket_no_legend_nccl667": ("slow", "SYS"),
    "4gpu_rtx4090x2_a6000_rtx5090_PHB_spaces_fedora": ("slow", "PHB"),
    "4x_a100_pcie_40gb_all_SYS_spaces_sm02": ("slow", "SYS"),
    "4x_a100_sxm4_80gb_NV12_1nic_roce_nic_legend": ("fit", "NV12"),
    "4x_rtx5060ti_PHB_no_legend_in_capture": ("slow", "PHB"),
    "4x_rtx_pro_6000_PHB_0-119": ("slow", "PHB"),
    "5gpu_rtx50_epyc_NODE_PHB_patched_p2p": ("slow", "NODE"),
    "8gpu_PIX_PHB_SYS_no_affinity_columns_transitional_legend": ("slow", "SYS"),
    "8gpu_dgx1_topo_mp_pcie_only_4nic_named_mlx5_no_nv_legend": ("slow", "SYS"),
    "8x_a100_aws_p4d_NV12_no_nic_gpu_numa_id": ("fit", "NV12"),
    "8x_a100_dgx_a100_NV12_12nic_named_mlx5_no_nic_legend": ("fit", "NV12"),
    "8x_a100_sxm4_80gb_NV12_4nic_spaces_odd_cpu_range_192-254": ("fit", "NV12"),
    "8x_h100_della_NV18_6nic_empty_cpu_affinity_slurm_cgroup": ("fit", "NV18"),
    "8x_p40_SOC_PIX_PXB_mlx5_cpu_affinity_only_old": ("fit", "PXB"),
    "8x_v100_hybrid_cube_mesh_vm_PHB_numa_range_0-1": ("slow", "PHB"),
    "8x_v100_sxm2_hybrid_cube_mesh_NV1_NV2_SYS_1nic_vastai": ("slow", "SYS"),
    GLUED: ("fit", "NV12"),
}


@pytest.mark.parametrize("cap", capture_params("A_topo_m"))
def test_tensor_parallel_verdict(cap):
    verdict, worst = VERDICTS[cap.path.stem]
    result = analyse(parse_topology(cap.text))
    assert result["verdict"] == verdict
    assert (result["worst_gpu_link"] or {}).get("code") == worst
    assert result["reason"].endswith(".")
    assert result["reason"].count(". ") <= 1


def test_nvlink_pairs_and_a_fit_subset_are_named():
    (cap,) = [p.values[0] for p in capture_params("A_topo_m") if p.id.startswith("3x_rtxa6000")]
    result = analyse(parse_topology(cap.text))
    assert result["nvlink_pairs"] == [{"gpus": ["GPU0", "GPU1"], "links": 4}]
    assert "GPU0 and GPU1 share NVLink" in result["reason"]


@pytest.mark.parametrize("cap", capture_params("B_topo_p2p"))
def test_p2p_statuses_match_expected(cap):
    p2p = parse_p2p(cap.text)
    pairs = expected_pairs(cap.expected)
    all_ok = "all" in cap.expected and "OK" in cap.expected and not pairs
    gpus = sorted(p2p)
    assert len(gpus) == expected_count(cap.expected, "GPUs")
    for a in gpus:
        assert a not in p2p[a]
        for b in gpus:
            if a != b:
                assert p2p[a][b] == (pairs.get((a, b)) or pairs.get((b, a)) or ("OK" if all_ok else None))


def test_broken_p2p_makes_a_fit_topology_slow_and_names_the_status():
    (cap,) = [p.values[0] for p in capture_params("A_topo_m") if p.id.startswith("2gpu_aws_PIX")]
    (p2p,) = [p.values[0] for p in capture_params("B_topo_p2p") if p.id.startswith("2x_rtx5090_p2p_rw_GNS")]
    result = analyse(parse_topology(cap.text), parse_p2p(p2p.text))
    assert result["verdict"] == "slow"
    assert "GNS (GPU not supported)" in result["reason"]


def test_combine_p2p_is_ok_only_where_every_matrix_says_ok():
    read = {"GPU0": {"GPU1": "OK"}, "GPU1": {"GPU0": "OK"}}
    write = {"GPU0": {"GPU1": "CNS"}, "GPU1": {"GPU0": "OK"}}
    assert combine_p2p(read, write) == {"GPU0": {"GPU1": "CNS"}, "GPU1": {"GPU0": "OK"}}


# Made-up variants of the same grammar that no capture shows, and damaged input.
def test_command_glued_to_the_header_and_a_wrapped_dump():
    text = "GPU Topology:\n$ nvidia-smi topo -m\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tPHB\t0-7\nGPU1\tPHB\t X \t0-7\n"
    topo = parse_topology(text)
    assert topo["links"]["GPU0"]["GPU1"] == "PHB"
    assert topo["gpus"][1]["cpu_affinity"] == "0-7"


def test_mixed_tabs_and_spaces():
    text = "\tGPU0  GPU1\tCPU Affinity    NUMA Affinity\nGPU0   X \tNV4  0-15\t0\nGPU1\tNV4    X    0-15 0\n"
    topo = parse_topology(text)
    assert topo["links"]["GPU1"]["GPU0"] == "NV4"
    assert [g["numa_affinity"] for g in topo["gpus"]] == ["0", "0"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("no matrix here\n", "no matrix header found"),
        ("\tGPU0\tGPU1\nGPU0\t X \tPHB\n", "line 2: the matrix ends before the row for GPU1"),
        ("\tGPU0\tGPU1\nGPU0\t X \nGPU1\tPHB\t X \n", "line 2: row GPU0 has 1 cells, the header names 2 devices"),
        ("\tGPU0\tGPU1\nGPU0\t X \tphb\nGPU1\tPHB\t X \n", "line 2: row GPU0, column GPU1: 'phb' is not a link code"),
        ("\tGPU0\tGPU1\nGPU0\tPHB\t X \nGPU1\tPHB\t X \n", "line 2: row GPU0 has 'PHB' where its own column"),
        ("\tGPU0\tGPU1\nGPU0\t X \tPHB\nGPU0\t X \tPHB\n", "line 3: second row for GPU0"),
        ("\tGPU0\tGPU0\nGPU0\t X \tPHB\n", "line 1: header names a device twice"),
        # Cells run together that could hide a link: a GPU-GPU cell (it decides tensor parallelism), a cell
        # that is not the last one, and one with no CPU Affinity column after it to have run into.
        ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV0-7\nGPU1\tNV4\t X \t0-7\n", "row GPU0, column GPU1: 'NV0-7'"),
        ("\tGPU0\tNIC0\tNIC1\tCPU Affinity\nGPU0\t X \tPH0-7\tPHB\n", "row GPU0, column NIC0: 'PH0-7'"),
        ("\tGPU0\tNIC0\nGPU0\t X \tPH0-7\n", "row GPU0, column NIC0: 'PH0-7'"),
    ],
)
def test_damaged_input_is_refused_with_the_line(text, message):
    with pytest.raises(TopologyParseError, match=re.escape(message)):
        parse_topology(text)


def _glued():
    (cap,) = [p.values[0] for p in capture_params("A_topo_m") if p.id == GLUED]
    return cap


def test_a_nic_cell_glued_to_the_affinity_is_marked_and_the_rest_is_read():
    topo = parse_topology(_glued().text)
    gpus = [f"GPU{i}" for i in range(8)]
    assert {topo["links"][a][b] for a in gpus for b in gpus if a != b} == {"NV12"}
    for gpu in gpus:
        assert [topo["links"][gpu][f"NIC{n}"] for n in range(7)] == ["PHB"] * 7
        assert "NIC7" not in topo["links"][gpu]
        # The NIC7 row printed its own cells whole: they stay, and are not copied into the damaged GPU cell.
        assert topo["links"]["NIC7"][gpu] == "PHB"
    assert topo["unreadable"][:2] == [
        {"row": "GPU0", "column": "NIC7", "text": "PH0-115", "line": 3},
        {"row": "GPU0", "column": "CPU Affinity", "text": "PH0-115", "line": 3},
    ]
    assert len(topo["unreadable"]) == 16
    # Never guessed: no CPU list is made up from the damaged cell; the fields after it are read in their own columns.
    assert {(g["cpu_affinity"], g["numa_affinity"], g["gpu_numa_id"]) for g in topo["gpus"]} == {(None, "0-3", None)}
    assert topo["nics"][7] == {"name": "NIC7", "device": "mlx5_7"}


@pytest.mark.parametrize(
    "variant",
    [
        pytest.param(lambda t: t.replace("\n", "\r\n"), id="windows-line-endings"),
        pytest.param(lambda t: t.replace("\n", " \n"), id="trailing-spaces"),
        pytest.param(lambda t: t.replace("\nGPU0", "\n\x1b[4mGPU0\x1b[0m", 1), id="ansi-escapes"),
    ],
)
def test_the_glued_capture_reads_the_same_through_paste_damage(variant):
    plain = parse_topology(_glued().text)
    varied = parse_topology(variant(_glued().text))
    assert varied["links"] == plain["links"]
    assert [(c["row"], c["column"]) for c in varied["unreadable"]] == [(c["row"], c["column"]) for c in plain["unreadable"]]


@pytest.mark.parametrize("cap", capture_params("B_topo_p2p"))
def test_a_p2p_matrix_alone_names_its_gpus_and_never_says_fit(cap):
    p2p = parse_p2p(cap.text)
    topo = topology_from_p2p(p2p)
    assert [g["name"] for g in topo["gpus"]] == [f"GPU{i}" for i in range(len(p2p))]
    result = analyse(topo, p2p)
    statuses = {status for row in p2p.values() for status in row.values()}
    if len(p2p) == 1:
        assert result["verdict"] == "single_gpu"
    elif statuses == {"OK"}:
        assert result["verdict"] == "unknown"
    else:
        assert result["verdict"] == "slow"
    assert result["worst_gpu_link"] is None


def test_a_glued_cell_with_two_digit_gpu_names():
    names = [f"GPU{i}" for i in range(11)]
    header = "\t" + "\t".join([*names, "NIC0", "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]) + "\r\n"
    rows = "".join(n + "\t" + "\t".join(" X " if m == n else "SYS" for m in names) + "\tSY0-63\t0\t\tN/A\r\n" for n in names)
    topo = parse_topology(header + rows)
    assert topo["links"]["GPU10"]["GPU9"] == "SYS"
    assert [c["row"] for c in topo["unreadable"] if c["column"] == "NIC0"] == names
    assert topo["gpus"][10]["numa_affinity"] == "0"


def test_a_p2p_matrix_from_another_box_is_named():
    (cap,) = [p.values[0] for p in capture_params("A_topo_m") if p.id.startswith("2gpu_aws_PIX")]
    (p2p,) = [p.values[0] for p in capture_params("B_topo_p2p") if p.id.startswith("4x_rtx5060ti")]
    assert check_p2p_matches(parse_topology(cap.text), parse_p2p(p2p.text)) == "GPU2"
    (same,) = [p.values[0] for p in capture_params("B_topo_p2p") if p.id.startswith("2x_rtx5090_p2p_rw_GNS")]
    assert check_p2p_matches(parse_topology(cap.text), parse_p2p(same.text)) is None


def test_two_digit_gpu_names_in_a_p2p_matrix_sort_by_number():
    names = [f"GPU{i}" for i in range(11)]
    header = "\t" + "\t".join(names) + "\n"
    rows = "".join(n + "\t" + "\t".join("X" if m == n else "OK" for m in names) + "\n" for n in names)
    topo = topology_from_p2p(parse_p2p(header + rows))
    assert [g["index"] for g in topo["gpus"]] == list(range(11))


def test_p2p_parser_refuses_link_codes():
    with pytest.raises(TopologyParseError, match="'PHB' is not a link code"):
        parse_p2p("\tGPU0\tGPU1\nGPU0\tX\tPHB\nGPU1\tOK\tX\n")
