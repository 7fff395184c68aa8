"""parse_topo: one focused test per quirk found in the second collection of REAL ``nvidia-smi topo -m`` outputs
(tests/fixtures/real-world/topo, SOURCES.md). Tests marked "synthetic" change a real fixture in one stated way; the
change is made in the test, never in the fixture."""
import json
import pathlib
import re

import pytest

from ansible_collections.b300.rollout.plugins.module_utils.hw import gpu_topology as gt

TOPO_DIR = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "real-world" / "topo"


def load(name):
    return (TOPO_DIR / (name + ".txt")).read_text(), json.loads((TOPO_DIR / (name + ".answer.json")).read_text())


# ----------------------------------------------------------------- real glued cells
def test_real_glued_pxbnode_and_syssys_b200():
    """Real B200 output: the tab between the NIC8 and NIC9 cells is missing in most rows (`PXBNODE`, `SYSSYS`)."""
    text, _ = load("b200x8_16nic_glued_pxbnode_syssys")
    assert "\tPXBNODE\t" in text and "\tSYSSYS\t" in text
    p = gt.parse_topo(text)
    assert p["gpu_nic"]["2"]["mlx5_8"] == "PXB" and p["gpu_nic"]["2"]["mlx5_9"] == "NODE"
    for g in ("4", "5", "6", "7"):
        assert p["gpu_nic"][g]["mlx5_8"] == "SYS" and p["gpu_nic"][g]["mlx5_9"] == "SYS"
    assert p["gpu_nic"]["2"]["mlx5_15"] == "SYS"  # nothing after the glued cell shifted
    assert p["cpu_affinity"]["2"] == "0-55,112-167" and p["numa_affinity"]["4"] == "1"


def test_real_glued_pixnode_reads_like_the_unglued_twin_host():
    """Real H200 pair: aihub0008 prints `PIXNODE` where aihub0007 (same board layout) prints `PIX<tab>NODE`."""
    glued = gt.parse_topo(load("h200x8_aihub0008_12nic_glued_pixnode")[0])
    clean = gt.parse_topo(load("h200x8_sglang_aihub_12nic")[0])
    assert glued["gpu_nic"]["5"]["mlx5_7"] == "PIX" and glued["gpu_nic"]["5"]["mlx5_8"] == "NODE"
    assert glued["gpu_nic"] == clean["gpu_nic"]
    assert glued["cpu_affinity"] == clean["cpu_affinity"]


def test_real_glued_in_two_places_with_widened_header_h20():
    """Real H20 output (spaces): glue at NIC12/NIC13 and NIC34/NIC35 of every row, header widened at those columns."""
    text, ans = load("h20x8_36nic_glued_two_places_vf_and_bond")
    assert "NIC12       NIC13" in text and "NODEPIX     0-55" in text and "SYSSYS      70-99,102-107" in text
    p = gt.parse_topo(text)
    assert len(p["nics"]) == 36 and p["nics"][-1] == "mlx5_bond_3"
    assert (p["gpu_nic"]["0"]["mlx5_12"], p["gpu_nic"]["0"]["mlx5_13"]) == ("NODE", "NODE")
    assert (p["gpu_nic"]["0"]["mlx5_bond_2"], p["gpu_nic"]["0"]["mlx5_bond_3"]) == ("NODE", "PIX")
    assert (p["gpu_nic"]["2"]["mlx5_12"], p["gpu_nic"]["2"]["mlx5_13"]) == ("PIX", "PIX")
    assert (p["gpu_nic"]["4"]["mlx5_bond_2"], p["gpu_nic"]["4"]["mlx5_bond_3"]) == ("SYS", "SYS")
    assert p["cpu_affinity"]["4"] == "70-99,102-107"


def test_glued_row_missing_a_cell_raises_naming_the_row():
    """Synthetic (from the real B200 fixture): a glued row that also lost a cell cannot fit its header."""
    text, _ = load("b200x8_16nic_glued_pxbnode_syssys")
    broken = re.sub(r"(?m)^(GPU2\t.*?\tPXBNODE)\tSYS\t", r"\1\t", text)
    with pytest.raises(gt.TopoParseError, match="row GPU2"):
        gt.parse_topo(broken)


# ----------------------------------------------------------------- layout quirks
def test_real_blank_line_between_rows():
    """Real markdown copy: an empty line between every row and a whitespace-only line after the header."""
    p = gt.parse_topo(load("v100x8_markdown_blank_lines_between_rows")[0])
    assert p["gpus"] == [str(i) for i in range(8)]
    assert p["gpu_gpu"]["7"] == {"0": "NV2", "1": "SYS", "2": "SYS", "3": "SYS", "4": "NV1", "5": "NV2", "6": "NV1"}


def test_blank_lines_between_tab_rows_read_the_same():
    """Synthetic (from the real h200x8_570_8nic): the same empty line inserted after every matrix row."""
    text, _ = load("h200x8_570_8nic")
    spaced = re.sub(r"(?m)^((?:GPU|NIC)\d+\t.*)$", r"\1\n", text)
    assert "\n\nGPU1\t" in spaced
    assert gt.parse_topo(spaced) == gt.parse_topo(text)


def test_second_copy_of_the_matrix_is_not_merged():
    """Synthetic (from the real h200x8_570_8nic): the block pasted twice; the first copy is read, rows not doubled."""
    text, _ = load("h200x8_570_8nic")
    block = text.split("\nLegend:")[0]
    assert gt.parse_topo(block + "\n\n" + block + "\n") == gt.parse_topo(block + "\n")


