#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: the host stack's state, plan and proof (logic in module_utils/host_stack.py)."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: host_stack_facts
short_description: Read the NVIDIA + ConnectX host stack, plan what to install/hold/remove and prove it (read-only)
description:
  - Reads dpkg and apt-mark state, C(apt-cache policy) of the stack's packages (local package lists only, never the
    network), C(apt-config dump), C(/proc/modules), C(/proc/driver/nvidia/version), C(nvidia-smi -q), the fabric
    manager's journal of this boot, C(mokutil --sb-state), the modules of the kernel that boots next (C(modinfo -k)),
    its C(/boot/config-*), C(/etc/modules-load.d) and the C(SW_MNG) mark in C(<sysfs_root>/class/infiniband/*/device/vpd).
  - Returns C(ansible_facts.host_stack) with the plan (install in the stack's order at exact versions, hold, unhold,
    remove, reboot and why, refusals) and the proof (one check per line with verdict, found, expected, fix).
  - Read-only; runs in check mode too. Missing tools (nvidia-smi, mokutil, journalctl) are read as empty output
    and the checks that need them fail with what was found.
  - Tools looked up in O(bin_path) before C(PATH) - nvidia-smi, mokutil.
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
        of those five,
        reboot - bool, reboot_reasons, refusals - non-empty means change nothing, notes), checks (check, verdict -
        pass, fail, warn or skip, found, expected, fix, evidence), summary (one line per check - check, verdict,
        found), failures (one line per failing check - host, check, found, expected, fix),
        running_kernel, next_kernel, secure_boot (true, false or null) and sw_mng_devices.
      type: dict
      returned: always
"""

import glob
import os
import platform

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.b300.rollout.plugins.module_utils import host_stack as hs
from ansible_collections.b300.rollout.plugins.module_utils.rdma_nic import vpd_is_sw_mng
from ansible_collections.b300.rollout.plugins.module_utils.tools import find_tool, hw_argument_spec


def _read(path):
    try:
        with open(path) as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError):
        return ""


def _run(module, argv):
    """stdout of argv, or '' when the tool is missing or fails (the check that needs it then fails with that)."""
    if not argv[0]:
        return ""
    rc, out, _err = module.run_command(argv, environ_update={"LC_ALL": "C"})
    return out if rc == 0 else ""


def _kernel_key(release):
    return [int(x) if x.isdigit() else x for x in release.replace("-", ".").split(".")]


def gather(module, stack, root, bin_path, sysfs_root):
    r = lambda *p: os.path.join(root, *p)  # noqa: E731 - a path under root
    running = platform.release()
    kernels = sorted((os.path.basename(p)[len("vmlinuz-"):] for p in glob.glob(r("boot", "vmlinuz-*"))),
                     key=_kernel_key)
    nxt = kernels[-1] if kernels else running   # GRUB's default on Ubuntu/Debian is the newest installed kernel
    dpkg = _run(module, [find_tool(module, "dpkg-query"), "-W", "-f", "${Package}\t${Version}\t${db:Status-Abbrev}\n"])
    names = [p["name"] for p in hs.stack_packages(stack, running)]
    mods = {}
    modinfo = find_tool(module, "modinfo")
    for m in stack.get("boot_modules") or []:
        fn = _run(module, [modinfo, "-k", nxt, "-F", "filename", m]).strip() if modinfo else ""
        signer = _run(module, [modinfo, "-k", nxt, "-F", "signer", m]).strip() if fn else ""
        mods[m] = {"path": fn or None, "signer": signer or None}
    load = {}
    for p in sorted(glob.glob(r("etc", "modules-load.d", "*.conf"))):
        load[os.path.basename(p)] = _read(p)
    ib = os.path.join(sysfs_root, "class", "infiniband")
    bridges = sorted(d for d in (os.listdir(ib) if os.path.isdir(ib) else [])
                     if vpd_is_sw_mng(os.path.join(ib, d, "device")))
    journal = find_tool(module, "journalctl")
    return {
        "dpkg": dpkg,
        "holds": _run(module, [find_tool(module, "apt-mark"), "showhold"]),
        "apt_policy": _run(module, [find_tool(module, "apt-cache"), "policy"] + names),
        "apt_config": _run(module, [find_tool(module, "apt-config"), "dump"]),
        "proc_modules": _read(r("proc", "modules")),
        "proc_version": _read(r("proc", "driver", "nvidia", "version")),
        "smi_q": _run(module, [find_tool(module, "nvidia-smi", bin_path), "-q"]),
        "fm_journal": _run(module, [journal, "-b", "--no-pager", "-o", "short", "-n", "5000", "-u",
                                    "nvidia-fabricmanager", "-u", "nvidia-nvlsm"]) if journal else "",
        "sb_state": _run(module, [find_tool(module, "mokutil", bin_path), "--sb-state"]),
        "running_kernel": running, "next_kernel": nxt, "next_kernel_modules": mods,
        "kernel_config": _read(r("boot", "config-%s" % nxt)),
        "modules_load": load, "sw_mng_devices": bridges,
        "unattended_upgrades_installed": "unattended-upgrades" in hs.parse_dpkg(dpkg),
    }


def main():
    module = AnsibleModule(
        argument_spec=dict(hw_argument_spec(), stack=dict(type="dict", required=True),
                           root=dict(type="path", default="/"), host=dict(type="str", required=True)),
        supports_check_mode=True,
    )
    p = module.params
    state = gather(module, p["stack"], p["root"], p["bin_path"], p["sysfs_root"])
    results = hs.checks(p["stack"], state)
    facts = {
        "plan": hs.plan(p["stack"], state), "checks": results, "summary": hs.summary(results), "failures": hs.failures(p["host"], results),
        "running_kernel": state["running_kernel"], "next_kernel": state["next_kernel"],
        "secure_boot": hs.parse_sb_state(state["sb_state"]), "sw_mng_devices": state["sw_mng_devices"],
    }
    module.exit_json(changed=False, ansible_facts={"host_stack": facts})


if __name__ == "__main__":
    main()
