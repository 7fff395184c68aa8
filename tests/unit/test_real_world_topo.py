"""parse_topo on REAL nvidia-smi topo -m outputs from public sources (tests/fixtures/real-world/topo, SOURCES.md),
compared with answers written by hand from the raw text; plus one focused test per known quirk."""
import json
import pathlib
import re

import pytest

from ansible_collections.b300.rollout.plugins.module_utils.hw import affinity as af
from ansible_collections.b300.rollout.plugins.module_utils.hw import gpu_topology as gt

TOPO_DIR = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "real-world" / "topo"
FIXTURES = sorted(p.name[:-4] for p in TOPO_DIR.glob("*.txt"))
LEVELS = ("PIX", "PXB", "PHB", "NODE", "SYS")


def load(name):
    return (TOPO_DIR / (name + ".txt")).read_text(), json.loads((TOPO_DIR / (name + ".answer.json")).read_text())


def nearest(parsed, gpu):
    row = parsed["gpu_nic"].get(gpu, {})
    ranked = [(LEVELS.index(v), n) for n, v in row.items() if v in LEVELS]
    if not ranked:
        return [], None
    best = min(r for r, _ in ranked)
    return sorted((n for r, n in ranked if r == best), key=parsed["nics"].index), LEVELS[best]


def test_enough_real_fixtures_each_with_answer_and_source():
    assert len(FIXTURES) >= 29
    sources = (TOPO_DIR / "SOURCES.md").read_text()
    for name in FIXTURES:
        assert (TOPO_DIR / (name + ".answer.json")).exists(), name
        assert "| %s |" % name in sources, name


@pytest.mark.parametrize("name", FIXTURES)
def test_real_fixture_matches_answer(name):
    text, ans = load(name)
    p = gt.parse_topo(text)
    assert len(p["gpus"]) == ans["gpu_count"]
    assert p["gpus"] == [str(i) for i in range(ans["gpu_count"])]
    assert p["nics"] == ans["nics"]
    assert p["nic_columns_present"] is bool(ans["nics"])
    assert p["cpu_affinity"] == ans["cpu_affinity"]
    assert p["numa_affinity"] == ans["numa_affinity"]
    assert p["gpu_gpu"].get("0", {}) == ans["gpu0_links"]
    for g, links in ans.get("gpu_gpu_extra", {}).items():
        for other, val in links.items():
            assert p["gpu_gpu"][g][other] == val, (g, other)
    # every GPU row has a cell for every other GPU and every NIC (no shifted or missing cells)
    for g in p["gpus"]:
        assert set(p["gpu_gpu"].get(g, {})) == set(p["gpus"]) - {g}
        assert set(p["gpu_nic"].get(g, {})) == set(p["nics"])
    for g, want in ans["nearest_nics"].items():
        got, level = nearest(p, g)
        assert got == want, g
        if "nearest_level" in ans:
            assert level == ans["nearest_level"][g], g


EIGHT_WITH_NICS = [n for n in FIXTURES if load(n)[1]["gpu_count"] == 8 and load(n)[1]["nics"]]


@pytest.mark.parametrize("name", EIGHT_WITH_NICS)
def test_real_8gpu_nearest_nic_through_affinity(name):
    """The same choice through affinity.nearest_nics, the code that feeds NCCL_IB_HCA / --disaggregation-ib-device."""
    text, ans = load(name)
    p = gt.parse_topo(text)
    fact = {"gpus": [{"index": int(g), "pci_bus_id": None, "numa_node": None} for g in p["gpus"]],
            "topology": {"gpu_nic": p["gpu_nic"]}}
    rdma = {"devices": [{"name": n, "usable": True, "role": "data", "pci_address": None, "numa_node": None}
                        for n in p["nics"]]}
    for g, want in ans["nearest_nics"].items():
        got = af.nearest_nics(fact, rdma, [int(g)], sysfs_root="/nonexistent")
        assert sorted(got) == sorted(want), g


# ----------------------------------------------------------------- focused quirks
def _glue(text, pattern):
    """Drop the tab the way drivers 525-570 do: between the cells matched by `pattern` (a regex with two groups)."""
    return re.sub(pattern, r"\1\2", text)


def test_glued_matrix_cells_like_PIXPHB():
    text, ans = load("h200x8_570_8nic")
    glued = _glue(text, r"(?m)^(GPU0\t.*?\tNODE\tSYS\tNODE\tPIX)\t(SYS)")
    assert "PIXSYS" in glued
    p = gt.parse_topo(glued)
    assert p == gt.parse_topo(text)
    assert nearest(p, "0")[0] == ans["nearest_nics"]["0"]


def test_glued_numa_and_gpu_numa_id_like_0NA():
    text, ans = load("h200x8_570_8nic")
    glued = text.replace("\t0\t\tN/A", "\t0N/A")
    assert "0N/A" in glued
    assert gt.parse_topo(glued) == gt.parse_topo(text)


