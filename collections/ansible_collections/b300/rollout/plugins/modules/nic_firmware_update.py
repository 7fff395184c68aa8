#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: plan, burn and live-activate ConnectX firmware (the engine: module_utils/firmware/fw_update_run.py, its
decisions module_utils/firmware/fw_update.py)."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: nic_firmware_update
short_description: Plan, burn and live-reset ConnectX NIC firmware, one host, decided by the firmware gate's matrix
description:
  - V(plan) (read-only, also in check mode) judges every device of O(rdma_nics) with the gate's matrix and judge
    (module_utils/hw/fw_matrix.py), picks the burning tool (C(flint) of NVIDIA MFT, else C(mstflint), each only from the
    version that knows the ConnectX-8), and for every device to burn checks the image before anything changes - its
    sha256 against the inventory's, and the PSID and version the image itself carries (C(flint -i IMAGE query)) against
    the device and the target, C(flint -i IMAGE verify) - and asks C(mlxfwreset -d DEV query) which reset levels the
    device supports (live reset or reboot). A device already at its target is skipped (no burn, no reset). A target
    OLDER than the running version (a downgrade) is refused unless the image entry's C(allow_downgrade_from) lists
    that running version; an allowed one is marked C(downgrade) and its reason starts with DOWNGRADE.
  - V(burn) runs C(flint -d PCI -i IMAGE -y burn) for each device the plan burns, one after the other; the first
    failure stops the module, naming the device, the tool's error and what state the NIC is in. Never passes
    C(-allow_psid_change), C(-nofs) or C(-clear_semaphore). Each burn runs under the NIC's lock (O(lock_dir)), after
    C(flint -d PCI q) shows the flash still holds what the plan saw (else another run burned it, and it is refused).
  - V(activate) runs C(mlxfwreset -d PCI reset -l LEVEL -y) where the plan chose a live reset, under the NIC's lock;
    a reboot plan is the caller's (the role reboots the host).
  - V(devices) (read-only, no tool run) is the plan without the tools - what each device needs and what taking the
    host out of service means (O(instances), O(router_hosts), O(maintenance)) - so nothing is copied to a host that
    needs nothing.
  - V(verify) (read-only) compares the RUNNING version of every burned device (O(rdma_nics) read after the
    activation) with its target and fails, naming the NIC's state and the fix, when one differs or still has an image
    pending.
  - V(report) (on the controller) renders every host entry under O(report_dir)/O(report_name).d/ into
    O(report_dir)/O(report_name).md and .json (and latest.md / latest.json), like the firmware audit's report.
  - Check mode - V(devices), V(plan), V(verify) run fully (they only read); V(burn) and V(activate) run nothing and
    return what they would run; V(report) writes the report (of a check-mode run, marked so).
  - Tools looked up in O(bin_path) before C(PATH) - flint, mstflint, mlxfwreset (or mstfwreset).
version_added: "1.3.0"
extends_documentation_fragment: [ansible.builtin.action_common_attributes, b300.rollout.common]
attributes:
  check_mode:
    support: full
    details: V(plan) reads only and runs; V(burn) / V(activate) change nothing and report what they would run.
