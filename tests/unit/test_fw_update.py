"""Unit tests for module_utils/firmware/fw_update.py (issue 29): the parsers on REAL tool outputs
(tests/fixtures/real-world/nic-fw-update/, SOURCES.md there; the expected values were written by reading the text) and
on the emulator's (sandbox/hwemu/fwtools.py, SYNTHESIZED), and every decision of the update."""
import pathlib
import sys

import pytest
import yaml

from ansible_collections.b300.rollout.plugins.module_utils.firmware import fw_update as fu
from ansible_collections.b300.rollout.plugins.module_utils.hw import fw_matrix as fm

import fwimage
import fwtools
import model

ROOT = pathlib.Path(__file__).resolve().parents[2]
REAL = ROOT / "tests" / "fixtures" / "real-world" / "nic-fw-update"


@pytest.fixture(scope="module")
def rows():
    return fm.load_matrix_doc(yaml.safe_load((ROOT / "roles" / "nic_firmware_gate" / "vars" / "nic_fw_matrix.yml").read_text()))


def real(name):
    return (REAL / name).read_text()


# ------------------------------------------------------------------------------------------ parsers, real outputs
def test_flint_device_query_real_bf3():
    q = fu.parse_flint_query(real("bf3_flint_d_q_secure_fw.txt"))
    assert q == {"image_type": "FS4", "fw_version": "24.33.1048", "fw_running": None, "release_date": "29.4.2022",
                 "product_version": "24.33.1048", "psid": "MT_0000000723", "security": "secure-fw",
                 "base_guid": "08c0eb030053eaec"}


def test_mlxfwreset_query_real_bf3():
    q = fu.parse_mlxfwreset_query(real("bf3_mlxfwreset_query.txt"))
    assert {n: v["supported"] for n, v in q["levels"].items()} == {0: True, 1: False, 3: True, 4: True}
    assert q["default_level"] == 0
    assert q["levels"][3]["description"] == "Driver restart and PCI reset"
    assert {n: v["supported"] for n, v in q["types"].items()} == {0: True, 1: False, 2: False, 3: False, 4: False}
    # the real output writes "Not supported" (lower-case s) in the sync section
    assert {n: (v["supported"], v["default"]) for n, v in q["sync"].items()} == {0: (False, False), 1: (True, True)}


def test_burn_real_mcc_flow_ok():
    b = fu.parse_flint_burn(real("cx4lx_mstflint_burn_secure_ok.txt"))
    assert b == {"ok": True, "flash_before": "12.28.2006", "flash_new": "12.28.2302", "error": None,
                 "needs_activation": True, "flow": "mcc"}


def test_burn_real_psid_mismatch_refused():
    b = fu.parse_flint_burn(real("cx4lx_mstflint_burn_psid_mismatch.txt"), rc=1)
    assert not b["ok"] and b["flash_before"] == "14.14.2320" and b["flash_new"] == "14.32.1900"
    assert b["error"] == ("-E- PSID mismatch. The PSID on flash (DEL2420110034) differs from the PSID in the given "
                          "image (MT_2420110034).")


def test_burn_real_legacy_flow_ok():
    b = fu.parse_flint_burn(real("cx4lx_mstflint_burn_psid_change_ok.txt"))
    assert b["ok"] and b["flow"] == "legacy" and b["flash_new"] == "14.32.1900" and b["needs_activation"]


def test_burn_rc_nonzero_is_never_ok():
    assert not fu.parse_flint_burn(real("cx4lx_mstflint_burn_secure_ok.txt"), rc=1)["ok"]


def test_query_without_fw_version_raises():
    with pytest.raises(ValueError, match="Cannot open"):
        fu.parse_flint_query("-E- Cannot open Device: 0000:5f:00.0. No such file or directory. MFE_CR_ERROR\n")


# issue 38: the FS2 (failsafe, "without signatures" + "Restoring signature") flows of real burns are successes
@pytest.mark.parametrize("name, before, new", [
    ("cx3_flint_burn_fs2_not_failsafe.txt", "2.35.5100", "2.42.5000"),
    ("cx3_flint_burn_fs2_same_version.txt", "2.42.5000", "2.42.5000"),
    ("cx3pro_windows_flint_burn_fs2.txt", "2.42.5700", "2.42.5700"),
    ("cx2_flint_burn_fs2_trailing_spaces.txt", None, None),
])
def test_burn_real_fs2_flows_ok(name, before, new):
    b = fu.parse_flint_burn(real(name))
    assert (b["ok"], b["flow"], b["error"], b["flash_before"], b["flash_new"]) == (True, "legacy", None, before, new)


