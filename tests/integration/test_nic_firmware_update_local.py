"""Issue 29 without the fleet: the whole playbooks/nic_firmware_update.yml on the controller (connection local) against
a PRIVATE copy of the emulated hardware (sandbox/hwemu, SYNTHESIZED) whose mlx5_3 supports the live reset level 3
(state/mlxfwreset.json): the live-reset path end to end (the fleet test, tests/integration/test_nic_firmware_update.py,
takes the CX8's reboot path), a wrong-PSID image refused before any change, and --check. No SGLang unit serves here,
so nothing leaves or rejoins a router; the host is its own router host (kimi_k3 plan), which needs the maintenance flag.
The maintenance lock, the image directory, the reports and the NCCL artifacts all live under the test's tmp dir."""
import hashlib
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys

import pytest
import yaml

import fwimage

ROOT = pathlib.Path(__file__).resolve().parents[2]
VENV_BIN = ROOT / ".venv" / "bin"

pytestmark = [pytest.mark.integration, pytest.mark.controller]


def my_address():
    """An address of this machine that is not loopback (the plan's advertise-address check wants one of the host's)."""
    out = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
    addrs = [a for a in out if ":" not in a and not a.startswith("127.")]
    if addrs:
        return addrs[0]
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("192.0.2.1", 9))
        return s.getsockname()[0]
    finally:
        s.close()


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    t = tmp_path_factory.mktemp("fwlocal")
    emu = t / "emu"
    shutil.copytree(ROOT / "sandbox" / "hwemu", emu, ignore=shutil.ignore_patterns("__pycache__"))
    inv = t / "inv"
    shutil.copytree(ROOT / "inventory" / "sandbox" / "group_vars", inv / "group_vars")
    addr = my_address()
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {
        "gpu_nodes": {"hosts": {"b300b": {"ansible_connection": "local", "ansible_host": addr,
                                          "ansible_python_interpreter": sys.executable}}},
        "sglang_router": {"hosts": {"b300b": None}}}}}))
    with open(inv / "group_vars" / "all.yml", "a") as fh:
        fh.write("\n" + yaml.safe_dump({
            "hw_bin_path": str(emu / "bin"), "hw_sysfs_root": str(emu / "sys"),
            "nccl_validation_tests_bin_dir": str(emu / "bin"), "b300_maintenance_lock": str(t / "lock" / "lock"),
            "nic_firmware_update_remote_dir": str(t / "remote"), "sglang_gpu_boot_check": False,
            "nccl_validation_artifacts_dir": str(t / "nccl"), "nic_firmware_update_lock_dir": str(t / "niclocks"),
            # never the controller's own /run/lock/b300-rollout: controller-lane tests run beside each other
            "host_lock_path": str(t / "hostlock" / "{{ inventory_hostname }}.lock")}))
    imgs = {}
    for name, psid in (("good", "MT_0000001217"), ("wrong", "MT_0000001218")):
        p = t / ("cx8-%s.bin" % name)
        fwimage.write_image(str(p), psid, "40.47.1026")
        imgs[name] = t / ("vars-%s.json" % name)
        imgs[name].write_text(json.dumps({"nic_firmware_update_images": [
            {"psid": "MT_0000001217", "version": "40.47.1026", "sha256": hashlib.sha256(p.read_bytes()).hexdigest(),
             "path": str(p), "where": "controller"}]}))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_CACHE_PLUGIN="memory",
               HWEMU_HOSTNAME="b300b", HWEMU_BURN_S="1", NO_COLOR="1", ANSIBLE_FORCE_COLOR="0",
               PATH="%s:%s" % (VENV_BIN, os.environ.get("PATH", "")))
    return {"t": t, "emu": emu, "inv": inv, "imgs": imgs, "env": env}


def fresh(local, live=True, scenario="cx8_fw_mismatch"):
    subprocess.run([str(local["emu"] / "bin" / "hwemu-scenario"), scenario], check=True, capture_output=True,
                   env=local["env"])
    if live:
        (local["emu"] / "state").mkdir(exist_ok=True)
        (local["emu"] / "state" / "mlxfwreset.json").write_text(json.dumps({"mlx5_3": {"3": True}}))


def play(local, images, name, *extra):
    argv = ["ansible-playbook", "-i", str(local["inv"]), "playbooks/nic_firmware_update.yml", "-e",
            "@%s" % local["imgs"][images], "-e", "nic_firmware_update_maintenance=true",
            "-e", "nic_firmware_update_report_dir=%s" % (local["t"] / "rep"), "-e", "nic_firmware_update_report_name=%s" % name]
    r = subprocess.run(argv + list(extra), cwd=ROOT, env=local["env"], capture_output=True, text=True, timeout=900)
    rep_path = local["t"] / "rep" / ("%s.json" % name)
    rep = json.loads(rep_path.read_text()) if rep_path.exists() else None
    return r.returncode, r.stdout + r.stderr, rep


