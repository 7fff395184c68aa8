"""The triage's rules fed with REAL text (tests/fixtures/real-world, each with its source in SOURCES.md): PCIe AER and
link events of the kernel log on a device's PCIe path, wrapped messages, probe-time bandwidth limits, Ethernet link
lines, probe failures, NCCL's QP / async / communicator / GPU Direct RDMA lines, PyTorch's watchdog, ethtool -S PHY
counters -- and the ranked cause they give (a link that went down outranks the NCCL errors it causes)."""
import pathlib
import re

import yaml

from ansible_collections.b300.rollout.plugins.module_utils.triage import triage_counters as tc
from ansible_collections.b300.rollout.plugins.module_utils.triage import triage_kmsg as tk
from ansible_collections.b300.rollout.plugins.module_utils.triage import triage_verdict as tv
from ansible_collections.b300.rollout.plugins.module_utils.triage.triage_traffic import parse_nccl_warns

ROOT = pathlib.Path(__file__).resolve().parents[2]
FX = ROOT / "tests" / "fixtures" / "real-world"
ROWS = yaml.safe_load((ROOT / "roles/nic_firmware_gate/vars/nic_fw_matrix.yml").read_text())[
    "nic_firmware_gate_matrix_rows"]
DRIVER = {"flavour": "doca_ofed", "version": "25.10-1.2.2", "version_scheme": "legacy"}


def text(kind, name):
    return (FX / kind / (name + ".txt")).read_text()


def nic(name, bdf, netdevs=()):
    return {"name": name, "model": "ConnectX-8", "role": "data", "pci_address": bdf, "fw_ver": "40.47.1026",
            "netdevs": list(netdevs)}


def kinds_of(raw, nics=(), gpus=(), below=None, dev=None):
    maps = tk.device_maps({"devices": list(nics)}, {"gpus": list(gpus)}, {}, below)
    devs = tk.scan(raw, maps)["devices"]
    return devs if dev is None else devs.get(dev, {})


def bad(fs):
    return [(f["device"], f["check"], f["verdict"], f["summary"]) for f in fs if f["verdict"] != "ok"]


# --------------------------------------------------------------------------- kernel log: one message, one finding
def test_a_wrapped_mlx5_message_is_one_finding():
    raw = text("kmsg", "wrap_amd_iommu_mail_eq_recover_cmd_recovered_after_timeout")
    k = kinds_of(raw, [nic("mlx5_0", "0000:00:02.0")], dev="mlx5_0")
    assert {kind: g["count"] for kind, g in k.items()} == {"mlx5_eq_recover": 1, "mlx5_cmd_timeout": 1}
    fs = tv.nic_kmsg("mlx5_0", k, "0000:00:02.0")
    assert bad(fs) == [("mlx5_0", "kernel_log", "fault", "1 command timeouts since 230.681799"),
                       ("mlx5_0", "kernel_log", "suspect", "lost interrupts recovered x1")]
    # the evidence is the joined line, not its halves
    assert "CREATE_CQ(0x400)" in fs[0]["evidence"][0] and "recovered after timeout" in fs[0]["evidence"][0]
    ibm = kinds_of(text("kmsg", "wrap_ibm_cx4lx_health_synd_after_pid"), [nic("mlx5_0", "0001:19:00.0")], dev="mlx5_0")
    hf = [f for f in tv.nic_kmsg("mlx5_0", ibm, "0001:19:00.0") if f["check"] == "kernel_log"]
    assert len(hf) == 1 and hf[0]["verdict"] == "fault" and "firmware health events" in hf[0]["summary"]


