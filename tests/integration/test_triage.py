"""Integration: the on-call triage (tools/triage) against the sandbox hosts (emulated hardware, sandbox/hwemu).

One tools/triage run per scenario pair (b300a and b300b on two different fault scenarios at once), reusing the
running fleet; a finalizer puts both hosts back to `healthy`. Checked: each scenario -> the right device, verdict
and most likely cause; the healthy fleet -> every device ok and nothing changed on the hosts (the marker-file proof of
tests/integration/test_firmware_audit.py); an unreachable host -> exit 3 and the report says so; --traffic charges
the counter deltas to the NIC that carried the traffic and is refused on a serving node.
"""
import json
import re
import time

import pytest

from test_firmware_audit import ROOT, changed_files, mark

HOSTS = ("b300a", "b300b")
SERVING_UNIT = "triagetest-serving"

# scenario -> (device of the most likely cause, verdict, words of the cause sentence)
EXPECT = {
    "cx8_fw_timeouts": ("mlx5_3", "fault", ["firmware 40.44.1036 older than driver 25.10-1.2.2", "14 command timeouts"]),
    "ib_port_flap": ("mlx5_5", "fault", ["port went down 6 times"]),
    "ib_port_half_rate": ("mlx5_2", "fault", ["port trained at 200 Gb/s, expected 400"]),
    "nic_pcie_x8": ("mlx5_6", "fault", ["PCIe link x8 instead of x16"]),
    "pcie_aer_nonfatal": ("mlx5_1", "fault", ["PCIe AER nonfatal errors"]),
    "peermem_missing": ("host", "suspect", ["nvidia_peermem not loaded"]),
    "acs_enabled": ("bridge 0000:99:01.0", "fault", ["ACS SrcValid/ReqRedir/CmpltRedir"]),
    "gpu_xid79": ("GPU 6", "fault", ["Xid 79 (GPU has fallen off the bus)"]),
    "fabric_degraded": ("host", "fault", ["NVLink fabric degraded on 8 GPUs"]),
    "gpu_hot_96c": ("GPU 3", "fault", ["96 C with thermal slowdown"]),
}

HISTORY_UNIT = "b300-health-history.service"
HISTORY_DIR = "/var/lib/b300-health-history"


@pytest.fixture(scope="module")
def fleet(sandbox, request):
    sandbox.scenarios_back_to_healthy(request, HOSTS)
    # site.yml installs the health history on every host, and the triage reads it: samples taken while other tests'
    # fault scenarios ran would be charged to this module's scenarios (a counter that grew in the history window).
    # The triage starts here from hosts without history (the sandbox's history is disposable) and the sampler is
    # started again afterwards; tests/integration/test_health_history.py covers the history itself.
    for h in HOSTS:
        sandbox.exec(h, "systemctl stop %s 2>/dev/null; rm -rf %s/*" % (HISTORY_UNIT, HISTORY_DIR), check=False)
    request.addfinalizer(lambda: [sandbox.exec(h, "systemctl start %s 2>/dev/null; true" % HISTORY_UNIT, check=False)
                                  for h in HOSTS])
    request.addfinalizer(lambda: sandbox.exec("b300a", "systemctl stop %s 2>/dev/null; true" % SERVING_UNIT, check=False))
    return {"sb": sandbox}


def triage(fleet, tmp_path, *args, timeout=600):
    r = fleet["sb"].run([str(ROOT / "tools" / "triage"), "--json", "--report-dir", str(tmp_path),
                         "-e", "triage_delta_window_s=2"] + list(args), check=False, timeout=timeout)
    try:
        rep = json.loads(r.stdout)
    except ValueError:
        raise AssertionError("no JSON report (rc %d):\n%s\n%s" % (r.returncode, r.stdout[-3000:], r.stderr[-3000:])) from None
    return r.returncode, rep


def check_scenario(rep, host, scenario):
    device, verdict, words = EXPECT[scenario]
    h = rep["hosts"][host]
    top = h["causes"][0]
    assert (top["device"], top["verdict"]) == (device, verdict), (host, scenario, h["causes"])
    for w in words:
        assert w in top["sentence"], (host, scenario, w, top["sentence"])
    assert h["status"] == verdict


def test_healthy_fleet_is_all_ok_and_unchanged(fleet, tmp_path):
    for h in HOSTS:
        fleet["sb"].scenario(h, "healthy")
        mark(fleet, h)
    rc, rep = triage(fleet, tmp_path, "-i", "inventory/sandbox", "-l", "b300a,b300b")
    assert rc == 0, rep["summary"]
    for h in HOSTS:
        e = rep["hosts"][h]
        assert e["status"] == "ok" and e["causes"] == [], (h, e["causes"])
        assert sum(1 for d in e["devices"].values() if d["kind"] == "nic") == 9
        assert e["kernel_log_source"] == "journalctl" and e["traffic"] == "not run" and e["history"] == "no history"
    for h in HOSTS:
        assert changed_files(fleet, h) == [], (h, changed_files(fleet, h))
    md = sorted(tmp_path.glob("triage-*.md"))[-1].read_text()
    assert "## b300a: OK" in md and "## b300b: OK" in md
    prom = sorted(tmp_path.glob("triage-*/b300b.prom"))
    assert prom and 'b300_triage_host_verdict{host="b300b"} 0' in prom[-1].read_text()


