#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: read everything the on-call triage judges on one host (logic in module_utils/triage/triage_collect.py)."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: triage_collect
short_description: Read what the on-call NCCL triage judges on one host (read-only)
description:
  - Reads, in one run and without changing anything on the host, the kernel log since a window (C(journalctl -k),
    falling back to C(dmesg)) scanned for mlx5 command timeouts and refused commands, mlx5 health/syndrome lines,
    lost interrupts, probe failures, PCIe slot power, port module temperature and errors, IB and Ethernet link
    losses, transmit timeouts, PCIe AER records and link events (pciehp, DPC, the probe-time bandwidth limit), NVIDIA
    Xid/SXid and nvidia_peermem errors, each attributed to C(mlx5_N) and its nearest GPU (an event of a PCIe port to
    the data NICs and GPUs below it); C(devlink health show) (and C(diagnose) of reporters that counted errors); IB
    port state, physical state, rate, error counters and RDMA transport counters of every data NIC, and the PHY
    counters of C(ethtool -S) on its netdev; PCIe link speed/width and AER
    counters of every data NIC, GPU and the bridges between them; ACS on those bridges (C(lspci -vvv), else
    C(setpci)); IOMMU mode; GPUDirect readiness (nvidia_peermem or DMA-BUF); the C(rdma_nics) and C(gpu_topology)
    facts and the GPU fields of C(nvidia-smi -q -x); the active serving units.
  - Counters (IB, RDMA, PHY), AER and the GPU clock-event counters are read twice, at least O(delta_window_s) apart, so the report can
    judge their growth during the triage.
  - The verdicts are made on the controller by M(b300.rollout.triage_report); rules and their sources are in
    C(module_utils/triage/triage_verdict.py).
  - Tools looked up in O(bin_path) before C(PATH) - journalctl, dmesg, devlink, lspci, setpci, lsmod, ethtool,
    nvidia-smi, mlxfwmanager, ofed_info.
version_added: "1.1.0"
extends_documentation_fragment: [ansible.builtin.action_common_attributes, b300.rollout.common, b300.rollout.hw]
attributes:
  check_mode:
    support: full
    details: Only reads; the same in check mode.
options:
  proc_root:
    description: Root of procfs, for C(cmdline) (IOMMU) and C(modules) (when C(lsmod) is missing).
    type: path
    default: /proc
  since:
    description: Kernel-log window, a duration like V(2h), V(90m), V(1d).
    type: str
    default: 2h
  delta_window_s:
    description: Minimum seconds between the two counter snapshots.
    type: float
    default: 10
  fabric_manager_devices:
    description: RDMA device names serving the NVLink fabric manager besides the auto-detected ConnectX-7.
    type: list
    elements: str
    default: []
  serving_unit_pattern:
    description: systemd unit pattern of the serving units (an active one means the node is serving; C(--traffic) is
      refused there unless forced). Empty skips the check.
    type: str
    default: sglang-*
  read_kernel_log:
    description: Read and scan the kernel log.
    type: bool
    default: true
notes:
  - Fails only when neither the NIC nor the GPU facts can be read; every other unreadable source is named in
    C(collection.errors) or in its own C(error) key, and the report says that check did not run.
"""

EXAMPLES = r"""
- name: Read what the triage judges
  b300.rollout.triage_collect:
    bin_path: "{{ [hw_bin_path] if hw_bin_path | default('', true) else [] }}"
    sysfs_root: "{{ hw_sysfs_root | default('/sys', true) }}"
    since: 2h
  register: triage_host
"""

RETURN = r"""
collection:
  description: >-
    host, epoch, since, since_s, delta_window_s, rdma_nics, gpu_topology, gpu_extras and gpu_extras_after (per GPU
    persistence mode, PCIe gen/width/replays, clock-event reasons and counters, temperatures, recovery action,
    fabric), nic_gpu (nearest GPU per data NIC), ports and ports_after (per NIC and port, state and counters),
    pcie (per PCI function, role nic/gpu/bridge/upstream, link, aer, acs), pcie_after, pcie_below (PCIe port ->
    the data NICs and GPUs below it), phy_counters and phy_counters_after (per data NIC, the C(ethtool -S) PHY
    counters of its netdev), phy_note (why they were not read, or null), kernel_log (source, error, lines, scan of
    events per device), devlink (health, diagnose, error), iommu, gdr, serving_units, errors, duration_s.
  returned: success
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.b300.rollout.plugins.module_utils.hw.tools import hw_argument_spec, ToolError
from ansible_collections.b300.rollout.plugins.module_utils.triage.triage_collect import collect


def main():
    module = AnsibleModule(
        argument_spec=dict(
            hw_argument_spec(),
            proc_root=dict(type="path", default="/proc"),
            since=dict(type="str", default="2h"),
            delta_window_s=dict(type="float", default=10.0),
            fabric_manager_devices=dict(type="list", elements="str", default=[]),
            serving_unit_pattern=dict(type="str", default="sglang-*"),
            read_kernel_log=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        col = collect(module, p["bin_path"], p["sysfs_root"], p["proc_root"], p["since"], p["delta_window_s"],
                      p["fabric_manager_devices"], p["serving_unit_pattern"], p["read_kernel_log"])
    except (ToolError, ValueError) as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, collection=col)


if __name__ == "__main__":
    main()
