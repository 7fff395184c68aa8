"""Emulated firmware burn / image query / reset of the ConnectX NICs (SYNTHESIZED hardware, sandbox only).

What the real tools print, and where each format below comes from (kept verbatim in
tests/fixtures/real-world/nic-fw-update/, sources in its SOURCES.md):
  * `flint -d DEV q` / `flint -i IMG q`: "Image type:", "FW Version:", "FW Version(Running):" (only while a burned
    image waits for a reset: mstflint flint/subcommands.cpp QuerySubCommand, cited in
    ../shared/reference/firmware-weights-router-facts.md), "FW Release Date:", "Product Version:", "Rom Info:", "Base
    GUID:", "PSID:", "Security Attributes:" (real BlueField-3 capture, MrBr-github/lshca issue #54); model.render_flint_query.
  * `flint -i IMG verify`: section lines "     /0x...-0x... (0x...)/ (NAME) - OK" and the last line
    "-I- FW image verification succeeded. Image is bootable." (mstflint subcommands.cpp VerifySubCommand
    printf("\\n-I- FW image verification succeeded. Image is bootable.\\n\\n")); a bad image stops at the failing
    section, "(NAME) /0xADDR/ - wrong CRC (exp:0x.., act:0x..)", with "-E- FW image verification failed: Bad CRC.. AN
    HCA DEVICE CAN NOT BOOT FROM THIS IMAGE." on the next line (real CX3 Pro capture,
    cx3pro_windows_flint_verify_wrong_crc.txt); an image query prints "Base GUID: N/A <count>" (real capture).
  * `flint -d DEV -i IMG [-y] burn`: "    Current FW version on flash:  X" / "    New FW version:               Y", then
    the secure-FW (MCC) flow's "FSMST_INITIALIZE -   OK" / "Writing Boot image component -   OK" /
    "Restoring signature                     - OK" and the tool's closing advice: MFT flint "-I- To load new FW run
    mlxfwreset or reboot machine.", mstflint "... run mstfwreset ..." (real captures: a ConnectX-8 burned by MFT flint
    in NVIDIA's nvfwupd documentation, cx8_nvfwupd_flint_burn_mcc.txt, and mstflint on a CX4 Lx,
    cx4lx_pve_mstflint_burn_mcc_restoring_signature.txt; tests/unit/test_hwemu_real_shapes.py compares); a PSID mismatch:
    "-E- PSID mismatch. The PSID on flash (A) differs from the PSID in the given image (B)." (real capture) - real
    flint refuses it without -allow_psid_change, and so does this one (the play never passes that flag).
  * `mlxfwreset -d DEV query`: "Reset-levels:" then one "N: <description padded to 62>-<Supported|Not Supported
    padded to 14>(default)" line per level, "Reset-types (...)" and "Reset-sync (...)" sections (mstflint
    mlxfwresetlib/cmd_reg_mfrl.py query_text "{0}: {1:<62}-{2:<14}{3}\\n"; real BlueField-3 output in the fixture,
    which writes "Not Supported" in the level and type sections and "Not supported" in the Reset-sync one).
  * `mlxfwreset -d DEV reset -l N -y`: a level the device does not support fails with
    "-E- Failed to send MFRL! reset-level N is not supported!" (cmd_reg_mfrl.py send(): CmdNotSupported); a live
    reset prints a blank line, "Requested reset level for device, DEV:" (DEV as given with -d; "The reset level for
    device, DEV is:" without -l), a blank line, "3: Driver restart and PCI reset", "Continue with reset?[y/N] y" (printed
    even with -y), the stages "-I- %-40s-" + Done (mlxfwreset.py printAndFlush) with "Restarting MST -Skipped" (no MST
    service here) and "-I- FW was loaded successfully." (real ConnectX-4/6 Dx/7 transcripts,
    tests/fixtures/real-world/nic-fw-update/cx6dx_mlxfwreset_l3_requested.txt and friends). No real ConnectX-8 reset
    transcript was found: the CX8 lines are the same tool's, not a CX8 capture. Level 4 really prints "-I- Sending
    reboot command to machine -Done" and reboots the machine (cx6dx_mstfwreset_level4_warm_reboot.txt): the emulator
    refuses it instead (a container cannot be rebooted from inside; the role reboots through its own path).
  * `flint --version` / `mstflint --version` / `mlxfwreset --version`: "flint, mft 4.34.0-145. Git SHA Hash: N/A"
    (the shape of a real MFT 4.36 `flint -v`: "flint, mft 4.36.0-147. Git SHA Hash: 7a24adf8c",
    flint_v_mft_4.36.0-147_trailing_period.txt) and "mstflint, mstflint 4.21.0, Git SHA Hash: N/A" (real 4.33.0:
    "mstflint, mstflint 4.33.0, Git SHA Hash: d431e08"); emulator-made values: MFT 4.34.0 for flint, Debian 12's
    mstflint 4.21.0, which does not know the CX8 device id.

CX8 activation (facts file, mstfwreset.py 2567-2575 and drivers_safety_check.py): a CX8 is a PCIe switch with the GPU
drivers bound below it, so level 3 (driver restart + PCI reset) is refused and only level 4 (warm reboot) is
supported: every emulated CX8 data NIC says so. The state file <root>/state/mlxfwreset.json ({"mlx5_3": {"3": true}})
makes a level supported on one device (the live-reset path in tests). The fabric-manager CX7 supports level 3.
The state file <root>/state/burn_fail makes the next burns fail part-way (the image on flash stays the old one, as
flint's fail-safe burn leaves it). <root>/state/burns.log records each flash write's start and end (a test hook).

State: <root>/state/fw.json {nic: {"flashed": ver, "running": ver, "boot": epoch of the boot it was burned in}} over
the scenario's firmware; a burned image becomes the running one on a reset of a supported level, or at the next boot
(the container's PID 1 starting later than the burn), and the sysfs fw_ver file follows. hwemu-scenario clears it.
"""
import json
import os
import re
import time