def test_fw_timeouts_with_traffic_and_a_flapping_port_on_a_serving_node(fleet, tmp_path):
    """b300b: the seed's failure, with --traffic: the deltas land on mlx5_3. b300a: a flapping port, and a serving
    unit active: traffic refused there, the passive triage still names mlx5_5."""
    fleet["sb"].scenario("b300b", "cx8_fw_timeouts")
    fleet["sb"].scenario("b300a", "ib_port_flap")
    fleet["sb"].exec("b300a", "systemd-run --unit=%s sleep 900 >/dev/null" % SERVING_UNIT)
    t0 = time.monotonic()
    rc, rep = triage(fleet, tmp_path, "-i", "inventory/sandbox", "-l", "b300a,b300b", "--traffic",
                     "-e", "triage_serving_unit_pattern=%s*" % SERVING_UNIT, "-e", "triage_traffic_repeats=2",
                     "-e", "triage_traffic_timeout_s=30")
    took = time.monotonic() - t0
    fleet["sb"].exec("b300a", "systemctl stop %s" % SERVING_UNIT)
    assert rc == 2, rep["summary"]
    check_scenario(rep, "b300a", "ib_port_flap")
    check_scenario(rep, "b300b", "cx8_fw_timeouts")
    a, b = rep["hosts"]["b300a"], rep["hosts"]["b300b"]
    assert a["serving_units"] == ["%s.service" % SERVING_UNIT]
    assert a["traffic"].startswith("refused: b300a runs serving units (%s.service)" % SERVING_UNIT), a["traffic"]
    assert b["traffic"] == "ran"
    m3 = {f["check"]: f for f in b["devices"]["mlx5_3"]["findings"] if f["verdict"] == "fault"}
    assert {"firmware", "kernel_log", "rdma_counters", "nccl_one_nic", "nccl_warn"} <= set(m3), sorted(m3)
    # one rdma_counters finding per counter that grew (local_ack_timeout_err and packet_seq_err here): read them all
    rdma = [f["summary"] for f in b["devices"]["mlx5_3"]["findings"] if f["check"] == "rdma_counters" and f["verdict"] == "fault"]
    assert any(re.search(r"local_ack_timeout_err \+[\d,]+ during the traffic test through mlx5_3", s) for s in rdma), rdma
    assert "IBV_WC_RETRY_EXC_ERR(12) on mlx5_3" in m3["nccl_warn"]["summary"]
    # only mlx5_3 carries the fault: every other NIC of b300b is ok after its own traffic
    assert sorted(n for n, d in b["devices"].items() if d["verdict"] != "ok") == ["mlx5_3"]
    assert took < 300, took


@pytest.mark.parametrize("pair", [("ib_port_half_rate", "nic_pcie_x8"), ("pcie_aer_nonfatal", "peermem_missing"),
                                  ("acs_enabled", "gpu_xid79")],
                         ids=lambda p: "+".join(p))
def test_fault_scenarios(fleet, tmp_path, pair):
    fleet["sb"].scenario("b300a", pair[0])
    fleet["sb"].scenario("b300b", pair[1])
    rc, rep = triage(fleet, tmp_path, "-i", "inventory/sandbox", "-l", "b300a,b300b")
    assert rc == 2, rep["summary"]
    check_scenario(rep, "b300a", pair[0])
    check_scenario(rep, "b300b", pair[1])


def test_unreachable_host_exits_3_and_says_so_with_the_last_fault_pair(fleet, tmp_path):
    """One run for two more scenarios and an unreachable host (b300y): 3 wins over 2, the faults are still named."""
    fleet["sb"].scenario("b300a", "fabric_degraded")
    fleet["sb"].scenario("b300b", "gpu_hot_96c")
    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "group_vars").symlink_to(ROOT / "inventory" / "sandbox" / "group_vars")
    (inv / "hosts.yml").write_text(
        "all:\n  children:\n    gpu_nodes:\n      hosts:\n        b300a: {ansible_host: 10.89.30.11}\n"
        "        b300b: {ansible_host: 10.89.30.12}\n        b300y: {ansible_host: 10.89.30.249}\n")
    rc, rep = triage(fleet, tmp_path / "rep", "-i", str(inv),
                     "-e", "ansible_ssh_private_key_file=%s" % (ROOT / ".cache" / "sandbox" / "id_ed25519"))
    assert rc == 3, rep["summary"]
    assert rep["summary"]["could_not_triage"] == ["b300y"] and rep["hosts"]["b300y"]["status"] == "unreachable"
    check_scenario(rep, "b300a", "fabric_degraded")
    check_scenario(rep, "b300b", "gpu_hot_96c")
    md = sorted((tmp_path / "rep").glob("triage-*.md"))[-1].read_text()
    assert "Could not triage b300y (unreachable)" in md
