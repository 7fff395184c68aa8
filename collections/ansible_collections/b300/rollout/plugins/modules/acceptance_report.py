#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module (controller): judge a finished acceptance run and write report.{md,json}, plots, textfile."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: acceptance_report
short_description: Verdict and report of a go-live acceptance run
description:
  - Reads the run directory (result.json and samples.jsonl of roles/acceptance/files/acceptance_client.py, the
    client's bench.jsonl), the NIC counters read before and after, and the previous accepted report of this pair;
    writes report.json, report.md, acceptance.prom and PNG plots (matplotlib when importable) into O(run_dir) and
    points O(latest) at it. Verdicts and rules in module_utils/verdicts/acceptance.py.
version_added: "1.0.0"
extends_documentation_fragment: [ansible.builtin.action_common_attributes, b300.rollout.common]
attributes:
  check_mode:
    support: none
options:
  run_dir:
    description: Run directory on the controller (C(artifacts/acceptance/<UTC>)).
    type: path
    required: true
  latest:
    description: The C(latest) symlink to (re)point at O(run_dir).
    type: path
    required: true
  profile:
    description: Profile name.
    type: str
    required: true
  run_plan:
    description: The C(run_plan) returned by M(b300.rollout.acceptance_plan).
    type: dict
    required: true
  seed:
    description: The seed figures of the profile.
    type: dict
    required: true
  nic_before:
    description: "C({instance: {device: {port_xmit_data, port_rcv_data}}}) before the run."
    type: dict
    default: {}
  nic_after:
    description: The same as O(nic_before), after the run.
    type: dict
    default: {}
  startup_lines:
    description: "C({instance: [transfer engine startup lines (HCAs found, transport chosen)]})."
    type: dict
    default: {}
  previous:
    description: Path of the previous accepted report.json of this pair (missing is fine).
    type: path
  thresholds:
    description: Overrides of the verdict thresholds.
    type: dict
    default: {}
  label:
    description: A line on the report (the sandbox labels its figures as tooling measures).
    type: str
    default: ""
"""

EXAMPLES = r"""
- name: Report
  b300.rollout.acceptance_report:
    run_dir: artifacts/acceptance/20261201T000000Z
    latest: artifacts/acceptance/latest
    profile: kimi_k3
    run_plan: "{{ _acc_plan.run_plan }}"
    seed: "{{ acceptance_seeds.kimi_k3 }}"
  delegate_to: localhost
"""

RETURN = r"""
report:
  description: >-
    The content of report.json without its time series (profile, verdict, rule, requests,
    output_throughput_tok_s, cache_hit_rate, seed, rdma per instance for PD, ...) and C(rules), every verdict rule
    in precedence order with what makes it fire (thresholds filled in) and its state in this run (fired with the
    detail, passed, off when its threshold is 0, or n/a).
  returned: always
  type: dict
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.b300.rollout.plugins.module_utils.verdicts import acceptance


def _plots(report, bench, run_dir):
    # imported here, not at the top: the plots are optional and the report is written without them where the
    # controller has no matplotlib
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    made = []
    tag = "%s %s (%s)" % (report["profile"], report["run"], report["label"] or "")
    rates = acceptance.window_rates(report["series"]["decode_tokens"], 10.0)
    fig, ax = plt.subplots(figsize=(9, 4))
    if rates:
        ax.step([t for t, r in rates], [r for t, r in rates], where="post", label="output tok/s per 10 s window")
    ax.axhline(report["output_throughput_tok_s"] or 0, color="green", ls="--", label="client output throughput")
    ax.set_xlabel("s since start")
    ax.set_ylabel("tok/s")
    ax.set_title("Throughput over time - " + tag, fontsize=8)
    ax.legend(fontsize=8)
    fig.savefig(os.path.join(run_dir, "throughput.png"), dpi=90)
    plt.close(fig)
    made.append("throughput.png")
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    ttfts = [x * 1000 for x in (bench or {}).get("ttfts") or [] if x]
    tpots = []
    for itl in (bench or {}).get("itls") or []:
        if itl:
            tpots.append(sum(itl) / len(itl) * 1000)
    axes[0].hist(ttfts or [0], bins=30)
    axes[0].set_title("TTFT (ms)")
    axes[1].hist(tpots or [0], bins=30)
    axes[1].set_title("TPOT (ms, mean ITL per request)")
    fig.suptitle(tag, fontsize=8)
    fig.savefig(os.path.join(run_dir, "latency.png"), dpi=90)
    plt.close(fig)
    made.append("latency.png")
    fig, ax = plt.subplots(figsize=(9, 4))
    c, p = report["series"]["cached_tokens"], report["series"]["prompt_tokens"]
    pts = [(t, (cc - c[0][1]) / (pp - p[0][1])) for (t, cc), (tp, pp) in zip(c, p) if pp - p[0][1] > 0] if c else []
    if pts:
        ax.plot([t for t, h in pts], [h * 100 for t, h in pts], label="cumulative hit (servers)")
    ax.axhline(report["cache_hit_rate"]["target"] * 100, color="red", ls="--", label="target")
    ax.set_ylim(0, 100)
    ax.set_xlabel("s since start")
    ax.set_ylabel("%")
    ax.set_title("Cache hit over time - " + tag, fontsize=8)
    ax.legend(fontsize=8)
    fig.savefig(os.path.join(run_dir, "cache_hit.png"), dpi=90)
    plt.close(fig)
    made.append("cache_hit.png")
    return made


def main():
    module = AnsibleModule(argument_spec={
        "run_dir": {"type": "path", "required": True}, "latest": {"type": "path", "required": True},
        "profile": {"type": "str", "required": True}, "run_plan": {"type": "dict", "required": True},
        "seed": {"type": "dict", "required": True}, "nic_before": {"type": "dict", "default": {}},
        "nic_after": {"type": "dict", "default": {}}, "startup_lines": {"type": "dict", "default": {}},
        "previous": {"type": "path"},
        "thresholds": {"type": "dict", "default": {}}, "label": {"type": "str", "default": ""}})
    p = module.params
    d = p["run_dir"]
    try:
        with open(os.path.join(d, "result.json"), encoding="utf-8") as fh:
            result = json.load(fh)
        samples = []
        if os.path.exists(os.path.join(d, "samples.jsonl")):
            with open(os.path.join(d, "samples.jsonl"), encoding="utf-8") as fh:
                samples = [json.loads(ln) for ln in fh if ln.strip()]
        bench = None
        if os.path.exists(os.path.join(d, "bench.jsonl")):
            with open(os.path.join(d, "bench.jsonl"), encoding="utf-8") as fh:
                bench = acceptance.parse_bench_output(fh.read())
    except (OSError, ValueError) as exc:
        module.fail_json(msg="acceptance report: cannot read the run in %s: %s" % (d, exc))
    previous = None
    if p["previous"] and os.path.exists(p["previous"]):
        with open(p["previous"], encoding="utf-8") as fh:
            prev = json.load(fh)
        previous = {"run": prev.get("run"), "output_throughput": prev.get("output_throughput_tok_s")}
    report = acceptance.build_report(p["profile"], p["run_plan"], p["seed"], result, bench, samples,
                                     p["nic_before"], p["nic_after"], previous, p["thresholds"], p["label"],
                                     os.path.basename(d.rstrip("/")), p["startup_lines"])
    report["plots"] = _plots(report, bench, d)
    with open(os.path.join(d, "report.json"), "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=1, sort_keys=True)
    with open(os.path.join(d, "report.md"), "w", encoding="utf-8") as fh:
        fh.write(acceptance.report_markdown(report))
    with open(os.path.join(d, "acceptance.prom"), "w", encoding="utf-8") as fh:
        fh.write(acceptance.prometheus_textfile(report))
    tmp = p["latest"] + ".tmp"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(os.path.basename(d.rstrip("/")), tmp)
    os.replace(tmp, p["latest"])
    slim = dict(report)
    slim.pop("series", None)
    module.exit_json(changed=True, report=slim)


if __name__ == "__main__":
    main()
