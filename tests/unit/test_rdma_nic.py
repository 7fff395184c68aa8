"""module_utils/hw/rdma_nic.py on SYNTHESIZED ConnectX sysfs trees and tool outputs (tests/fixtures/facts/synth.py).

No real RDMA capture exists (the H200 machines have no RDMA NICs): everything here is synthesized from
../shared/reference/output-formats.md and nic-firmware-driver-matrix.md.
"""
import pathlib

import pytest

from ansible_collections.b300.rollout.plugins.module_utils.hw import rdma_nic as rn

import synth


# ----------------------------------------------------------------- versions / flavours
@pytest.mark.parametrize("text,version,scheme,key", [
    ("25.10-1.2.2", "25.10-1.2.2", "legacy", (25, 10, 1, 2, 2)),
    ("24.10-3.2.5.0", "24.10-3.2.5.0", "legacy", (24, 10, 3, 2, 5, 0)),
    ("OFED-internal-26.04-1.0.9", "26.04-1.0.9", "legacy", (26, 4, 1, 0, 9)),
    ("2607.0.100", "2607.0.100", "yymm", (26, 7, 0, 100)),
    ("6.11.0-1014-nvidia", None, None, None),
    ("", None, None, None),
])
def test_parse_driver_version(text, version, scheme, key):
    p = rn.parse_driver_version(text)
    if version is None:
        assert p is None
    else:
        assert (p["version"], p["scheme"], p["key"]) == (version, scheme, key)


def test_version_keys_order_across_schemes():
    keys = [rn.parse_driver_version(v)["key"] for v in ("24.10-3.2.5.0", "25.10-1.2.2", "26.04-0.8.6", "2607.0.100")]
    assert keys == sorted(keys)


@pytest.mark.parametrize("text,raw,flavour,version", [
    ("MLNX_OFED_LINUX-24.10-3.2.5.0:\n", "MLNX_OFED_LINUX-24.10-3.2.5.0", "mlnx_ofed", "24.10-3.2.5.0"),
    ("OFED-internal-25.10-1.7.1:\n", "OFED-internal-25.10-1.7.1", "doca_ofed", "25.10-1.7.1"),
])
def test_parse_ofed_info(text, raw, flavour, version):
    assert rn.parse_ofed_info(text) == {"raw": raw, "flavour": flavour, "version": version}
    assert rn.parse_ofed_info("") is None


def test_driver_inbox_when_module_has_no_version(tmp_path):
    root = synth.make_sysfs(tmp_path, module_version=None)
    d = rn.driver_facts(root, None, kernel_release="6.11.0-1014-nvidia")
    assert d == {"flavour": "inbox", "version": "6.11.0-1014-nvidia", "version_scheme": "kernel", "ofed_info": None}


def test_driver_absent_without_mlx5_core(tmp_path):
    root = synth.make_sysfs(tmp_path, nics=0, fm_nic=False, mlx5_module=False)
    assert rn.driver_facts(root, None, "6.8.0")["flavour"] == "absent"


@pytest.mark.parametrize("module_version,ofed,flavour,version,scheme", [
    ("25.10-1.2.2", "OFED-internal-25.10-1.2.2:", "doca_ofed", "25.10-1.2.2", "legacy"),
    ("25.10-1.2.2", None, "doca_ofed", "25.10-1.2.2", "legacy"),          # no ofed_info: 25.x -> DOCA
    ("2607.0.100", None, "doca_ofed", "2607.0.100", "yymm"),              # new scheme -> DOCA
    ("24.10-3.2.5", None, "mlnx_ofed", "24.10-3.2.5", "legacy"),          # 24.x and older -> MLNX_OFED
    ("24.10-3.2.5", "MLNX_OFED_LINUX-24.10-3.2.5.0:", "mlnx_ofed", "24.10-3.2.5", "legacy"),
    ("24.10-3.2.5", "OFED-internal-24.10-3.2.5:", "doca_ofed", "24.10-3.2.5", "legacy"),  # ofed_info wins
])
def test_driver_flavours(tmp_path, module_version, ofed, flavour, version, scheme):
    root = synth.make_sysfs(tmp_path, module_version=module_version)
    d = rn.driver_facts(root, ofed, "6.8.0")
    assert (d["flavour"], d["version"], d["version_scheme"]) == (flavour, version, scheme)
    assert d["ofed_info"] == (ofed.rstrip(":") if ofed else None)


