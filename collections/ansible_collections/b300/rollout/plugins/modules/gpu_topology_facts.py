#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: gpu_topology facts from nvidia-smi (parsing lives in module_utils/hw/gpu_topology.py)."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_topology_facts
short_description: Read NVIDIA GPU inventory, health and topology into the gpu_topology fact
description:
  - Runs C(nvidia-smi -q -x), C(nvidia-smi topo -m) and C(nvidia-smi nvlink -s) once each and returns
    C(ansible_facts.gpu_topology) as described in docs/CONTRACTS.md.
  - NUMA nodes missing from the XML come from C(topo -m) or from sysfs (C(<sysfs_root>/bus/pci/devices/<addr>/numa_node)).
  - When the XML carries no driver version (R610+ drivers renamed it to "KMD Version") the plain
    C(nvidia-smi) banner is read as well.
  - C(topo -m) cells are read by their vocabulary, so tabs turned into spaces, a header without its leading tab,
    ANSI escapes, NIC columns named C(mlx5_N) (older drivers, no NIC Legend) and cells glued together by drivers
    525-570 (C(PIXPHB), C(0N/A)) all parse; a row that cannot be made to fit its header fails the module naming the row.
  - When sysfs lists the RDMA devices (C(<sysfs_root>/class/infiniband)), the nearest NIC per GPU from C(topo -m) is
    checked against sysfs (common PCIe ancestor, else NUMA node); on disagreement sysfs wins in
    C(topology.gpu_nic) and the case is listed in C(affinity_disagreements).
  - Read-only; runs in check mode too.
  - Tools looked up in O(bin_path) before C(PATH) - nvidia-smi.
version_added: "1.0.0"
extends_documentation_fragment: [ansible.builtin.action_common_attributes, b300.rollout.common, ansible.builtin.action_common_attributes.facts, b300.rollout.hw]
attributes:
  facts:
    support: full
    details: Returns C(ansible_facts.gpu_topology).
options:
  nvidia_smi_path:
    description: Path of nvidia-smi. Default is to search O(bin_path) first, then PATH.
    type: path
  return_raw:
    description: Also return the raw tool outputs under C(raw) (used to record evidence).
    type: bool
    default: false
notes:
  - Fails with a message naming the tool and the host when nvidia-smi is missing, exits non-zero or prints unreadable output.
"""

EXAMPLES = r"""
- name: Read GPU topology
  gpu_topology_facts:
    bin_path: "{{ [hw_bin_path] if hw_bin_path | default('', true) else [] }}"
    sysfs_root: "{{ hw_sysfs_root | default('/sys', true) }}"

- name: Show the problems nvidia-smi reports
  ansible.builtin.debug:
    var: ansible_facts.gpu_topology.problems
"""

RETURN = r"""
ansible_facts:
  description: Facts added to the host.
  returned: always
  type: dict
  contains:
    gpu_topology:
      description: >-
        driver_version, cuda_version, gpu_count, gpus (index, name, uuid, pci_bus_id, numa_node, memory_total_mib,
        vbios_version, temperatures, power_limit_w, clock_event_reasons_active, throttled, ecc, retired_pages,
        remapped_rows, fabric, nvlink), topology (nic_columns_present, gpu_gpu, gpu_nic, cpu_affinity,
        numa_affinity), affinity_disagreements and problems (list of human readable strings). See docs/CONTRACTS.md.
      type: dict
      returned: always
      contains:
        affinity_disagreements:
          description: >-
            GPUs whose nearest NIC per C(nvidia-smi topo -m) shares no NIC with the nearest per sysfs (PCIe path,
            else NUMA node); sysfs is used for those GPUs in topology.gpu_nic. Empty when they agree or sysfs lists
            none of the topo NICs.
          type: list
          elements: dict
          returned: always
          sample: [{gpu: 0, topo_nic: [mlx5_1], sysfs_nic: [mlx5_0],
                    reason: "nvidia-smi topo -m puts mlx5_1 nearest (PIX) but sysfs (PCIe path) puts mlx5_0 nearest (PIX); using sysfs"}]
timing_s:
  description: Seconds spent per nvidia-smi call and in parsing.
  type: dict
  returned: always
raw:
  description: Raw outputs of the three nvidia-smi calls (keys smi_xml, topo, nvlink, banner).
  type: dict
  returned: when return_raw is true
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.b300.rollout.plugins.module_utils.hw.tools import gather_gpu_topology, hw_argument_spec, ToolError


def main():
    module = AnsibleModule(
        argument_spec=dict(
            hw_argument_spec(),
            nvidia_smi_path=dict(type="path"),
            return_raw=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        facts, raw, timing = gather_gpu_topology(module, p["bin_path"], p["sysfs_root"], smi_path=p["nvidia_smi_path"])
    except ToolError as exc:
        module.fail_json(msg=str(exc), **({"rc": exc.rc} if exc.rc is not None else {}))
    result = dict(changed=False, ansible_facts={"gpu_topology": facts}, timing_s=timing)
    if p["return_raw"]:
        result["raw"] = {"smi_xml": raw["smi_xml"], "topo": raw["topo"], "nvlink": raw["nvlink"], "banner": raw["banner"]}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
