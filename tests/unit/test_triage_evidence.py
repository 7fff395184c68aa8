"""Pasted evidence (tools/triage --evidence [HOST=]FILE): REAL outputs (tests/fixtures/real-world, sources in their
SOURCES.md) judged with an emulated host's collection -- a kernel log, a job's NCCL/PyTorch log, perftest,
ibqueryerrors, perfquery -x and ethtool -S -- each charged to the host's device it names; the CLI's and the report
module's checks of the files."""
import importlib.machinery
import importlib.util
import os
import pathlib

import pytest
import yaml

from ansible_collections.b300.rollout.plugins.module_utils.triage import triage_evidence as te
from ansible_collections.b300.rollout.plugins.module_utils.triage.triage_collect import collect
from ansible_collections.b300.rollout.plugins.module_utils.triage.triage_verdict import judge_fleet, render_markdown

from triage_emu import BIN, emulated_host

REPO = pathlib.Path(__file__).resolve().parents[2]
FX = REPO / "tests" / "fixtures" / "real-world"
ROWS = yaml.safe_load((REPO / "roles/nic_firmware_gate/vars/nic_fw_matrix.yml").read_text())["nic_firmware_gate_matrix_rows"]
EXPECTED = {"ConnectX-8": 400, "ConnectX-7": 400}


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("emu")
    old = {k: os.environ.get(k) for k in ("HWEMU_ROOT", "HWEMU_HOSTNAME")}
    mod, sysfs, proc = emulated_host(tmp, "healthy")
    try:
        yield collect(mod, [BIN], sysfs, proc, "2h", 0, sleep=lambda s: None)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def nic(col, name):
    return [d for d in col["rdma_nics"]["devices"] if d["name"] == name][0]


def judge(col, files):
    rep = judge_fleet({"b300b": {"collection": col}}, ROWS, {}, EXPECTED, since="2h",
                      evidence={"b300b": [{"path": p, "text": t} for p, t in files]})
    return rep, rep["hosts"]["b300b"]


def test_a_previous_boots_kernel_log_is_judged_like_the_collected_one(healthy):
    # a real pciehp + mlx5 health sequence (aer_pciehp_mail_...), its BDFs replaced by mlx5_6's and its switch port's
    bdf = nic(healthy, "mlx5_6")["pci_address"]
    raw = (FX / "kmsg" / "aer_pciehp_mail_mlx5_link_down_card_not_present_fatal.txt").read_text()
    raw = raw.replace("0000:bb:00.0", bdf).replace("0000:b9:01.0", healthy["pcie"][bdf]["upstream"])
    rep, h = judge(healthy, [("dmesg-boot-1.txt", raw)])
    assert h["evidence"] == [{"path": "dmesg-boot-1.txt", "read": ["kernel log: 4 events"]}]
    assert h["causes"][0]["device"] == "mlx5_6" and h["causes"][0]["verdict"] == "fault"
    assert "PCIe link down x1 + card not present x1" in h["causes"][0]["sentence"]
    assert "Evidence: dmesg-boot-1.txt (kernel log: 4 events)." in render_markdown(rep)


def test_nccl_and_pytorch_logs_name_the_hca_or_the_host(healthy):
    files = [(str(FX / "nccl_warn" / n), (FX / "nccl_warn" / n).read_text()) for n in (
        "nccl1905_communicator_fatal_async_qp_hca_mlx5_ib0.txt", "torch_llamafactory7396_watchdog_pid_prefixed_rank_tags.txt")]
    _rep, h = judge(healthy, files)
    got = {(f["device"], f["verdict"], f["summary"]) for d in h["devices"].values() for f in d["findings"]
           if f["verdict"] != "ok"}
    assert ("mlx5_ib0", "fault", "async fatal event on mlx5_ib0") in got   # an HCA this host does not have: kept
    assert ("host", "fault", "NCCL communicator fatal error x1") in got
    assert any(d == "host" and v == "suspect" and s.startswith("PyTorch NCCL watchdog timeout") for d, v, s in got)
    assert all(e["read"][0].startswith("NCCL/PyTorch: ") for e in h["evidence"])


def test_counters_as_people_collect_them_are_charged_to_the_nic_or_the_fabric(healthy):
    lid3 = healthy["ports"]["mlx5_3"]["1"]["lid"]
    netdev4 = nic(healthy, "mlx5_4")["netdevs"][0]
    pq = (FX / "perfquery" / "exporter_switch2_x_link_downed_discards.txt").read_text()
    ibq = (FX / "ibqueryerrors" / "mail_sx6036_fabric_mlx4_hcas_quoted.txt").read_text()
    eth = (FX / "ethtool_stats" / "vyos_cx6dx_grep_err_crc_symbol_millions.txt").read_text()
    files = [("switch-port.txt", pq),                                               # a switch's LID: the fabric's
             ("nic3.txt", pq.replace("Lid 2052", "Lid %d" % lid3)),                 # this host's mlx5_3 by its LID
             ("ibq.txt", ibq.replace('"dl380g7 mlx4_0"', '"b300b mlx5_1"')),        # rdma-ndd's "%h %d" description
             ("eth.txt", eth.replace("eth5", netdev4))]                            # `ethtool -S <netdev>` names it
    _rep, h = judge(healthy, files)
    dev = {n: sorted(f["summary"] for f in d["findings"] if f["verdict"] != "ok") for n, d in h["devices"].items()
           if d["verdict"] != "ok"}
    assert set(dev) == {"mlx5_1", "mlx5_3", "mlx5_4", "fabric"}
    assert dev["mlx5_3"] == ["pasted perfquery -x: link_downed 1"]
    assert dev["mlx5_1"] == ["pasted ibqueryerrors: VL15_dropped 14"]
    assert dev["mlx5_4"] == ["rx_crc_errors_phy 13,147,323 since boot", "rx_symbol_err_phy 13,115,284 since boot"]
    # the perfquery switch port + the SX6036's port ALL and ports 1-8 (port 0 and the CAs have only PortXmitWait)
    assert dev["fabric"] == ["10 fabric ports with error counters in the pasted output"]
    assert all(d["verdict"] == "suspect" for d in h["devices"].values() if d["verdict"] != "ok")


