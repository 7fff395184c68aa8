"""The triage's collector and rules on every emulated fault scenario (sandbox/hwemu), in process: each scenario ->
the right device, verdict and most likely cause; the healthy host -> every device ok; the collector only reads."""
import hashlib
import os
import pathlib

import pytest
import yaml

from ansible_collections.b300.rollout.plugins.module_utils.triage.triage_collect import collect
from ansible_collections.b300.rollout.plugins.module_utils.triage.triage_verdict import judge_fleet, render_markdown, \
    render_textfile

from triage_emu import BIN, emulated_host

REPO = pathlib.Path(__file__).resolve().parents[2]
ROWS = yaml.safe_load((REPO / "roles/nic_firmware_gate/vars/nic_fw_matrix.yml").read_text())["nic_firmware_gate_matrix_rows"]
EXPECTED = {"ConnectX-8": 400, "ConnectX-7": 400}

# scenario -> (device of the most likely cause, its verdict, words the cause sentence must carry, checks that fired)
CASES = {
    "cx8_fw_timeouts": ("mlx5_3", "fault", ["mlx5_3 (GPU 3's NIC)", "firmware 40.44.1036 older than driver 25.10-1.2.2",
                                            "14 command timeouts", "mlxfwmanager -d 0000:5f:00.0 -u"],
                        {"firmware", "kernel_log", "rdma_counters"}),
    "cx8_fw_mismatch": ("mlx5_3", "fault", ["firmware 40.44.1036"], {"firmware"}),
    "ib_port_flap": ("mlx5_5", "fault", ["port went down 6 times", "link_downed 6 since boot"],
                     {"kernel_log", "ib_counters"}),
    "ib_port_half_rate": ("mlx5_2", "fault", ["port trained at 200 Gb/s, expected 400"], {"ib_port"}),
    "nic_pcie_x8": ("mlx5_6", "fault", ["PCIe link x8 instead of x16", "0000:bc:00.0"], {"pcie"}),
    "pcie_aer_nonfatal": ("mlx5_1", "fault", ["3 PCIe AER nonfatal errors"], {"aer"}),
    "peermem_missing": ("host", "suspect", ["nvidia_peermem not loaded", "modprobe nvidia_peermem"], {"gpudirect"}),
    "acs_enabled": ("bridge 0000:99:01.0", "fault", ["between GPU 4 and mlx5_4", "ACS SrcValid/ReqRedir/CmpltRedir"],
                    {"acs"}),
    "gpu_xid79": ("GPU 6", "fault", ["Xid 79 (GPU has fallen off the bus)", "Node Reboot Required"],
                  {"xid", "gpu_recovery_action"}),
    "fabric_degraded": ("host", "fault", ["NVLink fabric degraded on 8 GPUs"], {"fabric"}),
    "gpu_hot_96c": ("GPU 3", "fault", ["96 C with thermal slowdown", "airflow"], {"thermal"}),
    "nvlink_down": ("GPU 5", "fault", ["2 NVLink links down"], {"nvlink", "fabric"}),
    "ecc_errors": ("GPU 2", "fault", ["recovery action 'GPU Reset'"], {"gpu_recovery_action", "ecc", "remapped_rows"}),
}
READ_ONLY_TOOLS = {"nvidia-smi", "mlxfwmanager", "ofed_info", "journalctl", "dmesg", "devlink", "lspci", "setpci",
                   "lsmod", "systemctl", "ethtool"}


def tree_digest(root):
    h = hashlib.sha256()
    for dp, dns, fns in sorted(os.walk(root)):
        dns.sort()
        for fn in sorted(fns):
            p = os.path.join(dp, fn)
            if os.path.islink(p):
                h.update(("L%s>%s" % (p, os.readlink(p))).encode())
            elif os.path.isfile(p):
                with open(p, "rb") as fh:
                    h.update(p.encode() + fh.read())
    return h.hexdigest()


def triage(tmp_path, monkeypatch, scenario, delta=0):
    mod, sysfs, proc = emulated_host(tmp_path, scenario, monkeypatch=monkeypatch)
    col = collect(mod, [BIN], sysfs, proc, "2h", delta, sleep=lambda s: None)
    rep = judge_fleet({"b300b": {"collection": col}}, ROWS, {}, EXPECTED, since="2h")
    return rep, rep["hosts"]["b300b"], mod, col


