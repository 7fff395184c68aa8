"""module_utils/hw/affinity.py on a SYNTHESIZED HGX B300 host (tests/fixtures/facts/synth.py) and the REAL H200 topo."""
import pathlib

import pytest

from ansible_collections.b300.rollout.plugins.module_utils.hw import affinity as af
from ansible_collections.b300.rollout.plugins.module_utils.hw.gpu_topology import build_gpu_topology
from ansible_collections.b300.rollout.plugins.module_utils.hw.rdma_nic import build_rdma_nics

import synth


@pytest.fixture
def host(tmp_path):
    """(gpu_topology with NIC columns, gpu_topology without, rdma_nics, sysfs_root) for one synthesized B300 host."""
    root = synth.make_sysfs(tmp_path, fm_under_gpu0=True)
    with_nics = build_gpu_topology(synth.b300_xml(), synth.b300_topo(), synth.b300_nvlink(), sysfs_root=root)
    no_nics = build_gpu_topology(synth.b300_xml(), synth.b300_topo(with_nics=False), synth.b300_nvlink(),
                                 sysfs_root=root)
    return with_nics, no_nics, build_rdma_nics(root, "OFED-internal-25.10-1.2.2:", None, "6.8.0"), root


def _nic(rdma, name):
    return next(d for d in rdma["devices"] if d["name"] == name)


def test_distance_from_topo_cells(host):
    topo, _, rdma, root = host
    g0 = topo["gpus"][0]
    assert af.nic_distance(g0, _nic(rdma, "mlx5_0"), topo["topology"], root) == (0, "topo")
    assert af.nic_distance(g0, _nic(rdma, "mlx5_2"), topo["topology"], root) == (3, "topo")
    assert af.nic_distance(g0, _nic(rdma, "mlx5_6"), topo["topology"], root) == (4, "topo")


def test_distance_from_sysfs_when_topo_has_no_nic_columns(host):
    _, topo, rdma, root = host
    g0 = topo["gpus"][0]
    assert af.nic_distance(g0, _nic(rdma, "mlx5_0"), topo["topology"], root) == (0, "sysfs_pci")
    # the fabric-manager CX7 under the same switch as GPU 0: near, but it must never be chosen
    assert af.nic_distance(g0, _nic(rdma, "mlx5_8"), topo["topology"], root) == (0, "sysfs_pci")
    # different root complexes: NUMA decides
    assert af.nic_distance(g0, _nic(rdma, "mlx5_1"), topo["topology"], root) == (3, "numa")
    assert af.nic_distance(g0, _nic(rdma, "mlx5_7"), topo["topology"], root) == (4, "numa")


def test_distance_unknown_without_any_information(host):
    _, topo, rdma, _root = host
    g0 = dict(topo["gpus"][0], numa_node=None)
    assert af.nic_distance(g0, _nic(rdma, "mlx5_0"), topo["topology"], "/nonexistent") == (5, "unknown")


def test_pci_path(host):
    _, _, _, root = host
    assert af.pci_path(root, synth.gpu_pci(1)) == ["pci0000:30", "0000:30:01.0", "0000:31:00.0", "0000:32:00.0",
                                                   synth.gpu_pci(1)]
    assert af.pci_path(root, "0000:ff:00.0") == []


@pytest.mark.parametrize("which", [0, 1])
def test_nearest_one_per_gpu(host, which):
    topo = host[which]
    rdma, root = host[2], host[3]
    for i in range(8):
        assert af.nearest_nics(topo, rdma, [i], sysfs_root=root) == ["mlx5_%d" % i]
    assert af.gpu_nic_map(topo, rdma, sysfs_root=root) == {i: "mlx5_%d" % i for i in range(8)}


@pytest.mark.parametrize("which", [0, 1])
def test_nearest_for_a_gpu_set_in_gpu_order(host, which):
    topo, rdma, root = host[which], host[2], host[3]
    assert af.nearest_nics(topo, rdma, [6, 4, 5], sysfs_root=root) == ["mlx5_6", "mlx5_4", "mlx5_5"]
    assert af.nearest_nics(topo, rdma, list(range(8)), sysfs_root=root) == ["mlx5_%d" % i for i in range(8)]
    # count pads with the next nearest (same NUMA node first), deterministically
    assert af.nearest_nics(topo, rdma, [0], count=3, sysfs_root=root) == ["mlx5_0", "mlx5_1", "mlx5_2"]
    assert af.nearest_nics(topo, rdma, [0, 1], count=1, sysfs_root=root) == ["mlx5_0"]


