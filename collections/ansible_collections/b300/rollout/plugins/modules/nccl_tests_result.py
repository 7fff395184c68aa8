#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: classify repeated nccl-tests all_reduce_perf runs (thin wrapper over module_utils.nccl_results)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: nccl_tests_result
short_description: Classify repeated nccl-tests all_reduce_perf runs against thresholds
description:
  - Reads the outputs of K repeats of C(all_reduce_perf) (stdout text with NCCL INFO lines interleaved and/or the
    C(-J) JSON file, plus rc and timeout flag) and returns one verdict
    C(ok | slow | wrong_results | hang | intermittent | error) with the numbers behind it.
  - The gated figure is the median over the largest sizes (>= O(gate_min_bytes), or the O(gate_top_n) largest) of the
    out-of-place busbw (algbw for one GPU), then the median over the repeats; never the all-sizes average.
  - Without O(repeats) it only selects the threshold for O(gpu_name)/O(gpu_count)/O(nodes) (used by preflight).
  - Read-only; supports check mode.
version_added: "1.0.0"
extends_documentation_fragment: [ansible.builtin.action_common_attributes, b300.rollout.common]
options:
  repeats:
    description:
      - One entry per repeat. Each gives either C(stdout) (text) or C(stdout_path) (file on the managed host),
        optionally C(json_path) (the C(-J) file), and C(rc)/C(timed_out) directly or via C(meta_path)
        (the JSON written by the role's nccl_repeat.sh).
      - C(timed_out) defaults to rc being 124 or 137 (coreutils timeout).
    type: list
    elements: dict
    default: []
  output_prefixes:
    description:
      - Shorthand for O(repeats) as written by the role's nccl_repeat.sh - each prefix P stands for
        C(stdout_path=P.out), C(json_path=P.json), C(meta_path=P.meta.json). Appended after O(repeats).
    type: list
    elements: str
    default: []
  gpu_name:
    description: GPU model string, e.g. C(NVIDIA B300 SXM6 AC); matched against the table's C(gpu_match) regexes.
    type: str
    default: ""
  gpu_count:
    description: GPUs per host taking part.
    type: int
    required: true
  nodes:
    description: Number of hosts in the run (1 = single-node table, >1 = multi-node table).
    type: int
    default: 1
  nic_count:
    description: Usable data NICs per host (multi-node threshold derivation).
    type: int
  nic_rate_gbps:
    description: Slowest data NIC port rate in Gb/s (multi-node threshold derivation).
    type: float
  threshold_table:
    description: The role's threshold table (C(single_node) and C(multi_node) lists).
    type: dict
    default: {}
  threshold_override:
    description: Extra entries in the same shape, matched before O(threshold_table).
    type: dict
    default: {}
  min_gbps:
    description: Force this floor (GB/s), keeping the matched entry's metric; overrides the table.
    type: float
  gate_min_bytes:
    description: Sizes at or above this are gated.
    type: int
    default: 1073741824
  gate_top_n:
    description: When fewer than this many sizes reach O(gate_min_bytes), gate on this many largest sizes.
    type: int
    default: 3
  baseline:
    description: This host's previous ok result (C(gated_gbps), C(metric), C(gpu_count), C(nodes)); empty for none.
    type: dict
    default: {}
  regression_max_drop_pct:
    description: A drop larger than this percentage below a comparable baseline makes the verdict C(slow).
    type: float
    default: 10.0
"""

EXAMPLES = r"""
- name: Classify three repeats recorded by nccl_repeat.sh
  nccl_tests_result:
    output_prefixes:
      - /var/lib/nccl-validation/r1/single-1
      - /var/lib/nccl-validation/r1/single-2
      - /var/lib/nccl-validation/r1/single-3
    gpu_name: NVIDIA B300 SXM6 AC
    gpu_count: 8
    threshold_table: "{{ nccl_validation_threshold_table }}"
  register: nccl_verdict

- name: Classify runs whose text was captured by Ansible
  nccl_tests_result:
    repeats:
      - {rc: 0, timed_out: false, stdout: "{{ run1.stdout }}"}
      - {rc: 124, timed_out: true, stdout: "{{ run2.stdout }}"}
    gpu_name: NVIDIA H200
    gpu_count: 2
    threshold_table: "{{ nccl_validation_threshold_table }}"

- name: Only select the threshold (preflight)
  nccl_tests_result:
    gpu_name: NVIDIA H200
    gpu_count: 2
    threshold_table: "{{ nccl_validation_threshold_table }}"
  register: nccl_threshold
"""

RETURN = r"""
threshold:
  description: The selected threshold ({id, metric, min_gbps, expected_gbps, source, reasoning}) or null.
  returned: always
  type: dict
verdict:
  description: >-
    status, rule, message, gated_gbps, threshold_gbps, metric, gate_sizes, per_repeat_gated_gbps,
    per_repeat_max_size_busbw_gbps, per_repeat_status, counts, regression{baseline_gbps, drop_pct, fired},
    baseline_update and repeats[] (per repeat: status, rule, detail, rc, timed_out, rows, last_size, ...).
  returned: when repeats are given
  type: dict
  sample: {status: ok, rule: within_threshold, gated_gbps: 339.757, threshold_gbps: 305.0, metric: busbw}
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.b300.rollout.plugins.module_utils.health.nccl_results import analyze_repeat, classify, select_threshold


def _merged_table(table, override):
    merged = {}
    for key in ("single_node", "multi_node"):
        merged[key] = list((override or {}).get(key) or []) + list((table or {}).get(key) or [])
    return merged


def _read(path, limit=64 * 1024 * 1024):
    if not path or not os.path.isfile(path):
        return None
    with open(path, "rb") as fh:
        return fh.read(limit).decode("utf-8", "replace")


def main():
    module = AnsibleModule(
        argument_spec=dict(
            repeats=dict(type="list", elements="dict", default=[]),
            output_prefixes=dict(type="list", elements="str", default=[]),
            gpu_name=dict(type="str", default=""),
            gpu_count=dict(type="int", required=True),
            nodes=dict(type="int", default=1),
            nic_count=dict(type="int"),
            nic_rate_gbps=dict(type="float"),
            threshold_table=dict(type="dict", default={}),
            threshold_override=dict(type="dict", default={}),
            min_gbps=dict(type="float"),
            gate_min_bytes=dict(type="int", default=1073741824),
            gate_top_n=dict(type="int", default=3),
            baseline=dict(type="dict", default={}),
            regression_max_drop_pct=dict(type="float", default=10.0),
        ),
        supports_check_mode=True,
    )
    p = module.params
    table = _merged_table(p["threshold_table"], p["threshold_override"])
    threshold = select_threshold(table, p["gpu_name"], p["gpu_count"], p["nodes"], p["nic_count"], p["nic_rate_gbps"])
    if p["min_gbps"] is not None:
        threshold = {
            "id": "inventory_override", "metric": (threshold or {}).get("metric") or "busbw",
            "min_gbps": float(p["min_gbps"]), "expected_gbps": None,
            "source": "inventory variable (nccl_validation_min_busbw_gbps for one host, nccl_validation_multinode_min_busbw_gbps across hosts)",
            "reasoning": "set per host or group by the operator",
        }
    result = dict(changed=False, threshold=threshold)
    repeats = list(p["repeats"]) + [
        {"stdout_path": pre + ".out", "json_path": pre + ".json", "meta_path": pre + ".meta.json"}
        for pre in p["output_prefixes"]
    ]
    if not repeats:
        module.exit_json(**result)

    analysed = []
    for i, rep in enumerate(repeats, start=1):
        rc = rep.get("rc")
        timed_out = rep.get("timed_out")
        meta_text = _read(rep.get("meta_path"))
        if meta_text:
            try:
                meta = json.loads(meta_text)
            except ValueError:
                module.fail_json(msg="nccl_tests_result: %s is not the JSON nccl_repeat.sh writes (repeat %d)"
                                 % (rep.get("meta_path"), i), **result)
            rc = meta.get("rc", rc)
            timed_out = meta.get("timed_out", timed_out)
        elif rep.get("meta_path") and rc is None:
            rc = -1  # the run never recorded an exit status
        if rc is not None:
            try:
                rc = int(rc)
            except (TypeError, ValueError):
                module.fail_json(msg="nccl_tests_result: repeat %d rc must be an integer, got %r" % (i, rc), **result)
        stdout = rep.get("stdout")
        stdout_missing = False
        if stdout is None:
            stdout = _read(rep.get("stdout_path"))
            stdout_missing = stdout is None
        json_text = _read(rep.get("json_path")) if rep.get("json_path") else None
        a = analyze_repeat(i, rc, timed_out, stdout, json_text, threshold, p["gate_min_bytes"], p["gate_top_n"],
                           stdout_missing=stdout_missing)
        a["stdout_path"] = rep.get("stdout_path")
        a["json_path"] = rep.get("json_path")
        if meta_text:
            a["duration_s"] = json.loads(meta_text).get("duration_s")
        analysed.append(a)

    verdict = classify(analysed, threshold, gpu_count=p["gpu_count"], nodes=p["nodes"], baseline=p["baseline"] or None,
                       max_drop_pct=p["regression_max_drop_pct"])
    verdict["gpu_name"] = p["gpu_name"]
    result["verdict"] = verdict
    module.exit_json(**result)


if __name__ == "__main__":
    main()
