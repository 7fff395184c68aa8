# -*- coding: utf-8 -*-
"""Filters of roles/sglang's preflight decisions (module_utils/sglang/sglang_checks.py does the work; tested there).

- sglang_reach_paths, sglang_listen_specs, sglang_reach_blocked: the TCP paths between the hosts (13_preflight_reach...)
- sglang_boot_problems: GPU boot services and persistence mode (boot_check.yml)
- sglang_script_problems: what a role script reported (host check, venv check)
- sglang_smoke_empty, sglang_smoke_text: the router's smoke chat completions (router_deploy.yml)
- sglang_pick: the named keys of each mapping of a list; sglang_flag_value: the value of a flag in an argv list
Documentation: the .yml file of each filter next to this file.
"""

from __future__ import annotations

from ansible_collections.b300.rollout.plugins.module_utils.sglang import sglang_checks as sc


def sglang_reach_paths(plan, play_hosts):
    return sc.reach_paths(plan, list(play_hosts or []))


def sglang_listen_specs(paths, host):
    return sc.listen_specs(list(paths or []), host)


def sglang_reach_blocked(results, hostvars, connect_s):
    sources = {}
    for r in results or []:
        src = (r.get("item") or {}).get("src")
        if src and src not in sources:
            hv = hostvars[src]
            sources[src] = (hv["sglang_advertise_address"] if "sglang_advertise_address" in hv
                            else hv.get("ansible_host", src))
    return sc.reach_blocked(list(results or []), sources, connect_s)


def sglang_boot_problems(enabled_results, host, services, persistence):
    return sc.boot_problems(host, list(services or []), list(enabled_results or []), dict(persistence or {}))


def sglang_script_problems(result, host, script):
    return sc.script_problems(dict(result or {}), host, script)


def sglang_pick(items, keys):
    """[{k: item[k] for k in keys}] of a list of mappings (what a role script gets of each planned instance)."""
    return [{k: item[k] for k in keys if k in item} for item in items or []]


def sglang_flag_value(args, flags):
    return sc.flag_value(list(args or []), list(flags or []))


def sglang_smoke_empty(results):
    return sc.smoke_empty(list(results or []))


def sglang_smoke_text(results):
    text, reasoning = sc.smoke_text(list(results or []))
    return ("(reasoning) " if reasoning and text else "") + text


class FilterModule:
    """roles/sglang's preflight decisions."""

    def filters(self):
        return {"sglang_reach_paths": sglang_reach_paths, "sglang_listen_specs": sglang_listen_specs,
                "sglang_reach_blocked": sglang_reach_blocked, "sglang_boot_problems": sglang_boot_problems,
                "sglang_script_problems": sglang_script_problems, "sglang_smoke_empty": sglang_smoke_empty,
                "sglang_smoke_text": sglang_smoke_text, "sglang_pick": sglang_pick,
                "sglang_flag_value": sglang_flag_value}
