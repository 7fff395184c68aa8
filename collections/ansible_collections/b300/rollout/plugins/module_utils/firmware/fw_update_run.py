# -*- coding: utf-8 -*-
"""The ConnectX firmware update's engine on a host (issue 29; moved out of plugins/modules/nic_firmware_update.py by
issue 39, which is now its shell): each action runs the tools (through the module's run_command, every argv kept in
`commands`) and sequences the decisions of fw_update.py. `run(module)` returns (changed, result) or raises Refused
with the failure's message and result (the module passes both to fail_json)."""
from __future__ import annotations

import glob
import json
import os
import shutil
import time

from ansible_collections.b300.rollout.plugins.module_utils.firmware import fw_update as fu
from ansible_collections.b300.rollout.plugins.module_utils.hw.fw_matrix import MatrixError, merge_rows
from ansible_collections.b300.rollout.plugins.module_utils.hw.tools import find_tool


class Refused(Exception):
    """The action failed or was refused: msg and the rest of the module's failure result."""

    def __init__(self, msg, **result):
        Exception.__init__(self, msg)
        self.msg, self.result = msg, result


def _run(module, argv, commands, lock=None):
    """run_command; lock: the NIC's DeviceLock, whose descriptor the command inherits, so the lock lives as long as
    the burn or reset does - also when this module process dies first (killed, OOM, a lost session) and the tool
    runs on: a second run is refused by the lock instead of burning a half-written flash again."""
    commands.append(list(argv))
    rc, out, err = module.run_command(argv, pass_fds=[lock.fd] if lock is not None else None)
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
        raise Refused("nic_firmware_update: %s" % exc, plan={}, burned=[], activated=[], commands=commands,
                      failed_device=None) from None


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
        raise Refused(fu.lock_refusal(d, what, holder, path), failed_device=dict(d, kind="locked"),
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
                raise Refused(why, plan=pl, burned=done, activated=[], commands=commands,
                              failed_device=dict(d, kind="changed", state=why),
                              after_failure=fu.after_failure("burn", "changed", p["keep_out_on_failure"]))
            t0 = time.monotonic()
            rc, out, err = _run(module, argv, commands, lock=lock)
        finally:
            lock.release()
        res = fu.parse_flint_burn(out + "\n" + err, rc)
        if not res["ok"]:
            state = fu.nic_state("burn", d)
            raise Refused("%s (%s): burn failed: %s. NIC state: %s" % (d["device"], d["pci_address"],
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
            raise Refused("%s (%s): refused mlxfwreset -l %s: %s" % (
                d["device"], d["pci_address"], level, "; ".join(fu.check_live_levels([level]))), plan=pl, burned=[],
                activated=done, commands=commands, failed_device=dict(d, state=fu.nic_state("activate", d)))
        if module.check_mode:
            commands.append(argv)
            continue
        lock = _locked(module, p, d, "reset", commands, pl, "activated", done)
        try:
            t0 = time.monotonic()
            rc, out, err = _run(module, argv, commands, lock=lock)
        finally:
            lock.release()
        res = fu.parse_mlxfwreset_reset(out + "\n" + err, rc)
        why = fu.judge_live_reset(res, level)
        if why:
            state = fu.nic_state("activate", d)
            raise Refused("%s (%s): mlxfwreset -l %s: %s. NIC state: %s" % (
                d["device"], d["pci_address"], level, why, state), plan=pl, burned=[],
                activated=done, commands=commands, failed_device=dict(d, kind="reset", output=(out + err)[-2000:],
                                                                      state=state))
        done.append({"device": d["device"], "level": level, "seconds": round(time.monotonic() - t0, 2),
                     "stages": res["stages"]})
    return done


def run(module):
    """The action module.params["action"] names, on the module's params (its argument spec's keys)."""
    p = module.params
    commands = []
    result = {"plan": p["plan"], "burned": [], "activated": [], "commands": commands, "failed_device": None}
    if p["action"] == "devices":
        result["plan"] = devices_only(module, p, commands)
        result["service"] = fu.service_mode(p["instances"], p["host"], p["router_hosts"], p["maintenance"])
        return False, result
    if p["action"] == "verify":
        result["verify"] = fu.verify_running(p["plan"].get("devices") or [], p["rdma_nics"])
        if not result["verify"]["ok"]:
            bad = [d for d in p["plan"]["devices"] if d["device"] in " ".join(result["verify"]["problems"])]
            raise Refused("running firmware is not the target: %s. NIC state: %s" % (
                "; ".join(result["verify"]["problems"]), " ".join(fu.nic_state("verify", d) for d in bad)), **result)
        return False, result
    if p["action"] == "report":
        if not p["report_dir"]:
            raise Refused("action=report needs report_dir", **result)
        result["report"] = report(p)
        return False, result
    if p["action"] == "plan":
        result["plan"] = plan(module, p, commands)
        if result["plan"]["problems"]:
            raise Refused("nic_firmware_update plan refused, nothing changed: " + " | ".join(
                result["plan"]["problems"]), **result)
        return False, result
    if p["action"] == "burn":
        result["burned"] = burn(module, p, commands)
        return bool(result["burned"]), result
    result["activated"] = activate(module, p, commands)
    return bool(result["activated"]), result
