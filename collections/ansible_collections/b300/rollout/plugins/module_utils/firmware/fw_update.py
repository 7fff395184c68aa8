# -*- coding: utf-8 -*-
"""ConnectX firmware update (issue 29): parsers of the burn/reset tools' output and every decision of the update.

Plain stdlib functions (no Ansible imports); the module nic_firmware_update and the role nic_firmware_update only run
tools and sequence these. What is burned is decided by the same matrix and judge as the gate (fw_matrix.check_device),
so a device the gate passes is never touched.

Real output formats (tests/fixtures/real-world/nic-fw-update/, SOURCES.md there):
  * ``flint -d DEV q`` / ``flint -i IMG q``: ``Key:   value`` lines; ``FW Version(Running):`` only while a burned
    image waits for a reset (then ``FW Version:`` is the burned image).
  * ``flint -i IMG verify``: ``-I- FW image verification succeeded. Image is bootable.`` or ``-E- ...``.
  * ``flint -d DEV -i IMG burn``: ``Current FW version on flash:`` / ``New FW version:``, then either the MCC flow
    (``FSMST_INITIALIZE -   OK``, ``Writing Boot image component -   OK``) or the legacy one (``Burning FW image without
    signatures - OK``, ``Restoring signature - OK``), and ``-I- To load new FW run mstfwreset or reboot machine.``;
    errors as ``-E- ...`` (``-E- PSID mismatch. The PSID on flash (A) differs from the PSID in the given image (B).``).
  * ``mlxfwreset -d DEV query``: sections ``Reset-levels:``, ``Reset-types (...)``, ``Reset-sync (...)`` of lines
    ``N: description  -Supported|Not Supported  (default)`` (``Not supported`` too).
  * ``mlxfwreset -d DEV reset -l N -y``: ``Requested reset level for device, DEV:`` / ``N: description`` / the
    ``-I- <stage> -Done|Skipped`` lines / ``-I- FW was loaded successfully.``; level 4 ends with ``-I- Sending reboot
    command to machine -Done`` (parse_mlxfwreset_reset, judge_live_reset; levels: LIVE_RESET_LEVELS).
  * ``flint --version``: ``flint, mft 4.36.0-147. Git SHA Hash: ...`` (older: ``..., built on ...``); ``mstflint
    --version``: ``mstflint, mstflint 4.33.0, Git SHA Hash: ...`` or ``mstflint 4.6.0. Git SHA ...``.
  * The FS2/FS3 burn flows print ``Burning FS2 FW image without signatures - OK`` / ``Restoring signature - OK`` and
    often no ``-I-`` line. docs/triage-real-world.md section 8 lists every form with its source.
"""
from __future__ import absolute_import, division, print_function

import errno
import fcntl
import json
import os
import re
import socket
import time

from ansible_collections.b300.rollout.plugins.module_utils.hw.fw_matrix import check_device, match_row, parse_fw
from ansible_collections.b300.rollout.plugins.module_utils.common.md_table import table

__metaclass__ = type

# The tool that may burn a ConnectX-8 (device id 4131 = 0x1023), and from which version (facts file
# ../shared/reference/firmware-weights-router-facts.md, "mstflint and CX8"): mstflint learnt the CX8 device type in
# 4.28 and its manual first lists CX8 firmware in 4.31.0; Debian 12 ships 4.21.0 (too old). MFT 4.33 is the first
# bundle named there that ships CX8 firmware (40.46.1006). Ours, not NVIDIA's: the MFT minimum.
TOOL_MINIMUMS = {"mft": "4.33.0", "mstflint": "4.31.0"}
TOOL_ORDER = ("flint", "mstflint")   # MFT's flint first (NCO PR #173 moved to it for CX8), then mstflint
STAGES = ("plan", "image", "take_out", "burn", "activate", "verify", "gate", "nccl", "put_back")

_KV = re.compile(r"^([A-Za-z][A-Za-z ()/]*?):\s*(.*?)\s*$")
# the version may be followed by a build number and by punctuation: "mft 4.36.0-147. Git SHA", "mstflint 4.6.0. Git SHA"
# (real `-v` lines, tests/fixtures/real-world/nic-fw-update/SOURCES.md), "mstflint 4.21.0, Git SHA", "mft 4.34.0-145, built"
_VERSION = re.compile(r"^\s*(flint|mstflint|mlxfwreset|mstfwreset),\s*(mft|mstflint)\s+(\d+)\.(\d+)\.(\d+)"
                      r"(?:-(\w+))?[.,;:]*(?:\s|$)")
# The non-MCC burn flows (mstflint flint/subcommands.cpp burnCbFs2Func / burnCbFs3Func, and MFT's FS4 variant): the
# progress line "Burning FS2 FW image without signatures - N%" ends as "... - OK", then "Restoring signature - OK".
_LEGACY_BURN = re.compile(r"^Burning (?:FS\d )?FW image without signatures\b")
_BURN_STAGE_OK = re.compile(r"^(FSMST_INITIALIZE|Writing .* component|Burning (?:FS\d )?FW image without signatures|"
                            r"Restoring signature)\s*-\s*OK\s*$")
_RESET_LINE = re.compile(r"^\s*(\d+):\s*(.*?)\s*-\s*(Supported|Not [Ss]upported)\b\s*(\(default\))?")