def test_glued_cpu_list_numa_id_and_gpu_numa_id():
    """`64-127,192-2551N/A`: only the header count and the CPU-list rule (ranges run upwards) split it."""
    text, ans = load("h200x8_570_8nic")
    glued = text.replace("\t64-127,192-255\t1\t\tN/A", "\t64-127,192-2551N/A")
    assert "192-2551N/A" in glued
    p = gt.parse_topo(glued)
    assert p["cpu_affinity"] == ans["cpu_affinity"]
    assert p["numa_affinity"] == ans["numa_affinity"]
    assert p["gpu_nic"] == gt.parse_topo(text)["gpu_nic"]


def test_glued_cpu_list_48_95_144_1911NA():
    topo = ("\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
            "GPU0\t X \tNV18\tPIX\t0-47,96-143\t0\t\tN/A\n"
            "GPU1\tNV18\t X \tSYS\t48-95,144-1911N/A\n\nNIC Legend:\n\n  NIC0: mlx5_0\n")
    p = gt.parse_topo(topo)
    assert p["cpu_affinity"] == {"0": "0-47,96-143", "1": "48-95,144-191"}
    assert p["numa_affinity"] == {"0": "0", "1": "1"}
    assert p["gpu_nic"] == {"0": {"mlx5_0": "PIX"}, "1": {"mlx5_0": "SYS"}}


def test_row_that_cannot_fit_raises_naming_the_row():
    text, _ = load("h200x8_570_8nic")
    broken = re.sub(r"(?m)^(GPU5\t.*?)\tPIX\t", r"\1\t", text)  # one NIC cell lost
    with pytest.raises(gt.TopoParseError, match="row GPU5"):
        gt.parse_topo(broken)
    with pytest.raises(gt.TopoParseError, match="row GPU1"):
        gt.parse_topo(text.replace("GPU1\tNV18\t X \t", "GPU1\tNV18\t X \tBOGUS\t"))


def test_mlx5_header_without_legend():
    p = gt.parse_topo(load("gpu4_mlx5_header_nv3_4nic")[0])
    assert p["nic_legend"] == {}
    assert p["gpu_nic"]["2"] == {"mlx5_0": "SYS", "mlx5_1": "SYS", "mlx5_2": "NODE", "mlx5_3": "NODE"}


def test_spaces_for_tabs_with_seven_char_cells():
    text, ans = load("h100x8_vllm_collect_env_indented_1nic")
    spaced = text.expandtabs(8)
    assert "104-207 1" in spaced  # the 7-character CPU list now touches its neighbour
    p = gt.parse_topo(spaced)
    assert p["cpu_affinity"] == ans["cpu_affinity"] and p["numa_affinity"] == ans["numa_affinity"]
    assert p["gpu_nic"] == gt.parse_topo(text)["gpu_nic"]


def test_header_without_leading_tab_and_with_it_read_the_same():
    text, _ = load("h100x8_580_noleadingtab_12nic")
    assert text.startswith("GPU0\tGPU1")
    assert gt.parse_topo(text) == gt.parse_topo("\t" + text)


def test_ansi_escapes_in_header():
    text, ans = load("h200x8_570_8nic")
    lines = text.split("\n")
    lines[0] = "\t\x1b[4m" + lines[0].lstrip("\t") + "\x1b[0m"
    p = gt.parse_topo("\n".join(lines))
    assert p == gt.parse_topo(text)


# ------------------------------------------- every real fixture, in the forms copies of it take
def _ansi_header(text):
    lines = text.split("\n")
    i = next(k for k, ln in enumerate(lines) if "GPU0" in ln)
    lines[i] = "\t\x1b[4m" + lines[i].lstrip("\t ") + "\x1b[0m"
    return "\n".join(lines)


def _no_leading_header_tab(text):
    lines = text.split("\n")
    i = next(k for k, ln in enumerate(lines) if "GPU0" in ln)
    lines[i] = lines[i].lstrip("\t ")
    return "\n".join(lines)


VARIANTS = {
    "crlf": lambda t: t.replace("\r\n", "\n").replace("\n", "\r\n"),
    "trailing_spaces": lambda t: "\n".join(ln + "  " if ln.strip() else ln for ln in t.split("\n")),
    "tabs_to_spaces": lambda t: t.expandtabs(8),
    "tabs_to_4_spaces": lambda t: t.expandtabs(4),
    "ansi_underlined_header": _ansi_header,
    "header_without_leading_tab": _no_leading_header_tab,
}
KEYS = ("gpus", "nics", "cpu_affinity", "numa_affinity", "gpu_gpu", "gpu_nic")


# only the pairs where the copy differs from the original (a file already without tabs has no tabs-to-spaces form)
COPIED_FORMS = [(n, v) for n in FIXTURES for text in [load(n)[0]] for v in sorted(VARIANTS) if VARIANTS[v](text) != text]


@pytest.mark.parametrize("name,variant", COPIED_FORMS)
def test_real_fixture_reads_the_same_in_every_copied_form(name, variant):
    """A copy pasted into a ticket or a chat turns tabs into spaces, CRLF, underline escapes or a lost leading tab:
    the same matrix must come out. Rules, not files: this is how the further real outputs will arrive."""
    text, ans = load(name)
    changed = VARIANTS[variant](text)
    want = gt.parse_topo(text)
    got = gt.parse_topo(changed)
    assert {k: got[k] for k in KEYS} == {k: want[k] for k in KEYS}
    assert got["cpu_affinity"] == ans["cpu_affinity"]