# --------------------------------------------------------------------------- PCIe AER / link events on the path
def test_fatal_aer_on_a_port_above_the_nic_is_a_fault_on_that_nic():
    raw = text("kmsg", "aer_redhat7128107_fatal_sdes_indented_kernel_tag")
    below = {"0000:00:1b.2": ["mlx5_0"], "0000:03:04.0": ["mlx5_0"]}
    k = kinds_of(raw, [nic("mlx5_0", "0000:05:00.0")], below=below, dev="mlx5_0")
    fs = tv.kmsg_pcie("mlx5_0", k, "NIC", "0000:05:00.0")
    got = {(f["check"], f["verdict"], f["score"]) for f in fs}
    assert got == {("pcie_aer_log", "fault", tv.PCIE_DOWN_SCORE), ("pcie_aer_log", "suspect", 8),
                   ("pcie_link_log", "fault", tv.PCIE_DOWN_SCORE)}
    fatal = [f for f in fs if f["check"] == "pcie_aer_log" and f["verdict"] == "fault"][0]
    # the kernel prints bit 5 as "SDES" (older) or "Surprise Down Error": one name, the PCIe spec's
    assert fatal["summary"] == "PCIe fatal AER (Surprise Down Error) on 0000:03:04.0 above it x1"
    assert "lspci -vvv -s 0000:03:04.0" in fatal["fix"]


def test_gpu_surprise_down_outranks_the_xid_79_it_causes():
    raw = text("kmsg", "aer_gpuburn1_replay_timeout_then_surprise_down_xid79")
    gpu = {"index": 0, "pci_bus_id": "00000000:02:00.0"}
    k = kinds_of(raw, gpus=[gpu], below={"0000:00:02.0": ["GPU 0"]}, dev="GPU 0")
    assert k["pcie_aer"]["subs"] == {"correctable": 1, "fatal": 1} and k["xid"]["codes"] == {"79": 1}
    fs = tv.gpu_rules(0, gpu, {}, None, k, 0, None)
    top = sorted((f for f in fs if f["verdict"] == "fault"), key=lambda f: -f["score"])
    assert top[0]["check"] == "pcie_aer_log" and "Surprise Down" in top[0]["summary"]
    assert top[1]["check"] == "xid" and "Xid 79" in top[1]["summary"]
    # correctable alone (a Replay Timer Timeout) is a suspicion, not a fault
    cor = [f for f in fs if f["check"] == "pcie_aer_log" and f["verdict"] == "suspect"]
    assert len(cor) == 1 and "Replay Timer Timeout" in cor[0]["summary"]


def test_correctable_aer_is_suspect_many_in_the_window_fail():
    raw = text("kmsg", "aer_popos3363_nvidia_gpu_correctable_dll_syslog_mono")
    gpu = {"index": 3, "pci_bus_id": "00000000:07:00.0"}
    k = kinds_of(raw, gpus=[gpu], below={"0000:00:03.1": ["GPU 3"]}, dev="GPU 3")
    assert k["pcie_aer"]["count"] == 2 and k["pcie_aer"]["via"] == ["0000:00:03.1"]
    fs = tv.kmsg_pcie("GPU 3", k, "GPU", "0000:07:00.0", is_gpu=True)
    assert [(f["verdict"], f["score"]) for f in fs] == [("suspect", 8)]
    many = {"pcie_aer": dict(k["pcie_aer"], subs={"correctable": tv.AER_COR_FAULT}, count=tv.AER_COR_FAULT)}
    assert [f["verdict"] for f in tv.kmsg_pcie("GPU 3", many, "GPU", "0000:07:00.0", is_gpu=True)] == ["fault"]


def test_nonfatal_aer_and_recovery_failed_on_the_device():
    raw = text("kmsg", "aer_rpi116_nonfatal_cmpltto_malftlp_tlp_header")
    k = kinds_of(raw, [nic("mlx5_1", "0000:00:00.0")], dev="mlx5_1")
    fs = tv.kmsg_pcie("mlx5_1", k, "NIC", "0000:00:00.0")
    assert bad(fs) == [("mlx5_1", "pcie_aer_log", "fault", "2 PCIe AER non-fatal errors (Completion Timeout, Malformed "
                                                           "TLP) in the kernel log"),
                       ("mlx5_1", "pcie_link_log", "fault", "AER recovery failed x2")]


def test_the_kernel_log_and_sysfs_count_the_same_aer_once():
    raw = text("kmsg", "aer_rpi116_nonfatal_cmpltto_malftlp_tlp_header")
    k = kinds_of(raw, [nic("mlx5_1", "0000:00:00.0")], dev="mlx5_1")
    sysfs = tv.pcie_aer("mlx5_1", "NIC", "0000:00:00.0", {"nonfatal": {"CmpltTO": 2, "MalfTLP": 2, "total": 4}}, None, 0)
    fs = tv.fold_aer(sysfs + tv.kmsg_pcie("mlx5_1", k, "NIC", "0000:00:00.0"))
    aer = [f for f in fs if f.get("aer_sev") == "nonfatal"]
    assert len(aer) == 1 and aer[0]["check"] == "aer"
    assert "kernel log: 2 PCIe AER non-fatal errors (Completion Timeout, Malformed TLP) in the kernel log" in \
        aer[0]["evidence"]