def _strip_prompt(text):
    return [ln for ln in (text or "").splitlines() if not re.match(r"^\s*\S+@\S+[:~#$]", ln)]


# --------------------------------------------------------------------------------------------- parsers
def parse_flint_query(text):
    """``flint -d DEV q`` or ``flint -i IMG q`` -> {image_type, fw_version, fw_running, release_date, product_version,
    psid, security, base_guid}. fw_running is None unless a burned image waits for a reset. ValueError when the text
    has no FW Version line (an error, not a query)."""
    out = {"image_type": None, "fw_version": None, "fw_running": None, "release_date": None, "product_version": None,
           "psid": None, "security": None, "base_guid": None}
    keys = {"image type": "image_type", "fw version": "fw_version", "fw version(running)": "fw_running",
            "fw release date": "release_date", "product version": "product_version", "psid": "psid",
            "security attributes": "security"}
    errors = []
    for ln in _strip_prompt(text):
        s = ln.strip()
        if s.startswith("-E-"):
            errors.append(s)
            continue
        m = _KV.match(s)
        if not m:
            continue
        key, val = m.group(1).strip().lower(), m.group(2).strip()
        if key in keys and out[keys[key]] is None:
            out[keys[key]] = val if val.upper() != "N/A" else None
        elif key == "base guid":
            out["base_guid"] = val.split()[0] if val and val.split()[0].upper() != "N/A" else None   # an image: N/A
    if out["fw_version"] is None:
        raise ValueError("flint query output has no 'FW Version:' line (%s)" % (
            errors[0] if errors else "first line: %r" % ((text or "").strip().splitlines() or [""])[0][:120]))
    return out


def parse_flint_verify(text, rc=0):
    """``flint -i IMG verify`` -> {ok, reason}. ok only with the tool's own success line and rc 0."""
    lines = [ln.strip() for ln in (text or "").splitlines()]
    errs = [ln for ln in lines if ln.startswith("-E-")]
    # "/0x...-0x... (0x...)/ (NAME) /0x000ed39c/ - wrong CRC (exp:0x8e4c, act:0x9008)" (real CX3 Pro capture)
    bad = [ln for ln in lines if re.search(r"[)/]\s*-\s*wrong CRC", ln)]
    ok = rc == 0 and any("FW image verification succeeded" in ln for ln in lines) and not errs
    fallback = bad[0] if bad else "no verification success line (rc %s)" % rc
    reason = "image is bootable (flint verify)" if ok else (errs[0] if errs else fallback)
    return {"ok": ok, "reason": reason}


def parse_flint_burn(text, rc=0):
    """``flint -d DEV -i IMG burn`` output (stdout+stderr) -> {ok, flash_before, flash_new, error, needs_activation,
    flow}. ok: rc 0, no -E- line, and the tool's 'To load new FW' line or both burn stages OK."""
    lines = [ln.strip() for ln in _strip_prompt(text)]
    out = {"ok": False, "flash_before": None, "flash_new": None, "error": None, "needs_activation": False, "flow": None}
    for ln in lines:
        m = re.match(r"^Current FW version on flash:\s*(\S+)", ln)
        if m:
            out["flash_before"] = m.group(1)
        m = re.match(r"^New FW version:\s*(\S+)", ln)
        if m:
            out["flash_new"] = m.group(1)
        if ln.startswith("-E-") and out["error"] is None:
            out["error"] = ln
        if ln.startswith("FSMST_INITIALIZE"):
            out["flow"] = "mcc"
        elif _LEGACY_BURN.match(ln) and out["flow"] is None:
            out["flow"] = "legacy"
    staged = [ln for ln in lines if _BURN_STAGE_OK.match(ln)]
    loaded = any("To load new FW run" in ln for ln in lines)
    out["needs_activation"] = loaded
    out["ok"] = rc == 0 and out["error"] is None and (loaded or len(staged) >= 2)
    if not out["ok"] and out["error"] is None:
        out["error"] = "burn did not report success (rc %s)" % rc
    return out


def parse_mlxfwreset_query(text):
    """``mlxfwreset -d DEV query`` -> {levels, types, sync: {n: {supported, default, description}}, default_level}."""
    out = {"levels": {}, "types": {}, "sync": {}, "default_level": None}
    section = None
    for ln in _strip_prompt(text):
        s = ln.strip()
        low = s.lower()
        if low.startswith("reset-levels"):
            section = "levels"
            continue
        if low.startswith("reset-types"):
            section = "types"
            continue
        if low.startswith("reset-sync"):
            section = "sync"
            continue
        m = _RESET_LINE.match(s)
        if m and section:
            n = int(m.group(1))
            out[section][n] = {"supported": m.group(3) == "Supported", "default": bool(m.group(4)),
                               "description": m.group(2).strip()}
            if section == "levels" and m.group(4):
                out["default_level"] = n
    if not out["levels"]:
        raise ValueError("mlxfwreset query output has no 'Reset-levels:' section (first line: %r)"
                         % ((text or "").strip().splitlines() or [""])[0][:120])
    return out


