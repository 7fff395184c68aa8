"""Run the module nic_firmware_update (plugins/modules/) the way Ansible does (`ansible localhost -m`) against a private
copy of the EMULATED hardware (sandbox/hwemu, SYNTHESIZED: its flint/mlxfwreset burn and reset in the real tools'
formats), no fleet needed: the steps devices -> plan -> burn -> activate -> verify -> report, and every refusal."""
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
import yaml

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "sandbox" / "hwemu"))
import fwimage
from test_facts_modules import run_module

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
    assert rc == 0 and a["activated"] == [{"device": "mlx5_3", "level": 3, "seconds": a["activated"][0]["seconds"]}]
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
