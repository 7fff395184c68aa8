#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: plan, burn and live-activate ConnectX firmware (decisions in module_utils/fw_update.py)."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: nic_firmware_update
short_description: Plan, burn and live-reset ConnectX NIC firmware, one host, decided by the firmware gate's matrix
description:
  - V(plan) (read-only, also in check mode) judges every device of O(rdma_nics) with the gate's matrix and judge
    (module_utils/fw_matrix.py), picks the burning tool (C(flint) of NVIDIA MFT, else C(mstflint), each only from the
    version that knows the ConnectX-8), and for every device to burn checks the image before anything changes - its
    sha256 against the inventory's, and the PSID and version the image itself carries (C(flint -i IMAGE query)) against
    the device and the target, C(flint -i IMAGE verify) - and asks C(mlxfwreset -d DEV query) which reset levels the
    device supports (live reset or reboot). A device already at its target is skipped (no burn, no reset). A target
    OLDER than the running version (a downgrade) is refused unless the image entry's C(allow_downgrade_from) lists
    that running version; an allowed one is marked C(downgrade) and its reason starts with DOWNGRADE.
  - V(burn) runs C(flint -d PCI -i IMAGE -y burn) for each device the plan burns, one after the other; the first
    failure stops the module, naming the device, the tool's error and what state the NIC is in. Never passes
    C(-allow_psid_change), C(-nofs) or C(-clear_semaphore). Each burn runs under the NIC's lock (O(lock_dir)), after
    C(flint -d PCI q) shows the flash still holds what the plan saw (else another run burned it, and it is refused).
  - V(activate) runs C(mlxfwreset -d PCI reset -l LEVEL -y) where the plan chose a live reset, under the NIC's lock;
    a reboot plan is the caller's (the role reboots the host).
  - V(devices) (read-only, no tool run) is the plan without the tools - what each device needs and what taking the
    host out of service means (O(instances), O(router_hosts), O(maintenance)) - so nothing is copied to a host that
    needs nothing.
  - V(verify) (read-only) compares the RUNNING version of every burned device (O(rdma_nics) read after the
    activation) with its target and fails, naming the NIC's state and the fix, when one differs or still has an image
    pending.
  - V(report) (on the controller) renders every host entry under O(report_dir)/O(report_name).d/ into
    O(report_dir)/O(report_name).md and .json (and latest.md / latest.json), like the firmware audit's report.
  - Check mode - V(devices), V(plan), V(verify) run fully (they only read); V(burn) and V(activate) run nothing and
    return what they would run; V(report) writes the report (of a check-mode run, marked so).
  - Tools looked up in O(bin_path) before C(PATH) - flint, mstflint, mlxfwreset (or mstfwreset).
version_added: "1.3.0"
extends_documentation_fragment: [ansible.builtin.action_common_attributes, b300.rollout.common]
attributes:
  check_mode:
    support: full
    details: V(plan) reads only and runs; V(burn) / V(activate) change nothing and report what they would run.