import fwimage
import model

VERSIONS = {"flint": "flint, mft 4.34.0-145. Git SHA Hash: N/A",
            "mstflint": "mstflint, mstflint 4.21.0, Git SHA Hash: N/A",
            "mlxfwreset": "mlxfwreset, mft 4.34.0-145. Git SHA Hash: N/A"}
# the burn's closing advice names the reset tool of the package that burned (module docstring)
RESET_TOOL_OF = {"flint": "mlxfwreset", "mstflint": "mstfwreset"}
# CX8 id 4131 (0x1023) is unknown to mstflint before 4.28 ("Invalid device-type 4131", facts file)
MSTFLINT_KNOWS_CX8 = False
LEVELS = [(0, 'Driver, PCI link, network link will remain up ("live-Patch")'),
          (1, 'Only ARM side will not remain up ("Immediate reset").'),
          (3, "Driver restart and PCI reset"), (4, "Warm Reboot")]
TYPES = [(0, "Full chip reset"), (1, "Phy-less reset (keep network port active during reset)"),
         (2, "NIC only reset (for SoC devices)"), (3, "ARM only reset"), (4, "ARM OS shut down")]
SYNCS = [(0, "Tool is the owner"), (1, "Driver is the owner")]


def burn_seconds():
    try:
        return float(os.environ.get("HWEMU_BURN_S", "3"))
    except ValueError:
        return 3.0


def _path(root, name):
    d = os.path.join(root, "state")
    os.makedirs(d, exist_ok=True)
    return os.path.join(d, name)


def _load(root, name):
    try:
        with open(_path(root, name)) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


def _save(root, name, data):
    tmp = _path(root, name) + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh, sort_keys=True)
    os.replace(tmp, _path(root, name))


def apply_fw_state(st, root, boot_epoch):
    """Overlay the burned / activated firmware on the scenario state; activate images burned before this boot."""
    fw = _load(root, "fw.json")
    changed = False
    for n in st["nics"]:
        rec = fw.get(n["name"])
        if not rec:
            continue
        if rec.get("flashed") and rec["flashed"] != rec.get("running") and rec.get("boot", 0) < boot_epoch - 1:
            rec["running"] = rec["flashed"]          # rebooted since the burn: the flashed image runs now
            changed = True
        n["fw"] = rec.get("running") or n["fw"]
        n["fw_flashed"] = rec["flashed"] if rec.get("flashed") and rec["flashed"] != n["fw"] else None
        if rec.get("release_date"):
            n["fw_release_date"] = rec["release_date"]
        _sync_sysfs(root, n)
    if changed:
        _save(root, "fw.json", fw)
    return st


