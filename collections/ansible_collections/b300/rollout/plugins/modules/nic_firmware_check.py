#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: judge ConnectX firmware against the mlx5 driver using the firmware matrix."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: nic_firmware_check
short_description: Judge ConnectX NIC firmware against the installed mlx5 driver (firmware matrix)
description:
  - Takes C(rdma_nics) facts (from M(b300.rollout.rdma_nic_facts)) and the firmware matrix rows, and returns one verdict per
    device - V(ok), V(mismatch), V(unsupported), V(unknown), V(pending_reset) or V(ignored) - each naming the matrix
    row and the rule that decided it, and what firmware was expected.
  - Single-host mode (O(rdma_nics)) is used by the C(nic_firmware_gate) role; with O(enforce=true) the module fails
    with one line per failing device naming host, device, PCI address, model, firmware, driver, expected firmware and
    the command to fix it by hand.
  - Fleet mode (O(hosts)) is used by C(playbooks/firmware_audit.yml) once on the controller; it also checks GPU driver
    and VBIOS consistency and NVLink links down from C(gpu_topology) facts, and returns the report data. The
    Markdown/JSON report and the Prometheus textfiles are rendered from RV(report) by the playbook's templates
    (C(playbooks/templates/firmware_audit.md.j2), C(firmware_audit.prom.j2)), not by the module.
  - The engine is C(module_utils/firmware/fw_check_run.py), its decisions C(module_utils/hw/fw_matrix.py); gathering uses the same C(module_utils/hw/tools.py)
    runner and builders as M(b300.rollout.rdma_nic_facts) and M(b300.rollout.gpu_topology_facts). The module never
    touches the NICs, never flashes firmware, writes no file and always reports C(changed=false).
  - Tools looked up in O(bin_path) before C(PATH) - ofed_info, mlxfwmanager and nvidia-smi (gather mode).
version_added: "1.0.0"
extends_documentation_fragment: [ansible.builtin.action_common_attributes, b300.rollout.common, ansible.builtin.action_common_attributes.facts, b300.rollout.hw]
attributes:
  check_mode:
    support: full
    details: Never changes anything; gather mode only reads the host.
  facts:
    support: partial
    details: Only gather mode with O(as_facts=true) returns C(ansible_facts).