# ----------------------------------------------------------------- mlxfwmanager
def test_mlxfwmanager_pending_reset_reads_the_right_rows():
    text = synth.mlxfwmanager_query([(synth.nic_pci(3), "ConnectX8", "MT_0000001217", "40.47.1026")],
                                    pending={synth.nic_pci(3): "40.44.1036"})
    (rec,) = rn.parse_mlxfwmanager(text)
    assert rec["device_type"] == "ConnectX8"
    assert rec["psid"] == "MT_0000001217"
    assert rec["pci_address"] == synth.nic_pci(3)
    assert rec["fw_current"] == "40.47.1026"  # the FW row: flashed image
    assert rec["fw_running"] == "40.44.1036"  # the FW (Running) row
    assert rec["fw_available"] is None
    assert rec["status"] == "Up to date"


def test_mlxfwmanager_mst_device_name_and_available():
    text = synth.mlxfwmanager_query([("/dev/mst/mt4131_pciconf0", "ConnectX8", "MT_0000001217", "40.44.1036")],
                                    available={"/dev/mst/mt4131_pciconf0": "40.47.1026"})
    (rec,) = rn.parse_mlxfwmanager(text)
    assert rec["pci_device_name"] == "/dev/mst/mt4131_pciconf0"
    assert rec["pci_address"] is None
    assert (rec["fw_current"], rec["fw_available"], rec["fw_running"]) == ("40.44.1036", "40.47.1026", None)
    assert rec["status"] == "Update required"
    assert rec["base_guid"] == "b83fd20300010001"


def test_parse_ibstat():
    text = ("CA 'mlx5_0'\n\tCA type: MT4131\n\tNumber of ports: 1\n\tFirmware version: 40.46.5500\n"
            "\tPort 1:\n\t\tState: Active\n\t\tRate: 400\n\t\tLink layer: InfiniBand\n"
            "CA 'mlx5_1'\n\tCA type: MT4129\n\tFirmware version: 28.47.1026\n\tPort 1:\n\t\tState: Down\n")
    p = rn.parse_ibstat(text)
    assert p["mlx5_0"] == {"ca_type": "MT4131", "fw_ver": "40.46.5500",
                           "ports": {1: {"state": "Active", "rate": "400", "link_layer": "InfiniBand"}}}
    assert p["mlx5_1"]["ports"][1]["state"] == "Down"


# ----------------------------------------------------------------- build
def test_build_healthy_b300_excludes_fabric_manager_cx7(tmp_path):
    root = synth.make_sysfs(tmp_path)
    r = rn.build_rdma_nics(root, "OFED-internal-25.10-1.2.2:", None, "6.8.0")
    assert r["driver"] == {"flavour": "doca_ofed", "version": "25.10-1.2.2", "version_scheme": "legacy",
                           "ofed_info": "OFED-internal-25.10-1.2.2"}
    names = [d["name"] for d in r["devices"]]
    assert names == ["mlx5_%d" % i for i in range(9)]
    d0 = r["devices"][0]
    assert d0 == {
        "name": "mlx5_0", "pci_address": synth.nic_pci(0), "pci_device_id": "1023", "model": "ConnectX-8",
        "fw_ver": "40.47.1026", "psid": "MT_0000001217", "node_type": "CA", "numa_node": 0,
        "netdevs": ["ibp20s0"], "sw_mng": False,
        "ports": [{"port": 1, "state": "ACTIVE", "state_code": 4, "rate_gbps": 400, "rate": "400 Gb/sec (4X NDR)",
                   "link_layer": "InfiniBand"}],
        "role": "data", "usable": True, "unusable_reasons": [], "fw_pending": None, "fw_available": None,
        "fw_status": None, "fw_record_match": None,
    }
    fm = r["devices"][8]
    assert (fm["model"], fm["role"], fm["usable"]) == ("ConnectX-7", "fabric_manager", False)
    assert "fabric-manager" in fm["unusable_reasons"][0]
    assert r["usable_devices"] == ["mlx5_%d" % i for i in range(8)]
    assert r["devices"][5]["numa_node"] == 1


def test_cx7_alone_is_a_data_nic(tmp_path):
    root = synth.make_sysfs(tmp_path, nics=2, fm_nic=False, nic_device_id="1021")
    r = rn.build_rdma_nics(root)
    assert [d["role"] for d in r["devices"]] == ["data", "data"]
    assert r["usable_devices"] == ["mlx5_0", "mlx5_1"]


