# -*- coding: utf-8 -*-
"""Rollout state and decisions of roles/sglang, in plain Python (no Ansible imports; unit tests in
tests/unit/test_sglang_rollout.py).

What the role's task files used to compute in Jinja, one function per decision:

- reading what serves now: ``parse_systemctl_show`` (the ``systemctl show -p ...`` blocks of several units),
  ``env_api_key`` (the key an env file holds, as the role's templates write it);
- what changed and what to restart: ``pending_restart`` (a unit or env file newer than the running process: a run
  stopped between writing and restarting), ``restart_ids`` (unit, env file or venv changed, or pending),
  ``split_restarts`` (restart now, or leave to the rolling pass behind the router), ``rolling_order`` (decode,
  prefill, then regular workers: the one place that order is written);
- the API key: ``key_change`` (first, none, add, remove, rotate: the order a changed key rolls in);
- router membership: ``workers_view``, ``membership_check`` (before an instance leaves the router, every other planned
  instance must be healthy), ``worker_body`` (what POST /workers gets), ``missing_workers`` and ``unhealthy_workers``;
- the rollback: ``rollback_plan`` (what served before the run, what this run restarted, what to restore, restart
  and re-add, and what cannot be rolled back because its host is unreachable).

The data shapes are those of the modules that read the hosts (b300.rollout.sglang_units_state,
b300.rollout.sglang_router_members) and of the plan (b300.rollout.sglang_plan: instances with id, host, role, url,
unit_name, env_file; router with host, unit_name, env_file, workers).
"""

from __future__ import absolute_import, division, print_function

import json
import re

__metaclass__ = type

# the order a rolling pass restarts instances in: decode first (a prefill whose decode restarts loses its KV target
# for a moment; the other way round a decode would wait on a prefill that is restarting), then prefill, then regular
# workers. Plan order within each role.
ROLLING_ROLE_ORDER = ("decode", "prefill", "worker")
STRATEGIES = ("rolling", "parallel", "none")
KEY_CHANGES = ("first", "none", "add", "remove", "rotate")

# the env files' key line, as templates/etc/sglang/*.env.j2 write it: SGLANG_API_KEY="<key with \ and " escaped>"
_KEY_LINE = re.compile(r'^SGLANG_API_KEY="(.*)"$', re.M)
_UNESCAPE = re.compile(r"\\(.)")


def parse_systemctl_show(text):
    """``systemctl show -p Id,... U1 U2 ...`` output -> {Id: {property: value}} (blocks are separated by a blank line;
    a unit systemd does not know still has a block, with ActiveState=inactive and LoadState=not-found)."""
    out = {}
    for block in (text or "").split("\n\n"):
        props = {}
        for line in block.splitlines():
            if "=" in line:
                key, value = line.split("=", 1)
                props[key] = value
        if props.get("Id"):
            out[props["Id"]] = props
    return out


def unix_seconds(value):
    """A ``systemctl show --timestamp=unix`` value ('@1733212345', '' or 'n/a') -> int seconds, or None."""
    value = (value or "").strip()
    if value.startswith("@"):
        value = value[1:]
    return int(value) if value.isdigit() else None


def env_api_key(text):
    """The API key an env file holds ('' when none): the first SGLANG_API_KEY="..." line, unescaped."""
    m = _KEY_LINE.search(text or "")
    return _UNESCAPE.sub(r"\1", m.group(1)) if m else ""


def key_change(env_text, new_key):
    """What a run does to the API key of a serving fleet, from the router's env file as it is now (None: no env file,
    nothing served) and the key the run writes ('' = none). tasks/router_key.yml explains the orders:
    add = router first, remove = workers first, rotate = refused with the rolling strategy."""
    if env_text is None:
        return "first"
    now = env_api_key(env_text)
    new_key = new_key or ""
    if now == new_key:
        return "none"
    if not now:
        return "add"
    if not new_key:
        return "remove"
    return "rotate"


def pending_restart(instances, units, mtimes):
    """Ids of instances whose unit or env file is newer than the process that runs now (an earlier run stopped
    between writing the files and restarting): restarted like a changed instance.

    instances: [{id, unit_name, env_file}]; units: {unit: {ActiveState, ExecMainStartTimestamp}} (parse_systemctl_show
    of --timestamp=unix output); mtimes: {path: int seconds} (absent files left out). An inactive unit is not
    pending (it is started anyway), nor one whose start time is unknown."""
    out = []
    for inst in instances:
        unit = units.get(inst["unit_name"], {})
        started = unix_seconds(unit.get("ExecMainStartTimestamp"))
        if unit.get("ActiveState") != "active" or started is None:
            continue
        times = [mtimes[p] for p in ("/etc/systemd/system/" + inst["unit_name"], inst["env_file"]) if p in mtimes]
        if times and max(times) > started:
            out.append(inst["id"])
    return out


