"""Run the module nic_firmware_update (plugins/modules/) the way Ansible does (`ansible localhost -m`) against a private
copy of the EMULATED hardware (sandbox/hwemu, SYNTHESIZED: its flint/mlxfwreset burn and reset in the real tools'
formats), no fleet needed: the steps devices -> plan -> burn -> activate -> verify -> report, and every refusal."""
import hashlib
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import yaml

import fwimage
from test_facts_modules import _ansible_bin, run_module

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROWS = yaml.safe_load((ROOT / "roles" / "nic_firmware_gate" / "vars" / "nic_fw_matrix.yml").read_text())[
    "nic_firmware_gate_matrix_rows"]


@pytest.fixture()
def emu(tmp_path, monkeypatch):
    root = tmp_path / "hwemu"
    shutil.copytree(ROOT / "sandbox" / "hwemu", root, ignore=shutil.ignore_patterns("__pycache__", "real"))
    monkeypatch.setenv("HWEMU_HOSTNAME", "b300b")
    monkeypatch.setenv("HWEMU_BURN_S", "0")
    subprocess.run([str(root / "bin" / "hwemu-scenario"), "cx8_fw_mismatch"], check=True, capture_output=True)
    return root


def facts(emu, tmp_path):
    rc, res = run_module("rdma_nic_facts", {"bin_path": [str(emu / "bin")], "sysfs_root": str(emu / "sys")}, tmp_path)
    assert rc == 0, res
    return res["ansible_facts"]["rdma_nics"]


def images(tmp_path, psid="MT_0000001217", claimed="MT_0000001217", corrupt=False):
    p = tmp_path / ("fw-%s.bin" % psid)
    fwimage.write_image(str(p), psid, "40.47.1026", corrupt=corrupt)
    return [{"psid": claimed, "version": "40.47.1026", "sha256": hashlib.sha256(p.read_bytes()).hexdigest(),
             "path": str(p), "where": "host", "host_path": str(p)}]


def plan(emu, tmp_path, imgs, check=False):
    return run_module("nic_firmware_update", {"action": "plan", "rdma_nics": facts(emu, tmp_path), "matrix": ROWS,
                                              "images": imgs, "bin_path": [str(emu / "bin")]}, tmp_path, check=check)


def test_devices_and_service_read_only(emu, tmp_path):
    rc, res = run_module("nic_firmware_update", {
        "action": "devices", "rdma_nics": facts(emu, tmp_path), "matrix": ROWS, "host": "b300b",
        "instances": [{"host": "b300b", "role": "worker", "id": "b300b/W0"}], "router_hosts": ["b300a"],
        "images": [{"psid": "x", "version": "1", "sha256": "no", "path": "/p", "where": "usb"}]}, tmp_path)
    assert rc == 0 and not res["changed"], res
    assert res["plan"]["to_burn"] == ["mlx5_3"] and res["service"]["mode"] == "rolling"
    assert any("sha256 'no'" in p for p in res["plan"]["problems"]) and any("where 'usb'" in p for p in res["plan"]["problems"])


def test_plan_refuses_wrong_psid_from_the_image_itself(emu, tmp_path):
    rc, res = plan(emu, tmp_path, images(tmp_path, psid="MT_0000001218"))
    assert rc != 0 and res["failed"]
    assert "the image's own PSID is MT_0000001218, the device's MT_0000001217" in res["msg"]
    assert res["plan"]["tool"]["tool"] == "flint" and res["plan"]["tool"]["version"] == "4.34.0"
    assert "40.47.1026" not in (emu / "sys" / "class" / "infiniband" / "mlx5_3" / "fw_ver").read_text()
    assert not (emu / "state" / "fw.json").exists(), "nothing burned"


def test_plan_refuses_a_damaged_image_and_a_wrong_sha(emu, tmp_path):
    rc, res = plan(emu, tmp_path, images(tmp_path, corrupt=True))
    assert rc != 0 and "verification failed" in res["msg"]
    imgs = images(tmp_path)
    imgs[0]["sha256"] = "0" * 64
    rc, res = plan(emu, tmp_path, imgs)
    assert rc != 0 and "inventory pins %s" % ("0" * 64) in res["msg"]


