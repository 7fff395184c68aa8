"""The triage's collector and rules on every emulated fault scenario (sandbox/hwemu), in process: each scenario ->
the right device, verdict and most likely cause; the healthy host -> every device ok; the collector only reads."""
import hashlib
import os
import pathlib
import sys

import pytest
import yaml

from ansible_collections.b300.rollout.plugins.module_utils.triage_collect import collect
from ansible_collections.b300.rollout.plugins.module_utils.triage_verdict import judge_fleet, render_markdown, \
    render_textfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
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
                   "lsmod", "systemctl"}


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