def restart_ids(instance_ids, unit_changed, env_changed, venv_changed=False, pending=()):
    """Instances to (re)start because their unit file, env file or venv changed, or a restart is still pending.
    unit_changed / env_changed: {id: bool}. Plan order, each id once."""
    wanted = set(pending)
    for iid in instance_ids:
        if venv_changed or unit_changed.get(iid) or env_changed.get(iid):
            wanted.add(iid)
    return [iid for iid in instance_ids if iid in wanted]


def split_restarts(strategy, instances, changed_ids, listed_urls):
    """Changed instances -> {'now': ids restarted at once, 'rolling': ids left to the rolling pass behind the router}.

    rolling: an instance the router lists (the fleet serves through it) waits for the rolling pass; one it does not
    list (first deploy, no router yet) restarts now. parallel: every changed instance now. none: nothing restarts
    (files only). listed_urls: the worker URLs GET /workers lists ([] when the router did not answer 200)."""
    if strategy not in STRATEGIES:
        raise ValueError("unknown restart strategy %r (expected one of %s)" % (strategy, ", ".join(STRATEGIES)))
    changed = [i for i in instances if i["id"] in set(changed_ids)]
    if strategy == "none":
        return {"now": [], "rolling": []}
    if strategy == "parallel":
        return {"now": [i["id"] for i in changed], "rolling": []}
    listed = set(listed_urls or [])
    return {"now": [i["id"] for i in changed if i["url"] not in listed],
            "rolling": [i["id"] for i in changed if i["url"] in listed]}


def rolling_order(instances, ids):
    """The planned instances among ids in the order a rolling pass restarts them (ROLLING_ROLE_ORDER, then plan
    order). Ids the plan does not have are an error: a rolling pass never silently skips what it was asked for."""
    ids = list(ids)
    known = {i["id"] for i in instances}
    unknown = [i for i in ids if i not in known]
    if unknown:
        raise ValueError("not planned instances: %s (planned: %s)" % (", ".join(unknown), ", ".join(sorted(known))))
    wanted = set(ids)
    return [i for role in ROLLING_ROLE_ORDER for i in instances if i["role"] == role and i["id"] in wanted]


# ---- router membership ----------------------------------------------------------------------------------------

def workers_view(listing):
    """GET /workers JSON -> [{id, url, worker_type, is_healthy}] (nothing else: no key ever leaves the module)."""
    out = []
    for w in (listing or {}).get("workers") or []:
        if isinstance(w, dict) and w.get("url"):
            out.append({"id": w.get("id", ""), "url": w["url"], "worker_type": w.get("worker_type", "regular"),
                        "is_healthy": bool(w.get("is_healthy"))})
    return out


def healthy_urls(view):
    return [w["url"] for w in view if w["is_healthy"]]


def unhealthy_workers(planned, view):
    """Planned workers ({id, url}) the router does not list healthy (absent, or listed unhealthy)."""
    ok = set(healthy_urls(view))
    return [w for w in planned if w["url"] not in ok]


def missing_workers(planned, view):
    """Planned workers the router does not list at all."""
    listed = {w["url"] for w in view}
    return [w for w in planned if w["url"] not in listed]


def membership_check(leaving, others, view, router_url):
    """Before ``leaving`` ({id, url}) is taken out of the router: every other planned worker must be listed healthy,
    else taking it out could leave nothing (or less than planned) serving. Returns '' or the failure message."""
    bad = unhealthy_workers(others, view)
    if not bad:
        return ""
    found = ", ".join("%s healthy=%s" % (w["url"], w["is_healthy"]) for w in view) or "no worker"
    msg = ("pre-check: the router (%s/workers) does not list %s as healthy (found: %s); expected every planned "
           "instance other than %s healthy before it is removed; fix those first"
           % (router_url, ", ".join(w["id"] for w in bad), found, leaving["id"]))
    if not healthy_urls(view):
        msg += ("; no planned instance is healthy, so a rolling restart protects nothing: rerun with "
                "-e sglang_restart_strategy=parallel")
    return msg


def worker_body(planned, api_key=""):
    """The POST /workers body for a planned router worker ({url, worker_type, bootstrap_port}): worker_type only when
    not regular, bootstrap_port only when set, api_key only when the router runs with one (the router then sends it
    on the worker's health checks; without it a keyed worker answers 401)."""
    body = {"url": planned["url"]}
    if planned.get("worker_type", "regular") != "regular":
        body["worker_type"] = planned["worker_type"]
    if planned.get("bootstrap_port"):
        body["bootstrap_port"] = planned["bootstrap_port"]
    if api_key:
        body["api_key"] = api_key
    return body