def test_burn_real_fs2_stopped_part_way_is_not_ok():
    b = fu.parse_flint_burn(real("freebsd_flint_ext_burn_fs2_stopped_at_48pct.txt"))
    assert not b["ok"] and b["flow"] == "legacy" and b["flash_before"] == "2.36.5000"
    assert b["error"] == "burn did not report success (rc 0)"


def test_burn_restoring_signature_alone_is_not_a_success():
    # one stage OK is not the whole flow: the burn stage itself must have said OK
    assert not fu.parse_flint_burn("Restoring signature                     - OK\n")["ok"]


@pytest.mark.parametrize("name, tool, package, version", [
    ("mstflint_v_4.6.0_trailing_period.txt", "mstflint", "mstflint", "4.6.0"),
    ("flint_v_mft_4.36.0-147_trailing_period.txt", "flint", "mft", "4.36.0"),
    ("mstflint_v_4.33.0_ubuntu.txt", "mstflint", "mstflint", "4.33.0"),
])
def test_tool_version_real_lines(name, tool, package, version):
    v = fu.parse_tool_version(real(name))
    assert (v["tool"], v["package"], v["version"]) == (tool, package, version)


def test_old_mstflint_with_trailing_period_is_judged_by_its_version_not_refused_as_unreadable():
    c = fu.choose_tool({"flint": None, "mstflint": real("mstflint_v_4.6.0_trailing_period.txt")})
    assert not c["ok"] and "mstflint 4.6.0 is too old for the ConnectX-8" in c["reason"]
    assert fu.choose_tool({"flint": real("flint_v_mft_4.36.0-147_trailing_period.txt"), "mstflint": None})["ok"]


STAGES_L3 = ["Sending Reset Command To Fw", "Stopping Driver", "Resetting PCI", "Starting Driver", "Restarting MST"]


@pytest.mark.parametrize("name, device, mst", [
    ("cx4_talos_mlxfwreset_level3_minimal_mst_skipped.txt", "04:00.0", "Skipped"),
    ("cx7_mlxfwreset_level3_mst_device.txt", "/dev/mst/mt4129_pciconf0", "Done"),
    ("cx6dx_mlxfwreset_l3_requested.txt", "3d:00.1", "Skipped"),
])
def test_mlxfwreset_reset_real_level3(name, device, mst):
    r = fu.parse_mlxfwreset_reset(real(name))
    assert (r["ok"], r["level"], r["description"], r["device"], r["fw_loaded"], r["reboots_host"], r["error"]) == (
        True, 3, "Driver restart and PCI reset", device, True, False, None)
    assert list(r["stages"]) == STAGES_L3 and r["stages"]["Restarting MST"] == mst
    assert fu.judge_live_reset(r, 3) is None
    assert "plan asked for level 0" in fu.judge_live_reset(r, 0)


def test_mlxfwreset_reset_real_level4_reboots_the_machine_never_live():
    r = fu.parse_mlxfwreset_reset(real("cx6dx_mstfwreset_level4_warm_reboot.txt"))
    assert (r["level"], r["description"], r["device"], r["reboots_host"], r["fw_loaded"]) == (
        4, "Warm Reboot", "4b:00.0", True, False)
    assert r["stages"] == {"Sending Reset Command To Fw": "Done", "Sending reboot command to machine": "Done"}
    assert r["ok"]      # the tool did what it was asked: the machine reboots
    assert "rebooted (or asked to reboot) the machine" in fu.judge_live_reset(r, 4)


def test_mlxfwreset_reset_real_unsupported_device_refused():
    r = fu.parse_mlxfwreset_reset(real("cx3_mlxfwreset_unsupported_device.txt"), rc=1)
    assert not r["ok"] and r["error"] == "-E- Unsupported Device: /dev/mst/mt4099_pci_cr0 (ConnectX3)."
    assert fu.judge_live_reset(r, 3) == r["error"]