def test_real_irregular_spacing_between_cells():
    """Real copy whose gaps are 1-9 spaces (`NODE  NODE     NODE`, `NODE   X       NODE`)."""
    p = gt.parse_topo(load("h100x2_10nic_irregular_spacing")[0])
    assert p["gpu_nic"]["1"] == {"mlx5_0": "SYS", "mlx5_1": "SYS", "mlx5_2": "SYS", "mlx5_3": "SYS", "mlx5_4": "SYS",
                                 "mlx5_5": "SYS", "mlx5_6": "PIX", "mlx5_7": "NODE", "mlx5_8": "NODE",
                                 "mlx5_9": "NODE"}


def test_real_15_char_cpu_list_with_one_space_before_numa():
    """Real DGX A100 copy (spaces): `112-127,240-255 7` leaves one space between CPU list and NUMA id."""
    p = gt.parse_topo(load("a100x8_dgx_10nic_15char_cpu_list_one_space")[0])
    assert p["cpu_affinity"]["4"] == "112-127,240-255" and p["numa_affinity"]["4"] == "7"
    assert p["gpu_numa_id"]["4"] is None


def test_real_comma_cpu_lists_topo_mp():
    """Real `nvidia-smi topo -mp` output: CPU lists like `0,2,4,6,8,10`, GPU-GPU cells NODE/SYS."""
    p = gt.parse_topo(load("gpu8_topo_mp_12nic_comma_cpu_lists")[0])
    assert p["cpu_affinity"]["0"] == "0,2,4,6,8,10" and p["cpu_affinity"]["7"] == "1,3,5,7,9,11"
    assert p["gpu_gpu"]["0"]["4"] == "SYS" and p["gpu_gpu"]["0"]["1"] == "NODE"


# ----------------------------------------------------------------- empty / numeric named cells
def test_real_empty_cpu_and_numa_affinity_with_gpu_numa_id():
    """Real H800 container output: `SYS<tab><tab><tab><tab>N/A` = no CPU affinity, no NUMA affinity, GPU NUMA ID N/A."""
    text, _ = load("h800x4_17nic_blank_cpu_and_numa_affinity")
    p = gt.parse_topo(text)
    assert p["cpu_affinity"] == {str(g): None for g in range(4)}
    assert p["numa_affinity"] == {str(g): None for g in range(4)}
    assert p["gpu_numa_id"] == {str(g): None for g in range(4)}


def test_empty_cpu_affinity_keeps_a_numeric_gpu_numa_id_in_its_column():
    """Synthetic (from the real H800 fixture): the GPU NUMA ID after two empty cells is a number; it must not be read
    as a CPU list."""
    text, _ = load("h800x4_17nic_blank_cpu_and_numa_affinity")
    changed = text.replace("\tPIX\t\t\t\tN/A", "\tPIX\t\t\t\t1")
    assert "\t\t\t\t1\n" in changed
    p = gt.parse_topo(changed)
    assert p["gpu_numa_id"]["3"] == "1"
    assert p["cpu_affinity"]["3"] is None and p["numa_affinity"]["3"] is None


def test_empty_cpu_affinity_only():
    """Synthetic (from the real H800 fixture): CPU Affinity empty, NUMA Affinity 0, GPU NUMA ID N/A."""
    text, _ = load("h800x4_17nic_blank_cpu_and_numa_affinity")
    changed = text.replace("\t\t\t\tN/A", "\t\t0\t\tN/A")
    p = gt.parse_topo(changed)
    assert p["cpu_affinity"] == {str(g): None for g in range(4)}
    assert p["numa_affinity"] == {str(g): "0" for g in range(4)}


def test_numeric_gpu_numa_id():
    """Synthetic (from the real h200x8_570_8nic): GPU NUMA ID printed as a number (Grace/C2C systems) instead of N/A."""
    text, _ = load("h200x8_570_8nic")
    changed = text.replace("\t0\t\tN/A", "\t0\t\t2")
    p = gt.parse_topo(changed)
    assert p["gpu_numa_id"]["0"] == "2" and p["numa_affinity"]["0"] == "0"
    assert p["cpu_affinity"]["0"] == "0-63,128-191"


# ----------------------------------------------------------------- copies of the whole block
def test_crlf_line_endings():
    """Synthetic (from the real B300 fixture): Windows line endings."""
    text, _ = load("b300x8_cx8_bond_8nic_pxb")
    assert gt.parse_topo(text.replace("\n", "\r\n")) == gt.parse_topo(text)


def test_ansi_underline_and_no_leading_spaces_in_spaced_header():
    """Synthetic (from the real B300 fixture, spaces): header underlined with ANSI escapes and its indent removed."""
    text, _ = load("b300x8_cx8_bond_8nic_pxb")
    lines = text.split("\n")
    i = next(n for n, ln in enumerate(lines) if ln.strip().startswith("GPU0"))
    lines[i] = "\x1b[4m" + lines[i].strip() + "\x1b[0m"
    assert gt.parse_topo("\n".join(lines)) == gt.parse_topo(text)


def test_prose_after_the_legend_is_ignored():
    """Synthetic (from the real h200x8 emoji-prompt fixture): prose mentioning GPU0 and NIC rows after the legend."""
    text, _ = load("h200x8_12nic_emoji_prompt_nic1_2_7_8_unpaired")
    tail = "\nGPU0 sits next to NIC0 (PXB); GPU4 next to NIC6.\nNIC1 PIX NIC2\n"
    assert gt.parse_topo(text + tail) == gt.parse_topo(text)


def test_real_single_gpu_with_nic_columns():
    """Real lmdeploy check_env output: one GPU row, five bond NICs, title line before the header."""
    p = gt.parse_topo(load("a100x1_lmdeploy_check_env_5bond")[0])
    assert p["gpus"] == ["0"] and p["gpu_gpu"] == {}
    assert p["gpu_nic"]["0"]["mlx5_bond_3"] == "PXB"