# mlxfwreset / mstfwreset reset levels (mstfwreset(1) of mstflint 4.13-4.33, "Reset levels: 0: Driver, PCI link,
# network link will remain up ("live-Patch") 3: Driver restart and PCI reset 4: Warm Reboot 5: Cold Reboot"; MFT's
# mlxfwreset adds 1 for the BlueField ARM side). Levels 4 and 5 reboot the MACHINE (the tool prints "-I- Sending reboot
# command to machine -Done", real transcript in tests/fixtures/real-world/nic-fw-update/): a "live" activation may use
# only the levels that keep the host up; a reboot goes through the role's own reboot path (activate.yml), never here.
LIVE_RESET_LEVELS = {0: "live-Patch: driver, PCI link and network link stay up", 3: "driver restart and PCI reset"}
HOST_REBOOT_LEVELS = {4: "Warm Reboot (the tool reboots the machine)", 5: "Cold Reboot (the tool power-cycles the machine)"}
_RESET_HEAD = re.compile(r"^(?:The reset level for device|Minimal reset level for device|Requested reset level for "
                         r"device),\s*(.+?)(?:\s+is)?\s*:\s*$")
_RESET_STAGE = re.compile(r"^-I-\s+(\S.*?)\s*-(Done|Skipped|Failed.*?)\s*$")


def check_live_levels(levels):
    """Problems (strings) of nic_firmware_update_live_levels: every entry must be a level that keeps the host up
    (LIVE_RESET_LEVELS); a level that reboots the machine (4, 5) or any other one is refused with the fix."""
    probs = []
    for n in levels or []:     # empty: never a live reset, every activation is a reboot (allowed)
        if n in LIVE_RESET_LEVELS:
            continue
        what = HOST_REBOOT_LEVELS.get(n, "not an mlxfwreset level that keeps the host up")
        probs.append("nic_firmware_update_live_levels contains %r: level %s is %s. A live activation may use only %s; "
                     "the host's reboot goes through the role's reboot path (it reboots by itself where no live level "
                     "is supported): remove %r" % (n, n, what, sorted(LIVE_RESET_LEVELS), n))
    return probs


def parse_mlxfwreset_reset(text, rc=0):
    """``mlxfwreset -d DEV reset [-l N] -y`` transcript (stdout+stderr) -> {ok, level, description, device, stages,
    fw_loaded, reboots_host, error}.

    The tool prints a blank line, ``The reset level for device, DEV is:`` (``Minimal ...`` / ``Requested reset level
    for device, DEV:`` with -l), a blank line, ``N: description``, ``Continue with reset?[y/N] y`` (even with -y),
    then one ``-I- <stage padded to 40>-Done|Skipped|Failed`` line per stage (mstflint mlxfwreset.py ``"-I- %-40s-"``)
    and ``-I- FW was loaded successfully.``; level 4 ends with ``-I- Sending reboot command to machine -Done``.
    ok: rc 0, no ``-E-`` line, no Failed stage and the tool's own end (FW loaded, or the reboot command sent)."""
    out = {"ok": False, "level": None, "description": None, "device": None, "stages": {}, "fw_loaded": False,
           "reboots_host": False, "error": None}
    want_level = False
    for ln in _strip_prompt(text):
        s = ln.strip()
        if not s:
            continue
        m = _RESET_HEAD.match(s)
        if m:
            out["device"], want_level = m.group(1), True
            continue
        if want_level:
            m = re.match(r"^(\d+):\s*(.+?)\s*$", s)
            if m:
                out["level"], out["description"] = int(m.group(1)), m.group(2)
            want_level = False
            continue
        if s.startswith("-E-") and out["error"] is None:
            out["error"] = s
            continue
        m = _RESET_STAGE.match(s)
        if m:
            out["stages"][m.group(1)] = m.group(2)
            if "reboot command to machine" in m.group(1).lower():
                out["reboots_host"] = True
            continue
        if re.match(r"^-I-\s+FW was loaded successfully", s):
            out["fw_loaded"] = True
    if out["level"] in HOST_REBOOT_LEVELS:
        out["reboots_host"] = True
    failed = [k for k, v in out["stages"].items() if v.startswith("Failed")]
    if failed and out["error"] is None:
        out["error"] = "stage %r failed" % failed[0]
    sent_reboot = any("reboot command" in k.lower() and v == "Done" for k, v in out["stages"].items())
    out["ok"] = rc == 0 and out["error"] is None and (out["fw_loaded"] or sent_reboot)
    if not out["ok"] and out["error"] is None:
        out["error"] = "no '-I- FW was loaded successfully.' line (rc %s)" % rc
    return out


def judge_live_reset(res, level):
    """None when a parse_mlxfwreset_reset result is the live activation asked for (level `level`, the FW loaded, the
    host not rebooted), else why not (one line)."""
    if res["reboots_host"]:
        return "mlxfwreset rebooted (or asked to reboot) the machine at level %s: a live activation never may" % (
            res["level"],)
    if not res["ok"]:
        return res["error"]
    if res["level"] is not None and res["level"] != level:
        return "mlxfwreset ran level %s (%s), the plan asked for level %s" % (res["level"], res["description"], level)
    return None


def parse_tool_version(text):
    """``flint --version`` / ``mstflint --version`` -> {tool, package, version, key} or None."""
    for ln in (text or "").splitlines():
        m = _VERSION.match(ln)
        if m:
            key = (int(m.group(3)), int(m.group(4)), int(m.group(5)))
            return {"tool": m.group(1), "package": m.group(2), "version": "%d.%d.%d" % key, "key": key,
                    "raw": ln.strip()}
    return None


