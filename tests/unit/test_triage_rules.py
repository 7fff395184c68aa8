"""The triage's rules on literal inputs: history ("was it hot when it hung?"), traffic, counters, PCIe, GPUDirect,
IOMMU, the fleet's exit code and the unreachable host."""
import pathlib

import pytest
import yaml

from ansible_collections.b300.rollout.plugins.module_utils.triage import triage_kmsg as tk
from ansible_collections.b300.rollout.plugins.module_utils.triage import triage_pcie as tp
from ansible_collections.b300.rollout.plugins.module_utils.triage import triage_verdict as tv
from ansible_collections.b300.rollout.plugins.module_utils.triage.triage_collect import parse_since
from ansible_collections.b300.rollout.plugins.module_utils.triage.triage_traffic import parse_nccl_warns


ROWS = yaml.safe_load((pathlib.Path(__file__).resolve().parents[2] / "roles/nic_firmware_gate/vars/nic_fw_matrix.yml")
                      .read_text())["nic_firmware_gate_matrix_rows"]
DRIVER = {"flavour": "doca_ofed", "version": "25.10-1.2.2", "version_scheme": "legacy"}


def by(findings, check):
    return [f for f in findings if f["check"] == check]


# --------------------------------------------------------------------------- history (health_history_read's shape)
HIST = {"available": True, "window": {"start_epoch": 1764640000, "end_epoch": 1764661600},
        "gpus": {"0": {"samples": 720, "max_temp_c": 71, "max_mem_temp_c": 74, "min_sm_clock_mhz": 1965,
                       "thermal_violation_s": 0, "power_violation_s": 0, "hot": False, "first_hot_epoch": None},
                 "3": {"samples": 720, "max_temp_c": 96, "max_mem_temp_c": 93, "min_sm_clock_mhz": 1290,
                       "thermal_violation_s": 412.5, "power_violation_s": 3.0, "hot": True,
                       "first_hot_epoch": 1764650000},
                 "5": {"samples": 720, "max_temp_c": 90, "max_mem_temp_c": 88, "min_sm_clock_mhz": 1900,
                       "thermal_violation_s": 0, "power_violation_s": 0, "hot": True, "first_hot_epoch": 1764655000}},
        "nics": {"mlx5_3": {"local_ack_timeout_err": 3412, "port_xmit_data": 10 ** 12},
                 "mlx5_4": {"local_ack_timeout_err": 0}}, "plot_data": {}}


def test_history_hot_with_thermal_violation_is_a_fault_hot_alone_a_suspicion():
    fs = tv.history_rules(HIST, {3: "mlx5_3"}, "6h")
    th = {f["device"]: f for f in by(fs, "history_thermal")}
    assert set(th) == {"GPU 3", "GPU 5"}
    assert th["GPU 3"]["verdict"] == "fault" and "max 96 C" in th["GPU 3"]["summary"]
    assert "thermal violation 412 s" in th["GPU 3"]["evidence"][0] and "2025-12-02" in th["GPU 3"]["evidence"][0]
    assert th["GPU 5"]["verdict"] == "suspect"
    nic = by(fs, "history_counters")
    assert [(f["device"], f["verdict"]) for f in nic] == [("mlx5_3", "fault")]
    assert "local_ack_timeout_err +3,412 in the last 6h" == nic[0]["summary"]


@pytest.mark.parametrize("hist", [None, {}, {"available": False}, {"available": False, "gpus": {"0": {"hot": True}}}])
def test_no_history_judges_nothing(hist):
    assert tv.history_rules(hist, {}, "2h") == []


def test_history_reaches_the_report_and_the_cause():
    col = {"gpu_topology": {"gpus": [{"index": 3, "pci_bus_id": "00000000:5D:00.0"}]}, "rdma_nics": {},
           "nic_gpu": {}}
    rep = tv.judge_fleet({"b300a": {"collection": col}}, [], histories={"b300a": HIST}, since="6h")
    h = rep["hosts"]["b300a"]
    assert h["history"] == "available"
    assert h["causes"][0]["device"] == "GPU 3" and "it was hot in the window" in h["causes"][0]["sentence"]
    rep2 = tv.judge_fleet({"b300a": {"collection": col}}, [], since="6h")
    assert rep2["hosts"]["b300a"]["history"] == "no history" and rep2["hosts"]["b300a"]["status"] == "ok"
    assert "History: no history." in tv.render_markdown(rep2)