def test_bandwidth_limited_at_probe_nic_suspect_gpu_speed_only_not():
    raw = text("kmsg", "mlx5_cx6_ocp3_x4_slot_limited_insufficient_power")
    k = kinds_of(raw, [nic("mlx5_0", "0000:04:00.0", ["enp4s0np0"])], dev="mlx5_0")
    fs = tv.nic_kmsg("mlx5_0", k, "0000:04:00.0")
    assert ("mlx5_0", "pcie_link_log", "suspect", "NIC PCIe bandwidth limited at probe (2.5 GT/s x4)") in bad(fs)
    assert ("mlx5_0", "kernel_log", "suspect", "port went down 1 times") in bad(fs)   # `enp4s0np0: Link down`
    gpu = {"index": 0, "pci_bus_id": "00000000:01:00.0"}
    g = kinds_of(text("kmsg", "wrap_pci_gpu_bandwidth_limited_mail_wrapped"), gpus=[gpu], dev="GPU 0")
    # a width limit (x8 of x16) on a GPU is kept; a speed-only limit on an idle GPU would not be
    assert [f["summary"] for f in tv.kmsg_pcie("GPU 0", g, "GPU", "0000:01:00.0", is_gpu=True)] == [
        "GPU PCIe bandwidth limited at probe (16.0 GT/s x8)"]
    speed_only = {"pcie_link": {"subs": {"bandwidth_limited": 1}, "codes": {"2.5 GT/s x16": 1}, "via": [], "examples": [
        "pci 0000:01:00.0: 8.000 Gb/s available PCIe bandwidth, limited by 2.5 GT/s PCIe x16 link at 0000:00:01.1 "
        "(capable of 252.048 Gb/s with 16.0 GT/s PCIe x16 link)"]}}
    assert tv.kmsg_pcie("GPU 0", speed_only, "GPU", "0000:01:00.0", is_gpu=True) == []


def test_ethernet_link_lines_by_netdev_count_as_flaps():
    raw = text("kmsg", "mlx5_cx4lx_eswitch_link_flap_annotated")
    nics = [nic("mlx5_0", "0000:01:00.0", ["enp1s0f0np0"]), nic("mlx5_1", "0000:01:00.1", ["enp1s0f1np1"])]
    devs = kinds_of(raw, nics)
    assert bad(tv.nic_kmsg("mlx5_0", devs["mlx5_0"], "0000:01:00.0")) == [
        ("mlx5_0", "kernel_log", "suspect", "port went down 1 times")]
    assert bad(tv.nic_kmsg("mlx5_1", devs["mlx5_1"], "0000:01:00.1")) == [
        ("mlx5_1", "kernel_log", "suspect", "port went down 2 times")]


def test_a_connectx_the_driver_could_not_load_is_a_fault_outside_the_data_nics():
    raw = text("kmsg", "synd_create_eq_probe_failed_quoted_wrapped")
    col = {"rdma_nics": {"driver": DRIVER, "devices": []}, "gpu_topology": {}, "nic_gpu": {},
           "kernel_log": {"scan": {"devices": kinds_of(raw)}}}
    h = tv.judge_host(col, ROWS)
    assert h["causes"][0]["device"] in ("pci 0000:0b:00.0", "pci 0000:0b:00.1")
    assert {d: v["verdict"] for d, v in h["devices"].items() if v["verdict"] != "ok"} == {
        "pci 0000:0b:00.0": "fault", "pci 0000:0b:00.1": "fault"}
    assert "mlx5 probe failed (error -22)" in h["causes"][0]["sentence"]