def test_mlxfwreset_reset_rc0_without_the_loaded_line_is_not_ok():
    text = real("cx7_mlxfwreset_level3_mst_device.txt").replace("-I- FW was loaded successfully.\n", "")
    r = fu.parse_mlxfwreset_reset(text)
    assert not r["ok"] and "FW was loaded successfully" in r["error"]
    failed = real("cx7_mlxfwreset_level3_mst_device.txt").replace("Resetting PCI                           -Done",
                                                               "Resetting PCI                           -Failed")
    assert fu.parse_mlxfwreset_reset(failed)["error"] == "stage 'Resetting PCI' failed"


@pytest.mark.parametrize("levels, bad", [([3], []), ([0, 3], []), ([], []), ([4], [4]), ([3, 5], [5]), ([2], [2])])
def test_live_levels_never_reboot_the_host(levels, bad):
    probs = fu.check_live_levels(levels)
    assert len(probs) == len(bad)
    for n, p in zip(bad, probs):
        assert ("contains %d" % n) in p and "remove %d" % n in p
    if 4 in bad:
        assert "Warm Reboot" in probs[0]


def test_activation_never_picks_a_reboot_level_even_if_configured():
    q = fu.parse_mlxfwreset_query(real("bf3_mlxfwreset_query.txt"))     # level 4 (warm reboot) is Supported there
    act = fu.activation({"mlx5_0": q}, live_levels=(4,))
    assert act["method"] == "reboot" and act["per_device"]["mlx5_0"]["level"] is None


def test_verify_real_fs2_ok_and_wrong_crc():
    assert fu.parse_flint_verify(real("cx3pro_windows_flint_verify_ok.txt")) == {
        "ok": True, "reason": "image is bootable (flint verify)"}
    v = fu.parse_flint_verify(real("cx3pro_windows_flint_verify_wrong_crc.txt"), rc=1)
    assert v == {"ok": False, "reason": "-E- FW image verification failed: Bad CRC.. AN HCA DEVICE CAN NOT BOOT FROM "
                                        "THIS IMAGE."}
    # without the -E- line the failing section itself is the reason (its address token before "- wrong CRC")
    cut = real("cx3pro_windows_flint_verify_wrong_crc.txt").rsplit("-E-", 1)[0]
    assert fu.parse_flint_verify(cut, rc=1)["reason"].endswith("(Configuration) /0x000ed39c/ - wrong CRC (exp:0x8e4c, "
                                                               "act:0x9008)")


def test_image_query_real_na_guids():
    q = fu.parse_flint_query(real("cx4lx_pve_mstflint_image_query_na_guids.txt"))
    assert q == {"image_type": "FS3", "fw_version": "14.32.1912", "fw_running": None, "release_date": "21.1.2026",
                 "product_version": "rel-14_32_1912", "psid": "MT_0000000267", "security": None, "base_guid": None}


# ------------------------------------------------------------------------------------------ parsers, emulator outputs
@pytest.fixture()
def emu(tmp_path):
    st = model.build_state("cx8_fw_mismatch", "b300b")
    return {"root": str(tmp_path), "st": st, "nic": st["nics"][3]}


def test_emulated_image_query_and_verify(tmp_path):
    p = tmp_path / "fw.bin"
    fwimage.write_image(str(p), "MT_0000001217", "40.47.1026")
    q = fu.parse_flint_query(fwtools.render_image_query(fwimage.read_image(str(p))))
    assert (q["psid"], q["fw_version"], q["fw_running"]) == ("MT_0000001217", "40.47.1026", None)
    text, rc = fwtools.render_verify(fwimage.read_image(str(p)))
    assert fu.parse_flint_verify(text, rc)["ok"]
    fwimage.write_image(str(p), "MT_0000001217", "40.47.1026", corrupt=True)
    text, rc = fwtools.render_verify(fwimage.read_image(str(p)))
    v = fu.parse_flint_verify(text, rc)
    assert not v["ok"] and "verification failed" in v["reason"]


def test_emulated_burn_pending_then_reboot_activates(emu, tmp_path):
    p = tmp_path / "fw.bin"
    fwimage.write_image(str(p), "MT_0000001217", "40.47.1026")
    so, se, rc = fwtools.burn(emu["root"], emu["st"], emu["nic"], fwimage.read_image(str(p)), 1000.0, sleep=lambda s: 0)
    b = fu.parse_flint_burn(so + se, rc)
    assert b["ok"] and (b["flash_before"], b["flash_new"]) == ("40.44.1036", "40.47.1026")
    st = fwtools.apply_fw_state(model.build_state("cx8_fw_mismatch", "b300b"), emu["root"], 1000.0)
    q = fu.parse_flint_query(model.render_flint_query(st, st["nics"][3]))
    assert (q["fw_version"], q["fw_running"]) == ("40.47.1026", "40.44.1036")     # pending until a reset
    st = fwtools.apply_fw_state(model.build_state("cx8_fw_mismatch", "b300b"), emu["root"], 2000.0)  # next boot
    assert st["nics"][3]["fw"] == "40.47.1026" and st["nics"][3]["fw_flashed"] is None


