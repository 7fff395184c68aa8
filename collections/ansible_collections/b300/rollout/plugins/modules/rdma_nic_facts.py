#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: rdma_nics facts from sysfs, ofed_info and mlxfwmanager (logic in module_utils/rdma_nic.py)."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: rdma_nic_facts
short_description: Read ConnectX/BlueField RDMA NICs, their firmware and the mlx5 driver flavour into the rdma_nics fact
description:
  - Reads C(<sysfs_root>/class/infiniband) and C(<sysfs_root>/module/mlx5_core/version), runs C(ofed_info -s) and
    C(mlxfwmanager --query) once each when present, and returns C(ansible_facts.rdma_nics) as described in
    docs/CONTRACTS.md.
  - Marks devices unusable (port not ACTIVE, link layer unknown, node type not CA) and gives the NVLink
    fabric-manager ConnectX-7 of an HGX B300 the role C(fabric_manager) (never usable for data).
  - Read-only; runs in check mode too.
version_added: "0.1.0"
author: b300-rollout
options:
  bin_path:
    description: Directories searched for ofed_info and mlxfwmanager before PATH (the C(hw_bin_path) inventory variable).
    type: list
    elements: path
    default: []
  sysfs_root:
    description: Root of the sysfs tree (the C(hw_sysfs_root) inventory variable).
    type: path
    default: /sys
  run_mlxfwmanager:
    description:
      - Run C(mlxfwmanager --query) to learn pending and available firmware.
      - Unset means auto, run it when it is installed. V(true) fails when it is missing. V(false) never runs it.
    type: bool
  mlxfwmanager_path:
    description: Path of mlxfwmanager. Default is to search O(bin_path) first, then PATH.
    type: path
  ofed_info_path:
    description: Path of ofed_info. Default is to search O(bin_path) first, then PATH; absent means no OFED/DOCA userland.
    type: path
  fabric_manager_devices:
    description: RDMA device names (C(mlx5_N)) that serve the NVLink fabric manager, in addition to the auto-detected ConnectX-7.
    type: list
    elements: str
    default: []
notes:
  - Fails with a message naming the tool and the host when a requested tool is missing or exits non-zero.
"""

EXAMPLES = r"""
- name: Read RDMA NICs
  rdma_nic_facts:
    bin_path: "{{ [hw_bin_path] if hw_bin_path | default('', true) else [] }}"
    sysfs_root: "{{ hw_sysfs_root | default('/sys', true) }}"

- name: NICs usable for RDMA transfers
  ansible.builtin.debug:
    var: ansible_facts.rdma_nics.usable_devices
"""

RETURN = r"""
ansible_facts:
  description: Facts added to the host.
  returned: always
  type: dict
  contains:
    rdma_nics:
      description: >-
        driver (flavour, version, version_scheme, ofed_info), devices (name, pci_address, pci_device_id, model,
        fw_ver, psid, node_type, numa_node, netdevs, ports, role, usable, unusable_reasons, fw_pending,
        fw_available, fw_status, fw_record_match - pci|mst|guid|mac|psid or null), usable_devices,
        fw_pending_unattributed (flashed images pending a reset that match no device: device, psid, fw_running,
        fw_pending) and findings (one line each). See docs/CONTRACTS.md.
      type: dict
      returned: always
"""

import os
import socket

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.b300.rollout.plugins.module_utils.rdma_nic import build_rdma_nics


def run_tool(module, argv):
    rc, out, err = module.run_command(argv)
    if rc != 0:
        module.fail_json(msg="%s: `%s` failed on host %s (rc=%s, expected 0): %s" % (
            os.path.basename(argv[0]), " ".join(argv), socket.gethostname(), rc, (err or out).strip()[:500]), rc=rc)
    return out


def main():
    module = AnsibleModule(
        argument_spec=dict(
            bin_path=dict(type="list", elements="path", default=[]),
            sysfs_root=dict(type="path", default="/sys"),
            run_mlxfwmanager=dict(type="bool"),
            mlxfwmanager_path=dict(type="path"),
            ofed_info_path=dict(type="path"),
            fabric_manager_devices=dict(type="list", elements="str", default=[]),
        ),
        supports_check_mode=True,
    )
    p = module.params
    host = socket.gethostname()
    dirs = p["bin_path"]

    ofed_info = p["ofed_info_path"] or module.get_bin_path("ofed_info", opt_dirs=dirs)
    if p["ofed_info_path"] and not os.path.exists(p["ofed_info_path"]):
        module.fail_json(msg="ofed_info: %s not found on host %s" % (p["ofed_info_path"], host))
    ofed_text = run_tool(module, [ofed_info, "-s"]) if ofed_info else None

    mlxfw_text = None
    if p["run_mlxfwmanager"] is not False:
        mlxfw = p["mlxfwmanager_path"] or module.get_bin_path("mlxfwmanager", opt_dirs=dirs)
        if mlxfw and not os.path.exists(mlxfw):
            mlxfw = None
        if mlxfw:
            mlxfw_text = run_tool(module, [mlxfw, "--query"])
        elif p["run_mlxfwmanager"]:
            module.fail_json(msg="mlxfwmanager not found on host %s (searched %s and PATH); run_mlxfwmanager=true "
                                 "expects NVIDIA MFT to be installed" % (host, dirs or "no extra dirs"))
    mst_text = None
    if mlxfw_text and "/dev/mst/" in mlxfw_text:
        # MST service running: mlxfwmanager names devices /dev/mst/mt4129_pciconf0; mst status -v maps them to PCI
        mst = module.get_bin_path("mst", opt_dirs=dirs)
        if mst:
            mrc, mout, _merr = module.run_command([mst, "status", "-v"])
            mst_text = mout if mrc == 0 else None  # without it, pending images stay host-level findings
    facts = build_rdma_nics(sysfs_root=p["sysfs_root"], ofed_info_text=ofed_text, mlxfwmanager_text=mlxfw_text,
                            mst_status_text=mst_text,
                            kernel_release=os.uname().release, fabric_manager_devices=p["fabric_manager_devices"])
    module.exit_json(changed=False, ansible_facts={"rdma_nics": facts},
                     tools={"ofed_info": ofed_info, "mlxfwmanager_ran": mlxfw_text is not None})


if __name__ == "__main__":
    main()