# --------------------------------------------------------------------------------------------- decisions
def _key(v):
    return tuple(int(x) for x in str(v).split(".")[:3])


def choose_tool(version_texts, minimums=None):
    """version_texts: {'flint': text or None, 'mstflint': text or None} (None: not installed).
    Returns {tool, package, version, ok, reason, checked: [{tool, version, ok, reason}]}: the first tool of TOOL_ORDER
    whose package version knows the CX8; ok False (and tool None) when none does."""
    mins = dict(TOOL_MINIMUMS, **(minimums or {}))
    checked = []
    for name in TOOL_ORDER:
        text = version_texts.get(name)
        if text is None:
            checked.append({"tool": name, "version": None, "ok": False, "reason": "%s not installed" % name})
            continue
        v = parse_tool_version(text)
        if v is None:
            checked.append({"tool": name, "version": None, "ok": False,
                            "reason": "%s --version not understood: %r" % (name, text.strip()[:120])})
            continue
        need = mins[v["package"]]
        ok = v["key"] >= _key(need)
        checked.append({"tool": name, "package": v["package"], "version": v["version"], "ok": ok,
                        "reason": "%s %s %s the ConnectX-8 (needs %s >= %s)" % (
                            v["package"], v["version"], "knows" if ok else "is too old for", v["package"], need)})
    best = next((c for c in checked if c["ok"]), None)
    if best:
        return dict(best, checked=checked)
    return {"tool": None, "package": None, "version": None, "ok": False, "checked": checked,
            "reason": "no burning tool knows the ConnectX-8: " + "; ".join(c["reason"] for c in checked)
                      + ". Install NVIDIA MFT >= %s (or mstflint >= %s)" % (mins["mft"], mins["mstflint"])}


def target_of(rule):
    """The version to burn for a matrix rule: its exact version, else its minimum; None when it names neither."""
    if not rule or "unsupported" in rule:
        return None
    return rule.get("exact") or rule.get("minimum")


def plan_devices(rdma_nics, rows, policy=None):
    """Per device of rdma_nics: the gate's verdict and what the update does with it.

    action: skip (verdict ok / ignored: no burn, no reset), burn (mismatch, or a pending image that is not the
    target), activate (the target is already burned and waits for a reset), refuse (unsupported / unknown: the matrix
    names no target). Returns a list sorted by device name."""
    rdma_nics = rdma_nics or {}
    driver = rdma_nics.get("driver") or {}
    out = []
    for dev in sorted(rdma_nics.get("devices") or [], key=lambda d: d.get("name") or ""):
        v = check_device(dev, driver, rows, policy)
        row, _how = match_row(rows, driver.get("flavour") or "absent", driver.get("version"))
        rule = (row or {}).get("models", {}).get(dev.get("model")) if row else None
        target = target_of(rule)
        item = {"device": dev.get("name"), "pci_address": dev.get("pci_address"), "model": dev.get("model"),
                "psid": dev.get("psid"), "role": dev.get("role"), "fw_running": dev.get("fw_ver"),
                "fw_pending": dev.get("fw_pending"), "verdict": v["verdict"], "row": v["row"], "rule": v["rule"],
                "expected": v["expected"], "target": target, "action": None, "reason": v["reason"]}
        if v["verdict"] in ("ok", "ignored"):
            item["action"] = "skip"
            item["reason"] = "%s: %s (no burn, no reset)" % (v["verdict"], v["reason"])
        elif v["verdict"] == "mismatch" and target:
            item["action"] = "burn"
        elif v["verdict"] == "pending_reset" and target:
            same = parse_fw(dev.get("fw_pending")) == parse_fw(target)
            item["action"] = "activate" if same else "burn"
            item["reason"] = ("the target %s is burned and waits for a reset" % target if same else
                              "a burned image %s (not the target %s) waits for a reset: burn the target over it"
                              % (dev.get("fw_pending"), target))
        else:
            item["action"] = "refuse"
            item["reason"] = "%s: %s; the matrix names no target version to burn" % (v["verdict"], v["reason"])
        out.append(item)
    return out


def check_images_input(images):
    """Problems of the inventory's image list (nic_firmware_update_images): each entry needs psid, version, a pinned
    sha256 (64 hex digits), path, and where (controller|host)."""
    probs = []
    for i, img in enumerate(images or []):
        if not isinstance(img, dict):
            probs.append("nic_firmware_update_images[%d]: a mapping, got %r" % (i, img))
            continue
        miss = [k for k in ("psid", "version", "sha256", "path", "where") if not img.get(k)]
        if miss:
            probs.append("nic_firmware_update_images[%d]: needs %s" % (i, ", ".join(miss)))
        if img.get("sha256") and not re.match(r"^[0-9a-f]{64}$", str(img["sha256"])):
            probs.append("nic_firmware_update_images[%d]: sha256 %r is not 64 lower-case hex digits" % (i, img["sha256"]))
        if img.get("where") and img["where"] not in ("controller", "host"):
            probs.append("nic_firmware_update_images[%d]: where %r is not controller or host" % (i, img["where"]))
        if img.get("version") and parse_fw(img["version"]) is None:
            probs.append("nic_firmware_update_images[%d]: version %r is not like 40.47.1026" % (i, img["version"]))
        bad = [v for v in downgrade_from(img) if parse_fw(v) is None]
        if bad or not isinstance(img.get("allow_downgrade_from", []), (list, str)):
            probs.append("nic_firmware_update_images[%d]: allow_downgrade_from %r must be a version or a list of "
                         "versions like 40.48.1010 (the RUNNING versions this older image may replace)"
                         % (i, img.get("allow_downgrade_from")))
    return probs