def test_emulated_wrong_psid_burn_refused(emu, tmp_path):
    p = tmp_path / "fw.bin"
    fwimage.write_image(str(p), "MT_0000001218", "40.47.1026")
    so, se, rc = fwtools.burn(emu["root"], emu["st"], emu["nic"], fwimage.read_image(str(p)), 1000.0, sleep=lambda s: 0)
    assert rc == 1 and "PSID mismatch" in fu.parse_flint_burn(so + se, rc)["error"]


def test_emulated_cx8_reset_query_says_reboot(emu):
    q = fu.parse_mlxfwreset_query(fwtools.render_reset_query(emu["root"], emu["nic"]))
    assert {n: v["supported"] for n, v in q["levels"].items()} == {0: False, 1: False, 3: False, 4: True}
    assert fu.activation({"mlx5_3": q})["method"] == "reboot"


def test_tool_versions():
    assert fu.parse_tool_version(fwtools.VERSIONS["flint"])["version"] == "4.34.0"
    assert fu.parse_tool_version("mstflint, mstflint 4.21.0, Git SHA Hash: N/A")["package"] == "mstflint"
    assert fu.parse_tool_version("flint: command not found") is None


# ------------------------------------------------------------------------------------------ decisions
def test_choose_tool_prefers_mft_and_refuses_old_mstflint():
    c = fu.choose_tool({"flint": fwtools.VERSIONS["flint"], "mstflint": fwtools.VERSIONS["mstflint"]})
    assert c["ok"] and c["tool"] == "flint" and c["version"] == "4.34.0"
    c = fu.choose_tool({"flint": None, "mstflint": "mstflint, mstflint 4.21.0, Git SHA Hash: N/A"})
    assert not c["ok"] and c["tool"] is None
    assert "mstflint 4.21.0 is too old for the ConnectX-8 (needs mstflint >= 4.31.0)" in c["reason"]
    c = fu.choose_tool({"flint": None, "mstflint": "mstflint, mstflint 4.33.0, Git SHA Hash: N/A"})
    assert c["ok"] and c["tool"] == "mstflint"
    assert not fu.choose_tool({"flint": "flint, mft 4.30.0-1, built on x", "mstflint": None})["ok"]


def _nics(fw3="40.44.1036", pending=None):
    devs = []
    for i in range(8):
        devs.append({"name": "mlx5_%d" % i, "pci_address": "0000:%02x:00.0" % (0x1a + 0x15 * i), "model": "ConnectX-8",
                     "fw_ver": fw3 if i == 3 else "40.47.1026", "psid": "MT_0000001217", "role": "data",
                     "fw_pending": pending if i == 3 else None})
    devs.append({"name": "mlx5_8", "pci_address": "0000:d5:00.0", "model": "ConnectX-7", "fw_ver": "28.47.1026",
                 "psid": "MT_0000000838", "role": "fabric_manager", "fw_pending": None})
    return {"driver": {"flavour": "doca_ofed", "version": "25.10-1.2.2"}, "devices": devs}


def test_plan_burns_only_the_mismatched_device(rows):
    plan = fu.plan_devices(_nics(), rows)
    acts = {p["device"]: p["action"] for p in plan}
    assert acts.pop("mlx5_3") == "burn" and set(acts.values()) == {"skip"}
    p3 = next(p for p in plan if p["device"] == "mlx5_3")
    assert p3["target"] == "40.47.1026" and p3["row"] == "doca-3.2-ofed-25.10-1.2.2"
    assert fu.plan_devices(_nics(fw3="40.47.1026"), rows)[3]["action"] == "skip"


def test_plan_pending_target_only_needs_activation(rows):
    plan = fu.plan_devices(_nics(pending="40.47.1026"), rows)
    assert [p["action"] for p in plan if p["device"] == "mlx5_3"] == ["activate"]
    plan = fu.plan_devices(_nics(pending="40.46.1006"), rows)
    assert [p["action"] for p in plan if p["device"] == "mlx5_3"] == ["burn"]


