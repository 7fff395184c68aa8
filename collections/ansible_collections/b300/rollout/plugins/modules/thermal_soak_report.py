#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: judge a finished thermal soak on the host (verdict per GPU and host), reap leftovers."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: thermal_soak_report
short_description: Verdicts (ok, hot, throttled, error) from a GPU thermal soak's samples
description:
  - Reads C(samples.csv) (query CSV or C(nvidia-smi dmon) text, recognised by its C(# gpu ...) header) and
    C(status.json) written by C(thermal_soak_runner.py) in O(out_dir), checks that no
    process of the soak is still alive (kills and lists any, unless in check mode), and judges each GPU with
    C(module_utils/health/thermal.py).
  - A host is C(error) when the loader was missing or failed, nothing was sampled, or a GPU never reached load;
    C(hot) when a GPU exceeded O(ceiling_c); C(throttled) when counted clock-event reasons were active in more than
    O(throttle_max_fraction) of loaded samples or the SM clock fell more than O(clock_drop_max_pct) under load.
version_added: "1.0.0"
extends_documentation_fragment: [ansible.builtin.action_common_attributes, b300.rollout.common]
attributes:
  check_mode:
    support: full
    details: In check mode leftover load processes are listed but not killed.
options:
  out_dir:
    description: Directory of the runner's output on the host.
    type: path
    required: true
  host:
    description: Host name recorded in the summary.
    type: str
    required: true
  expected_gpus:
    description: GPU indices that must have samples.
    type: list
    elements: int
    default: []
  loader_problem:
    description: Set when no loader was available; the host verdict becomes C(error) with this text.
    type: str
  duration_s:
    description: Planned soak duration (recorded in the summary).
    type: int
  ceiling_c:
    description: Temperature ceiling in degrees C.
    type: float
    default: 90
  loaded_util_pct:
    description: utilization.gpu at or above which a sample counts as loaded.
    type: float
    default: 50
  throttle_reasons:
    description: Clock-event reasons counted as throttling.
    type: list
    elements: str
    default: [hw_thermal_slowdown, sw_thermal_slowdown, hw_slowdown, hw_power_brake_slowdown]
  throttle_max_fraction:
    description: Largest tolerated fraction of loaded samples with a counted reason active.
    type: float
    default: 0.1
  clock_drop_max_pct:
    description: Largest tolerated drop (percent) of the last-third median SM clock vs the first-minute median.
    type: float
    default: 15
  baseline_s:
    description: Length of the baseline window at the start of the load (at most a third of the loaded span).
    type: float
    default: 60
  sample_ms:
    description: Sampling interval used (for time accounting when timestamps are sparse).
    type: int
    default: 2000
"""

EXAMPLES = r"""
- name: Judge the soak
  thermal_soak_report:
    out_dir: /var/tmp/thermal_soak/run
    host: "{{ inventory_hostname }}"
    expected_gpus: "{{ probe.gpu_indices }}"
    ceiling_c: 90
  register: soak
"""

RETURN = r"""
summary:
  description: Host summary (verdict, reasons, per-GPU figures, throttled intervals, load throughput); C(sampler) says
    which sampler's output was read (query or dmon); per GPU C(util_sampled) is false when dmon ran without C(-s u)
    (every sample then counts as loaded).
  returned: always
  type: dict
  sample:
    host: b300a
    verdict: throttled
    reasons: ["GPU 3 throttled: hw_thermal_slowdown active in 60% of loaded samples (limit 10%)"]
    gpus: {"0": {"verdict": "ok", "temp_max_c": 71.0, "sm_median_mhz": 1965.0, "util_sampled": true}}
    sampler: query
leftovers_killed:
  description: Soak processes found alive after the runner finished (killed unless in check mode).
  returned: always
  type: list
"""

import json
import os
import signal

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.b300.rollout.plugins.module_utils.health.thermal import analyse_host, load_problems, parse_any, parse_load_log


def _read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _session_members(sids):
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        stat = _read("/proc/%s/stat" % name)
        if not stat:
            continue
        try:
            fields = stat.rsplit(")", 1)[1].split()
            state, sid = fields[0], int(fields[3])
        except (IndexError, ValueError):
            continue
        if sid in sids and state not in ("Z", "X"):  # zombies hold nothing and cannot be killed
            found.append(int(name))
    return found


def main():
    module = AnsibleModule(
        argument_spec=dict(
            out_dir=dict(type="path", required=True),
            host=dict(type="str", required=True),
            expected_gpus=dict(type="list", elements="int", default=[]),
            loader_problem=dict(type="str"),
            duration_s=dict(type="int"),
            ceiling_c=dict(type="float", default=90.0),
            loaded_util_pct=dict(type="float", default=50.0),
            throttle_reasons=dict(type="list", elements="str",
                                  default=["hw_thermal_slowdown", "sw_thermal_slowdown", "hw_slowdown",
                                           "hw_power_brake_slowdown"]),
            throttle_max_fraction=dict(type="float", default=0.1),
            clock_drop_max_pct=dict(type="float", default=15.0),
            baseline_s=dict(type="float", default=60.0),
            sample_ms=dict(type="int", default=2000),
        ),
        supports_check_mode=True,
    )
    p = module.params
    out_dir = p["out_dir"]
    problems = []
    if p["loader_problem"]:
        problems.append("loader missing: " + p["loader_problem"])

    # nothing of the soak may outlive it
    leftovers = []
    pids = _read(os.path.join(out_dir, "pids.json"))
    if pids:
        sids = set(json.loads(pids).get("sessions", []))
        for pid in _session_members(sids):
            leftovers.append(pid)
            if not module.check_mode:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    if leftovers:
        problems.append("soak processes still alive after the runner: %s%s"
                        % (leftovers, "" if module.check_mode else " (killed)"))

    status_text = _read(os.path.join(out_dir, "status.json"))
    status = json.loads(status_text) if status_text else None
    if not p["loader_problem"]:
        problems += load_problems(status)
    text = _read(os.path.join(out_dir, "samples.csv")) or ""
    parsed = parse_any(text, interval_s=max(1.0, round(p["sample_ms"] / 1000.0)))
    params = {k: p[k] for k in ("ceiling_c", "loaded_util_pct", "throttle_reasons", "throttle_max_fraction",
                                "clock_drop_max_pct", "baseline_s", "sample_ms")}
    summary = analyse_host(parsed["samples"], params, expected_gpus=p["expected_gpus"], load_errors=problems,
                           host=p["host"], duration_s=p["duration_s"])
    summary["malformed_lines"] = parsed["malformed"]
    summary["fields"] = parsed["fields"]
    summary["sampler"] = parsed["sampler"]
    summary["loader"] = None
    if status:
        summary["loader"] = {"loads": [{k: ld.get(k) for k in ("name", "argv", "runs", "rcs", "failed", "ended_early_s")}
                                       for ld in status.get("loads", [])],
                             "leftovers_killed_by_runner": status.get("leftovers_killed", [])}
        tflops = {}
        for ld in status.get("loads", []):
            tflops.update(parse_load_log(_read(os.path.join(out_dir, "load-%s.log" % ld["name"]))))
        if tflops:
            summary["load_tflops"] = {g: {"first": v[0][1], "last": v[-1][1], "min": min(x for _t, x in v),
                                          "max": max(x for _t, x in v), "reports": len(v)}
                                      for g, v in sorted(tflops.items())}
    module.exit_json(changed=bool(leftovers) and not module.check_mode, summary=summary, leftovers_killed=leftovers)


if __name__ == "__main__":
    main()