def test_plan_refuses_when_only_an_old_mstflint_is_there(emu, tmp_path):
    os.remove(emu / "bin" / "flint")
    rc, res = plan(emu, tmp_path, images(tmp_path))
    assert rc != 0 and "mstflint 4.21.0 is too old for the ConnectX-8" in res["msg"], res["msg"]


def test_burn_then_reboot_plan_then_verify_fails_until_activated(emu, tmp_path):
    rc, p = plan(emu, tmp_path, images(tmp_path))
    assert rc == 0, p
    assert p["plan"]["activation"]["method"] == "reboot" and "level(s) [3] not supported" in p["plan"]["activation"]["reason"]
    rc, chk = run_module("nic_firmware_update", {"action": "burn", "plan": p["plan"]}, tmp_path, check=True)
    assert rc == 0 and not chk["changed"] and chk["commands"][0][-4:] == ["-i", images(tmp_path)[0]["path"], "-y", "burn"]
    assert not (emu / "state" / "fw.json").exists(), "check mode burned"
    rc, b = run_module("nic_firmware_update", {"action": "burn", "plan": p["plan"]}, tmp_path)
    assert rc == 0 and b["changed"] and b["burned"][0]["flash_new"] == "40.47.1026", b
    rc, v = run_module("nic_firmware_update", {"action": "verify", "plan": p["plan"],
                                               "rdma_nics": facts(emu, tmp_path)}, tmp_path)
    assert rc != 0 and "burned image 40.47.1026 still pending" in v["msg"] and "BMC" in v["msg"]
    state = json.loads((emu / "state" / "fw.json").read_text())
    state["mlx5_3"]["boot"] = 0            # the emulator's "next boot": PID 1 started after the burn
    (emu / "state" / "fw.json").write_text(json.dumps(state))
    rc, v = run_module("nic_firmware_update", {"action": "verify", "plan": p["plan"],
                                               "rdma_nics": facts(emu, tmp_path)}, tmp_path)
    assert rc == 0 and v["verify"]["ok"], v


def test_live_reset_where_the_device_supports_it(emu, tmp_path):
    (emu / "state").mkdir(exist_ok=True)
    (emu / "state" / "mlxfwreset.json").write_text(json.dumps({"mlx5_3": {"3": True}}))
    rc, p = plan(emu, tmp_path, images(tmp_path))
    assert rc == 0 and p["plan"]["activation"]["method"] == "live", p
    assert run_module("nic_firmware_update", {"action": "burn", "plan": p["plan"]}, tmp_path)[0] == 0
    rc, a = run_module("nic_firmware_update", {"action": "activate", "plan": p["plan"]}, tmp_path)
    assert rc == 0 and a["activated"] == [{"device": "mlx5_3", "level": 3, "seconds": a["activated"][0]["seconds"],
                                           "stages": {"Stopping Driver": "Done", "Resetting PCI": "Done",
                                                      "Sending Reset Command To Fw": "Done", "Starting Driver": "Done",
                                                      "Restarting MST": "Skipped"}}], a
    assert (emu / "sys" / "class" / "infiniband" / "mlx5_3" / "fw_ver").read_text().strip() == "40.47.1026"
    rc, v = run_module("nic_firmware_update", {"action": "verify", "plan": p["plan"],
                                               "rdma_nics": facts(emu, tmp_path)}, tmp_path)
    assert rc == 0 and v["verify"]["ok"]


def test_report_from_host_entries(emu, tmp_path):
    rc, p = plan(emu, tmp_path, images(tmp_path))
    d = tmp_path / "rep" / "run1.d"
    d.mkdir(parents=True)
    (d / "b300b.json").write_text(json.dumps({"host": "b300b", "stage": "burn", "status": "failed", "plan": p["plan"],
                                              "problems": ["-E- boom"], "stamps": {"take_out": 10, "burn": 12},
                                              "end": 20}))
    rc, r = run_module("nic_firmware_update", {"action": "report", "report_dir": str(tmp_path / "rep"),
                                               "report_name": "run1"}, tmp_path)
    assert rc == 0 and r["report"]["summary"]["exit_code"] == 2
    js = json.loads((tmp_path / "rep" / "latest.json").read_text())
    assert js["hosts"][0]["timings"] == {"take_out_s": 2.0}
    assert "fail-safe" in (tmp_path / "rep" / "run1.md").read_text()