# ---- rollback ---------------------------------------------------------------------------------------------------

def _unit_path(unit):
    return "/etc/systemd/system/" + unit


def rollback_plan(plan, snapshots, now_units, unreachable=()):
    """What tasks/rollback.yml does after a router deploy or rolling pass failed on a serving fleet.

    plan: the sglang_plan result (instances, router). snapshots: {host: {'files': {path: base64 or ''}, 'units':
    {unit: {'invocation', 'active'}}}} taken before any file was written (tasks/snapshot.yml; a host
    without one is absent). now_units: {host: parse_systemctl_show of Id,InvocationID,ActiveState now}; unreachable:
    hosts that cannot be read or changed now.

    Returns {served, why_not, restore: [{host, path, kind, id}], restart: [instance ids], router_restart: bool,
    unreachable: [hosts], lost: [instance ids on unreachable hosts], workers: [the planned router workers to have
    back, those of unreachable hosts left out], front_restart: bool}. kind is unit|env|router_unit|router_env|
    front_unit|front_cfg (the owner/mode of the restored file). Only files the snapshot holds are restored (an empty content = the file did not exist before:
    nothing to restore, the run created it for an instance that did not serve). A router host that is unreachable
    leaves nothing to roll back through (why_not says so)."""
    router = plan.get("router") or {}
    rhost, runit = router.get("host"), router.get("unit_name")
    hosts = sorted({i["host"] for i in plan.get("instances", [])} | ({rhost} if rhost else set()))
    unreachable = sorted(set(unreachable))
    out = {"served": False, "why_not": "", "restore": [], "restart": [], "router_restart": False,
           "front_restart": False, "unreachable": unreachable, "lost": [], "workers": []}
    rsnap = snapshots.get(rhost) or {}
    if not rhost:
        out["why_not"] = "the plan has no router"
        return out
    no_snap = [h for h in hosts if h not in snapshots]
    if no_snap:
        out["why_not"] = "no snapshot of %s (its preflight did not run in this play)" % ", ".join(no_snap)
        return out
    if (rsnap.get("units", {}).get(runit) or {}).get("active") != "active" \
            or not rsnap.get("files", {}).get(router.get("env_file", "")):
        out["why_not"] = "the router was not serving before this run (a first deploy: nothing to go back to)"
        return out
    if rhost in unreachable:
        out["why_not"] = "the router host %s is unreachable: nothing can be restored through it" % rhost
        return out
    out["served"] = True
    for inst in plan.get("instances", []):
        files = snapshots[inst["host"]].get("files", {})
        if inst["host"] in unreachable:
            out["lost"].append(inst["id"])
            continue
        for path, kind in ((_unit_path(inst["unit_name"]), "unit"), (inst["env_file"], "env")):
            if files.get(path):
                out["restore"].append({"host": inst["host"], "path": path, "kind": kind, "id": inst["id"]})
        if _moved(snapshots[inst["host"]], now_units.get(inst["host"]), inst["unit_name"]):
            out["restart"].append(inst["id"])
    for path, kind in ((_unit_path(runit), "router_unit"), (router["env_file"], "router_env")):
        if rsnap.get("files", {}).get(path):
            out["restore"].append({"host": rhost, "path": path, "kind": kind, "id": "router"})
    out["router_restart"] = _moved(rsnap, now_units.get(rhost), runit)
    front = router.get("front")
    out["front_restart"] = False
    if front:
        for path, kind in ((_unit_path(front["unit_name"]), "front_unit"), (front["config"], "front_cfg")):
            if rsnap.get("files", {}).get(path):
                out["restore"].append({"host": rhost, "path": path, "kind": kind, "id": "router"})
        # a front that served before and runs another process now (its unit changed) is restarted; one whose
        # config alone is restored is reloaded (rollback.yml), which keeps its connections
        was = (rsnap.get("units") or {}).get(front["unit_name"]) or {}
        out["front_restart"] = was.get("active") == "active" and _moved(rsnap, now_units.get(rhost), front["unit_name"])
    lost = set(out["lost"])
    out["workers"] = [w for w in router.get("workers", []) if w.get("id") not in lost]
    return out


def _moved(snapshot, now, unit):
    """True when the unit's process is not the one the snapshot saw: a new InvocationID, or not active now. A host
    whose state could not be read (now None) counts as moved: restarting on the restored files is the safe side."""
    if now is None:
        return True
    cur = now.get(unit) or {}
    was = (snapshot.get("units") or {}).get(unit) or {}
    return cur.get("ActiveState") != "active" or cur.get("InvocationID", "") != was.get("invocation", "")


def snapshot_units(show):
    """parse_systemctl_show output -> the snapshot's units part {unit: {'invocation', 'active'}}."""
    return {u: {"invocation": p.get("InvocationID", ""), "active": p.get("ActiveState", "")} for u, p in show.items()}