def _sync_sysfs(root, n):
    path = os.path.join(root, "sys", "class", "infiniband", n["name"], "fw_ver")
    try:
        with open(path) as fh:
            if fh.read().strip() == n["fw"]:
                return
        with open(path, "w") as fh:
            fh.write(n["fw"] + "\n")
    except OSError:
        pass


def reset_levels(root, n):
    if n["model"] == "ConnectX-8":
        levels = {0: False, 1: False, 3: False, 4: True}
    else:
        levels = {0: False, 1: False, 3: True, 4: True}
    for k, v in (_load(root, "mlxfwreset.json").get(n["name"]) or {}).items():
        levels[int(k)] = bool(v)
    return levels


def _line(num, desc, ok, default, not_supported="Not Supported"):
    return "{0}: {1:<62}-{2:<14}{3}\n".format(num, desc, "Supported" if ok else not_supported,
                                              "(default)" if default else "")


def render_reset_query(root, n):
    lv = reset_levels(root, n)
    default = min((k for k in (0, 3, 4) if lv.get(k)), default=None)
    out = "Reset-levels:\n" + "".join(_line(k, d, lv.get(k), k == default) for k, d in LEVELS)
    out += "\nReset-types (relevant only for reset-levels 1,3,4):\n"
    out += "".join(_line(k, d, k == 0, k == 0) for k, d in TYPES)
    out += "\nReset-sync (relevant only for reset-level 3):\n"
    out += "".join(_line(k, d, k == 1 and lv.get(3), k == 1 and lv.get(3), "Not supported") for k, d in SYNCS)
    return out


def render_image_query(img):
    n = {"fw": img["version"], "fw_flashed": None, "fw_release_date": img.get("release_date", "N/A"),
         "guid": "0000000000000000", "psid": img["psid"]}
    text = model.render_flint_query(None, n)
    # an image carries no GUIDs or MACs: real `mstflint -i IMG q` prints "Base GUID:             N/A                     4"
    # (cx4lx_pve_mstflint_image_query_na_guids.txt); the count column stays
    text = re.sub(r"(?m)^(Base (?:GUID|MAC):\s+)\S+\s+(\d+)$", lambda m: "%s%-24s%s" % (m.group(1), "N/A", m.group(2)),
                  text)
    return text.replace("Image type:            FS5", "Image type:            %s" % img.get("image_type", "FS5"))


def render_verify(img):
    secs = [("0x00000018", "0x0000001f", "0x000008", "HW_POINTERS"), ("0x00000500", "0x0000053f", "0x000040", "TOOLS_AREA"),
            ("0x00001000", "0x00003fff", "0x003000", "BOOT2"), ("0x00004000", "0x0000401f", "0x000020", "ITOC_HEADER"),
            ("0x00005000", "0x0000fff7", "0x00aff8", "PCI_CODE"), ("0x00010000", "0x000103ff", "0x000400", "IMAGE_INFO")]
    out = "\n     %s failsafe image\n\n" % img.get("image_type", "FS5")
    for i, (a, b, ln, name) in enumerate(secs):
        bad = not img["crc_ok"] and i == len(secs) - 2
        # a failing section names its address after its name (mstflint fs3_ops "%s /0x%08x/ - wrong CRC (exp:0x%x,
        # act:0x%x)"; real: "(Configuration) /0x000ed39c/ - wrong CRC (exp:0x8e4c, act:0x9008)")
        out += "     /%s-%s (%s)/ (%s)%s - %s\n" % (a, b, ln, name, " /%s/" % a if bad else "",
                                                  "wrong CRC (exp:0x5a2f, act:0x91c4)" if bad else "OK")
        if bad:     # the tool stops at the bad section and prints its error right below it (real capture)
            return out + "-E- FW image verification failed: Bad CRC.. AN HCA DEVICE CAN NOT BOOT FROM THIS IMAGE.\n", 1
    return out + "\n-I- FW image verification succeeded. Image is bootable.\n\n", 0