def fw(local):
    return (local["emu"] / "sys" / "class" / "infiniband" / "mlx5_3" / "fw_ver").read_text().strip()


def test_wrong_psid_refused_before_any_change(local):
    fresh(local)
    rc, out, rep = play(local, "wrong", "wrong")
    assert rc != 0 and "the image's own PSID is MT_0000001218, the device's MT_0000001217" in " ".join(out.split()), \
        out[-3000:]
    assert fw(local) == "40.44.1036" and not (local["emu"] / "state" / "fw.json").exists()
    assert not (local["t"] / "lock" / "lock").exists() and not (local["t"] / "remote").exists()
    assert (rep["hosts"][0]["status"], rep["hosts"][0]["stage"]) == ("refused", "image")


def test_check_mode_burns_nothing(local):
    fresh(local)
    rc, out, rep = play(local, "good", "check", "--check")
    assert rc == 0, out[-3000:]
    assert "would run: %s/bin/flint -d 0000:5f:00.0" % local["emu"] in " ".join(out.split())
    assert "activation: live reset (mlxfwreset -l 3) on mlx5_3" in " ".join(out.split())
    assert fw(local) == "40.44.1036" and not (local["emu"] / "state" / "fw.json").exists()
    assert rep["summary"]["check_mode"] is True and rep["hosts"][0]["status"] == "would_update"


def test_check_mode_on_an_untouched_host_shows_no_change(local):
    """Issue 38: the controller's report was counted as a change of the host, so --check on a fleet whose NICs all
    pass the gate recapped `changed=1`. The recap line of the host must say changed=0."""
    fresh(local, scenario="healthy")
    rc, out, rep = play(local, "good", "check-healthy", "--check")
    assert rc == 0, out[-3000:]
    recap = [ln for ln in out.splitlines() if ln.startswith("b300b ") and "ok=" in ln]
    assert recap and " changed=0 " in " ".join(recap[-1].split()) + " ", recap or out[-3000:]
    assert rep["hosts"][0]["status"] != "would_update" and all(
        d["action"] == "skip" for d in rep["hosts"][0]["devices"]), rep["hosts"][0]


def test_a_live_level_that_reboots_the_host_is_refused(local):
    """nic_firmware_update_live_levels: [4] (mlxfwreset level 4 = warm reboot of the machine) never reaches a tool."""
    fresh(local)
    rc, out, rep = play(local, "good", "level4", "-e", '{"nic_firmware_update_live_levels": [4]}')
    assert rc != 0 and "nic_firmware_update_live_levels" in out and "value of" in out.lower(), out[-3000:]
    assert rep is None      # refused by the role's argument spec, before the first task of the update
    assert fw(local) == "40.44.1036" and not (local["emu"] / "state" / "fw.json").exists()


def test_live_reset_path_end_to_end(local):
    fresh(local)
    rc, out, rep = play(local, "good", "live")
    assert rc == 0, out[-5000:]
    h = rep["hosts"][0]
    assert h["status"] == "updated" and h["activation"]["method"] == "live" and h["verify"]["ok"], h
    assert fw(local) == "40.47.1026" and "FW Version(Running)" not in subprocess.run(
        [str(local["emu"] / "bin" / "flint"), "-d", "mlx5_3", "q"], capture_output=True, text=True,
        env=local["env"]).stdout
    assert not (local["t"] / "lock" / "lock").exists()
    assert set(h["timings"]) >= {"burn_s", "activate_s", "verify_s"}
    (ROOT / "artifacts" / "firmware-update").mkdir(parents=True, exist_ok=True)
    (ROOT / "artifacts" / "firmware-update" / "test-local-figures.json").write_text(json.dumps(h["timings"]) + "\n")