options:
  action:
    description: What to do (see the description).
    type: str
    required: true
    choices: [devices, plan, burn, activate, verify, report]
  rdma_nics:
    description: The host's C(ansible_facts.rdma_nics) (V(plan)).
    type: dict
    default: {}
  matrix:
    description: Built-in matrix rows (C(nic_firmware_gate_matrix_rows)) (V(plan)).
    type: list
    elements: dict
    default: []
  extra_rows:
    description: Operator rows (C(nic_firmware_gate_extra_rows)), checked first (V(plan)).
    type: list
    elements: dict
    default: []
  policy:
    description: The gate's policy (unknown, pending_reset, ignore_roles), as C(nic_firmware_check) takes it.
    type: dict
    default: {}
  images:
    description:
      - Firmware images, one per PSID and version - C(psid), C(version), C(sha256) (64 hex digits, pinned in the
        inventory), C(path), C(where) and, for V(plan), C(host_path) (where the role put it on the host). V(devices)
        checks the list's shape.
      - C(allow_downgrade_from) (optional, one version or a list) - the RUNNING versions this image may replace although
        it is older (an explicit rollback, per PSID and version); without it a downgrade is refused.
    type: list
    elements: dict
    default: []
  tool_minimums:
    description: Lowest package version that may burn a ConnectX-8 - C(mft) and C(mstflint) (defaults in module_utils/firmware/fw_update.py).
    type: dict
    default: {}
  live_levels:
    description:
      - mlxfwreset levels a live activation may use, in order of preference, only where the device says it supports them.
      - Only 0 and 3 keep the host up (mstfwreset(1) - 4 is a warm and 5 a cold reboot of the machine); any other level
        is refused by V(devices) and V(plan), and the reset's transcript is read - a reset that reboots the machine fails.
    type: list
    elements: int
    default: [3]
  plan:
    description: The C(plan) a V(plan) run returned (V(burn) and V(activate)).
    type: dict
    default: {}
  instances:
    description: The SGLang plan's instances (C(sglang_plan.instances) - host, role, id) (V(devices)).
    type: list
    elements: dict
    default: []
  router_hosts:
    description: Hosts that run the router (the C(sglang_router) group) (V(devices)).
    type: list
    elements: str
    default: []
  maintenance:
    description: The operator's explicit maintenance flag - allows an update that stops the whole fleet (PD, router host).
    type: bool
    default: false
  host:
    description: The host's inventory name (V(devices)).
    type: str
    default: ""
  report_dir:
    description: Directory of the reports on the controller (V(report)).
    type: path
  report_name:
    description: Name of this run's report (V(report)).
    type: str
    default: latest
  missing_image_ok:
    description: V(plan) in check mode - an image not yet copied to the host is reported as not checked, not as a problem.
    type: bool
    default: false
  check_mode_run:
    description: The run being reported was a check-mode run (V(report)).
    type: bool
    default: false
  bin_path:
    description: Directories searched for flint, mstflint and mlxfwreset before C(PATH) (the C(hw_bin_path) setting).
    type: list
    elements: path
    default: []
  lock_dir:
    description:
      - V(burn) and V(activate) hold an exclusive C(flock) on C(<lock_dir>/b300-nic-<pci>.lock) around each device's
        burn (with a re-read of its flash, C(flint -d PCI q), first) and reset; the kernel frees it when the module
        ends. A second caller is refused at once, naming the holder written in the file.
    type: path
    default: /run/lock
  lock_holder:
    description: Who and which run holds the per-device lock (written into the lock file, named to a refused caller).
    type: str
    default: ""
  keep_out_on_failure:
    description: >-
      V(burn) - a fail-safe burn failure (the old image runs) returns RV(after_failure) C(put_back=true) unless
      this is set (C(nic_firmware_update_keep_out_on_failure)).
    type: bool
    default: false
notes:
  - V(plan) fails (after returning the plan) when any device cannot be updated safely; the message lists every problem.
"""

EXAMPLES = r"""
- name: What would be burned, and is the image right (read-only)
  b300.rollout.nic_firmware_update:
    action: plan
    rdma_nics: "{{ ansible_facts.rdma_nics }}"
    matrix: "{{ nic_firmware_gate_matrix_rows }}"
    images:
      - {psid: MT_0000001217, version: "40.47.1026", sha256: "{{ cx8_sha256 }}", host_path: /var/tmp/fw/cx8.bin}
  register: fw_plan

- name: Burn the planned devices
  b300.rollout.nic_firmware_update:
    action: burn
    plan: "{{ fw_plan.plan }}"