def test_plan_refuses_unknown_driver(rows):
    n = _nics()
    n["driver"] = {"flavour": "doca_ofed", "version": "99.01-0.0.1"}
    assert {p["action"] for p in fu.plan_devices(n, rows) if p["role"] == "data"} == {"refuse"}


def _dev(rows):
    return next(p for p in fu.plan_devices(_nics(), rows) if p["device"] == "mlx5_3")


def test_check_image_all_good_and_each_refusal(rows):
    dev = _dev(rows)
    sha = "a" * 64
    entry = {"psid": "MT_0000001217", "version": "40.47.1026", "sha256": sha, "path": "/fw/fw.bin"}
    good_q = {"psid": "MT_0000001217", "fw_version": "40.47.1026"}
    assert fu.check_image(entry, sha, good_q, {"ok": True}, dev) == []
    wrong = fu.check_image(entry, sha, dict(good_q, psid="MT_0000001218"), {"ok": True}, dev)
    assert len(wrong) == 1 and "the image's own PSID is MT_0000001218, the device's MT_0000001217" in wrong[0]
    assert "sha256" in fu.check_image(entry, "b" * 64, good_q, {"ok": True}, dev)[0]
    assert "own version is 40.46.1006" in fu.check_image(entry, sha, dict(good_q, fw_version="40.46.1006"),
                                                         {"ok": True}, dev)[0]
    assert "verify" in fu.check_image(entry, sha, good_q, {"ok": False, "reason": "bad CRC"}, dev)[0]
    assert "no sha256 pinned" in fu.check_image(dict(entry, sha256=""), sha, good_q, {"ok": True}, dev)[0]
    assert "no image for PSID" in fu.check_image(None, None, {}, {}, dev)[0]
    assert fu.pick_image([entry], "MT_0000001217", "40.47.1026") is entry
    assert fu.pick_image([entry], "MT_0000001218", "40.47.1026") is None


def test_activation_live_only_where_supported():
    sup = {"levels": {3: {"supported": True, "description": "Driver restart and PCI reset"}, 4: {"supported": True}}}
    nosup = {"levels": {3: {"supported": False, "description": "x"}, 4: {"supported": True, "description": "y"}}}
    assert fu.activation({"mlx5_3": sup}) == {
        "method": "live", "level": 3, "reason": "live reset (mlxfwreset -l 3) on mlx5_3",
        "per_device": {"mlx5_3": {"level": 3, "reason": "mlxfwreset: level 3 (Driver restart and PCI reset) supported"}}}
    a = fu.activation({"mlx5_3": sup, "mlx5_4": nosup})
    assert a["method"] == "reboot" and "mlx5_4" in a["reason"] and "mlx5_3" not in a["reason"]
    assert fu.activation({"mlx5_3": {"error": "rc 1"}})["method"] == "reboot"
    assert fu.activation({})["method"] == "none"


def test_service_mode():
    kimi = [{"host": "b300a", "role": "worker", "id": "b300a/w0"}, {"host": "b300b", "role": "worker", "id": "b300b/w0"}]
    pd = [{"host": "b300a", "role": "prefill", "id": "P0"}, {"host": "b300b", "role": "decode", "id": "D0"}]
    assert fu.service_mode(kimi, "b300b", ["b300a"])["mode"] == "rolling"
    r = fu.service_mode(kimi, "b300a", ["b300a"])
    assert r["mode"] == "outage" and not r["allowed"] and "router" in r["reason"]
    r = fu.service_mode(pd, "b300b", ["b300a"])
    assert r["mode"] == "outage" and not r["allowed"] and "nic_firmware_update_maintenance=true" in r["reason"]
    assert fu.service_mode(pd, "b300b", ["b300a"], maintenance_ok=True)["allowed"]
    assert fu.service_mode([], "b300b", ["b300a"])["mode"] == "none"


def test_verify_running_requires_running_not_burned(rows):
    plan = fu.plan_devices(_nics(), rows)
    assert fu.verify_running(plan, _nics(fw3="40.47.1026"))["ok"]
    v = fu.verify_running(plan, _nics(pending="40.47.1026"))
    assert not v["ok"] and "running 40.44.1036, target 40.47.1026, burned image 40.47.1026 still pending" in v["problems"][0]


