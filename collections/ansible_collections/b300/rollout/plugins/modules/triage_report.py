#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: judge the triage collections of every host (logic in module_utils/triage/triage_verdict.py)."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: triage_report
short_description: Judge the on-call NCCL triage of every host - device verdicts and the most likely cause
description:
  - Runs on the controller once. Takes, per host, the result of M(b300.rollout.triage_collect) (unreachable or failed
    results are recognised and reported as "could not triage"), optionally the health history
    (C(health_history_read)) and the per-NIC traffic results of M(b300.rollout.triage_traffic), and returns one
    verdict per device - V(ok), V(suspect) or V(fault) - with findings (check, rule and its source, evidence, fix),
    the host verdict, the causes ranked from the evidence joined on each device, the Markdown report, one
    node_exporter textfile per host and the exit code (0 ok, 2 fault found, 3 a host could not be triaged; 3 wins).
  - The firmware/driver verdict is the one the preflight gate computes (C(module_utils/hw/fw_matrix.py)).
  - Writes nothing; the playbook writes the files.
version_added: "1.1.0"
extends_documentation_fragment: [ansible.builtin.action_common_attributes, b300.rollout.common]
attributes:
  check_mode:
    support: full
    details: Pure computation.
options:
  hosts:
    description: Mapping host -> the registered result of M(b300.rollout.triage_collect).
    type: dict
    required: true
  matrix:
    description: Firmware matrix rows (C(nic_firmware_gate_matrix_rows)).
    type: list
    elements: dict
    required: true
  extra_rows:
    description: Operator rows (C(nic_firmware_gate_extra_rows)), checked first.
    type: list
    elements: dict
    default: []
  policy:
    description: Firmware gate policy (C(unknown), C(pending_reset), C(ignore_roles)) as for M(b300.rollout.nic_firmware_check).
    type: dict
    default: {}
  expected_port_gbps:
    description: Expected IB port rate (Gb/s) per NIC model, the inventory's C(nccl_validation_expected_port_gbps).
    type: dict
    default: {}
  histories:
    description: Mapping host -> the C(health_history_read) result (C(available), C(window), C(gpus), C(nics)); a host
      without one is reported with "no history".
    type: dict
    default: {}
  traffic:
    description: Mapping host -> the C(results) of M(b300.rollout.triage_traffic) (per NIC).
    type: dict
    default: {}
  evidence:
    description:
      - Mapping host -> list of files on the controller the on-call engineer pasted for that host (C(tools/triage
        --evidence HOST=FILE)) - a kernel log (a previous boot's dmesg), a job's NCCL or PyTorch log, perftest,
        C(ibqueryerrors), C(perfquery -x) or C(ethtool -S) output. Each is read with the triage's own parsers and
        judged with the host's collection (C(module_utils/triage/triage_evidence.py)); the report lists what each file held.
      - A file that cannot be read, is larger than 8 MiB, or names a host this run does not triage fails the module
        before anything is judged.
    type: dict
    default: {}
  since:
    description: The kernel-log window, for the report.
    type: str
    default: "?"
  history_window:
    description: The history window, for the report (defaults to O(since)).
    type: str
"""

EXAMPLES = r"""
- name: Judge every host
  b300.rollout.triage_report:
    hosts: "{{ dict(ansible_play_hosts_all | zip(ansible_play_hosts_all | map('extract', hostvars, 'triage_host'))) }}"
    matrix: "{{ nic_firmware_gate_matrix_rows }}"
    expected_port_gbps: "{{ nccl_validation_expected_port_gbps | default({}) }}"
    since: 2h
  delegate_to: localhost
  run_once: true
  register: triage_result
"""

RETURN = r"""
report:
  description: hosts (per host status, devices with verdict and findings, causes, most_likely_cause, history,
    traffic, evidence - each pasted file with what was read in it), summary (hosts, could_not_triage, fault,
    suspect, ok, exit_code), since, history_window.
  returned: always
  type: dict
markdown:
  description: The Markdown report.
  returned: always
  type: str
textfiles:
  description: Mapping host -> node_exporter textfile content.
  returned: always
  type: dict
exit_code:
  description: 0 every host ok (suspects included), 2 a fault found, 3 a host could not be triaged (wins over 2).
  returned: always
  type: int
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.b300.rollout.plugins.module_utils.hw import fw_matrix
from ansible_collections.b300.rollout.plugins.module_utils.triage.triage_evidence import MAX_BYTES
from ansible_collections.b300.rollout.plugins.module_utils.triage.triage_verdict import judge_fleet, render_markdown, \
    render_textfile


def read_files(module, evidence, hosts):
    """{host: [path]} -> {host: [{path, text}]}; fails on a host not triaged, an unreadable or oversized file."""
    out = {}
    for host, paths in sorted((evidence or {}).items()):
        if host not in (hosts or {}):
            module.fail_json(msg="triage_report: evidence for host %s, which this run does not triage (hosts: %s); "
                                 "name a triaged host (--evidence HOST=FILE)" % (host, ", ".join(sorted(hosts or {}))))
        for path in paths if isinstance(paths, list) else [paths]:
            try:
                with open(path, "rb") as fh:
                    raw = fh.read(MAX_BYTES + 1)
            except OSError as exc:
                module.fail_json(msg="triage_report: evidence file %s for %s cannot be read: %s" % (path, host, exc))
            if len(raw) > MAX_BYTES:
                module.fail_json(msg="triage_report: evidence file %s for %s is larger than %d MiB: cut it to the "
                                     "window of the hang" % (path, host, MAX_BYTES >> 20))
            out.setdefault(host, []).append({"path": path, "text": raw.decode("utf-8", "replace")})
    return out


def main():
    module = AnsibleModule(
        argument_spec=dict(
            hosts=dict(type="dict", required=True),
            matrix=dict(type="list", elements="dict", required=True),
            extra_rows=dict(type="list", elements="dict", default=[]),
            policy=dict(type="dict", default={}),
            expected_port_gbps=dict(type="dict", default={}),
            histories=dict(type="dict", default={}),
            traffic=dict(type="dict", default={}),
            evidence=dict(type="dict", default={}),
            since=dict(type="str", default="?"),
            history_window=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    evidence = read_files(module, p["evidence"], p["hosts"])
    try:
        rows = fw_matrix.merge_rows(p["matrix"], p["extra_rows"])
        expected = {k: float(v) for k, v in (p["expected_port_gbps"] or {}).items()}
        report = judge_fleet(p["hosts"], rows, p["policy"], expected, p["histories"], p["traffic"], p["since"],
                             p["history_window"] or p["since"], evidence)
    except (ValueError, fw_matrix.MatrixError) as exc:
        module.fail_json(msg="triage_report: %s" % exc)
    module.exit_json(changed=False, report=report, markdown=render_markdown(report),
                     textfiles={h: render_textfile(report, h) for h in report["hosts"]},
                     exit_code=report["summary"]["exit_code"])


if __name__ == "__main__":
    main()