# --------------------------------------------------------------------------- traffic
def port(counters=None, hw=None):
    return {"port": "1", "state": "ACTIVE", "phys_state": "LinkUp", "rate_gbps": 400, "counters": counters or {},
            "hw_counters": hw or {}}


def test_traffic_deltas_are_charged_to_the_nic_that_carried_them():
    warns = parse_nccl_warns("b300b:1:2 [0] transport/net_ib/p2p.cc:648 NCCL WARN NET/IB: Got completion from peer "
                             "10.89.30.11<40554> with status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_RDMA_WRITE(1) "
                             "vendor_err=129 hca mlx5_3")
    traffic = {
        "mlx5_2": {"ib_write_bw": {"rc": 0, "gbps": 387.2}, "nccl": {"verdict": "ok", "gated_gbps": 41.0, "warns": {}},
                   "counters_before": port({"link_downed": 0}, {"local_ack_timeout_err": 0}),
                   "counters_after": port({"link_downed": 0}, {"local_ack_timeout_err": 0}), "duration_s": 20},
        "mlx5_3": {"ib_write_bw": {"rc": 0, "gbps": 381.0},
                   "nccl": {"verdict": "intermittent", "gated_gbps": 40.2, "reasons": ["mixed outcomes"], "warns": warns},
                   "counters_before": port({}, {"local_ack_timeout_err": 212}),
                   "counters_after": port({}, {"local_ack_timeout_err": 3624}), "duration_s": 21},
        "mlx5_6": {"ib_write_bw": {"rc": 0, "gbps": 120.4}, "nccl": {"verdict": "ok", "gated_gbps": 40.0, "warns": {}},
                   "counters_before": port(), "counters_after": port(), "duration_s": 20},
    }
    col = {"rdma_nics": {"driver": DRIVER, "devices": [
        {"name": n, "model": "ConnectX-8", "role": "data", "pci_address": "0000:%02x:00.0" % i, "fw_ver": "40.47.1026"}
        for i, n in ((0x3c, "mlx5_2"), (0x5f, "mlx5_3"), (0xbc, "mlx5_6"))]}, "gpu_topology": {}, "nic_gpu": {}}
    h = tv.judge_host(col, ROWS, expected_port_gbps={"ConnectX-8": 400}, traffic=traffic)
    d = h["devices"]
    assert d["mlx5_2"]["verdict"] == "ok"
    m3 = {f["check"]: f for f in d["mlx5_3"]["findings"] if f["verdict"] == "fault"}
    assert {"nccl_one_nic", "nccl_warn", "rdma_counters"} <= set(m3)
    assert m3["rdma_counters"]["summary"] == "local_ack_timeout_err +3,412 during the traffic test through mlx5_3"
    assert "IBV_WC_RETRY_EXC_ERR(12)" in m3["nccl_warn"]["summary"]
    m6 = {f["check"]: f for f in d["mlx5_6"]["findings"]}
    assert m6["gdr_loopback"]["verdict"] == "fault" and "floor 360" in m6["gdr_loopback"]["evidence"][0]
    assert h["causes"][0]["device"] == "mlx5_3"


def test_traffic_refused_and_failed_loopback():
    col = {"rdma_nics": {}, "gpu_topology": {}, "nic_gpu": {}}
    rep = tv.judge_fleet({"b300a": {"collection": col}}, [],
                         traffic={"b300a": {"refused": "b300a runs serving units (sglang-kimi_k3-w0.service):\n drain it"}})
    assert rep["hosts"]["b300a"]["traffic"] == "refused: b300a runs serving units (sglang-kimi_k3-w0.service): drain it"
    assert rep["hosts"]["b300a"]["status"] == "ok"
    assert "Traffic: refused: b300a runs serving units" in tv.render_markdown(rep)
    fs = tv.traffic_rules({"mlx5_0": {"ib_write_bw": {"rc": 1, "gbps": None, "error": " Couldn't allocate MR"}}},
                          {"mlx5_0": 400})
    assert [(f["device"], f["check"], f["verdict"]) for f in fs] == [("mlx5_0", "gdr_loopback", "fault")]
    assert "Couldn't allocate MR" in fs[0]["evidence"][0]