# ------------------------------------------------------------------------------------------ issue 35
def newer_firmware(emu, version="40.48.1010"):
    """mlx5_3 runs a NEWER image than the matrix's 40.47.1026 (the emulator's fw.json overlay, fwtools.apply_fw_state)."""
    (emu / "state").mkdir(exist_ok=True)
    (emu / "state" / "fw.json").write_text(json.dumps({"mlx5_3": {"running": version, "flashed": version}}))


def test_a_downgrade_is_refused_in_the_plan_unless_allowed_then_burned_as_a_downgrade(emu, tmp_path):
    newer_firmware(emu)
    rc, dev = run_module("nic_firmware_update", {"action": "devices", "rdma_nics": facts(emu, tmp_path), "matrix": ROWS,
                                                 "host": "b300b", "images": images(tmp_path)}, tmp_path)
    assert rc == 0 and dev["plan"]["to_burn"] == [], dev      # the role's devices step refuses on these problems
    assert [p for p in dev["plan"]["problems"] if "DOWNGRADE 40.48.1010 -> 40.47.1026 of mlx5_3" in p and "refused" in p]
    rc, res = plan(emu, tmp_path, images(tmp_path))
    assert rc != 0 and "DOWNGRADE 40.48.1010 -> 40.47.1026 of mlx5_3" in res["msg"] and "refused" in res["msg"], res["msg"]
    assert res["plan"]["to_burn"] == []
    imgs = [dict(images(tmp_path)[0], allow_downgrade_from=["40.48.1010"])]
    rc, p = plan(emu, tmp_path, imgs, check=True)
    assert rc == 0, p["msg"]
    d3 = next(d for d in p["plan"]["devices"] if d["device"] == "mlx5_3")
    assert d3["downgrade"] and d3["reason"].startswith("DOWNGRADE 40.48.1010 -> 40.47.1026") and p["plan"]["to_burn"] == ["mlx5_3"]
    rc, b = run_module("nic_firmware_update", {"action": "burn", "plan": p["plan"], "lock_dir": str(tmp_path / "locks")},
                       tmp_path)
    assert rc == 0 and b["burned"][0]["downgrade"] and b["burned"][0]["flash_new"] == "40.47.1026", b


def test_a_held_nic_lock_refuses_the_burn_naming_its_holder(emu, tmp_path):
    from ansible_collections.b300.rollout.plugins.module_utils.firmware import fw_update as fu
    rc, p = plan(emu, tmp_path, images(tmp_path))
    assert rc == 0, p
    lock = fu.DeviceLock(fu.lock_path(str(tmp_path / "locks"), "0000:5f:00.0"), {"run": "fw-update-OTHER by bob"})
    assert lock.acquire() is None
    try:
        rc, b = run_module("nic_firmware_update", {"action": "burn", "plan": p["plan"], "lock_dir": str(tmp_path / "locks")},
                           tmp_path)
    finally:
        lock.release()
    assert rc != 0 and "another run holds the NIC's lock" in b["msg"] and "fw-update-OTHER by bob" in b["msg"], b["msg"]
    assert b["failed_device"]["kind"] == "locked" and b["after_failure"]["put_back"] is False
    assert not (emu / "state" / "burns.log").exists() and not (emu / "state" / "fw.json").exists(), "burned"


