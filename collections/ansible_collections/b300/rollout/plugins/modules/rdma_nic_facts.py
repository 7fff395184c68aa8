#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: rdma_nics facts from sysfs, ofed_info and mlxfwmanager (logic in module_utils/hw/rdma_nic.py)."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: rdma_nic_facts
short_description: Read ConnectX/BlueField RDMA NICs, their firmware and the mlx5 driver flavour into the rdma_nics fact
description:
  - Reads C(<sysfs_root>/class/infiniband) and C(<sysfs_root>/module/mlx5_core/version), runs C(ofed_info -s) and
    C(mlxfwmanager --query) once each when present, and returns C(ansible_facts.rdma_nics) as described in
    docs/CONTRACTS.md.
  - Marks devices unusable (port not ACTIVE, link layer unknown, node type not CA) and gives the NVSwitch
    management bridge (C(SW_MNG) in the device's PCI VPD; else the ConnectX-7 beside ConnectX-8/9) the role
    C(fabric_manager) and, on a host with ConnectX-8/9, every
    other model (BlueField-3 north-south DPUs, older ConnectX) the role C(frontend); neither is ever usable for data.
  - Read-only; runs in check mode too.
  - Tools looked up in O(bin_path) before C(PATH) - ofed_info and mlxfwmanager.
version_added: "1.0.0"
extends_documentation_fragment: [ansible.builtin.action_common_attributes, b300.rollout.common, ansible.builtin.action_common_attributes.facts, b300.rollout.hw]
attributes:
  facts:
    support: full
    details: Returns C(ansible_facts.rdma_nics).
options:
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
        fw_ver, psid, node_type, numa_node, netdevs, sw_mng (SW_MNG in the PCI VPD: the NVSwitch
        management bridge), ports, role, usable, unusable_reasons, fw_pending,
        fw_available, fw_status, fw_record_match - pci|mst|guid|mac|psid or null), usable_devices,
        fw_pending_unattributed (flashed images pending a reset that match no device: device, psid, fw_running,
        fw_pending), mlxfwmanager_error (why its output was not understood, or null) and findings (one line
        each). See docs/CONTRACTS.md.
      type: dict
      returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.b300.rollout.plugins.module_utils.hw.tools import gather_rdma_nics, hw_argument_spec, ToolError


def main():
    module = AnsibleModule(
        argument_spec=dict(
            hw_argument_spec(),
            run_mlxfwmanager=dict(type="bool"),
            mlxfwmanager_path=dict(type="path"),
            ofed_info_path=dict(type="path"),
            fabric_manager_devices=dict(type="list", elements="str", default=[]),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        facts, tools = gather_rdma_nics(module, p["bin_path"], p["sysfs_root"], ofed_info_path=p["ofed_info_path"],
                                        mlxfwmanager_path=p["mlxfwmanager_path"], run_mlxfwmanager=p["run_mlxfwmanager"],
                                        fabric_manager_devices=p["fabric_manager_devices"])
    except ToolError as exc:
        module.fail_json(msg=str(exc), **({"rc": exc.rc} if exc.rc is not None else {}))
    module.exit_json(changed=False, ansible_facts={"rdma_nics": facts}, tools=tools)


if __name__ == "__main__":
    main()