def test_healthy_host_is_all_ok_and_collect_only_reads(tmp_path, monkeypatch):
    rep, h, mod, col = triage(tmp_path, monkeypatch, "healthy")
    assert rep["summary"]["exit_code"] == 0
    assert h["status"] == "ok" and h["causes"] == [] and h["most_likely_cause"] is None
    bad = {n: [f["summary"] for f in d["findings"] if f["verdict"] != "ok"] for n, d in h["devices"].items()
           if d["verdict"] != "ok"}
    assert bad == {}
    # every device the triage should have judged is there: 9 NICs, 8 GPUs, 24 bridges, the host
    kinds = {}
    for d in h["devices"].values():
        kinds[d["kind"]] = kinds.get(d["kind"], 0) + 1
    assert kinds == {"nic": 9, "gpu": 8, "bridge": 24, "host": 1}
    assert col["kernel_log"]["source"] == "journalctl" and col["devlink"]["error"] is None
    assert col["gdr"]["peermem"] is True and col["iommu"]["mode"] == "passthrough"
    assert all(e["acs_source"] == "lspci -vvv ACSCtl" for e in col["pcie"].values() if e["role"] == "bridge")
    # only reading tools ran, and the emulated host's files are exactly as before
    tools = {os.path.basename(c[0]) for c in mod.calls}
    assert tools <= READ_ONLY_TOOLS, tools - READ_ONLY_TOOLS
    assert not any(a in c for c in mod.calls for a in ("-u", "burn", "reset", "set"))
    assert all(c[1] == "-S" for c in mod.calls if os.path.basename(c[0]) == "ethtool")   # statistics only
    # ethtool -S of every data NIC's netdev, twice (the deltas); healthy: FEC-corrected bits reported, nothing judged
    assert sorted(col["phy_counters"]) == ["mlx5_%d" % i for i in range(8)] == sorted(col["phy_counters_after"])
    assert col["phy_counters"]["mlx5_0"]["rx_crc_errors_phy"] == 0 and col["phy_note"] is None
    assert "| every device | ok |" in render_markdown(rep)


def test_collect_changes_no_file_of_the_host(tmp_path, monkeypatch):
    mod, sysfs, proc = emulated_host(tmp_path, "cx8_fw_timeouts", monkeypatch=monkeypatch)
    before = tree_digest(os.path.realpath(sysfs)) + tree_digest(proc)
    collect(mod, [BIN], sysfs, proc, "2h", 0, sleep=lambda s: None)
    assert tree_digest(os.path.realpath(sysfs)) + tree_digest(proc) == before


@pytest.mark.parametrize("scenario", sorted(CASES))
def test_scenario_names_the_device_the_verdict_and_the_cause(tmp_path, monkeypatch, scenario):
    device, verdict, words, checks = CASES[scenario]
    rep, h, _mod, _col = triage(tmp_path, monkeypatch, scenario)
    assert h["causes"], scenario
    top = h["causes"][0]
    assert (top["device"], top["verdict"]) == (device, verdict), h["causes"]
    for w in words:
        assert w in top["sentence"], (w, top["sentence"])
    fired = {f["check"] for d in h["devices"].values() for f in d["findings"] if f["verdict"] != "ok"
             and f["device"] in (device,) + tuple("GPU %d" % i for i in range(8))}
    assert checks <= fired, (checks, fired)
    assert rep["summary"]["exit_code"] == (2 if verdict == "fault" else 0)
    # the fault stays on its device: every other NIC and GPU of the host is ok (the fabric is the whole node's)
    others = {n: d["verdict"] for n, d in h["devices"].items() if d["verdict"] != "ok" and n != device}
    if scenario == "fabric_degraded":
        assert set(others) == {"GPU %d" % i for i in range(8)}
    elif scenario == "nvlink_down":
        assert set(others) <= {"host"}
    else:
        assert others == {}, others
    prom = render_textfile(rep, "b300b")
    assert 'b300_triage_device{host="b300b",device="%s",verdict="%s"} 1' % (device, verdict) in prom
    assert 'b300_triage_host_verdict{host="b300b"} %d' % {"fault": 2, "suspect": 1}[verdict] in prom


def test_cx8_fw_timeouts_report_reads_like_the_issue(tmp_path, monkeypatch):
    rep, h, _m, col = triage(tmp_path, monkeypatch, "cx8_fw_timeouts")
    md = render_markdown(rep)
    assert "**Most likely cause:** mlx5_3 (GPU 3's NIC): firmware 40.44.1036 older than driver 25.10-1.2.2 expects" in md
    assert "local_ack_timeout_err 212 since boot" in md
    assert col["kernel_log"]["scan"]["devices"]["mlx5_3"]["mlx5_cmd_timeout"]["count"] == 14
    assert 'b300_mlx5_cmd_timeouts{host="b300b",device="mlx5_3"} 14' in render_textfile(rep, "b300b")


def test_kernel_log_window_excludes_older_lines(tmp_path, monkeypatch):
    mod, sysfs, proc = emulated_host(tmp_path, "cx8_fw_timeouts", monkeypatch=monkeypatch)
    col = collect(mod, [BIN], sysfs, proc, "30m", 0, sleep=lambda s: None)
    # the 14 lines span ~95 minutes: 30 minutes hold the last 3 pairs at most
    n = col["kernel_log"]["scan"]["devices"]["mlx5_3"]["mlx5_cmd_timeout"]["count"]
    assert 2 <= n <= 6, n