def test_two_burns_of_one_nic_at_once_burn_it_once(emu, tmp_path, monkeypatch):
    """Two module runs with the same plan, started together (the emulated burn takes 4 s): one burns, the other is
    refused - by the NIC's lock while the first burns, or after it by the flash re-read under the lock."""
    import concurrent.futures
    rc, p = plan(emu, tmp_path, images(tmp_path))
    assert rc == 0, p
    monkeypatch.setenv("HWEMU_BURN_S", "4")
    args = {"action": "burn", "plan": p["plan"], "lock_dir": str(tmp_path / "locks")}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda i: run_module("nic_firmware_update", args, tmp_path / ("r%d" % i)), (1, 2)))
    ok = [r for rc, r in runs if rc == 0]
    refused = [r for rc, r in runs if rc != 0]
    assert len(ok) == 1 and len(refused) == 1, runs
    assert ok[0]["burned"][0]["flash_new"] == "40.47.1026"
    assert refused[0]["failed_device"]["kind"] in ("locked", "changed"), refused[0]["msg"]
    assert "another run" in refused[0]["msg"] and refused[0]["burned"] == []
    log = (emu / "state" / "burns.log").read_text().split("\n")
    assert [ln.split()[2:] for ln in log if ln] == [["mlx5_3", "40.47.1026", "start"], ["mlx5_3", "40.47.1026", "end"]]


def test_a_failed_burn_returns_put_back_unless_kept_out(emu, tmp_path):
    rc, p = plan(emu, tmp_path, images(tmp_path))
    (emu / "state" / "burn_fail").write_text("1\n")
    for keep, put in ((False, True), (True, False)):
        rc, b = run_module("nic_firmware_update", {"action": "burn", "plan": p["plan"], "keep_out_on_failure": keep,
                                                   "lock_dir": str(tmp_path / "locks")}, tmp_path)
        assert rc != 0 and b["failed_device"]["kind"] == "burn" and b["after_failure"]["put_back"] is put, b
        assert b["msg"].count("Flash write failed") == 1, b["msg"]


def test_a_killed_module_leaves_its_running_burn_holding_the_nic_lock(emu, tmp_path, monkeypatch):
    """The module process dies mid-burn (OOM, kill -9, a lost session) while flint, its child, burns on: the NIC's
    lock must live as long as the burn does (flint inherits the lock's descriptor), so a second run is refused by
    the lock instead of reading a flash that is half written and burning the NIC a second time."""
    rc, p = plan(emu, tmp_path, images(tmp_path))
    assert rc == 0, p
    monkeypatch.setenv("HWEMU_BURN_S", "40")     # the second run must reach the lock while the first burn runs
    args = {"action": "burn", "plan": p["plan"], "lock_dir": str(tmp_path / "locks")}
    flint = []
    log = emu / "state" / "burns.log"
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp1"),
               ANSIBLE_CACHE_PLUGIN="memory")
    first = subprocess.Popen([_ansible_bin("ansible"), "localhost", "-i", "localhost,",
                              "-c", "local", "-e", "ansible_python_interpreter=%s" % sys.executable,
                              "-m", "b300.rollout.nic_firmware_update", "-a", json.dumps(args)],
                             cwd=str(ROOT), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (log.is_file() and "start" in log.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert log.is_file() and "start" in log.read_text(), "the first burn never started"
        flint = subprocess.run(["pgrep", "-f", "%s -d .* burn" % (emu / "bin" / "flint")], capture_output=True,
                               text=True).stdout.split()
        assert flint, "no burning flint process found"
        module_pid = int(re.search(r"^PPid:\s+(\d+)", pathlib.Path("/proc/%s/status" % flint[0]).read_text(),
                                   re.M).group(1))
        os.kill(module_pid, signal.SIGKILL)          # the module dies; its burn goes on
        rc, second = run_module("nic_firmware_update", args, tmp_path / "r2")
        assert rc != 0 and second["failed_device"]["kind"] == "locked", second
        assert "another run holds the NIC's lock" in second["msg"] and second["burned"] == [], second["msg"]
        starts = [ln for ln in log.read_text().splitlines() if ln.endswith(" start")]
        assert len(starts) == 1, log.read_text()       # one burn of the NIC, not two
    finally:
        first.wait(timeout=120)
        for pid in flint:                                # the orphaned burn is not left running after the test
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