def _burn_log(root, n, img, what):
    """Test hook, not a real tool's behaviour: one line per flash write started/ended (state/burns.log: epoch, pid,
    NIC, version, start|end), so a test can count the burns of one NIC and see two of them overlap."""
    with open(_path(root, "burns.log"), "a") as fh:
        fh.write("%.3f %d %s %s %s\n" % (time.time(), os.getpid(), n["name"], img["version"], what))


def burn(root, st, n, img, boot_epoch, sleep=time.sleep, tool="flint"):
    """(stdout, stderr, rc) of `flint -d DEV -i IMG -y burn` (`mstflint` with tool="mstflint"; real output formats,
    module docstring)."""
    if img is None:
        return "", "-E- Cannot open image file: not a ConnectX firmware image (emulator: no hwemu image header)\n", 1
    if img.get("device_id") != n["part_id"]:
        return "", ("-E- The given image is not compatible with the device: image device id %d, device id %d\n"
                    % (img.get("device_id"), n["part_id"])), 1
    head = "\n    Current FW version on flash:  %s\n    New FW version:               %s\n\n" % (
        model.nic_flashed_fw(n), img["version"])
    if img["psid"] != n["psid"]:
        return head, ("-E- PSID mismatch. The PSID on flash (%s) differs from the PSID in the given image (%s).\n"
                      % (n["psid"], img["psid"])), 1
    if not img["crc_ok"]:
        return head, "-E- Burning FW image failed: Bad CRC in the given image\n", 1
    if os.path.exists(_path(root, "burn_fail")):      # test hook: the flash write fails part-way (fail-safe burn)
        return head + "FSMST_INITIALIZE -   OK\nWriting Boot image component -   FAIL\n", (
            "-E- Burning FW image failed: Flash write failed (emulated: state/burn_fail)\n"), 1
    _burn_log(root, n, img, "start")
    sleep(burn_seconds())
    fw = _load(root, "fw.json")
    rec = fw.setdefault(n["name"], {"running": n["fw"]})
    rec.update(flashed=img["version"], boot=boot_epoch, release_date=img.get("release_date"))
    _save(root, "fw.json", fw)
    _burn_log(root, n, img, "end")
    return (head + "FSMST_INITIALIZE -   OK\nWriting Boot image component -   OK\n"
            "Restoring signature                     - OK\n"
            "-I- To load new FW run %s or reboot machine.\n" % RESET_TOOL_OF.get(tool, "mlxfwreset")), "", 0


def reset(root, n, level, dev=None):
    """(stdout, stderr, rc) of `mlxfwreset -d DEV reset -l LEVEL -y` (DEV as given; the PCI address when None)."""
    lv = reset_levels(root, n)
    dev = dev or n["pci"]
    head = ("\nRequested reset level for device, %s:\n" % dev if level is not None
            else "\nThe reset level for device, %s is:\n" % dev)
    if level is None:
        level = min((k for k in (0, 3, 4) if lv.get(k)), default=4)
    if not lv.get(level):
        return "", "-E- Failed to send MFRL! reset-level %d is not supported!\n" % level, 1
    if level == 4:
        return "", ("-E- reset-level 4 (warm reboot) reboots the machine: the emulator does not; reboot the host "
                    "(sandbox/fleet.sh reboot)\n"), 1
    fw = _load(root, "fw.json")
    rec = fw.get(n["name"])
    if rec and rec.get("flashed"):
        rec["running"] = rec["flashed"]
        _save(root, "fw.json", fw)
        n["fw"] = rec["running"]
        _sync_sysfs(root, n)      # the driver re-probes the device: sysfs fw_ver shows the new image at once
    desc = dict(LEVELS)[level]
    stages = [("Sending Reset Command To Fw", "Done"), ("Stopping Driver", "Done"), ("Resetting PCI", "Done"),
              ("Starting Driver", "Done"), ("Restarting MST", "Skipped")]
    return (head + "\n%d: %s\nContinue with reset?[y/N] y\n" % (level, desc)
            + "".join("-I- %-40s-%s\n" % st for st in stages) + "-I- FW was loaded successfully.\n"), "", 0


def image(path):
    return fwimage.read_image(path)