# --------------------------------------------------------------------------- counters, ports, PCIe
def test_counters_since_boot_suspect_growth_fault():
    fs = tv.nic_counters("mlx5_1", port({"symbol_error": 10, "link_downed": 1}, {"out_of_sequence": 5}),
                         port({"symbol_error": 10, "link_downed": 2}, {"out_of_sequence": 9}), 10, "the triage")
    got = {(f["check"], f["summary"].split()[0]): f["verdict"] for f in fs}
    assert got == {("ib_counters", "link_downed"): "fault", ("ib_counters", "symbol_error"): "suspect",
                   ("rdma_counters", "out_of_sequence"): "suspect"}


def test_port_rules():
    fs = tv.nic_port("mlx5_0", {"port": "1", "state": "DOWN", "state_code": 1, "phys_state": "Polling",
                                "rate_gbps": 10, "rate": "10 Gb/sec (4X SDR)"}, 400)
    assert [f["summary"] for f in fs] == ["port 1 DOWN", "physical link Polling", "port trained at 10 Gb/s, expected 400"]
    assert tv.nic_port("mlx5_0", port(), 400) == [] and tv.nic_port("mlx5_0", port(), None) == []


def test_pcie_link_rules_nic_gpu_and_upstream_max():
    nic = {"bdf": "0000:bc:00.0", "current_width": 16, "max_width": 16, "current_speed": 32.0, "max_speed": 64.0}
    up = {"bdf": "0000:b9:01.0", "max_width": 16, "max_speed": 32.0}
    assert tv.pcie_link("mlx5_6", "NIC", nic, up) == []           # upstream port caps the speed at 32 GT/s
    fs = tv.pcie_link("mlx5_6", "NIC", nic, None)
    assert [f["verdict"] for f in fs] == ["fault"]
    fs = tv.pcie_link("GPU 6", "GPU", nic, None, is_gpu=True)
    assert [f["verdict"] for f in fs] == ["suspect"]             # idle GPUs lower their link speed
    aer = {"correctable": {"total": 3}, "nonfatal": {"CmpltTO": 3, "total": 3}, "fatal": {"total": 0}}
    fs = tv.pcie_aer("mlx5_1", "NIC", "0000:2c:00.0", aer, {"correctable": {"total": 500}}, 10)
    assert [(f["check"], f["verdict"]) for f in fs] == [("aer", "fault"), ("aer", "fault")]
    assert "CmpltTO 3" in fs[0]["evidence"][0]


def test_acs_words_and_iommu_and_gdr(tmp_path):
    assert tp.acs_enabled_bits(0x001d) == ["SrcValid", "ReqRedir", "CmpltRedir"]
    assert tp.acs_enabled_bits(0) == []
    assert tp.acs_enabled_bits({"SrcValid": False, "ReqRedir": True}) == ["ReqRedir"]
    lsp = tp.parse_lspci_acs("5c:01.0 PCI bridge: X\n\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+\n")
    assert tp.acs_enabled_bits(lsp["0000:5c:01.0"]["ACSCtl"]) == ["SrcValid", "ReqRedir", "CmpltRedir"]
    (tmp_path / "class" / "iommu" / "dmar0").mkdir(parents=True)
    assert tp.iommu_mode("BOOT_IMAGE=/vmlinuz intel_iommu=on", str(tmp_path))["mode"] == "translated"
    assert tp.iommu_mode("BOOT_IMAGE=/vmlinuz intel_iommu=on iommu=pt", str(tmp_path))["mode"] == "passthrough"
    g = tp.gdr_state(str(tmp_path), "Module Size Used by\nib_core 507904 8 mlx5_ib\n", "6.8.0-87-generic")
    assert (g["peermem"], g["mode"]) == (False, "dmabuf")
    assert tp.gdr_state(str(tmp_path), "", "5.4.0-100-generic")["mode"] == "none"
    g = tp.gdr_state(str(tmp_path), "nvidia_peermem 16384 0\nib_core 507904 9 nvidia_peermem,mlx5_ib\n", "6.8.0")
    assert g["mode"] == "peermem" and "nvidia_peermem" in g["evidence"][0]
    host = tv.host_rules({"gdr": tp.gdr_state(str(tmp_path), "", "5.4.0"), "iommu": {"mode": "translated"}})
    assert {(f["check"], f["verdict"]) for f in host} == {("gpudirect", "fault"), ("iommu", "suspect")}