def test_a_failed_burn_stops_and_says_what_state_the_nic_is_in(local):
    fresh(local)
    (local["emu"] / "state" / "burn_fail").write_text("1\n")
    rc, out, rep = play(local, "good", "burnfail")
    assert rc != 0, out[-3000:]
    h = rep["hosts"][0]
    assert (h["status"], h["stage"]) == ("failed", "burn"), h
    state = next(d for d in h["devices"] if d["device"] == "mlx5_3")["state"]
    assert "fail-safe: the running image 40.44.1036 stays on the flash and keeps running" in state, state
    assert fw(local) == "40.44.1036"
    # the old image runs: the host is back in service (the maintenance lock removed) and the resume command is named
    assert h["after_failure"]["put_back"] is True and h["after_failure"]["done"] is True, h
    assert not (local["t"] / "lock" / "lock").exists()
    md = (local["t"] / "rep" / "burnfail.md").read_text()
    assert md.count("Flash write failed") == 1 and md.count("stays on the flash and keeps running") == 1, md
    assert "resume: `tools/fw-update -i %s -l b300b -e nic_firmware_update_maintenance=true`" % local["inv"] in md, md
    stop = next(ln for ln in out.splitlines() if "Record | STOP" in ln or "firmware update FAILED at stage" in ln)
    flat = " ".join(out.split())
    assert "firmware update FAILED at stage burn" in flat and "Resume: tools/fw-update -i" in flat, out[-3000:]
    assert "Flash write failed" not in flat.split("firmware update FAILED at stage burn", 1)[1], stop
    # told to keep it out: the maintenance lock stays (NCCL runs and soaks still refuse the host)
    rc, out, rep = play(local, "good", "burnkeep", "-e", "nic_firmware_update_keep_out_on_failure=true")
    h = rep["hosts"][0]
    assert rc != 0 and h["after_failure"]["put_back"] is False and "kept out of service" in h["after_failure"]["reason"]
    assert json.loads((local["t"] / "lock" / "lock").read_text())["holder"] == "nic_firmware_update"
    (local["t"] / "lock" / "lock").unlink()
    (local["emu"] / "state" / "burn_fail").unlink()


def tool(local, name, images, *extra):
    """tools/fw-update as the on-call runs it (ansible-runner), on an inventory that carries `images`."""
    inv = local["t"] / ("inv-%s" % name)
    shutil.copytree(local["inv"], inv)
    (inv / "group_vars" / "gpu_nodes.yml").write_text(yaml.safe_dump({"nic_firmware_update_images": images}))
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "fw-update"), "-i", str(inv), "-l", "b300b",
                        "--report-dir", str(local["t"] / "rep")] + list(extra), cwd=ROOT, env=local["env"],
                       capture_output=True, text=True, timeout=900)
    return r.returncode, r.stdout + r.stderr


def good_images(local):
    return json.loads(local["imgs"]["good"].read_text())["nic_firmware_update_images"]


def test_fw_update_exit_2_and_the_cause_when_the_controllers_image_fails_its_checksum(local):
    fresh(local)
    imgs = [dict(good_images(local)[0], sha256="0" * 64)]
    found = hashlib.sha256(pathlib.Path(imgs[0]["path"]).read_bytes()).hexdigest()
    rc, out = tool(local, "badsha", imgs, "-e", "nic_firmware_update_maintenance=true")
    flat = " ".join(out.split())
    assert rc == 2, out[-3000:]
    assert "One or more items failed" not in flat, out[-3000:]
    assert ("image %s (PSID MT_0000001217, 40.47.1026) on the controller has sha256 %s; the inventory pins %s"
            % (imgs[0]["path"], found, "0" * 64)) in flat and "Fix: put the pinned file at that path" in flat, out[-3000:]
    assert fw(local) == "40.44.1036" and not (local["emu"] / "state" / "fw.json").exists()


def test_fw_update_exit_2_when_a_pd_fleet_is_refused_for_want_of_a_maintenance_window(local):
    rc, out = tool(local, "pd", good_images(local), "-e", "sglang_profile=glm52_pd")
    flat = " ".join(out.split())
    assert rc == 2, out[-3000:]
    assert "REFUSED (STAGE PD_GUARD)" in flat.upper() and "maintenance window" in flat, out[-3000:]
    assert "-e nic_firmware_update_maintenance=true" in flat


def test_fw_update_exit_1_for_a_bad_argument_or_no_inventory(local):
    for argv in (["-e", "novalue"], ["-i", str(local["t"] / "no-such-inventory"), "-l", "b300b"]):
        r = subprocess.run([sys.executable, str(ROOT / "tools" / "fw-update")] + argv, cwd=ROOT, env=local["env"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 1, (argv, r.stdout, r.stderr)


def test_an_allowed_downgrade_is_called_out_in_the_plan_console_and_report_exit_0(local):
    fresh(local)
    (local["emu"] / "state" / "fw.json").write_text(json.dumps({"mlx5_3": {"running": "40.48.1010",
                                                                            "flashed": "40.48.1010"}}))
    # (without allow_downgrade_from it is refused: tests/unit/test_fw_update_module.py, devices and plan)
    imgs = [dict(good_images(local)[0], allow_downgrade_from="40.48.1010")]
    rc, out = tool(local, "down", imgs, "-e", "nic_firmware_update_maintenance=true", "--check", "-v")
    flat = " ".join(out.split())
    assert rc == 0, out[-3000:]
    assert "b300b: burn mlx5_3 with flint" in flat and "; DOWNGRADE 40.48.1010 -> 40.47.1026 of mlx5_3" in flat, out[-4000:]
    assert "| 40.48.1010 | 40.47.1026 | burn DOWNGRADE |" in out and "mlx5_3: DOWNGRADE 40.48.1010 -> 40.47.1026" in out
    assert fw(local) == "40.48.1010"