# --------------------------------------------------------------------------- ethtool -S PHY counters (emulated)
def test_phy_counters_growing_during_the_triage_fail_that_nic(tmp_path, monkeypatch):
    mod, sysfs, proc = emulated_host(tmp_path, "healthy", monkeypatch=monkeypatch)
    netdev = [d for d in os.listdir(os.path.join(sysfs, "class", "infiniband", "mlx5_4", "device", "net"))][0]

    def errors_while_waiting(_s):   # symbol errors the FEC could not correct, between the two snapshots
        (tmp_path / "state" / "ethtool.json").write_text('{"%s": {"rx_symbol_err_phy": 40}}' % netdev)
    col = collect(mod, [BIN], sysfs, proc, "2h", 5, sleep=errors_while_waiting)
    assert col["phy_counters"]["mlx5_4"]["rx_symbol_err_phy"] == 0
    assert col["phy_counters_after"]["mlx5_4"]["rx_symbol_err_phy"] == 40
    rep = judge_fleet({"b300b": {"collection": col}}, ROWS, {}, EXPECTED, since="2h")
    h = rep["hosts"]["b300b"]
    assert h["causes"][0]["device"] == "mlx5_4" and h["causes"][0]["verdict"] == "fault"
    assert "rx_symbol_err_phy +40 during the triage" in h["causes"][0]["sentence"]
    assert {n for n, d in h["devices"].items() if d["verdict"] != "ok"} == {"mlx5_4"}


def test_without_ethtool_the_phy_counters_are_a_note_not_a_finding(tmp_path, monkeypatch):
    mod, sysfs, proc = emulated_host(tmp_path, "healthy", monkeypatch=monkeypatch)
    real = mod.get_bin_path
    monkeypatch.setattr(mod, "get_bin_path", lambda name, *a, **kw: None if name == "ethtool" else real(name, *a, **kw))
    col = collect(mod, [BIN], sysfs, proc, "2h", 0, sleep=lambda s: None)
    assert col["phy_counters"] == {} and col["phy_note"] == "ethtool not found: PHY counters not read"
    assert judge_fleet({"b300b": {"collection": col}}, ROWS, {}, EXPECTED, since="2h")["hosts"]["b300b"]["status"] == "ok"


# --------------------------------------------------------------------------- the kernel log's PCIe ports
def test_pcie_ports_above_each_device_and_a_surprise_down_there(tmp_path, monkeypatch):
    """pcie_below from the emulated sysfs: the switch port right above mlx5_2 carries only it, the ports further up
    carry its GPU too. Real AER lines (aer_gpuburn1_replay_timeout_then_surprise_down_xid79.txt of the real-world
    kmsg fixtures, the port's BDF replaced by that switch port's) on it make mlx5_2 the most likely cause; GPU 2, not
    below that port, stays ok."""
    from ansible_collections.b300.rollout.plugins.module_utils.triage import triage_kmsg as tk
    from ansible_collections.b300.rollout.plugins.module_utils.triage.triage_pcie import upstream_of
    mod, sysfs, proc = emulated_host(tmp_path, "healthy", monkeypatch=monkeypatch)
    col = collect(mod, [BIN], sysfs, proc, "2h", 0, sleep=lambda s: None)
    nic = [d for d in col["rdma_nics"]["devices"] if d["name"] == "mlx5_2"][0]
    port = upstream_of(sysfs, nic["pci_address"])
    assert col["pcie_below"][port] == ["mlx5_2"]
    assert any(set(v) == {"mlx5_2", "GPU 2"} for v in col["pcie_below"].values())
    raw = (REPO / "tests/fixtures/real-world/kmsg/aer_gpuburn1_replay_timeout_then_surprise_down_xid79.txt").read_text()
    raw = "\n".join(ln.replace("0000:00:02.0", port) for ln in raw.splitlines() if "pcieport" in ln)
    maps = tk.device_maps(col["rdma_nics"], col["gpu_topology"], col["nic_gpu"], col["pcie_below"])
    col["kernel_log"]["scan"] = {"devices": tk.scan(raw, maps)["devices"]}
    rep = judge_fleet({"b300b": {"collection": col}}, ROWS, {}, EXPECTED, since="2h")
    top = rep["hosts"]["b300b"]["causes"][0]
    assert top["device"] == "mlx5_2" and top["verdict"] == "fault"
    assert top["sentence"].startswith("mlx5_2 (GPU 2's NIC): PCIe fatal AER (Surprise Down Error) on %s above it" % port)
    assert rep["hosts"]["b300b"]["devices"]["GPU 2"]["verdict"] == "ok"