def test_kmsg_formats_and_classes():
    lines = [
        "2026-11-29T02:10:11+0000 b300b kernel: mlx5_core 0000:5f:00.0: health recovery failed",
        "[  12.5] mlx5_core 0000:5f:00.0: Fatal error 1 detected",
        "Nov 29 02:10:11 b300b kernel: mlx5_core 0000:5f:00.0: Detected insufficient power on the PCIe slot (27W).",
        "2026-11-29T02:10:11,123456+00:00 mlx5_core 0000:5f:00.0 ibp95s0: Port module event: module 0, Cable plugged, "
        "High Temperature",
        "[Mon May 25 12:35:01 2026] NVRM: Xid (PCI:0000:1b:00): 13, Graphics SM Warp Exception",
        "nvidia-nvswitch3: SXid (PCI:0000:86:00.0): 20034, Fatal, Link 30 LTSSM Fault Up",
        "nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context, skipping further processing",
        "ibp95s0: lost carrier",
        "random line",
    ]
    ev = [tk.parse_line(ln) for ln in lines]
    assert [e["kind"] if e else None for e in ev] == [
        "mlx5_health", "mlx5_health", "mlx5_slot_power", "mlx5_module_temp", "xid", "sxid", "peermem_invalid_context",
        "ib_carrier_lost", None]
    assert ev[0]["ts"] == "2026-11-29T02:10:11+0000" and ev[3]["netdev"] == "ibp95s0"
    assert ev[2]["code"] == "27W" and ev[4]["code"] == 13 and ev[4]["sub"] == "other" and ev[5]["sub"] == "fatal"
    maps = tk.device_maps({"devices": [{"name": "mlx5_3", "pci_address": "0000:5f:00.0", "netdevs": ["ibp95s0"]}]},
                          {"gpus": [{"index": 0, "pci_bus_id": "00000000:1B:00.0"}]}, {"mlx5_3": 3})
    devs = [tk.attribute(e, maps) if e else None for e in ev]
    assert devs == ["mlx5_3", "mlx5_3", "mlx5_3", "mlx5_3", "GPU 0", "pci 0000:86:00.0", "host", "mlx5_3", None]


def test_since_and_fleet_exit_codes_unreachable_wins():
    assert parse_since("2h") == 7200 and parse_since("90m") == 5400 and parse_since("1d") == 86400
    with pytest.raises(ValueError):
        parse_since("yesterday")
    bad = {"collection": {"rdma_nics": {"driver": DRIVER, "devices": [
        {"name": "mlx5_0", "model": "ConnectX-8", "role": "data", "pci_address": "0000:1a:00.0", "fw_ver": "40.47.1026"}]},
        "ports": {"mlx5_0": {"1": dict(port(), state="DOWN")}}, "nic_gpu": {}}}
    rep = tv.judge_fleet({"b300b": bad}, ROWS, expected_port_gbps={"ConnectX-8": 400})
    assert rep["summary"]["exit_code"] == 2 and rep["summary"]["fault"] == ["b300b"]
    assert rep["hosts"]["b300b"]["causes"][0]["sentence"].startswith("mlx5_0: port 1 DOWN")
    rep = tv.judge_fleet({"b300b": bad, "b300y": {"unreachable": True, "msg": "Failed to connect to the host via ssh"}},
                         ROWS, expected_port_gbps={"ConnectX-8": 400})
    assert rep["summary"]["exit_code"] == 3 and rep["summary"]["could_not_triage"] == ["b300y"]
    md = tv.render_markdown(rep)
    assert "## b300y: UNREACHABLE" in md and "Could not triage b300y (unreachable): Failed to connect" in md
    assert 'b300_triage_host_verdict{host="b300y"} 3' in tv.render_textfile(rep, "b300y")
    rep = tv.judge_fleet({"b300c": {"failed": True, "msg": "nvidia-smi not found"}}, [])
    assert rep["hosts"]["b300c"]["status"] == "failed" and rep["summary"]["exit_code"] == 3
