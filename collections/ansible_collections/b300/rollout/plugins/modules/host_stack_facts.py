#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: the host stack's state, plan and proof (logic in module_utils/hoststack/host_stack.py)."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: host_stack_facts
short_description: Read the NVIDIA + ConnectX host stack, plan what to install/hold/remove and prove it (read-only)
description:
  - Reads dpkg state (holds from its selections), C(apt-cache policy) of the stack's packages only when one is missing or
    at another version (local package lists only, never the
    network), C(apt-config dump), C(/proc/modules), C(/proc/driver/nvidia/version), C(nvidia-smi -q), the fabric
    manager's journal of this boot, C(mokutil --sb-state), the modules of the kernel that boots next (C(modinfo -k)),
    its C(/boot/config-*), C(/etc/modules-load.d) and the C(SW_MNG) mark in C(<sysfs_root>/class/infiniband/*/device/vpd).
  - Returns C(ansible_facts.host_stack) with the plan (install in the stack's order at exact versions, hold, unhold,
    remove, reboot and why, refusals) and the proof (one check per line with verdict, found, expected, fix).
  - Read-only; runs in check mode too. Missing tools (nvidia-smi, mokutil, journalctl) are read as empty output
    and the checks that need them fail with what was found.
  - Tools looked up in O(bin_path) before C(PATH) - nvidia-smi, mokutil, modinfo.
version_added: "1.3.0"
extends_documentation_fragment: [ansible.builtin.action_common_attributes, b300.rollout.common, ansible.builtin.action_common_attributes.facts, b300.rollout.hw]
attributes:
  facts:
    support: full
    details: Returns C(ansible_facts.host_stack).
options:
  stack:
    description: The declared stack, one entry of C(host_stack_stacks) (roles/host_stack/vars/stacks.yml).
    type: dict
    required: true
  root:
    description: Root under which C(/proc), C(/etc), C(/boot) and C(/lib/modules) are read (tests and the sandbox).
    type: path
    default: /
  proc_root:
    description:
      - Directory read for C(modules) and C(driver/nvidia/version) instead of C(<root>/proc) (the sandbox's emulated
        driver writes its own there, sandbox/hwemu/hoststack.py); empty - C(<root>/proc).
    type: path
    default: ""
  read_files:
    description:
      - Files (under O(root)) whose text is returned in C(files), so the caller writes one only where it differs (the
        role's apt pins, unattended-upgrades blacklist and modules-load.d file).
    type: list
    elements: path
    default: []
  host:
    description: Host name the failure messages carry.
    type: str
    required: true
"""

EXAMPLES = r"""
- name: Read the host stack
  b300.rollout.host_stack_facts:
    stack: "{{ host_stack_stacks[host_stack_name] }}"
    host: "{{ inventory_hostname }}"
  module_defaults:
    group/b300.rollout.hw: "{{ hw_module_defaults }}"
"""

RETURN = r"""
ansible_facts:
  description: Facts set for the host.
  returned: always
  type: dict
  contains:
    host_stack:
      description: >-
        plan (install - name=version in install order, hold, unhold, remove, modprobe - modules to load now, acts - any
        of those five, restart - units to restart when no reboot follows (the fabric manager after its version,
        NVLSM or the bridge modules changed),
        reboot - bool, reboot_reasons, refusals - non-empty means change nothing, notes), checks (check, verdict -
        pass, fail, warn or skip, found, expected, fix, evidence), summary (one line per check - check, verdict,
        found), verdicts (check -> verdict), failures (one line per failing check - host, check, found, expected, fix),
        running_kernel, next_kernel, secure_boot (true, false or null), sw_mng_devices and files (path -> its text,
        null when absent or unreadable; the paths of O(read_files)), boot_age_s (seconds since the host booted: the
        uptime less PID 1's start, so a container's own start in the sandbox; null when unreadable).
      type: dict
      returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.b300.rollout.plugins.module_utils.hoststack.host_stack_io import boot_age_s, gather, read_text, report
from ansible_collections.b300.rollout.plugins.module_utils.hw.tools import find_tool, hw_argument_spec


def main():
    module = AnsibleModule(
        argument_spec=dict(hw_argument_spec(), stack=dict(type="dict", required=True),
                           root=dict(type="path", default="/"), proc_root=dict(type="path", default=""),
                           read_files=dict(type="list", elements="path", default=[]),
                           host=dict(type="str", required=True)),
        supports_check_mode=True,
    )
    p = module.params

    def run(argv):
        """stdout, or '' when the tool is missing or fails (the check that needs it then fails saying so)."""
        if not argv[0]:
            return ""
        rc, out, _err = module.run_command(argv, environ_update={"LC_ALL": "C"})
        return out if rc == 0 else ""

    def find(name, extra):
        return find_tool(module, name, extra)

    state = gather(run, find, p["stack"], p["root"], p["bin_path"], p["sysfs_root"], p["proc_root"] or None)
    fact = report(p["stack"], state, p["host"])
    fact["files"] = {f: read_text(p["root"], f) for f in p["read_files"]}
    fact["boot_age_s"] = boot_age_s(p["root"])
    module.exit_json(changed=False, ansible_facts={"host_stack": fact})


if __name__ == "__main__":
    main()