def test_pasted_perftest_tables_each_judged_in_2_20_byte_units(healthy):
    raw = (FX / "perftest" / "cu05_cu07_write_atomic_read_send_mb_indented_markdown.txt").read_text()
    _rep, h = judge(healthy, [("pt.txt", raw)])
    assert h["evidence"][0]["read"] == ["perftest: 4 tables"]
    fs = [f for d in h["devices"].values() for f in d["findings"] if f["check"] == "evidence_perftest"]
    assert len(fs) == 4
    # 100G EDR figures against this host's 400G NICs: below 90 % -> suspect; the atomics table is reported only
    assert sorted((f["verdict"], f["summary"].split(" Gb/s")[0].rsplit(" ", 1)[0]) for f in fs) == [
        ("ok", "pasted Atomic FETCH_AND_ADD BW Test"), ("suspect", "pasted RDMA_Read BW Test"),
        ("suspect", "pasted RDMA_Write BW Test"), ("suspect", "pasted Send BW Test")]


def test_an_unreachable_hosts_evidence_is_listed_not_judged():
    rep = judge_fleet({"b300a": {"unreachable": True, "msg": "ssh: timeout"}}, ROWS,
                      evidence={"b300a": [{"path": "/tmp/x.log", "text": "NCCL WARN Call to ibv_create_qp failed"}]})
    assert rep["hosts"]["b300a"]["evidence"] == [{"path": "/tmp/x.log", "read": ["not judged: the host could not be "
                                                                                "triaged"]}]
    assert "Evidence not judged: /tmp/x.log" in render_markdown(rep)


# --------------------------------------------------------------------------- the files themselves
def load_cli():
    # tools/triage imports the shared wrapper tools/runner_cli.py from its own directory (tools/ is on sys.path: pytest.ini)
    loader = importlib.machinery.SourceFileLoader("triage_cli", str(REPO / "tools" / "triage"))
    spec = importlib.util.spec_from_loader("triage_cli", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def test_cli_evidence_files_need_their_host_and_a_readable_small_file(tmp_path):
    cli = load_cli()
    f = tmp_path / "dmesg.txt"
    f.write_text("x\n")
    assert cli.evidence_files(["b300a=%s" % f], None) == {"b300a": [str(f)]}
    assert cli.evidence_files([str(f)], "b300b") == {"b300b": [str(f)]}
    for spec, limit, words in ((str(f), None, "name its host"), (str(f), "b300a,b300b", "name its host"),
                               ("b300a=%s" % (tmp_path / "none"), None, "is not a readable file")):
        with pytest.raises(ValueError, match=words):
            cli.evidence_files([spec], limit)
    big = tmp_path / "big.log"
    with open(big, "wb") as fh:
        fh.truncate(cli.EVIDENCE_MAX_BYTES + 1)
    with pytest.raises(ValueError, match="larger than 8 MiB"):
        cli.evidence_files(["b300a=%s" % big], None)
    assert cli.EVIDENCE_MAX_BYTES == te.MAX_BYTES
    a = cli.parse_args(["-l", "b300b", "--evidence", str(f)])
    assert a.evidence_files == {"b300b": [str(f)]}
    with pytest.raises(SystemExit):
        cli.parse_args(["--evidence", str(f)])


class FakeModule:
    def fail_json(self, msg, **kw):
        raise RuntimeError(msg)


def test_report_module_refuses_an_unknown_host_an_unreadable_or_oversized_file(tmp_path):
    from ansible_collections.b300.rollout.plugins.modules.triage_report import read_files
    f = tmp_path / "job.log"
    f.write_text("NCCL WARN Call to ibv_create_qp failed\n")
    assert read_files(FakeModule(), {"b300a": [str(f)]}, {"b300a": {}}) == {
        "b300a": [{"path": str(f), "text": "NCCL WARN Call to ibv_create_qp failed\n"}]}
    with pytest.raises(RuntimeError, match="evidence for host b300z, which this run does not triage"):
        read_files(FakeModule(), {"b300z": [str(f)]}, {"b300a": {}})
    with pytest.raises(RuntimeError, match="cannot be read"):
        read_files(FakeModule(), {"b300a": [str(tmp_path / "none")]}, {"b300a": {}})
    big = tmp_path / "big.log"
    with open(big, "wb") as fh:
        fh.truncate(te.MAX_BYTES + 1)
    with pytest.raises(RuntimeError, match="larger than 8 MiB"):
        read_files(FakeModule(), {"b300a": [str(big)]}, {"b300a": {}})