def downgrade_from(img):
    """The running versions an image entry explicitly allows to be replaced by its (older) version: the entry's
    ``allow_downgrade_from`` (one version or a list; absent: none)."""
    allowed = (img or {}).get("allow_downgrade_from") or []
    if isinstance(allowed, str):
        allowed = [allowed]
    return [str(v) for v in allowed] if isinstance(allowed, list) else []


def apply_downgrades(devices, images):
    """A target OLDER than the version a device runs is a downgrade: refused unless the inventory's image entry for
    that PSID and target version lists the device's running version in ``allow_downgrade_from``; an allowed one is
    marked (``downgrade: true``, the reason starts with DOWNGRADE) so the plan, the console and the report say so.
    Changes and returns ``devices`` (plan_devices items)."""
    for d in devices:
        d.setdefault("downgrade", False)
        if d["action"] not in ("burn", "activate") or not d.get("target"):
            continue
        run, tgt = parse_fw(d.get("fw_running")), parse_fw(d["target"])
        if run is None or tgt is None or tgt >= run:
            continue
        entry = pick_image(images, d.get("psid"), d["target"])
        allowed = [v for v in downgrade_from(entry) if parse_fw(v) == run]
        what = "DOWNGRADE %s -> %s of %s (%s, PSID %s; matrix row %s)" % (
            d["fw_running"], d["target"], d["device"], d["pci_address"], d.get("psid"), d.get("row"))
        if allowed:
            d["downgrade"] = True
            d["reason"] = "%s: allowed by nic_firmware_update_images (PSID %s, version %s) allow_downgrade_from %s; %s" % (
                what, d.get("psid"), d["target"], allowed[0], d["reason"])
            continue
        d["action"] = "refuse"
        d["reason"] = ("%s refused, nothing changed: the target is older than the running firmware. If this rollback "
                       "is intended, add allow_downgrade_from: ['%s'] to the nic_firmware_update_images entry of PSID %s "
                       "version %s; otherwise fix the matrix row %s (or nic_firmware_gate_extra_rows) that names the "
                       "older version" % (what, d["fw_running"], d.get("psid"), d["target"], d.get("row")))
    return devices


STAMPS = ("take_out", "burn", "activate", "activated", "verify", "put_back")


def spans(stamps, end):
    """Seconds of each step from the epoch stamps the role took at each step's start (missing steps left out):
    take_out_s, burn_s, activate_s (the reset or reboot, back and answering), verify_s, put_back_s."""
    t = {k: float(v) for k, v in (stamps or {}).items() if v not in (None, "")}
    out = {}
    for name, a, b in (("take_out_s", "take_out", "burn"), ("burn_s", "burn", "activate"),
                       ("activate_s", "activate", "activated"), ("verify_s", "verify", "put_back"),
                       ("put_back_s", "put_back", "end")):
        tb = t.get(b, end if b == "end" else None)
        if name != "put_back_s" and b not in t:
            continue
        if a in t and tb is not None:
            out[name] = round(tb - t[a], 1)
    return out


def pick_image(images, psid, target):
    """The inventory image entry for (psid, target version), or None."""
    for img in images or []:
        if img.get("psid") == psid and parse_fw(img.get("version")) == parse_fw(target):
            return img
    return None


def check_image(entry, sha256_actual, query, verify, device):
    """Problems (list of strings, empty when fine) of one image for one device, before anything changes.

    entry: the inventory image {psid, version, sha256, path}; query: parse_flint_query of `flint -i IMG q` (or an
    {'error'} dict); verify: parse_flint_verify; device: a plan_devices item."""
    probs = []
    where = "%s (%s, PSID %s)" % (device["device"], device["pci_address"], device["psid"])
    if entry is None:
        return ["%s: no image for PSID %s version %s in nic_firmware_update_images" % (
            where, device["psid"], device["target"])]
    want = str(entry.get("sha256") or "").lower()
    if not re.match(r"^[0-9a-f]{64}$", want):
        probs.append("%s: image %s has no sha256 pinned in the inventory (64 hex digits)" % (where, entry.get("path")))
    elif sha256_actual != want:
        probs.append("%s: image %s sha256 %s, inventory pins %s (wrong or damaged file): put the pinned file there, "
                     "or pin the new file's sha256 once its vendor checksum is checked" % (
                         where, entry.get("path"), sha256_actual, want))
    if query.get("error"):
        probs.append("%s: `flint -i %s query` failed: %s" % (where, entry.get("path"), query["error"]))
    else:
        if query.get("psid") != device["psid"]:
            probs.append("%s: the image's own PSID is %s, the device's %s (flint -i query): refused, this play never "
                         "changes a PSID" % (where, query.get("psid"), device["psid"]))
        if parse_fw(query.get("fw_version")) != parse_fw(device["target"]):
            probs.append("%s: the image's own version is %s, the target %s (flint -i query)" % (
                where, query.get("fw_version"), device["target"]))
    if not verify.get("ok"):
        probs.append("%s: `flint -i %s verify`: %s" % (where, entry.get("path"), verify.get("reason")))
    return probs