def test_failure_states_name_the_nic_state_and_the_fix(rows):
    dev = _dev(rows)
    assert "fail-safe" in fu.nic_state("burn", dev, "-E- x") and "40.44.1036" in fu.nic_state("burn", dev)
    assert "still RUNS 40.44.1036" in fu.nic_state("activate", dev) and "Reboot the host" in fu.nic_state("activate", dev)
    assert "BMC" in fu.nic_state("verify", dev)
    assert "nothing was changed" in fu.nic_state("image", dev)
    assert "runs 40.47.1026 (verified)" in fu.nic_state("nccl", dev) and "gate still refuses" in fu.nic_state("gate", dev)
    assert all("unknown stage" not in fu.nic_state(s, dev) for s in fu.STAGES)


def test_report_markdown_and_exit_code(rows):
    plan = fu.plan_devices(_nics(), rows)
    ok = fu.host_result("b300b", plan, "put_back", "updated", {"method": "reboot", "reason": "reboot: x"},
                        fu.verify_running(plan, _nics(fw3="40.47.1026")), timings={"burn": 3.1})
    md, js = fu.render_report([ok, fu.host_result("b300a", fu.plan_devices(_nics(fw3="40.47.1026"), rows), "plan",
                                                  "skipped")], "t1")
    assert "| b300b | mlx5_3 | ConnectX-8 | 0000:59:00.0 | MT_0000001217 | 40.44.1036 | 40.47.1026 | burn | 40.47.1026 |" in md
    assert js["summary"]["exit_code"] == 0 and js["summary"]["by_status"] == {"skipped": ["b300a"], "updated": ["b300b"]}
    bad = fu.host_result("b300b", plan, "burn", "failed", problems=["-E- boom"])
    md, js = fu.render_report([bad], "t2")
    assert js["summary"]["exit_code"] == 2 and "fail-safe" in md


# ------------------------------------------------------------------------------------------ issue 35: downgrades
def test_a_downgrade_is_refused_unless_the_image_entry_allows_that_running_version(rows):
    newer = _nics(fw3="40.48.1010")
    plan = fu.plan_devices(newer, rows)
    assert next(p for p in plan if p["device"] == "mlx5_3")["action"] == "burn"     # the gate alone would burn it
    img = {"psid": "MT_0000001217", "version": "40.47.1026", "sha256": "a" * 64, "path": "/fw", "where": "host"}
    p3 = next(p for p in fu.apply_downgrades(plan, [img]) if p["device"] == "mlx5_3")
    assert p3["action"] == "refuse" and not p3["downgrade"]
    assert p3["reason"].startswith("DOWNGRADE 40.48.1010 -> 40.47.1026 of mlx5_3") and "refused, nothing changed" in p3["reason"]
    assert "allow_downgrade_from: ['40.48.1010']" in p3["reason"]
    other = dict(img, allow_downgrade_from=["40.48.2000"])            # another running version: still refused
    assert next(p for p in fu.apply_downgrades(fu.plan_devices(newer, rows), [other])
                if p["device"] == "mlx5_3")["action"] == "refuse"
    for allowed in ("40.48.1010", ["40.46.1006", "40.48.1010"]):
        p3 = next(p for p in fu.apply_downgrades(fu.plan_devices(newer, rows), [dict(img, allow_downgrade_from=allowed)])
                  if p["device"] == "mlx5_3")
        assert p3["action"] == "burn" and p3["downgrade"] and p3["reason"].startswith("DOWNGRADE 40.48.1010 -> 40.47.1026")
    up = fu.apply_downgrades(fu.plan_devices(_nics(), rows), [img])     # an upgrade is untouched
    assert {p["device"]: (p["action"], p["downgrade"]) for p in up}["mlx5_3"] == ("burn", False)
    md, _ = fu.render_report([fu.host_result("b300b", [p3], "done", "would_update")], "d1", True)
    assert "| 40.48.1010 | 40.47.1026 | burn DOWNGRADE |" in md and "mlx5_3: DOWNGRADE 40.48.1010 -> 40.47.1026" in md


def test_allow_downgrade_from_shape_is_checked():
    img = {"psid": "P", "version": "40.47.1026", "sha256": "a" * 64, "path": "/fw", "where": "host"}
    assert fu.check_images_input([dict(img, allow_downgrade_from=["40.48.1010"])]) == []
    probs = fu.check_images_input([dict(img, allow_downgrade_from=["latest"]), dict(img, allow_downgrade_from=7)])
    assert len(probs) == 2 and all("allow_downgrade_from" in p for p in probs)


