#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: judge a gpu_topology fact against expectations (logic: module_utils/hw/gpu_topology.health_problems)."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_health_check
short_description: Gate on GPU health from the gpu_topology fact
description:
  - Checks C(gpu_topology) (from M(b300.rollout.gpu_topology_facts)) for GPU count and model, NVLink links down, uncorrectable
    ECC errors, row-remapping failure or pending, active thermal/power throttling and a fabric state other than
    the expected one.
  - Each check has a policy; V(fail) problems fail the task (one line per problem in C(msg)),
    V(warn) problems become warnings, V(ignore) drops the check.
  - Read-only; runs in check mode too.
version_added: "1.0.0"
extends_documentation_fragment: [ansible.builtin.action_common_attributes, b300.rollout.common]
options:
  gpu_topology:
    description: The C(ansible_facts.gpu_topology) dict of the host.
    type: dict
    required: true
  host:
    description: Name used in messages (the inventory hostname). Default is the host's own hostname.
    type: str
  expected:
    description: Expected values.
    type: dict
    default: {}
    suboptions:
      gpu_count:
        description: Number of GPUs nvidia-smi must list; unset skips the check.
        type: int
      gpu_model:
        description: Exact product name of every GPU; unset skips the check.
        type: str
      nvlink_links:
        description: Active NVLink links every GPU must have; unset only reports links listed as inactive.
        type: int
      fabric_state:
        description: Expected C(fabric.state); empty skips the check.
        type: str
        default: Completed
      fabric_required:
        description: Whether a GPU that reports no fabric state at all (N/A) is a problem.
        type: bool
        default: false
      throttle_reasons:
        description:
          - Clock-event reasons counted as throttling. Unset means hardware slowdown, thermal and power brake
            (C(hw_slowdown), C(hw_thermal_slowdown), C(sw_thermal_slowdown), C(hw_power_brake_slowdown)).
          - Other active reasons, such as C(sw_power_cap) on a loaded GPU, are returned in RV(notes), not as problems.
        type: list
        elements: str
  policies:
    description: Policy per check.
    type: dict
    default: {}
    suboptions:
      gpu_count:
        description: Policy for the GPU count check.
        type: str
        choices: [fail, warn, ignore]
        default: fail
      gpu_model:
        description: Policy for the GPU model check.
        type: str
        choices: [fail, warn, ignore]
        default: fail
      nvlink:
        description: Policy for NVLink links down.
        type: str
        choices: [fail, warn, ignore]
        default: fail
      ecc:
        description: Policy for uncorrectable ECC errors.
        type: str
        choices: [fail, warn, ignore]
        default: fail
      remapped_rows:
        description: Policy for row-remapping failure or pending.
        type: str
        choices: [fail, warn, ignore]
        default: fail
      throttle:
        description: Policy for active thermal/power throttling.
        type: str
        choices: [fail, warn, ignore]
        default: fail
      fabric:
        description: Policy for the fabric state.
        type: str
        choices: [fail, warn, ignore]
        default: fail
"""

EXAMPLES = r"""
- name: Gate on GPU health
  gpu_health_check:
    gpu_topology: "{{ ansible_facts.gpu_topology }}"
    host: "{{ inventory_hostname }}"
    expected:
      gpu_count: 8
      gpu_model: NVIDIA B300 SXM6 AC
      nvlink_links: 18
    policies:
      throttle: warn
"""

RETURN = r"""
problems:
  description: One entry per problem found (ignored checks left out).
  returned: always
  type: list
  elements: dict
  sample:
    - host: b300a
      gpu: 5
      pci: "0000:b3:00.0"
      check: nvlink
      severity: fail
      expected: 18
      actual: 16
      message: "b300a: GPU 5 (0000:b3:00.0): 2 NVLink links down (links 3, 11); expected 18 links up, 16 up"
notes:
  description: Information that is not a problem, e.g. C(sw_power_cap) active on a loaded GPU.
  returned: always
  type: list
  elements: str
  sample: ["b300a: GPU 1 (0000:2a:00.0): clock-event reason(s) sw_power_cap active (normal under load; not gated)"]
counts:
  description: Number of problems per severity.
  returned: always
  type: dict
  sample: {fail: 1, warn: 0}
"""

import socket

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.b300.rollout.plugins.module_utils.hw.gpu_topology import health_notes, health_problems

POLICY = dict(type="str", choices=["fail", "warn", "ignore"], default="fail")


def main():
    module = AnsibleModule(
        argument_spec=dict(
            gpu_topology=dict(type="dict", required=True),
            host=dict(type="str"),
            expected=dict(type="dict", default={}, options=dict(
                gpu_count=dict(type="int"),
                gpu_model=dict(type="str"),
                nvlink_links=dict(type="int"),
                fabric_state=dict(type="str", default="Completed"),
                fabric_required=dict(type="bool", default=False),
                throttle_reasons=dict(type="list", elements="str"),
            )),
            policies=dict(type="dict", default={}, options=dict(
                gpu_count=POLICY, gpu_model=POLICY, nvlink=POLICY, ecc=POLICY, remapped_rows=POLICY,
                throttle=POLICY, fabric=POLICY,
            )),
        ),
        supports_check_mode=True,
    )
    p = module.params
    host = p["host"] or socket.gethostname()
    problems = health_problems(p["gpu_topology"], expected=p["expected"], policies=p["policies"], host=host)
    notes = health_notes(p["gpu_topology"], expected=p["expected"], host=host)
    fails = [x for x in problems if x["severity"] == "fail"]
    for x in problems:
        if x["severity"] == "warn":
            module.warn(x["message"])
    counts = {"fail": len(fails), "warn": len(problems) - len(fails)}
    if fails:
        module.fail_json(msg="\n".join(x["message"] for x in fails), problems=problems, notes=notes, counts=counts)
    module.exit_json(changed=False, problems=problems, notes=notes, counts=counts,
                     msg="%s: GPU health OK (%d GPUs, %d warnings)" % (
                         host, p["gpu_topology"].get("gpu_count", 0), counts["warn"]))


if __name__ == "__main__":
    main()