def activation(reset_queries, live_levels=(3,)):
    """How to activate the burned images of one host. reset_queries: {device: parse_mlxfwreset_query result or
    {'error': text}}. A live reset (mlxfwreset -l N) only where the tool says that level is supported on that device,
    for EVERY device to activate; otherwise one reboot of the host (which activates them all).
    Returns {method: live|reboot|none, level, per_device: {dev: {level, reason}}, reason}."""
    if not reset_queries:
        return {"method": "none", "level": None, "per_device": {}, "reason": "nothing to activate"}
    per, reboot = {}, []
    for dev in sorted(reset_queries):
        q = reset_queries[dev]
        if q.get("error"):
            per[dev] = {"level": None, "reason": "mlxfwreset query failed: %s" % q["error"]}
            reboot.append(dev)
            continue
        lvl = next((n for n in live_levels if n in LIVE_RESET_LEVELS and (q["levels"].get(n) or {}).get("supported")),
                   None)     # a level that reboots the machine is never a live one (check_live_levels refuses it)
        if lvl is None:
            sup = sorted(n for n, x in q["levels"].items() if x["supported"])
            per[dev] = {"level": None, "reason": "mlxfwreset: level(s) %s not supported on %s (supported: %s)" % (
                list(live_levels), dev, sup or "none")}
            reboot.append(dev)
        else:
            per[dev] = {"level": lvl, "reason": "mlxfwreset: level %d (%s) supported" % (
                lvl, q["levels"][lvl]["description"])}
    if reboot:
        return {"method": "reboot", "level": None, "per_device": per,
                "reason": "reboot: no supported live reset level on %s (%s)" % (
                    ", ".join(reboot), "; ".join(per[d]["reason"] for d in reboot))}
    levels = sorted(set(p["level"] for p in per.values()))
    return {"method": "live", "level": levels[-1], "per_device": per,
            "reason": "live reset (mlxfwreset -l %s) on %s" % ("/".join(map(str, levels)), ", ".join(sorted(per)))}


def service_mode(instances, host, router_hosts, maintenance_ok=False):
    """What taking `host` out of service means. instances: the SGLang plan's instances (host, role, id, url).
    Returns {mode: none|rolling|outage, allowed, instances, reason}: none (no instance there), rolling (its workers
    leave the router, the other hosts keep serving), outage (a PD instance, or the router, is on it: the whole fleet
    stops) which needs the explicit maintenance flag."""
    mine = [i for i in instances or [] if i.get("host") == host]
    pd = [i for i in mine if i.get("role") in ("prefill", "decode")]
    router = host in (router_hosts or [])
    if not mine and not router:
        return {"mode": "none", "allowed": True, "instances": [], "reason": "%s serves no SGLang instance" % host}
    if pd or router or any(i.get("role") in ("prefill", "decode") for i in instances or []):
        why = []
        if any(i.get("role") in ("prefill", "decode") for i in instances or []):
            why.append("the profile is prefill/decode disaggregated: losing %s stops every request of the PD fleet "
                       "(a prefill has no decode to hand its KV to, or the other way round)" % host)
        if router:
            why.append("%s runs the router: while it is out no request is served" % host)
        reason = "; ".join(why)
        return {"mode": "outage", "allowed": bool(maintenance_ok), "instances": [i.get("id") for i in mine],
                "reason": reason + ("; allowed by nic_firmware_update_maintenance=true" if maintenance_ok else
                                    ". Refused: pass -e nic_firmware_update_maintenance=true in a maintenance window "
                                    "(the fleet stops serving while this host is updated)")}
    return {"mode": "rolling", "allowed": True, "instances": [i.get("id") for i in mine],
            "reason": "%s leaves the router (drained first); the other hosts keep serving" % host}


def verify_running(planned, rdma_nics):
    """After activation: every burned/activated device RUNS the target (sysfs fw_ver) and has no image pending.
    Returns {ok, devices: [{device, target, running, pending, ok}], problems}."""
    by_name = {d.get("name"): d for d in (rdma_nics or {}).get("devices") or []}
    rows, probs = [], []
    for p in planned:
        if p["action"] not in ("burn", "activate"):
            continue
        d = by_name.get(p["device"]) or {}
        running, pending = d.get("fw_ver"), d.get("fw_pending")
        ok = parse_fw(running) == parse_fw(p["target"]) and not pending
        rows.append({"device": p["device"], "target": p["target"], "running": running, "pending": pending, "ok": ok})
        if not ok:
            still = ", burned image %s still pending" % pending if pending else ""
            probs.append("%s (%s): running %s, target %s%s" % (p["device"], p["pci_address"], running, p["target"], still))
    return {"ok": not probs, "devices": rows, "problems": probs}