# ------------------------------------------------------------------------------------------ issue 35: after a failure
def test_after_failure_puts_back_only_a_fail_safe_burn_failure():
    assert fu.after_failure("burn", "burn")["put_back"] is True
    kept = fu.after_failure("burn", "burn", keep_out=True)
    assert kept["put_back"] is False and "nic_firmware_update_keep_out_on_failure=true" in kept["reason"]
    assert fu.after_failure("burn", "locked")["put_back"] is False          # the other run owns the host
    assert fu.after_failure("burn", "changed")["put_back"] is False
    assert "what the flash holds is unknown" in fu.after_failure("burn", None)["reason"]
    for stage in ("activate", "verify", "gate", "nccl", "put_back"):
        assert fu.after_failure(stage, None)["put_back"] is False


def test_resume_command():
    assert fu.resume_command("b300b") == "tools/fw-update -l b300b"
    assert fu.resume_command("b300b", "/repo/inventory/sandbox", "/repo") == "tools/fw-update -i inventory/sandbox -l b300b"
    assert fu.resume_command("b300a", "/tmp/inv", "/repo", maintenance=True) == (
        "tools/fw-update -i /tmp/inv -l b300a -e nic_firmware_update_maintenance=true")


def test_a_failed_burn_says_its_cause_once_and_how_to_resume(rows):
    dev = _dev(rows)
    err = "-E- Burning FW image failed: Flash write failed"
    msg = "mlx5_3 (0000:59:00.0): burn failed: %s. NIC state: %s" % (err, fu.nic_state("burn", dev))
    r = fu.host_result("b300b", fu.plan_devices(_nics(), rows), "burn", "failed", problems=[msg],
                       after=dict(fu.after_failure("burn", "burn"), done=True), resume=fu.resume_command("b300b"))
    md, js = fu.render_report([r], "t3")
    assert md.count(err) == 1 and md.count("stays on the flash and keeps running") == 1, md
    assert "service: back in service: the burn is fail-safe" in md and "resume: `tools/fw-update -l b300b`" in md
    assert js["summary"]["exit_code"] == 2 and js["hosts"][0]["resume"] == "tools/fw-update -l b300b"


# ------------------------------------------------------------------------------------------ issue 35: per-NIC lock
def test_device_lock_refuses_a_second_holder_naming_the_first_and_the_kernel_frees_it(tmp_path):
    path = fu.lock_path(str(tmp_path / "locks"), "0000:59:00.0")
    assert path.endswith("/b300-nic-0000:59:00.0.lock")
    first = fu.DeviceLock(path, {"holder": "nic_firmware_update burn", "run": "fw-update-A by alice"})
    assert first.acquire() is None
    held = fu.DeviceLock(path, {"run": "fw-update-B"}).acquire()      # another open file description: refused
    assert '"run": "fw-update-A by alice"' in held and '"pid": %d' % __import__("os").getpid() in held
    first.release()
    again = fu.DeviceLock(path, {"run": "fw-update-B"})
    assert again.acquire() is None
    again.release()
    import subprocess
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; sys.path[:0] = %r\n"
        "from ansible_collections.b300.rollout.plugins.module_utils.firmware import fw_update as fu\n"
        "assert fu.DeviceLock(%r, {'run': 'killed'}).acquire() is None\nprint('held', flush=True)\ntime.sleep(60)")
        % (sys.path, path)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    assert "killed" in fu.DeviceLock(path, {"run": "C"}).acquire()
    holder.kill()
    holder.wait()
    last = fu.DeviceLock(path, {"run": "C"})
    assert last.acquire() is None                                       # freed by the kernel, no clean-up ran
    last.release()
    assert "another run holds the NIC's lock %s" % path in fu.lock_refusal(
        {"device": "mlx5_3", "pci_address": "0000:59:00.0"}, "burn", held, path)


def test_burn_still_needed_under_the_lock(rows):
    dev = _dev(rows)
    assert fu.burn_still_needed(dev, {"fw_version": "40.44.1036", "fw_running": None}) is None
    why = fu.burn_still_needed(dev, {"fw_version": "40.47.1026", "fw_running": "40.44.1036"})
    assert "changed since this run's plan" in why and "flash 40.47.1026" in why
    assert "under the lock failed" in fu.burn_still_needed(dev, {"error": "-E- no device"})