options:
  action:
    description: What to do (see the description).
    type: str
    required: true
    choices: [devices, plan, burn, activate, verify, report]
  rdma_nics:
    description: The host's C(ansible_facts.rdma_nics) (V(plan)).
    type: dict
    default: {}
  matrix:
    description: Built-in matrix rows (C(nic_firmware_gate_matrix_rows)) (V(plan)).
    type: list
    elements: dict
    default: []
  extra_rows:
    description: Operator rows (C(nic_firmware_gate_extra_rows)), checked first (V(plan)).
    type: list
    elements: dict
    default: []
  policy:
    description: The gate's policy (unknown, pending_reset, ignore_roles), as C(nic_firmware_check) takes it.
    type: dict
    default: {}
  images:
    description:
      - Firmware images, one per PSID and version - C(psid), C(version), C(sha256) (64 hex digits, pinned in the
        inventory), C(path), C(where) and, for V(plan), C(host_path) (where the role put it on the host). V(devices)
        checks the list's shape.
      - C(allow_downgrade_from) (optional, one version or a list) - the RUNNING versions this image may replace although
        it is older (an explicit rollback, per PSID and version); without it a downgrade is refused.
    type: list
    elements: dict
    default: []
  tool_minimums:
    description: Lowest package version that may burn a ConnectX-8 - C(mft) and C(mstflint) (defaults in module_utils/fw_update.py).
    type: dict
    default: {}
  live_levels:
    description:
      - mlxfwreset levels a live activation may use, in order of preference, only where the device says it supports them.
      - Only 0 and 3 keep the host up (mstfwreset(1) - 4 is a warm and 5 a cold reboot of the machine); any other level
        is refused by V(devices) and V(plan), and the reset's transcript is read - a reset that reboots the machine fails.
    type: list
    elements: int
    default: [3]
  plan:
    description: The C(plan) a V(plan) run returned (V(burn) and V(activate)).
    type: dict
    default: {}
  instances:
    description: The SGLang plan's instances (C(sglang_plan.instances) - host, role, id) (V(devices)).
    type: list
    elements: dict
    default: []
  router_hosts:
    description: Hosts that run the router (the C(sglang_router) group) (V(devices)).
    type: list
    elements: str
    default: []
  maintenance:
    description: The operator's explicit maintenance flag - allows an update that stops the whole fleet (PD, router host).
    type: bool
    default: false
  host:
    description: The host's inventory name (V(devices)).
    type: str
    default: ""
  report_dir:
    description: Directory of the reports on the controller (V(report)).
    type: path
  report_name:
    description: Name of this run's report (V(report)).
    type: str
    default: latest
  missing_image_ok:
    description: V(plan) in check mode - an image not yet copied to the host is reported as not checked, not as a problem.
    type: bool
    default: false
  check_mode_run:
    description: The run being reported was a check-mode run (V(report)).
    type: bool
    default: false
  bin_path:
    description: Directories searched for flint, mstflint and mlxfwreset before C(PATH) (the C(hw_bin_path) setting).
    type: list
    elements: path
    default: []
  lock_dir:
    description:
      - V(burn) and V(activate) hold an exclusive C(flock) on C(<lock_dir>/b300-nic-<pci>.lock) around each device's
        burn (with a re-read of its flash, C(flint -d PCI q), first) and reset; the kernel frees it when the module
        ends. A second caller is refused at once, naming the holder written in the file.
    type: path
    default: /run/lock
  lock_holder:
    description: Who and which run holds the per-device lock (written into the lock file, named to a refused caller).
    type: str
    default: ""
  keep_out_on_failure:
    description: >-
      V(burn) - a fail-safe burn failure (the old image runs) returns RV(after_failure) C(put_back=true) unless
      this is set (C(nic_firmware_update_keep_out_on_failure)).
    type: bool
    default: false
notes:
  - V(plan) fails (after returning the plan) when any device cannot be updated safely; the message lists every problem.
"""

EXAMPLES = r"""
- name: What would be burned, and is the image right (read-only)
  b300.rollout.nic_firmware_update:
    action: plan
    rdma_nics: "{{ ansible_facts.rdma_nics }}"
    matrix: "{{ nic_firmware_gate_matrix_rows }}"
    images:
      - {psid: MT_0000001217, version: "40.47.1026", sha256: "{{ cx8_sha256 }}", host_path: /var/tmp/fw/cx8.bin}
  register: fw_plan

- name: Burn the planned devices
  b300.rollout.nic_firmware_update:
    action: burn
    plan: "{{ fw_plan.plan }}"

- name: Live reset where the plan chose it
  b300.rollout.nic_firmware_update:
    action: activate
    plan: "{{ fw_plan.plan }}"
  when: fw_plan.plan.activation.method == 'live'