def nic_state(stage, device, detail=""):
    """Exactly what state a NIC is in after a failure at `stage`, and what to do (one line for the on-call)."""
    pci = device.get("pci_address") or device.get("device")
    tgt = device.get("target")
    texts = {
        "plan": "nothing was changed on this host. Fix the input named above and re-run.",
        "image": "nothing was changed: the flash still holds %s. Fix the image (sha256, PSID, version) named above and "
                 "re-run." % (device.get("fw_pending") or device.get("fw_running")),
        "take_out": "the NIC is unchanged (running %s); the host may be out of the router: re-run the play (it puts "
                    "the host back once the update passes), or playbooks/rolling_restart.yml to re-add it without the "
                    "update." % device.get("fw_running"),
        "burn": "the burn failed (its error is above). flint's burn is fail-safe: the running image %s stays on the "
                "flash and keeps running; the NIC is usable as before. Do not reboot to 'fix' it; fix the error, then "
                "re-run (`flint -d %s q` shows what is on flash)." % (device.get("fw_running"), pci),
        "activate": "the flash holds %s but the NIC still RUNS %s (pending): the gate refuses this host until it is "
                    "activated. Reboot the host (or `mlxfwreset -d %s reset` where `mlxfwreset -d %s q` lists level 3 "
                    "as supported), then re-run this play to verify and put it back." % (tgt, device.get("fw_running"),
                                                                                         pci, pci),
        "verify": "the host was reset/rebooted but %s does not run %s (%s). A warm reboot may not activate CX8 "
                  "firmware on every platform: power-cycle the host from its BMC (cold/AC cycle), then re-run this "
                  "play; the host stays out of service meanwhile." % (device.get("device"), tgt, detail or "see above"),
        "gate": "the NIC runs %s (verified), but the firmware gate still refuses this host (%s): it stays out of "
                "service (maintenance lock); read the gate's message above, fix, re-run." % (tgt, detail or "see above"),
        "nccl": "the NIC runs %s (verified) and the gate passes, but the per-host NCCL run failed (%s): the host stays "
                "out of service (maintenance lock); run tools/triage -l <host> --traffic, fix, re-run (nothing is "
                "burned again)." % (tgt, detail or "see above"),
        "put_back": "the NIC runs %s (verified); the workers did not come back healthy: see the unit journal above, "
                    "fix, then re-run (nothing is burned again)." % tgt,
    }
    return texts.get(stage, "unknown stage %s" % stage)


def resume_command(host, inventory=None, root=None, maintenance=False):
    """The command that resumes the update of `host` (the same play: it plans again from what the NICs run now).
    inventory: the run's inventory source (shown relative to the repository root `root` when inside it)."""
    if inventory and root and os.path.isabs(inventory):
        rel = os.path.relpath(inventory, root)
        inventory = inventory if rel.startswith("..") else rel
    flag = " -e nic_firmware_update_maintenance=true" if maintenance else ""
    return "tools/fw-update %s-l %s%s" % ("-i %s " % inventory if inventory else "", host, flag)


def after_failure(stage, failure_kind, keep_out=False):
    """Whether a failed host goes back in service. Only after a FAIL-SAFE burn failure (flint's own error: the old
    image stays on the flash and keeps running, so the host serves as it did): its units and router membership come
    back unless keep_out (nic_firmware_update_keep_out_on_failure). Never after a refusal by the per-device lock or a
    NIC changed by another run (that run owns the host now), nor after a later stage (activation/verify: the NIC's
    state is not the one that served). Returns {put_back, reason}."""
    if stage != "burn" or failure_kind != "burn":
        if stage != "burn":
            why = "a failure at stage %s leaves the NIC in a state that did not serve before" % stage
        elif failure_kind in ("locked", "changed"):
            why = "another run holds or changed this NIC; it owns the host's service state"
        else:
            why = "the burn step failed without flint's own (fail-safe) burn error, so what the flash holds is unknown"
        return {"put_back": False, "reason": "stays out of service: %s" % why}
    if keep_out:
        return {"put_back": False, "reason": "kept out of service (nic_firmware_update_keep_out_on_failure=true); "
                                             "the old image still runs"}
    return {"put_back": True, "reason": "back in service: the burn is fail-safe, the old image still runs "
                                        "(nic_firmware_update_keep_out_on_failure=true keeps it out)"}


# --------------------------------------------------------------------------------------------- per-device lock
def lock_path(lock_dir, pci):
    """The per-device lock file of one NIC: <lock_dir>/b300-nic-<pci>.lock."""
    return os.path.join(lock_dir, "b300-nic-%s.lock" % str(pci).replace("/", "_"))