# --------------------------------------------------------------------------- the ranked cause
def test_link_down_on_the_nic_upstream_port_outranks_the_nccl_errors_it_causes():
    raw = text("kmsg", "aer_pciehp_mail_mlx5_link_down_card_not_present_fatal")
    nics = [nic("mlx5_6", "0000:bb:00.0"), nic("mlx5_3", "0000:5f:00.0")]
    below = {"0000:b9:01.0": ["mlx5_6"]}
    col = {"rdma_nics": {"driver": DRIVER, "devices": nics}, "gpu_topology": {}, "nic_gpu": {},
           "kernel_log": {"scan": {"devices": kinds_of(raw, nics, below=below)}}}
    # the completion errors NCCL printed when the link went (a real 2.30 log; its HCA renamed to the NIC that lost it)
    warns = parse_nccl_warns(text("nccl_warn", "nccl2397_2_30_status_names_hca"))
    assert warns["completions"]
    for c in warns["completions"]:
        c["hca"] = "mlx5_6"
    traffic = {"mlx5_6": {"nccl": {"verdict": "error", "reasons": ["NCCL failure"], "warns": warns}},
               "mlx5_3": {"nccl": {"verdict": "error", "reasons": ["peer exited"], "warns": {}}}}
    h = tv.judge_host(col, ROWS, traffic=traffic)
    top = h["causes"][0]
    assert top["device"] == "mlx5_6" and top["verdict"] == "fault"
    assert top["sentence"].startswith("mlx5_6: PCIe link down x1 + card not present x1 on 0000:b9:01.0 above it")
    assert "drain the node; reseat 0000:bb:00.0 and the port 0000:b9:01.0" in top["sentence"]
    assert [c["device"] for c in h["causes"]][:2] == ["mlx5_6", "mlx5_3"]


# --------------------------------------------------------------------------- NCCL and PyTorch lines
def nccl(name, dev="host"):
    return bad(tv.nccl_warn_findings(parse_nccl_warns(text("nccl_warn", name)), dev))


def test_nccl_queue_pair_and_async_failures_are_judged_with_their_reason():
    got = nccl("nccl230_local_catastrophic_get_async_event_mpirun_tags")
    assert got == [("host", "nccl_warn", "fault", "HCA catastrophic error (async event) x3"),
                   ("host", "nccl_warn", "suspect", "NCCL lost the HCA's async events x3")]
    fs = tv.nccl_warn_findings(parse_nccl_warns(text("nccl_warn", "nccl562_ibvwrap_c_create_qp_failed_tf_bazel")), "host")
    assert bad(fs) == [("host", "nccl_warn", "fault", "NCCL ibv_create_qp failed x3")]
    assert "ulimit -l" in fs[0]["fix"]
    fs = tv.nccl_warn_findings(parse_nccl_warns(text("nccl_warn", "nccltests185_ibv_modify_qp_network_unreachable_title")),
                               "mlx5_2")
    assert bad(fs) == [("mlx5_2", "nccl_warn", "fault", "NCCL ibv_modify_qp failed (Network is unreachable)")]
    assert "NCCL_IB_GID_INDEX" in fs[0]["fix"]
    got = nccl("nccl1905_communicator_fatal_async_qp_hca_mlx5_ib0")
    assert ("mlx5_ib0", "nccl_warn", "fault", "async fatal event on mlx5_ib0") in got
    assert ("host", "nccl_warn", "fault", "NCCL communicator fatal error x1") in got
    got = nccl("nccl1710_hca_got_async_event_quoted_markdown_links")
    assert ("mlx5_0", "nccl_warn", "fault", "async event 'local access violation work queue error' on mlx5_0 x3") in got
    assert ("host", "nccl_warn", "fault", "NCCL IBV_WC_REM_INV_REQ_ERR(9) on host") in got