def test_fabric_manager_and_unusable_nics_never_chosen(tmp_path):
    root = synth.make_sysfs(tmp_path, fm_under_gpu0=True, port_state={0: "1: DOWN"})
    topo = build_gpu_topology(synth.b300_xml(), synth.b300_topo(with_nics=False), synth.b300_nvlink(), sysfs_root=root)
    rdma = build_rdma_nics(root)
    got = af.nearest_nics(topo, rdma, [0], sysfs_root=root)
    assert "mlx5_8" not in got and "mlx5_0" not in got
    assert got == ["mlx5_1", "mlx5_2", "mlx5_3"]  # next best: same NUMA node
    assert "mlx5_8" not in af.nearest_nics(topo, rdma, list(range(8)), count=9, sysfs_root=root)


def test_no_usable_nics_and_unknown_gpu(host):
    topo = host[0]
    assert af.nearest_nics(topo, {"devices": []}, [0]) == []
    with pytest.raises(ValueError):
        af.nearest_nics(topo, host[2], [42])


def test_real_h200_topo_without_nics_gives_no_distance(real_fixtures, tmp_path):
    d = real_fixtures / "nvidia-h200-vm"
    topo = build_gpu_topology((d / "q.xml").read_text(), (d / "topo.txt").read_text(), "", sysfs_root=str(tmp_path))
    fake_nic = {"name": "mlx5_0", "pci_address": "0000:00:09.0", "numa_node": None, "usable": True, "role": "data"}
    assert af.nic_distance(topo["gpus"][0], fake_nic, topo["topology"], str(tmp_path)) == (5, "unknown")
    # all-unknown distances still give every usable data NIC, sorted by name
    rdma = {"devices": [dict(fake_nic, name="mlx5_1"), fake_nic]}
    assert af.nearest_nics(topo, rdma, [0], sysfs_root=str(tmp_path)) == ["mlx5_0", "mlx5_1"]


# ----------------------------------------------------------------- hwemu scenarios (SYNTHESIZED, tests/fixtures/synth)
def _scenarios(synth_dir):
    if not synth_dir.is_dir():
        return []
    return sorted(p.name for p in synth_dir.iterdir() if (p / "expect.json").exists())


SYNTH_DIR = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "synth"


@pytest.mark.parametrize("scenario", _scenarios(SYNTH_DIR) or ["(hwemu fixtures not rendered)"])
def test_hwemu_scenario_matches_its_design(scenario):
    import json

    d = SYNTH_DIR / scenario
    if not d.is_dir():
        pytest.fail("tests/fixtures/synth has no scenarios: render them with sandbox/hwemu/render_fixtures.py")
    exp = json.loads((d / "expect.json").read_text())
    sysfs = str(d / "sys")
    topo = build_gpu_topology((d / "q.xml").read_text(), (d / "topo.txt").read_text(),
                              (d / "nvlink-s.txt").read_text(), sysfs_root=sysfs,
                              banner_text=(d / "smi.txt").read_text())
    rdma = build_rdma_nics(sysfs, (d / "ofed_info.txt").read_text(), (d / "mlxfwmanager.txt").read_text(), "6.8.0")
    assert topo["driver_version"] == exp["driver_version"]
    assert topo["gpu_count"] == exp["gpu_count"]
    assert [g["pci_bus_id"] for g in topo["gpus"]] == exp["gpu_pci_bus_ids"]
    assert topo["topology"]["nic_columns_present"] is exp["topo_nic_columns"]
    assert {str(g["index"]): g["nvlink"]["down_links"] for g in topo["gpus"] if g["nvlink"]["down_links"]} == \
        {k: sorted(v) for k, v in exp["nvlink_down"].items()}
    assert [g["index"] for g in topo["gpus"] if g["throttled"]] == exp["throttled_gpus"]
    assert [g["index"] for g in topo["gpus"] if g["ecc"]["volatile_uncorrectable"]] == exp["ecc_uncorrectable_gpus"]
    assert rdma["driver"]["version"] == exp["ofed_version"]
    by = {n["name"]: n for n in rdma["devices"]}
    assert set(by) == set(exp["nics"])
    for name, e in exp["nics"].items():
        assert (by[name]["pci_address"], by[name]["model"], by[name]["role"], by[name]["numa_node"],
                by[name]["fw_ver"]) == (e["pci"], e["model"], e["role"], e["numa_node"], e["fw_running"]), name
        assert by[name]["fw_pending"] == (e["fw_flashed"] if e["fw_flashed"] != e["fw_running"] else None), name
    assert sorted(n for n, x in by.items() if x["fw_pending"]) == sorted(exp["fw_pending_nics"])
    assert rdma["usable_devices"] == sorted(n for n, e in exp["nics"].items() if e["role"] == "data")
    # affinity: each GPU's nearest usable data NIC is the one the scenario put under its PCIe switch
    want = {e["nearest_gpu"]: n for n, e in exp["nics"].items() if e["nearest_gpu"] is not None}
    assert af.gpu_nic_map(topo, rdma, sysfs_root=sysfs) == want
    sources = {af.nic_distance(topo["gpus"][0], by["mlx5_0"], topo["topology"], sysfs)[1]}
    assert sources == ({"topo"} if exp["topo_nic_columns"] else {"sysfs_pci"})
