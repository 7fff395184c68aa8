# -*- coding: utf-8 -*-
"""Filters of roles/sglang's rollout decisions (module_utils/sglang/sglang_rollout.py does the work; tested there).

- sglang_restart_ids: instances to (re)start from the role's template results, the venv change and what is pending
- sglang_split_restarts: restart now, or leave to the rolling pass behind the router
- sglang_rolling_order: the planned instances among ids in the rolling order (decode, prefill, worker)
- sglang_key_change: first | none | add | remove | rotate, from the router env file's base64 content (None: absent)
- sglang_rollback_plan, sglang_restored_files, sglang_rollback_summary: what a rollback restores, restarts and
  re-adds, and the message it ends the run with
- sglang_plan_hosts: the hosts the planner gets (groups, address, hardware facts, overrides)
- sglang_drain_verdict, sglang_rolling_stop: one step of a rolling pass (drained? the message it stops with)
Documentation: the .yml file of each filter next to this file.
"""

from __future__ import annotations

import base64

from ansible.errors import AnsibleFilterError
from ansible_collections.b300.rollout.plugins.module_utils.sglang import sglang_rollout as ro


def _changed_by_position(instances, results):
    # loop results are matched to the instances by position: a no_log result carries no loop variable
    results = list(results or [])
    return {inst["id"]: bool(results[n].get("changed")) if n < len(results) else False
            for n, inst in enumerate(instances)}


def sglang_restart_ids(instances, unit_results, env_results, venv_changed=False, pending=()):
    instances = list(instances or [])
    return ro.restart_ids([i["id"] for i in instances], _changed_by_position(instances, unit_results),
                          _changed_by_position(instances, env_results), bool(venv_changed), list(pending or []))


def sglang_split_restarts(instances, strategy, changed_ids, listed_urls=()):
    try:
        return ro.split_restarts(strategy, list(instances or []), list(changed_ids or []), list(listed_urls or []))
    except ValueError as e:
        raise AnsibleFilterError("sglang_split_restarts: %s" % e) from e


def sglang_rolling_order(instances, ids):
    try:
        return ro.rolling_order(list(instances or []), list(ids or []))
    except ValueError as e:
        raise AnsibleFilterError("sglang_rolling_order: %s" % e) from e


def sglang_key_change(env_b64, new_key):
    text = None if env_b64 is None else base64.b64decode(env_b64).decode("utf-8", "replace")
    return ro.key_change(text, new_key)


def sglang_env_key(env_b64):
    return ro.env_api_key(base64.b64decode(env_b64 or "").decode("utf-8", "replace"))


def sglang_rollback_plan(plan, hostvars, state_results):
    """state_results: the loop results of b300.rollout.sglang_units_state over the plan's hosts (item = host),
    run with ignore_unreachable; the snapshots are each host's _sglang_snap fact."""
    hosts = sorted({i["host"] for i in plan.get("instances", [])} | {(plan.get("router") or {}).get("host")} - {None})
    snapshots = {}
    for h in hosts:
        snap = hostvars[h].get("_sglang_snap") if h in hostvars else None
        if snap:
            snapshots[h] = snap
    now, unreachable = {}, []
    for r in state_results or []:
        if r.get("unreachable") or r.get("failed") or "units" not in r:
            unreachable.append(r.get("item"))
        else:
            now[r["item"]] = r["units"]
    return ro.rollback_plan(plan, snapshots, now, unreachable)


def sglang_restored_files(items, results):
    return ro.restored_files(list(items or []), list(results or []))


def sglang_rollback_summary(rb, restored, reason, key_set):
    return ro.rollback_summary(rb, list(restored or []), reason, bool(key_set))


def sglang_drain_verdict(result, inst, settings):
    """settings: {timeout_s, stop_timeout_s, on_timeout, env_file} (the role's drain variables)."""
    s = dict(settings or {})
    return ro.drain_verdict(dict(result or {}), inst, s.get("timeout_s"), s.get("stop_timeout_s"), s.get("on_timeout"),
                            s.get("env_file"))


def sglang_rolling_stop(inst, failed_task, failed_msg, removed, order, done, profile):
    ids = [i["id"] for i in (order or [inst])]
    return ro.rolling_stop_message(inst, failed_task, failed_msg, bool(removed), ids, list(done or []), profile)


def sglang_plan_hosts(names, hostvars):
    out = []
    for name in names:
        hv = hostvars[name]
        facts = hv.get("ansible_facts") or {}
        out.append({"name": name,
                    # default() semantics: an advertise address set to '' stays '' (the preflight names it)
                    "address": hv["sglang_advertise_address"] if "sglang_advertise_address" in hv
                    else hv.get("ansible_host", name),
                    "groups": list(hv.get("group_names") or []),
                    "gpu_topology": facts.get("gpu_topology"),
                    "rdma_nics": facts.get("rdma_nics"),
                    "instance_overrides": hv.get("sglang_instance_overrides") or {}})
    return out


class FilterModule:
    """roles/sglang's rollout decisions."""

    def filters(self):
        return {"sglang_restart_ids": sglang_restart_ids, "sglang_split_restarts": sglang_split_restarts,
                "sglang_rolling_order": sglang_rolling_order, "sglang_key_change": sglang_key_change,
                "sglang_env_key": sglang_env_key, "sglang_rollback_plan": sglang_rollback_plan,
                "sglang_plan_hosts": sglang_plan_hosts, "sglang_drain_verdict": sglang_drain_verdict,
                "sglang_rolling_stop": sglang_rolling_stop, "sglang_restored_files": sglang_restored_files,
                "sglang_rollback_summary": sglang_rollback_summary}