"""

RETURN = r"""
plan:
  description: >-
    devices (per device - device, pci_address, model, psid, role, fw_running, fw_pending, verdict, row, rule,
    expected, target, action skip|burn|activate|refuse, downgrade, reason, image), downgrades (the reason of each
    allowed downgrade, one line each), tool (tool, package, version, ok, reason,
    path, checked), reset_tool (path or null), activation (method live|reboot|none, level, per_device, reason),
    problems (one line each), to_burn and to_activate (device names).
  returned: always
  type: dict
  sample: {to_burn: [mlx5_3], activation: {method: reboot}}
burned:
  description: >-
    Devices burned by this run (V(burn)), each with device, pci_address, target, flash_before, flash_new, downgrade
    (an allowed downgrade), seconds.
  returned: always
  type: list
  elements: dict
activated:
  description: >-
    Devices live-reset by this run (V(activate)), each with device, level, seconds and stages (the transcript's
    C(-I-) stages and their Done/Skipped).
  returned: always
  type: list
  elements: dict
commands:
  description: Every command this run ran or, in check mode, would run (argv lists).
  returned: always
  type: list
  elements: list
failed_device:
  description: >-
    The device whose burn or reset failed or was refused, with kind (burn - flint failed, fail-safe; changed - the
    flash is not what the plan saw; locked - another run holds the NIC's lock; reset), the tool's output and the NIC's
    state (null when none).
  returned: always
  type: dict
after_failure:
  description: >-
    On a failed or refused V(burn) / V(activate) only - put_back (whether the role puts the host back in service: only
    after flint's own fail-safe burn failure, unless O(keep_out_on_failure)) and reason (module_utils fw_update.after_failure).
  returned: on failure of burn or activate
  type: dict
service:
  description: V(devices) - mode none|rolling|outage, allowed, instances (ids on this host), reason.
  returned: when action is devices
  type: dict
verify:
  description: V(verify) - ok, devices (device, target, running, pending, ok), problems.
  returned: when action is verify
  type: dict
report:
  description: >-
    V(report) - md and json (paths written), text (the Markdown), summary (hosts, exit_code 0|2, check_mode,
    by_status) and resume (host - the command that resumes each failed or refused host).
  returned: when action is report
  type: dict
"""

import glob
import json
import os
import shutil
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.b300.rollout.plugins.module_utils import fw_update as fu
from ansible_collections.b300.rollout.plugins.module_utils.fw_matrix import MatrixError, merge_rows
from ansible_collections.b300.rollout.plugins.module_utils.tools import find_tool


def _run(module, argv, commands):
    commands.append(list(argv))
    rc, out, err = module.run_command(argv)
    return rc, out or "", err or ""


def _tool(module, p, commands):
    texts, paths = {}, {}
    for name in fu.TOOL_ORDER:
        path = find_tool(module, name, p["bin_path"])
        paths[name] = path
        texts[name] = None
        if path:
            rc, out, err = _run(module, [path, "--version"], commands)
            texts[name] = out if rc == 0 else (out + err or "rc %d" % rc)
    choice = fu.choose_tool(texts, p["tool_minimums"])
    choice["path"] = paths.get(choice["tool"]) if choice["tool"] else None
    return choice


def _rows(module, p, commands):
    try:
        return merge_rows(p["matrix"], p["extra_rows"])
    except MatrixError as exc:
        module.fail_json(msg="nic_firmware_update: %s" % exc, plan={}, burned=[], activated=[], commands=commands,
                         failed_device=None)


def devices_only(module, p, commands):
    devices = fu.apply_downgrades(fu.plan_devices(p["rdma_nics"], _rows(module, p, commands), p["policy"]), p["images"])
    return {"devices": devices, "to_burn": [d["device"] for d in devices if d["action"] == "burn"],
            "to_activate": [d["device"] for d in devices if d["action"] in ("burn", "activate")],
            "problems": fu.check_images_input(p["images"]) + fu.check_live_levels(p["live_levels"]) + [
                "%s (%s): %s" % (d["device"], d["pci_address"], d["reason"]) for d in devices if d["action"] == "refuse"]}


def report(p):
    d = os.path.join(p["report_dir"], p["report_name"] + ".d")
    results = []
    for f in sorted(glob.glob(os.path.join(d, "*.json"))):
        with open(f) as fh:
            e = json.load(fh)
        if e.get("status") == "failed" and not e.get("after_failure"):
            e["after_failure"] = fu.after_failure(e.get("stage"), None)
        results.append(fu.host_result(e["host"], (e.get("plan") or {}).get("devices"), e.get("stage"), e.get("status"),
                                      (e.get("plan") or {}).get("activation"), e.get("verify"), e.get("problems"),
                                      fu.spans(e.get("stamps"), e.get("end")), e.get("service"),
                                      (e.get("plan") or {}).get("tool"), e.get("after_failure"),
                                      fu.resume_command(e["host"], e.get("inventory"), e.get("root"),
                                                        (e.get("service") or {}).get("mode") == "outage")))
    md, js = fu.render_report(results, p["report_name"], p["check_mode_run"])
    paths = {}
    for ext, text in (("md", md), ("json", json.dumps(js, indent=2, sort_keys=True) + "\n")):
        path = os.path.join(p["report_dir"], "%s.%s" % (p["report_name"], ext))
        with open(path + ".tmp", "w") as fh:
            fh.write(text)
        os.replace(path + ".tmp", path)
        shutil.copyfile(path, os.path.join(p["report_dir"], "latest.%s" % ext))
        paths[ext] = path
    return dict(paths, summary=js["summary"], text=md, resume={r["host"]: r["resume"] for r in results if r["resume"]})


def plan(module, p, commands):
    devices = fu.apply_downgrades(fu.plan_devices(p["rdma_nics"], _rows(module, p, commands), p["policy"]), p["images"])
    todo = [d for d in devices if d["action"] in ("burn", "activate")]
    problems = ["%s (%s): %s" % (d["device"], d["pci_address"], d["reason"]) for d in devices if d["action"] == "refuse"]
    problems += fu.check_live_levels(p["live_levels"])
    tool = _tool(module, p, commands) if todo else {"tool": None, "ok": True, "reason": "nothing to burn", "path": None,
                                                    "checked": []}
    if todo and not tool["ok"]:
        problems.append(tool["reason"])
    for d in devices:
        if d["action"] != "burn":
            continue
        entry = fu.pick_image(p["images"], d["psid"], d["target"])
        d["image"] = (entry or {}).get("host_path")
        if entry is None or not tool["ok"]:
            problems += fu.check_image(entry, None, {}, {"ok": False}, d) if entry is None else []
            continue
        path = entry.get("host_path")
        if (not path or not os.path.isfile(path)) and p["missing_image_ok"]:
            d["image_check"] = {"skipped": "image not on the host (check mode copies nothing); its sha256 was checked "
                                           "on the controller, its PSID and version are checked on a real run"}
            continue
        if not path or not os.path.isfile(path):
            problems.append("%s: image %s not found on this host" % (d["device"], path))
            continue
        rc, out, err = _run(module, [tool["path"], "-i", path, "query"], commands)
        try:
            query = fu.parse_flint_query(out + err) if rc == 0 else {"error": (err or out).strip()[:300]}
        except ValueError as exc:
            query = {"error": str(exc)}
        rc, out, err = _run(module, [tool["path"], "-i", path, "verify"], commands)
        verify = fu.parse_flint_verify(out + err, rc)
        d["image_check"] = {"query": query, "verify": verify}
        problems += fu.check_image(dict(entry, path=path), module.sha256(path), query, verify, d)
    reset_tool = find_tool(module, "mlxfwreset", p["bin_path"]) or find_tool(module, "mstfwreset", p["bin_path"])
    queries = {}
    for d in todo:
        if not reset_tool:
            queries[d["device"]] = {"error": "mlxfwreset / mstfwreset not found"}
            continue
        rc, out, err = _run(module, [reset_tool, "-d", d["pci_address"], "query"], commands)
        try:
            queries[d["device"]] = fu.parse_mlxfwreset_query(out) if rc == 0 else {"error": (err or out).strip()[:300]}
        except ValueError as exc:
            queries[d["device"]] = {"error": str(exc)}
    act = fu.activation(queries, p["live_levels"])
    return {"devices": devices, "tool": tool, "reset_tool": reset_tool, "activation": act, "problems": problems,
            "downgrades": [d["reason"] for d in devices if d.get("downgrade")],
            "to_burn": [d["device"] for d in devices if d["action"] == "burn"],
            "to_activate": [d["device"] for d in todo]}


def _locked(module, p, d, what, commands, pl, done_key, done):
    """The NIC's lock (fu.DeviceLock), held until the caller releases it; a held lock refuses this call, naming its
    holder."""
    path = fu.lock_path(p["lock_dir"], d["pci_address"])
    lock = fu.DeviceLock(path, {"holder": "nic_firmware_update %s" % what, "run": p["lock_holder"],
                                "device": d["device"]})
    try:
        holder = lock.acquire()
    except (IOError, OSError) as exc:
        holder = "the lock could not be taken: %s" % exc
    if holder is not None:
        res = {"plan": pl, "burned": [], "activated": [], "commands": commands}
        res[done_key] = done
        module.fail_json(msg=fu.lock_refusal(d, what, holder, path), failed_device=dict(d, kind="locked"),
                         after_failure=fu.after_failure("burn" if what == "burn" else "activate", "locked",
                                                        p["keep_out_on_failure"]), **res)
    return lock


def burn(module, p, commands):
    pl = p["plan"]
    done = []
    for d in [x for x in pl.get("devices", []) if x["action"] == "burn"]:
        argv = [pl["tool"]["path"], "-d", d["pci_address"], "-i", d["image"], "-y", "burn"]
        if module.check_mode:
            commands.append(argv)
            continue
        lock = _locked(module, p, d, "burn", commands, pl, "burned", done)
        try:
            rc, out, err = _run(module, [pl["tool"]["path"], "-d", d["pci_address"], "q"], commands)
            try:
                query = fu.parse_flint_query(out + err) if rc == 0 else {"error": (err or out).strip()[:300]}
            except ValueError as exc:
                query = {"error": str(exc)}
            why = fu.burn_still_needed(d, query)
            if why:
                module.fail_json(msg=why, plan=pl, burned=done, activated=[], commands=commands,
                                 failed_device=dict(d, kind="changed", state=why),
                                 after_failure=fu.after_failure("burn", "changed", p["keep_out_on_failure"]))
            t0 = time.monotonic()
            rc, out, err = _run(module, argv, commands)
        finally:
            lock.release()
        res = fu.parse_flint_burn(out + "\n" + err, rc)
        if not res["ok"]:
            state = fu.nic_state("burn", d)
            module.fail_json(msg="%s (%s): burn failed: %s. NIC state: %s" % (d["device"], d["pci_address"],
                                                                              res["error"], state),
                             plan=pl, burned=done, activated=[], commands=commands,
                             failed_device=dict(d, kind="burn", output=(out + err)[-2000:], state=state),
                             after_failure=fu.after_failure("burn", "burn", p["keep_out_on_failure"]))
        done.append({"device": d["device"], "pci_address": d["pci_address"], "target": d["target"],
                     "flash_before": res["flash_before"], "flash_new": res["flash_new"],
                     "downgrade": bool(d.get("downgrade")), "seconds": round(time.monotonic() - t0, 2)})
    return done


def activate(module, p, commands):
    pl = p["plan"]
    act = pl.get("activation") or {}
    done = []
    if act.get("method") != "live":
        return done
    for d in [x for x in pl.get("devices", []) if x["action"] in ("burn", "activate")]:
        level = act["per_device"][d["device"]]["level"]
        argv = [pl["reset_tool"], "-d", d["pci_address"], "reset", "-l", str(level), "-y"]
        if level not in fu.LIVE_RESET_LEVELS:      # a plan from elsewhere: never a level that reboots the machine
            module.fail_json(msg="%s (%s): refused mlxfwreset -l %s: %s" % (
                d["device"], d["pci_address"], level, "; ".join(fu.check_live_levels([level]))), plan=pl, burned=[],
                activated=done, commands=commands, failed_device=dict(d, state=fu.nic_state("activate", d)))
        if module.check_mode:
            commands.append(argv)
            continue
        lock = _locked(module, p, d, "reset", commands, pl, "activated", done)
        try:
            t0 = time.monotonic()
            rc, out, err = _run(module, argv, commands)
        finally:
            lock.release()
        res = fu.parse_mlxfwreset_reset(out + "\n" + err, rc)
        why = fu.judge_live_reset(res, level)
        if why:
            state = fu.nic_state("activate", d)
            module.fail_json(msg="%s (%s): mlxfwreset -l %s: %s. NIC state: %s" % (
                d["device"], d["pci_address"], level, why, state), plan=pl, burned=[],
                activated=done, commands=commands, failed_device=dict(d, kind="reset", output=(out + err)[-2000:],
                                                                      state=state))
        done.append({"device": d["device"], "level": level, "seconds": round(time.monotonic() - t0, 2),
                     "stages": res["stages"]})
    return done


def main():
    module = AnsibleModule(
        argument_spec=dict(
            action=dict(type="str", required=True, choices=["devices", "plan", "burn", "activate", "verify", "report"]),
            instances=dict(type="list", elements="dict", default=[]),
            router_hosts=dict(type="list", elements="str", default=[]),
            maintenance=dict(type="bool", default=False),
            host=dict(type="str", default=""),
            report_dir=dict(type="path"),
            report_name=dict(type="str", default="latest"),
            check_mode_run=dict(type="bool", default=False),
            missing_image_ok=dict(type="bool", default=False),
            rdma_nics=dict(type="dict", default={}),
            matrix=dict(type="list", elements="dict", default=[]),
            extra_rows=dict(type="list", elements="dict", default=[]),
            policy=dict(type="dict", default={}),
            images=dict(type="list", elements="dict", default=[]),
            tool_minimums=dict(type="dict", default={}),
            live_levels=dict(type="list", elements="int", default=[3]),
            plan=dict(type="dict", default={}),
            bin_path=dict(type="list", elements="path", default=[]),
            lock_dir=dict(type="path", default="/run/lock"),
            lock_holder=dict(type="str", default=""),
            keep_out_on_failure=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    p = module.params
    commands = []
    result = {"plan": p["plan"], "burned": [], "activated": [], "commands": commands, "failed_device": None}
    if p["action"] == "devices":
        result["plan"] = devices_only(module, p, commands)
        result["service"] = fu.service_mode(p["instances"], p["host"], p["router_hosts"], p["maintenance"])
        module.exit_json(changed=False, **result)
    if p["action"] == "verify":
        result["verify"] = fu.verify_running(p["plan"].get("devices") or [], p["rdma_nics"])
        if not result["verify"]["ok"]:
            bad = [d for d in p["plan"]["devices"] if d["device"] in " ".join(result["verify"]["problems"])]
            module.fail_json(msg="running firmware is not the target: %s. NIC state: %s" % (
                "; ".join(result["verify"]["problems"]), " ".join(fu.nic_state("verify", d) for d in bad)), **result)
        module.exit_json(changed=False, **result)
    if p["action"] == "report":
        if not p["report_dir"]:
            module.fail_json(msg="action=report needs report_dir", **result)
        result["report"] = report(p)
        module.exit_json(changed=False, **result)
    if p["action"] == "plan":
        result["plan"] = plan(module, p, commands)
        if result["plan"]["problems"]:
            module.fail_json(msg="nic_firmware_update plan refused, nothing changed: " + " | ".join(
                result["plan"]["problems"]), **result)
        module.exit_json(changed=False, **result)
    if p["action"] == "burn":
        result["burned"] = burn(module, p, commands)
        module.exit_json(changed=bool(result["burned"]), **result)
    result["activated"] = activate(module, p, commands)
    module.exit_json(changed=bool(result["activated"]), **result)


if __name__ == "__main__":
    main()