def restored_files(items, results):
    """Descriptions ('<id> <kind>', kind without the router_ prefix for the router: 'router unit') of the restore
    items whose copy changed the file; results are matched to items by position (no_log results carry no item)."""
    out = []
    for item, res in zip(items, results):
        if (res or {}).get("changed"):
            out.append("%s %s" % (item["id"], item["kind"].replace("router_", "").replace("_", " ")))
    return out


def rollback_summary(rb, restored, reason, key_set):
    """The message a rollback ends the run with: ROLLED BACK (everything served again) or ROLLBACK INCOMPLETE (a host
    was unreachable: what it serves could not be put back). restored: restored_files() of both restore tasks."""
    restarted = rb["restart"] + (["router"] if rb["router_restart"] else [])
    done = ("Restored %s; restarted on the restored files: %s; the router lists all %d planned workers healthy"
            % (", ".join(restored) or "no file (none had changed)", ", ".join(restarted) or "nothing",
               len(rb["workers"])))
    if rb["unreachable"]:
        return ("ROLLBACK INCOMPLETE: %s -- %s %s unreachable: %s not restored (their files and processes are as "
                "the failed run left them). %s of the hosts that answered. When %s answer again: rerun site.yml with "
                "the inputs that served before." % (reason, ", ".join(rb["unreachable"]),
                                                    "is" if len(rb["unreachable"]) == 1 else "are",
                                                    ", ".join(rb["lost"]) or "no instance", done,
                                                    ", ".join(rb["unreachable"])))
    return ("ROLLED BACK: %s -- %s. The fleet serves as before this run (API key %s, the previous flags). Fix the "
            "cause, then rerun." % (reason, done, "set" if key_set else "none"))


# ---- one step of a rolling pass -----------------------------------------------------------------------------------

def drain_verdict(result, inst, timeout_s, stop_timeout_s, on_timeout, env_file):
    """The outcome of files/sglang_probe.py --drain for instance inst (its last slice's result: rc, stdout JSON).

    rc 0 drained, 5 the worker has no load endpoint (a fixed wait follows), 4 the deadline passed (an error unless
    on_timeout == 'restart'), 6 the worker refused the running router's key, else the probe failed.
    Returns {ok, fixed_wait, msg}: msg is the success line when ok, the failure message otherwise."""
    rc = result.get("rc", 1)
    try:
        data = json.loads(result.get("stdout") or "{}")
    except ValueError:
        data = {}
    detail = data.get("detail") or result.get("stderr") or "no output"
    ok = rc in (0, 5) or (rc == 4 and on_timeout == "restart")
    if ok:
        head = "drained" if rc != 4 else "NOT drained, restarted anyway (sglang_rolling_drain_on_timeout=restart)"
        return {"ok": True, "fixed_wait": rc == 5, "msg": "%s %s: %s" % (inst["id"], head, data.get("detail", ""))}
    msg = "%s: %s (%s, %s) did not drain: %s." % (inst["host"], inst["id"], inst["unit_name"], inst["url"], detail)
    if rc == 4:
        msg += (" Found still on it after %s s (sglang_rolling_drain_timeout_s): %s; expected nothing running, waiting "
                "or in KV transfer. It is out of the router and still serving those requests: wait and rerun, or "
                "restart it anyway with -e sglang_rolling_drain_on_timeout=restart (its stop then drains for "
                "sglang_stop_timeout_s = %s s, what is left after that fails)."
                % (timeout_s, json.dumps(data.get("loads") or {}, sort_keys=True), stop_timeout_s))
    elif rc == 6:
        msg += (" Expected GET /v1/loads to accept the running router's key (%s): the worker runs with another key; "
                "fix the key (tasks/router_key.yml) and rerun." % env_file)
    return {"ok": False, "fixed_wait": False, "msg": msg}


def rolling_stop_message(inst, failed_task, failed_msg, removed, order_ids, done_ids, profile):
    """The message a rolling pass stops with at instance inst, and the command that resumes it."""
    remaining = [i for i in order_ids if i not in set(done_ids)]
    where = ("The instance is NOT in the router" if removed
             else "The instance is STILL in the router (nothing was removed or restarted)")
    return ("Rolling restart stopped at %s (%s on %s, %s): task '%s' failed: %s. %s; every other instance was left "
            "running and serving. Fix it (journalctl -u %s on %s), then rerun with: ansible-playbook "
            "playbooks/rolling_restart.yml -e sglang_profile=%s -e '{\"sglang_rolling_instances\": %s}'"
            % (inst["id"], inst["unit_name"], inst["host"], inst["url"], failed_task or "?", failed_msg or "", where,
               inst["unit_name"], inst["host"], profile, json.dumps(remaining)))