options:
  rdma_nics:
    description: C(ansible_facts.rdma_nics) of one host (single-host mode). Mutually exclusive with O(hosts).
    type: dict
  host:
    description: Host name used in messages (single-host mode).
    type: str
    default: localhost
  hosts:
    description:
      - Fleet mode. Mapping host -> C({status, msg, rdma_nics, gpu_topology}) (C(status) V(ok), V(unreachable) or
        V(failed)), or host -> the result registered from the gather task (unreachable/failed results are recognised).
    type: dict
  matrix:
    description: Built-in matrix rows (the role's C(nic_firmware_gate_matrix_rows)). One of O(matrix) or O(matrix_file) is required.
    type: list
    elements: dict
  matrix_file:
    description: YAML file with a list of rows or a C(nic_firmware_gate_matrix_rows) key, read where the module runs.
    type: path
  extra_rows:
    description: Operator rows (C(nic_firmware_gate_extra_rows)); checked first, and replace built-in rows of the same id.
    type: list
    elements: dict
    default: []
  policy:
    description:
      - C(unknown) and C(pending_reset) - V(warn) or V(fail) (default V(fail) for both); C(ignore_roles) - device
        roles reported as V(ignored) (default V([fabric_manager])).
    type: dict
    default: {}
  enforce:
    description: Fail when any device's verdict is failing under the policy (single-host mode).
    type: bool
    default: false
  gather:
    description:
      - Gather mode (run on the host) - read the facts named here in ONE module run and return them as
        C(ansible_facts), with the same content as M(b300.rollout.rdma_nic_facts) and M(b300.rollout.gpu_topology_facts) (same
        C(module_utils) builders). The audit uses it to keep one task per host.
      - A source whose tool is missing is returned as C(null) with the reason in C(gather_errors) instead of failing,
        so an audit reports it rather than losing the host.
    type: list
    elements: str
    choices: [rdma_nics, gpu_topology]
    default: []
  ofed_info:
    description:
      - Gather mode - V(always) runs C(ofed_info -s) like M(b300.rollout.rdma_nic_facts). V(auto) runs it only when the
        C(mlx5_core) module version cannot tell DOCA-OFED from MLNX_OFED by itself (versions older than 25.x);
        C(rdma_nics.driver.ofed_info) is then null. The audit uses V(auto) (one emulated tool call less per host).
    type: str
    choices: [always, auto]
    default: always
  as_facts:
    description:
      - Gather mode - return the data as C(ansible_facts) (V(true)) or only under C(gathered) (V(false)).
      - The audit uses V(false) - its C(gpu_topology) is partial (no topo matrix, see O(read_topo)) and must not
        land in hostvars or in ansible.cfg's fact cache where another role could take it for the full fact.
    type: bool
    default: true
  fabric_manager_devices:
    description: Gather mode - RDMA device names serving the NVLink fabric manager besides the auto-detected ConnectX-7.
    type: list
    elements: str
    default: []
  read_topo:
    description:
      - Gather mode - also run C(nvidia-smi topo -m). The audit sets V(false) (it needs driver, VBIOS and NVLink
        state only); C(gpu_topology.topology) is then empty and C(topology_read) is false.
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Read rdma_nics and gpu_topology in one module run (audit)
  nic_firmware_check:
    gather: [rdma_nics, gpu_topology]
    bin_path: "{{ [hw_bin_path] if hw_bin_path | default('', true) else [] }}"
    sysfs_root: "{{ hw_sysfs_root | default('/sys', true) }}"

- name: Gate NIC firmware on this host
  nic_firmware_check:
    rdma_nics: "{{ ansible_facts.rdma_nics }}"
    host: "{{ inventory_hostname }}"
    matrix: "{{ nic_firmware_gate_matrix_rows }}"
    extra_rows: "{{ nic_firmware_gate_extra_rows }}"
    policy: {unknown: fail, pending_reset: fail}
    enforce: true

- name: Audit a fleet on the controller
  nic_firmware_check:
    hosts:
      b300a: {status: ok, rdma_nics: "{{ hostvars.b300a.ansible_facts.rdma_nics }}", gpu_topology: {}}
      b300b: {status: unreachable, msg: "ssh: connect to host b300b port 22: No route to host"}
    matrix_file: roles/nic_firmware_gate/vars/nic_fw_matrix.yml
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
status:
  description: Single-host mode - V(ok), V(warn) or V(fail).
  returned: single-host mode
  type: str
verdicts:
  description: One entry per device - device, pci_address, model, psid, role, fw, fw_pending, driver_flavour,
    driver_version, verdict, row, rule, expected, source, reason, severity (ok/warn/fail), remediation.
  returned: single-host mode
  type: list
  elements: dict
counts:
  description: Single-host mode - number of devices per verdict.
  returned: single-host mode
  type: dict
  sample: {ok: 8, mismatch: 1, ignored: 1}
rows_used:
  description: Single-host mode - number of firmware matrix rows after O(extra_rows) were merged.
  returned: single-host mode
  type: int
messages:
  description: One line per failing or warning device (what the gate prints).
  returned: always
  type: list
  elements: str
report:
  description: Fleet mode - the audit, rendered into Markdown, JSON and Prometheus textfiles by the playbook's templates.
  returned: fleet mode
  type: dict
  contains:
    hosts:
      description: Host -> status (V(ok), V(warn), V(fail), V(unreachable), V(failed)), msg, and for judged hosts nic
        (the single-host result) and messages; host_stack (summary, failures) where the audit read the host stack's
        proof (a failing check is one of its messages and puts the host in the summary's failing list, exit code
        2).
      type: dict
      returned: always
    nic_rows:
      description: Every device verdict (as in RV(verdicts)) with its host.
      type: list
      elements: dict
      returned: always
    gpu:
      description: GPU consistency - hosts (driver_version, gpu_count, vbios per model, nvlink_links_down) and problems.
      type: dict
      returned: always
    summary:
      description: hosts, unreachable_or_failed, failing, warning, verdicts (count per verdict), gpu_problems, exit_code.
      type: dict
      returned: always
exit_code:
  description: Fleet mode - 0 all ok, 2 any finding, 3 any host unreachable or failed (3 wins).
  returned: fleet mode
  type: int
ansible_facts:
  description: Gather mode - C(rdma_nics) and/or C(gpu_topology) (docs/CONTRACTS.md schemas).
  returned: gather mode with O(as_facts=true)
  type: dict
gathered:
  description: Gather mode - the same data when O(as_facts=false).
  returned: gather mode with O(as_facts=false)
  type: dict
gather_errors:
  description: Gather mode - source -> why it could not be read.
  returned: gather mode
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.b300.rollout.plugins.module_utils.firmware import fw_check_run as engine
from ansible_collections.b300.rollout.plugins.module_utils.hw.tools import hw_argument_spec


def main():
    module = AnsibleModule(
        argument_spec=dict(
            hw_argument_spec(),
            rdma_nics=dict(type="dict"),
            host=dict(type="str", default="localhost"),
            hosts=dict(type="dict"),
            matrix=dict(type="list", elements="dict"),
            matrix_file=dict(type="path"),
            extra_rows=dict(type="list", elements="dict", default=[]),
            policy=dict(type="dict", default={}),
            enforce=dict(type="bool", default=False),
            gather=dict(type="list", elements="str", choices=["rdma_nics", "gpu_topology"], default=[]),
            read_topo=dict(type="bool", default=True),
            ofed_info=dict(type="str", choices=["always", "auto"], default="always"),
            fabric_manager_devices=dict(type="list", elements="str", default=[]),
            as_facts=dict(type="bool", default=True),
        ),
        mutually_exclusive=[("rdma_nics", "hosts"), ("matrix", "matrix_file"), ("gather", "rdma_nics"), ("gather", "hosts")],
        supports_check_mode=True,
    )
    try:
        if module.params["gather"]:
            module.exit_json(**engine.gather(module, module.params))
        result, warnings = engine.judge(module.params)
    except engine.Refused as exc:
        for w in exc.result.pop("warnings", []):
            module.warn(w)
        module.fail_json(msg=exc.msg, **exc.result)
    for w in warnings:
        module.warn(w)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