class DeviceLock(object):
    """An exclusive flock(2) on a NIC's lock file, held by this process around a burn or a reset and released by the
    kernel when the last process holding its descriptor ends: this one, and the burn or reset tool, which inherits
    it (fw_update_run._run), so a tool still running after its module was killed keeps the NIC locked. The holder (pid, machine, who/which run, since) is
    written into the file so a refused caller can name it. The file is never removed (removing a flock'ed file lets a
    third caller lock a new inode while the first still holds the old one)."""

    def __init__(self, path, holder):
        self.path = path
        self.holder = holder
        self.fd = None

    def acquire(self):
        """None when held now; else the holder's text (the caller is refused, nothing waits)."""
        d = os.path.dirname(self.path)
        if d and not os.path.isdir(d):
            os.makedirs(d, 0o755)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except (IOError, OSError) as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                os.close(fd)
                raise
            text = os.read(fd, 4096).decode("utf-8", "replace").strip()
            os.close(fd)
            return text or "(a holder that has not written its name yet)"
        doc = dict(self.holder, pid=os.getpid(), machine=socket.gethostname(),
                   since=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        os.ftruncate(fd, 0)
        os.write(fd, (json.dumps(doc, sort_keys=True) + "\n").encode("utf-8"))
        self.fd = fd
        return None

    def release(self):
        if self.fd is not None:
            os.close(self.fd)     # closing the descriptor drops the flock
            self.fd = None


def lock_refusal(device, what, holder_text, path):
    """The message of a caller refused by a NIC's lock."""
    return ("%s (%s): %s refused, nothing done: another run holds the NIC's lock %s: %s. Wait for it to end (its "
            "report names the result), then re-run: the plan is made again from what the NIC holds then"
            % (device["device"], device["pci_address"], what, path, holder_text))


def burn_still_needed(device, query):
    """Under the lock, before the burn: is the flash still what the plan saw? query: parse_flint_query of
    `flint -d PCI q` now (or {'error'}). None when the burn may go on, else why not (another run burned or changed the
    NIC since this run's plan: burning again would be a second burn of one NIC)."""
    where = "%s (%s)" % (device["device"], device["pci_address"])
    if query.get("error"):
        return "%s: burn refused: `flint -d %s q` under the lock failed (%s); nothing burned" % (
            where, device["pci_address"], query["error"])
    running = query.get("fw_running") or query.get("fw_version")
    flash = query.get("fw_version")
    seen_flash = device.get("fw_pending") or device.get("fw_running")
    if parse_fw(running) != parse_fw(device.get("fw_running")) or parse_fw(flash) != parse_fw(seen_flash):
        return ("%s: burn refused, nothing burned: the NIC changed since this run's plan (plan: running %s, flash %s; "
                "now: running %s, flash %s) - another run burned or activated it. Re-run: the plan is made again "
                "from what the NIC holds now" % (where, device.get("fw_running"), seen_flash, running, flash))
    return None


# --------------------------------------------------------------------------------------------- report
def host_result(host, planned, stage_reached, status, activation_info=None, verify=None, problems=None,
                timings=None, service=None, tool=None, after=None, resume=None):
    """One host's entry of the update report. after: after_failure's decision and what came of it ({put_back,
    reason, done, error}); resume: the command that resumes a failed or refused host."""
    devs = []
    for p in planned or []:
        d = dict(p)
        if status in ("failed", "refused") and p["action"] in ("burn", "activate"):
            d["state"] = nic_state(stage_reached, p)
        devs.append(d)
    return {"host": host, "status": status, "stage": stage_reached, "devices": devs, "activation": activation_info,
            "verify": verify, "problems": list(problems or []), "timings": dict(timings or {}), "service": service,
            "tool": tool, "after_failure": after, "resume": resume if status in ("failed", "refused") else None}


def render_report(results, run_name, check_mode=False):
    """Markdown + JSON-ready dict of the whole run: like the audit's (one table row per NIC)."""
    hosts = sorted(results, key=lambda r: r["host"])
    statuses = [r["status"] for r in hosts]
    exit_code = 2 if "failed" in statuses or "refused" in statuses else 0
    summary = {"hosts": len(hosts), "exit_code": exit_code, "check_mode": bool(check_mode),
               "by_status": {s: sorted(r["host"] for r in hosts if r["status"] == s) for s in sorted(set(statuses))}}
    rows = []
    for r in hosts:
        after = {v["device"]: v for v in ((r.get("verify") or {}).get("devices") or [])}
        for d in r["devices"]:
            a = after.get(d["device"])
            rows.append((r["host"], d["device"], d["model"], d["pci_address"], d["psid"], d["fw_running"],
                         d.get("target") or "-", d["action"] + (" DOWNGRADE" if d.get("downgrade") else ""),
                         (a["running"] if a else "-"), d["verdict"]))
    md = ["# NIC firmware update %s%s" % (run_name, " (check mode: nothing changed)" if check_mode else ""), ""]
    md += table(("host", "device", "model", "PCI", "psid", "before", "target", "action", "after", "verdict"), rows)
    md.append("")
    for r in hosts:
        act = r.get("activation") or {}
        tool = r.get("tool") or {}
        md.append("- **%s**: %s (stage %s)%s%s%s" % (
            r["host"], r["status"].upper(), r["stage"],
            "; tool: %s (%s)" % (tool.get("path") or tool.get("tool"), tool.get("reason")) if tool.get("tool") else "",
            "; activation: %s" % act.get("reason") if act else "",
            "; " + "; ".join(r["problems"]) if r["problems"] else ""))
        for d in r["devices"]:
            if d.get("downgrade"):
                md.append("  - %s: DOWNGRADE %s -> %s (allowed by allow_downgrade_from)" % (
                    d["device"], d.get("fw_running"), d.get("target")))
            if d.get("state") and not any(d["state"] in p for p in r["problems"]):
                md.append("  - %s: %s" % (d["device"], d["state"]))
        after = r.get("after_failure") or {}
        if after:
            came = (" - FAILED: %s" % after["error"]) if after.get("error") else ""
            md.append("  - service: %s%s" % (after.get("reason"), came))
        if r.get("resume"):
            md.append("  - resume: `%s`" % r["resume"])
        if r.get("timings"):
            md.append("  - timings (s): " + ", ".join("%s %s" % kv for kv in sorted(r["timings"].items())))
    return "\n".join(md) + "\n", {"name": run_name, "hosts": hosts, "summary": summary}
