# -*- coding: utf-8 -*-
"""GPU <-> RDMA NIC affinity: which data NICs sit nearest to a set of GPUs.

Used by the SGLang role (``--disaggregation-ib-device``) and the NCCL role (``NCCL_IB_HCA``).

Public API (also in docs/CONTRACTS.md):

``nic_distance(gpu, nic, topology, sysfs_root="/sys") -> (rank, source)``
    gpu: one entry of ``gpu_topology.gpus``; nic: one entry of ``rdma_nics.devices``;
    topology: ``gpu_topology.topology`` (may be None). rank: 0 PIX, 1 PXB, 2 PHB, 3 NODE, 4 SYS,
    5 unknown (lower is nearer). source: ``topo`` (the ``nvidia-smi topo -m`` GPU/NIC cell),
    ``sysfs_pci`` (common ancestor of the two PCI paths under ``<sysfs_root>/bus/pci/devices``),
    ``numa`` (same NUMA node -> NODE, different -> SYS) or ``unknown``.

``nearest_nics(gpu_topology, rdma_nics, gpu_indices, count=None, sysfs_root="/sys") -> [nic names]``
    Only usable data NICs (``role == data`` and ``usable``), never the fabric-manager ConnectX-7.
    count=None: for each GPU in ``gpu_indices`` (in the given order) the NICs tied at that GPU's best rank,
    de-duplicated, in order of first appearance (ties by name). count=N: that list, then padded with the
    remaining usable NICs ordered by (best rank over the GPUs, sum of ranks, name), cut to N.
    Deterministic for the same inputs. Empty list when no NIC is usable.

``gpu_nic_map(gpu_topology, rdma_nics, sysfs_root="/sys") -> {gpu_index: nic name or None}``
    the single nearest usable data NIC per GPU (``nearest_nics(..., [i], count=1)``).
"""
from __future__ import annotations

import os
import re

LEVEL_RANK = {"PIX": 0, "PXB": 1, "PHB": 2, "NODE": 3, "SYS": 4}
UNKNOWN_RANK = 5
_PCI_RE = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_ROOT_RE = re.compile(r"^pci[0-9a-f]{4,8}:[0-9a-f]{2}$")


def pci_path(sysfs_root, pci_address):
    """Chain of PCI components from the root complex down to the device, e.g.
    ``['pci0000:17', '0000:17:01.0', '0000:18:00.0', '0000:1a:00.0']``; [] when unknown."""
    if not pci_address:
        return []
    link = os.path.join(sysfs_root or "/sys", "bus", "pci", "devices", pci_address)
    if not os.path.exists(link):
        return []
    parts = os.path.realpath(link).split(os.sep)
    out = []
    for p in parts:
        p = p.lower()
        if _ROOT_RE.match(p):
            out = [p]
        elif _PCI_RE.match(p):
            out.append(p)
    return out if out and out[-1] == pci_address.lower() else []


def _sysfs_rank(gpu_pci, nic_pci, sysfs_root):
    a, b = pci_path(sysfs_root, gpu_pci), pci_path(sysfs_root, nic_pci)
    if not a or not b:
        return None
    common = 0
    for x, y in zip(a[:-1], b[:-1]):
        if x != y:
            break
        common += 1
    if common == 0:
        return None  # different root complexes: decide by NUMA node
    has_root = _ROOT_RE.match(a[0]) is not None
    if has_root and common == 1:
        return LEVEL_RANK["PHB"]
    # bridges between each device and the common ancestor
    hops = max(len(a) - 1 - common, len(b) - 1 - common)
    return LEVEL_RANK["PIX"] if hops <= 1 else LEVEL_RANK["PXB"]


def nic_distance(gpu, nic, topology=None, sysfs_root="/sys"):
    """(rank, source) for one GPU and one NIC; see the module docstring."""
    cell = ((topology or {}).get("gpu_nic") or {}).get(str(gpu.get("index")), {}).get(nic.get("name"))
    if cell in LEVEL_RANK:
        return LEVEL_RANK[cell], "topo"
    rank = _sysfs_rank(gpu.get("pci_bus_id"), nic.get("pci_address"), sysfs_root)
    if rank is not None:
        return rank, "sysfs_pci"
    gn, nn = gpu.get("numa_node"), nic.get("numa_node")
    if gn is not None and nn is not None:
        return (LEVEL_RANK["NODE"] if gn == nn else LEVEL_RANK["SYS"]), "numa"
    return UNKNOWN_RANK, "unknown"


def usable_data_nics(rdma_nics):
    return sorted((d for d in (rdma_nics or {}).get("devices") or []
                   if d.get("usable") and d.get("role", "data") == "data"), key=lambda d: d["name"])


def nearest_nics(gpu_topology, rdma_nics, gpu_indices, count=None, sysfs_root="/sys"):
    """Usable data NICs nearest to the GPUs in ``gpu_indices``; see the module docstring."""
    nics = usable_data_nics(rdma_nics)
    if not nics:
        return []
    by_index = {g["index"]: g for g in (gpu_topology or {}).get("gpus") or []}
    topology = (gpu_topology or {}).get("topology")
    gpus = [by_index[int(i)] for i in gpu_indices if int(i) in by_index]
    if not gpus:
        raise ValueError("none of GPUs %s are in gpu_topology (have %s)" % (list(gpu_indices), sorted(by_index)))
    ranks = {n["name"]: [nic_distance(g, n, topology, sysfs_root)[0] for g in gpus] for n in nics}
    ordered = []
    for gi, _g in enumerate(gpus):
        best = min(ranks[n["name"]][gi] for n in nics)
        for n in nics:
            if ranks[n["name"]][gi] == best and n["name"] not in ordered:
                ordered.append(n["name"])
    if count is None:
        return ordered
    rest = sorted((n["name"] for n in nics if n["name"] not in ordered),
                  key=lambda name: (min(ranks[name]), sum(ranks[name]), name))
    return (ordered + rest)[:int(count)]


def gpu_nic_map(gpu_topology, rdma_nics, sysfs_root="/sys"):
    """{gpu index: nearest usable data NIC name or None}."""
    out = {}
    for g in (gpu_topology or {}).get("gpus") or []:
        names = nearest_nics(gpu_topology, rdma_nics, [g["index"]], count=1, sysfs_root=sysfs_root)
        out[g["index"]] = names[0] if names else None
    return out