def test_active_bluefield3_beside_cx8_is_frontend_never_a_data_nic(tmp_path):
    """An HGX B300 with 8 CX8, the NVLink-management CX7 and two BlueField-3 north-south DPUs whose Ethernet ports are
    up: the BF3s were 'data' and usable, so NCCL_IB_HCA took them and the two-node test ran over the frontend."""
    root = synth.make_sysfs(tmp_path)
    for k, pci in enumerate(("0000:e1:00.0", "0000:e2:00.0")):
        synth.flat_ib_device(root, "mlx5_%d" % (9 + k), pci, "32.47.1026", psid="MT_0000000884",
                             guid="a088:c203:0032:137%d" % k, device_id="a2dc", link_layer="Ethernet")
    r = rn.build_rdma_nics(root, "OFED-internal-25.10-1.2.2:")
    roles = {d["name"]: (d["model"], d["role"], d["usable"]) for d in r["devices"]}
    assert roles["mlx5_9"] == roles["mlx5_10"] == ("BlueField-3", "frontend", False)
    assert roles["mlx5_8"] == ("ConnectX-7", "fabric_manager", False)
    assert r["usable_devices"] == ["mlx5_%d" % i for i in range(8)]
    bf3 = next(d for d in r["devices"] if d["name"] == "mlx5_9")
    assert bf3["unusable_reasons"] == [
        "frontend NIC (BlueField-3 0000:e1:00.0, device id a2dc): not a ConnectX-8/9 GPU-fabric NIC on this host, "
        "kept out of NCCL_IB_HCA and --disaggregation-ib-device"]
    from ansible_collections.b300.rollout.plugins.module_utils.health import nccl_results
    assert nccl_results.ib_hca_list(r["devices"], r["usable_devices"]) == "=" + ",".join(
        "mlx5_%d" % i for i in range(8))


def test_bluefield3_without_cx8_stays_a_data_nic(tmp_path):
    """Only a host with the ConnectX-8/9 generation has a fabric to tell the frontend from: elsewhere nothing moves."""
    synth.flat_ib_device(tmp_path, "mlx5_0", "0000:e1:00.0", "32.47.1026", psid="MT_0000000884", device_id="a2dc")
    r = rn.build_rdma_nics(str(tmp_path))
    assert (r["devices"][0]["role"], r["devices"][0]["usable"]) == ("data", True)


def test_fabric_manager_devices_option(tmp_path):
    root = synth.make_sysfs(tmp_path, fm_nic=False)
    r = rn.build_rdma_nics(root, fabric_manager_devices=["mlx5_7"])
    assert r["devices"][7]["role"] == "fabric_manager"
    assert "mlx5_7" not in r["usable_devices"] and len(r["usable_devices"]) == 7