def test_gpu_direct_rdma_lines_are_judged_by_their_reason():
    assert nccl("nccl899_gdr_disabled_no_module_three_hcas") == [
        ("host", "nccl_gdr", "fault", "NCCL: GPU Direct RDMA disabled, no peermem module (mlx5_1, mlx5_2, mlx5_3)")]
    assert nccl("nccl1537_gdr_disabled_no_reason_peermem_loaded") == [
        ("mlx5_0", "nccl_gdr", "fault", "GPU Direct RDMA disabled for mlx5_0"),
        ("mlx5_1", "nccl_gdr", "fault", "GPU Direct RDMA disabled for mlx5_1")]
    # the plugin that carries the traffic says Disabled although NET/IB said DMABUF enabled: the last word counts
    got = nccl("gdr_gb10_dmabuf_enabled_plugin_disabled_conflict")
    assert got == [("rocep1s0f0", "nccl_gdr", "fault", "GPU Direct RDMA disabled for rocep1s0f0")]
    assert nccl("gdr_peermem_and_dmabuf_enabled_no_closing_quote_bond") == []
    # disabled by distance, then enabled once NCCL_NET_GDR_LEVEL allowed it: the last word per GPU/HCA pair
    assert nccl("gdr_distance_disabled_then_enabled_after_gdr_level") == []
    first = parse_nccl_warns(text("nccl_warn", "gdr_distance_disabled_then_enabled_after_gdr_level"))
    first["gdr_gpu"] = first["gdr_gpu"][:1]
    assert [f[3] for f in bad(tv.nccl_warn_findings(first, "host"))] == [
        "NCCL GDR off for GPU 0 / HCA 0 (distance above the GDR level)"]
    # NET/Socket's own "Disabled for HCA 0 'eth0'" is no GDR finding; no IB device at all is
    assert nccl("gdr_socket_transport_disabled_for_eth0") == [
        ("host", "nccl_warn", "fault", "NCCL found no IB device (network Socket)")]


def test_pytorch_watchdog_is_the_hang_not_its_cause():
    got = nccl("torch_llamafactory7396_watchdog_pid_prefixed_rank_tags")
    assert len(got) == 1 and got[0][:3] == ("host", "nccl_warn", "suspect")
    assert "ALLREDUCE SeqNum=1580" in got[0][3]
    got = nccl("torch_sglang1693_watchdog_terminate_what_restated")
    assert len(got) == 1 and got[0][2] == "suspect"


# --------------------------------------------------------------------------- ethtool -S PHY counters
def test_phy_counters_growth_fails_since_boot_warns_fec_corrections_reported():
    vyos = tc.phy_counters(tc.parse_ethtool_stats(text("ethtool_stats", "vyos_cx6dx_grep_err_crc_symbol_millions")))
    fs = tv.nic_phy_counters("mlx5_4", vyos, vyos, 0, "the triage")
    assert bad(fs) == [("mlx5_4", "phy_counters", "suspect", "rx_crc_errors_phy 13,147,323 since boot"),
                       ("mlx5_4", "phy_counters", "suspect", "rx_symbol_err_phy 13,115,284 since boot")]
    grown = dict(vyos, rx_symbol_err_phy=vyos["rx_symbol_err_phy"] + 40)
    fs = tv.nic_phy_counters("mlx5_4", vyos, grown, 10, "the triage (10s, live traffic)")
    assert ("mlx5_4", "phy_counters", "fault", "rx_symbol_err_phy +40 during the triage (10s, live traffic)") in bad(fs)
    gx = tc.phy_counters(tc.parse_ethtool_stats(text("ethtool_stats", "gx10_cx7_lanes_unindented_no_header")))
    fs = tv.nic_phy_counters("mlx5_0", gx, gx, 0, "the triage")
    assert bad(fs) == [] and [f["summary"] for f in fs] == ["FEC corrections (info)",
                                                           "raw errors before FEC per lane since boot (info)"]
    assert fs[0]["evidence"] == ["rx_corrected_bits_phy 198"]
    # the real text: rx_err_lane_0_phy: 6, _1_: 2, _2_: 190, _3_: 0 (a zero lane is not listed)
    assert fs[1]["evidence"] == ["rx_err_lane_0_phy 6; rx_err_lane_1_phy 2; rx_err_lane_2_phy 190"]