- name: Live reset where the plan chose it
  b300.rollout.nic_firmware_update:
    action: activate
    plan: "{{ fw_plan.plan }}"
  when: fw_plan.plan.activation.method == 'live'
"""

RETURN = r"""
plan:
  description: >-
    devices (per device - device, pci_address, model, psid, role, fw_running, fw_pending, verdict, row, rule,
    expected, target, action skip|burn|activate|refuse, downgrade, reason, image), downgrades (the reason of each
    allowed downgrade, one line each), tool (tool, package, version, ok, reason,
    path, checked), reset_tool (path or null), activation (method live|reboot|none, level, per_device, reason),
    problems (one line each), to_burn and to_activate (device names).
  returned: always
  type: dict
  sample: {to_burn: [mlx5_3], activation: {method: reboot}}
burned:
  description: >-
    Devices burned by this run (V(burn)), each with device, pci_address, target, flash_before, flash_new, downgrade
    (an allowed downgrade), seconds.
  returned: always
  type: list
  elements: dict
activated:
  description: >-
    Devices live-reset by this run (V(activate)), each with device, level, seconds and stages (the transcript's
    C(-I-) stages and their Done/Skipped).
  returned: always
  type: list
  elements: dict
commands:
  description: Every command this run ran or, in check mode, would run (argv lists).
  returned: always
  type: list
  elements: list
failed_device:
  description: >-
    The device whose burn or reset failed or was refused, with kind (burn - flint failed, fail-safe; changed - the
    flash is not what the plan saw; locked - another run holds the NIC's lock; reset), the tool's output and the NIC's
    state (null when none).
  returned: always
  type: dict
after_failure:
  description: >-
    On a failed or refused V(burn) / V(activate) only - put_back (whether the role puts the host back in service: only
    after flint's own fail-safe burn failure, unless O(keep_out_on_failure)) and reason (module_utils fw_update.after_failure).
  returned: on failure of burn or activate
  type: dict
service:
  description: V(devices) - mode none|rolling|outage, allowed, instances (ids on this host), reason.
  returned: when action is devices
  type: dict
verify:
  description: V(verify) - ok, devices (device, target, running, pending, ok), problems.
  returned: when action is verify
  type: dict
report:
  description: >-
    V(report) - md and json (paths written), text (the Markdown), summary (hosts, exit_code 0|2, check_mode,
    by_status) and resume (host - the command that resumes each failed or refused host).
  returned: when action is report
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.b300.rollout.plugins.module_utils.firmware import fw_update_run as engine


def main():
    module = AnsibleModule(
        argument_spec=dict(
            action=dict(type="str", required=True, choices=["devices", "plan", "burn", "activate", "verify", "report"]),
            instances=dict(type="list", elements="dict", default=[]),
            router_hosts=dict(type="list", elements="str", default=[]),
            maintenance=dict(type="bool", default=False),
            host=dict(type="str", default=""),
            report_dir=dict(type="path"),
            report_name=dict(type="str", default="latest"),
            check_mode_run=dict(type="bool", default=False),
            missing_image_ok=dict(type="bool", default=False),
            rdma_nics=dict(type="dict", default={}),
            matrix=dict(type="list", elements="dict", default=[]),
            extra_rows=dict(type="list", elements="dict", default=[]),
            policy=dict(type="dict", default={}),
            images=dict(type="list", elements="dict", default=[]),
            tool_minimums=dict(type="dict", default={}),
            live_levels=dict(type="list", elements="int", default=[3]),
            plan=dict(type="dict", default={}),
            bin_path=dict(type="list", elements="path", default=[]),
            lock_dir=dict(type="path", default="/run/lock"),
            lock_holder=dict(type="str", default=""),
            keep_out_on_failure=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    try:
        changed, result = engine.run(module)
    except engine.Refused as exc:
        module.fail_json(msg=exc.msg, **exc.result)
    module.exit_json(changed=changed, **result)


if __name__ == "__main__":
    main()