def test_unusable_reasons(tmp_path):
    root = synth.make_sysfs(tmp_path, port_state={1: "1: DOWN"}, link_layer={2: "Unknown"}, node_type={3: "2: SWITCH"})
    r = rn.build_rdma_nics(root)
    by = {d["name"]: d for d in r["devices"]}
    assert by["mlx5_1"]["unusable_reasons"] == ["port 1 state DOWN, expected ACTIVE"]
    assert by["mlx5_2"]["unusable_reasons"] == ["port 1 link_layer Unknown, expected InfiniBand or Ethernet"]
    assert by["mlx5_3"]["unusable_reasons"] == ["node_type SWITCH, expected CA"]
    assert r["usable_devices"] == ["mlx5_0", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7"]


def test_pending_firmware_reset_matched_by_pci(tmp_path):
    root = synth.make_sysfs(tmp_path)
    fw = synth.mlxfwmanager_query(
        [(synth.nic_pci(i), "ConnectX8", "MT_0000001217", "40.47.1026") for i in range(8)],
        pending={synth.nic_pci(3): "40.44.1036"})
    r = rn.build_rdma_nics(root, "OFED-internal-25.10-1.2.2:", fw)
    d3 = r["devices"][3]
    assert d3["fw_pending"] == "40.47.1026"
    assert d3["usable"] is True  # pending firmware is for the firmware gate, the NIC still works
    assert [d["fw_pending"] for d in r["devices"]].count(None) == 8
    assert r["devices"][0]["fw_status"] == "Up to date"


def test_pending_firmware_matched_by_guid(tmp_path):
    root = synth.make_sysfs(tmp_path, nics=1, fm_nic=False)
    fw = synth.mlxfwmanager_query([("/dev/mst/mt4131_pciconf0", "ConnectX8", "MT_0000001217", "40.47.1026")],
                                  pending={"/dev/mst/mt4131_pciconf0": "40.44.1036"})
    fw = fw.replace("b83fd20300010001", "b83fd20300000001")  # node_guid of mlx5_0 in the synthesized tree
    r = rn.build_rdma_nics(root, None, fw)
    assert r["devices"][0]["fw_pending"] == "40.47.1026"


def test_no_infiniband_class(tmp_path):
    r = rn.build_rdma_nics(str(tmp_path), None, None, "6.8.0")
    assert r == {"driver": {"flavour": "absent", "version": None, "version_scheme": None, "ofed_info": None},
                 "devices": [], "usable_devices": [], "fw_pending_unattributed": [], "mlxfwmanager_error": None,
                 "findings": []}


@pytest.mark.parametrize("dev_id,model", [("1021", "ConnectX-7"), ("1023", "ConnectX-8"), ("1025", "ConnectX-9"),
                                          ("a2dc", "BlueField-3"), ("1017", "unknown")])
def test_models(tmp_path, dev_id, model):
    root = synth.make_sysfs(tmp_path, nics=1, fm_nic=False, nic_device_id=dev_id)
    assert rn.build_rdma_nics(root)["devices"][0]["model"] == model


# ----------------------------------------------------------------- the NVSwitch management bridge (SW_MNG in the VPD)
def test_sw_mng_vpd_makes_the_bridge_fabric_manager_without_cx8(tmp_path):
    """A ConnectX-7 alone is a data NIC (test above) unless its VPD says SW_MNG: then it is the NVSwitch management
    bridge, never usable for data, and the reason names the VPD (issue 36)."""
    root = synth.make_sysfs(tmp_path, nics=2, fm_nic=True, nic_device_id="1021", sw_mng=(2,))
    r = rn.build_rdma_nics(root)
    bridge = r["devices"][2]
    assert (bridge["name"], bridge["sw_mng"], bridge["role"], bridge["usable"]) == ("mlx5_2", True, "fabric_manager",
                                                                                    False)
    assert bridge["unusable_reasons"][0].startswith("NVSwitch management bridge (ConnectX-7 0000:f1:00.0, SW_MNG in "
                                                    "its VPD)")
    assert [d["sw_mng"] for d in r["devices"][:2]] == [False, False]
    assert r["usable_devices"] == ["mlx5_0", "mlx5_1"]


def test_vpd_without_sw_mng_changes_nothing(tmp_path):
    root = synth.make_sysfs(tmp_path, nics=2, fm_nic=False, nic_device_id="1021")
    pdev = rn.os.path.join(root, "class", "infiniband", "mlx5_0", "device")
    with open(rn.os.path.join(pdev, "vpd"), "wb") as fh:
        fh.write(synth.SW_MNG_VPD.replace(b"SW_MNG", b"SW_ABC"))
    r = rn.build_rdma_nics(root)
    assert [(d["sw_mng"], d["role"]) for d in r["devices"]] == [(False, "data"), (False, "data")]


def test_sw_mng_bridge_left_out_of_the_firmware_gate(tmp_path):
    """The gate never judges the bridge's firmware (flint cannot read it): an unknown version on it is not a failure,
    the same version on a data ConnectX-7 is."""
    import yaml

    from ansible_collections.b300.rollout.plugins.module_utils.hw import fw_matrix
    matrix = pathlib.Path(__file__).resolve().parents[2] / "roles" / "nic_firmware_gate" / "vars" / "nic_fw_matrix.yml"
    rows = fw_matrix.load_matrix_doc(yaml.safe_load(matrix.read_text()))
    root = synth.make_sysfs(tmp_path, nics=1, nic_device_id="1021", fw="1.0.0", sw_mng=(1,))
    r = rn.build_rdma_nics(root, "OFED-internal-25.10-1.2.2:")
    res = fw_matrix.check_host(r, rows)
    by_dev = {v["device"]: v for v in res["verdicts"]}
    assert by_dev["mlx5_1"]["verdict"] == "ignored" and "not a data NIC" in by_dev["mlx5_1"]["reason"]
    assert by_dev["mlx5_0"]["severity"] == "fail"