def test_per_lane_raw_errors_before_fec_growing_warn_as_mlx5_counters_rst_says():
    """Issue 38: rx_err_lane_N_phy are raw errors BEFORE FEC (kernel mlx5 counters.rst, type Error: increasing means
    high BER, traffic might be lost, check with rx_corrected_bits_phy), not FEC corrections: their growth warns."""
    gx = tc.phy_counters(tc.parse_ethtool_stats(text("ethtool_stats", "gx10_cx7_lanes_unindented_no_header")))
    grown = dict(gx, rx_err_lane_2_phy=gx["rx_err_lane_2_phy"] + 5000, rx_corrected_bits_phy=gx["rx_corrected_bits_phy"]
                 + 5000)
    fs = tv.nic_phy_counters("mlx5_0", gx, grown, 10, "the triage (10s, live traffic)")
    assert bad(fs) == [("mlx5_0", "phy_counters", "suspect",
                        "raw errors before FEC on lane 2 +5,000 during the triage (10s, live traffic)")]
    lane = next(f for f in fs if f["verdict"] == "suspect")
    assert lane["evidence"] == ["rx_err_lane_2_phy 190 -> 5,190 (+5,000 in 10s); rx_corrected_bits_phy +5,000"]
    assert "before FEC" in lane["rule"] and "mlxlink" in lane["fix"] and lane["score"] < 30   # never a fault alone
    # the FEC-corrected bits alone growing stay information (a healthy PAM4 link corrects some)
    fec = dict(gx, rx_corrected_bits_phy=gx["rx_corrected_bits_phy"] + 5000)
    assert bad(tv.nic_phy_counters("mlx5_0", gx, fec, 10, "the triage")) == []


DMESG_H = ("dmesgH_timer_module_month_stamp_batches", "dmesgH_amdgpu_gpf_wrapped_call_trace")


def test_dmesg_human_and_reltime_stamps_are_read():
    """Issue 38: `dmesg -H` / `--reltime` print `[Mar 3 14:53]` for a batch's first line and `[  +1.000031]` for the
    rest (real captures): the stamp is split off and the message read, a wrapped message stays one."""
    lines = text("kmsg", DMESG_H[0]).splitlines()
    assert tk.split_prefix(lines[0]) == ("Mar 3 14:53", "GOOD NEWS EVERYONE: timer lab1 module loaded")
    assert tk.split_prefix(lines[1]) == ("+1.000031", "exipred")
    assert len(tk.logical_lines(text("kmsg", DMESG_H[0]))) == 8
    gpf = tk.logical_lines(text("kmsg", DMESG_H[1]))
    assert len(gpf) == 9 - 1 and gpf[0][1].endswith("address 0xd5e5a4ae79d24a32: 0000 [#1] PREEMPT SMP PTI")
    assert tk.split_prefix("[Dec10 14:32] mlx5_core 0000:5f:00.0: Link down") == (
        "Dec10 14:32", "mlx5_core 0000:5f:00.0: Link down")


def _as_dmesg_h(raw):
    """The same records as util-linux `dmesg -H` prints them: the first `[Mar 3 14:53]`, the rest `[  +S.UUUUUU]`
    (the seconds since the record before; dmesg.c prints "[  +0.000000] " for an unchanged stamp)."""
    out, prev = [], None
    for ln in raw.splitlines():
        m = re.match(r"^\[\s*(\d+\.\d+)\](.*)$", ln)
        if not m:
            out.append(ln)
            continue
        t = float(m.group(1))
        out.append(("[Mar 3 14:53]" if prev is None else "[%+11.6f]" % (t - prev)).replace("[ +", "[  +") + m.group(2))
        prev = t
    return "\n".join(out) + "\n"


def test_real_mlx5_logs_read_the_same_through_dmesg_h():
    """No public `dmesg -H` capture with mlx5 lines exists (kmsg/SOURCES.md): the real mlx5 captures with monotonic
    stamps, re-stamped as `dmesg -H` prints them, give the same events (kind, device, code) as the original."""
    stamped = {p.stem: [ln for ln in p.read_text().splitlines() if ln] for p in sorted((FX / "kmsg").glob("*.txt"))}
    names = [n for n, lines in stamped.items()
             if len(lines) > 1 and all(re.match(r"^\[\s*\d+\.\d+\] ", ln) for ln in lines)]
    assert len(names) >= 5, names

    def key(t):
        return [(e["kind"], e["sub"], e["code"], e["bdf"], e["name"], e["netdev"]) for e in tk.parse(t)]

    seen = 0
    for n in names:
        raw = text("kmsg", n)
        h = _as_dmesg_h(raw)
        assert "[  +" in h and key(h) == key(raw), n
        seen += len(key(raw))
    assert seen >= 5
