# -*- coding: utf-8 -*-
"""PCIe links, AER counters, ACS, IOMMU and GPUDirect readiness of the triage (stdlib only).

Sources (``../shared/reference/oncall-triage-anchors.md`` R6-R8):
  * ``/sys/bus/pci/devices/<BDF>/{current,max}_link_{speed,width}`` (= lspci LnkSta/LnkCap) -- :func:`read_link`;
  * ``/sys/bus/pci/devices/<BDF>/aer_dev_{correctable,nonfatal,fatal}`` (``TOTAL_ERR_*`` lines) -- :func:`parse_aer`;
  * ``lspci -vvv`` ``ACSCtl:`` (``SrcValid+``...) -- :func:`parse_lspci_acs`; ``setpci -s BDF ECAP_ACS+0x6.w`` (non-zero =
    enabled) -- :func:`parse_setpci_acs`;
  * ``/proc/cmdline`` (``iommu=pt``, ``intel_iommu=``, ``amd_iommu=``), ``/sys/class/iommu``, ``<dev>/iommu_group/type``
    -- :func:`iommu_mode`;
  * ``/sys/module/nvidia_peermem/version`` (or legacy ``/sys/kernel/mm/memory_peers/nv_mem*/version``), ``lsmod`` /
    ``/proc/modules`` -- :func:`gdr_state` (NCCL's own test, ``src/transport/net_ib/gdr.cc:14-21``).
"""
from __future__ import annotations

import os
import re

from ansible_collections.b300.rollout.plugins.module_utils.hw.affinity import pci_path


def _read(path):
    try:
        with open(path) as fh:
            return fh.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def parse_speed(text):
    """``64.0 GT/s PCIe`` -> 64.0; ``8.0 GT/s`` -> 8.0; ``Unknown`` / None -> None."""
    m = re.match(r"^\s*(\d+(?:\.\d+)?)\s*GT/s", text or "")
    return float(m.group(1)) if m else None


def parse_width(text):
    m = re.match(r"^\s*x?(\d+)\s*$", text or "")
    return int(m.group(1)) if m else None


GEN_OF_SPEED = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6, 128.0: 7}


def read_link(sysfs_root, bdf):
    """{bdf, current_speed, max_speed, current_width, max_width, gen, max_gen} of one PCI function (None when absent)."""
    d = os.path.join(sysfs_root or "/sys", "bus", "pci", "devices", bdf)
    cs = parse_speed(_read(os.path.join(d, "current_link_speed")))
    ms = parse_speed(_read(os.path.join(d, "max_link_speed")))
    return {"bdf": bdf, "current_speed": cs, "max_speed": ms,
            "current_width": parse_width(_read(os.path.join(d, "current_link_width"))),
            "max_width": parse_width(_read(os.path.join(d, "max_link_width"))),
            "gen": GEN_OF_SPEED.get(cs), "max_gen": GEN_OF_SPEED.get(ms)}


def path_between(sysfs_root, a, b):
    """PCI functions from device a up to the common ancestor and down to device b (both ends included, the host
    bridge ``pciXXXX:YY`` excluded); [] when either path is unknown. This is the GPU<->NIC path of R6/R8."""
    pa, pb = pci_path(sysfs_root, a), pci_path(sysfs_root, b)
    if not pa or not pb:
        return []
    common = 0
    for x, y in zip(pa, pb):
        if x != y:
            break
        common += 1
    up = list(reversed(pa[max(common - 1, 0):]))
    down = pb[common:]
    out = [p for p in up + down if not p.startswith("pci")]
    seen, res = set(), []
    for p in out:
        if p not in seen:
            seen.add(p)
            res.append(p)
    return res


def upstream_of(sysfs_root, bdf):
    """The PCI function directly above bdf (its upstream bridge port), or None."""
    p = pci_path(sysfs_root, bdf)
    return p[-2] if len(p) >= 2 and not p[-2].startswith("pci") else None


def parse_aer(text):
    """``aer_dev_*`` file text (``RxErr 0`` ... ``TOTAL_ERR_COR 0``) -> {name: int}; TOTAL_ERR_* kept as 'total'."""
    out = {}
    for ln in (text or "").splitlines():
        parts = ln.split()
        if len(parts) == 2 and re.match(r"^-?\d+$", parts[1]):
            key = "total" if parts[0].startswith("TOTAL_ERR") else parts[0]
            out[key] = int(parts[1])
    return out


def read_aer(sysfs_root, bdf):
    """{correctable, nonfatal, fatal} each a parse_aer dict, or None when the kernel exposes no AER files."""
    d = os.path.join(sysfs_root or "/sys", "bus", "pci", "devices", bdf)
    out = {}
    for kind in ("correctable", "nonfatal", "fatal"):
        t = _read(os.path.join(d, "aer_dev_" + kind))
        out[kind] = parse_aer(t) if t is not None else None
    return out if any(v is not None for v in out.values()) else None


# --------------------------------------------------------------------------- ACS
ACS_REDIRECT_BITS = ("SrcValid", "ReqRedir", "CmpltRedir")


def parse_lspci_acs(text):
    """``lspci -vvv`` text of one or more functions -> {bdf or '': {'ACSCap': {...}, 'ACSCtl': {bit: bool}}}."""
    out = {}
    cur = ""
    for ln in (text or "").splitlines():
        m = re.match(r"^([0-9a-fA-F]{4}:)?([0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s", ln)
        if m:
            cur = ((m.group(1) or "0000:") + m.group(2)).lower()
            continue
        m = re.search(r"\b(ACSCap|ACSCtl):\s*(.*)$", ln)
        if m:
            bits = {}
            for tok in m.group(2).split():
                mm = re.match(r"^([A-Za-z]+)([+-])$", tok)
                if mm:
                    bits[mm.group(1)] = mm.group(2) == "+"
            out.setdefault(cur, {})[m.group(1)] = bits
    return out


def parse_setpci_acs(text):
    """``setpci -s BDF ECAP_ACS+0x6.w`` output (hex word) -> int, or None (no ACS capability: setpci prints an error)."""
    t = (text or "").strip()
    return int(t, 16) if re.match(r"^[0-9a-fA-F]{1,4}$", t) else None


def acs_enabled_bits(ctl):
    """Names of the P2P-redirecting ACS controls that are on (SrcValid, ReqRedir, CmpltRedir), from a parsed ACSCtl
    dict or a setpci word (bit 0 SrcValid, 2 ReqRedir, 3 CmpltRedir)."""
    if isinstance(ctl, int):
        return [n for n, bit in (("SrcValid", 0x1), ("ReqRedir", 0x4), ("CmpltRedir", 0x8)) if ctl & bit]
    return [b for b in ACS_REDIRECT_BITS if (ctl or {}).get(b)]


# --------------------------------------------------------------------------- IOMMU
def iommu_mode(cmdline, sysfs_root="/sys", bdfs=()):
    """{'mode': passthrough|translated|off|unknown, 'evidence': [...]}: the kernel command line (iommu=pt,
    intel_iommu=/amd_iommu=), the default domain type of the devices' IOMMU groups (identity = passthrough), and
    /sys/class/iommu."""
    ev = []
    cl = cmdline or ""
    types = {}
    for b in bdfs or ():
        t = _read(os.path.join(sysfs_root or "/sys", "bus", "pci", "devices", b, "iommu_group", "type"))
        if t:
            types[b] = t
    units = []
    try:
        units = sorted(os.listdir(os.path.join(sysfs_root or "/sys", "class", "iommu")))
    except OSError:
        pass
    if cl:
        ev.append("cmdline: " + " ".join(t for t in cl.split() if "iommu" in t) or "cmdline: no iommu option")
    if types:
        ev.append("iommu_group types: " + ", ".join("%s=%s" % kv for kv in sorted(types.items())))
    if units:
        ev.append("/sys/class/iommu: " + " ".join(units))
    translated = [b for b, t in types.items() if t.startswith("DMA")]
    if types and not translated:
        return {"mode": "passthrough", "evidence": ev, "translated_devices": []}
    if translated:
        return {"mode": "translated", "evidence": ev, "translated_devices": sorted(translated)}
    if re.search(r"(?:^|\s)iommu=(?:pt|off)\b|(?:^|\s)(?:intel|amd)_iommu=off\b", cl):
        return {"mode": "passthrough" if "iommu=pt" in cl else "off", "evidence": ev, "translated_devices": []}
    if re.search(r"(?:^|\s)(?:intel|amd)_iommu=on\b", cl) and units:
        return {"mode": "translated", "evidence": ev, "translated_devices": []}
    if not units:
        return {"mode": "off", "evidence": ev or ["no IOMMU unit in /sys/class/iommu"], "translated_devices": []}
    return {"mode": "unknown", "evidence": ev, "translated_devices": []}


# --------------------------------------------------------------------------- GPUDirect RDMA
PEERMEM_PATHS = (("module", "nvidia_peermem", "version"), ("kernel", "mm", "memory_peers", "nv_mem", "version"),
                 ("kernel", "mm", "memory_peers", "nv_mem_nc", "version"))


def parse_lsmod(text):
    """``lsmod`` or ``/proc/modules`` text -> {module: [users]}."""
    out = {}
    for ln in (text or "").splitlines():
        parts = ln.split()
        if not parts or parts[0] == "Module":
            continue
        users = []
        if len(parts) >= 4 and parts[3] not in ("-",) and not parts[3].startswith("Live"):
            users = [u for u in parts[3].strip(",").split(",") if u and u != "-"]
        out[parts[0]] = users
    return out


def _kernel_at_least(release, major, minor):
    m = re.match(r"^(\d+)\.(\d+)", release or "")
    return bool(m) and (int(m.group(1)), int(m.group(2))) >= (major, minor)


def gdr_state(sysfs_root="/sys", lsmod_text=None, kernel_release=None):
    """What NCCL would find for GPUDirect RDMA: {'peermem': bool, 'peermem_source', 'dmabuf_possible': bool|None,
    'mode': peermem|dmabuf|none, 'evidence': [...]} (peermem as NCCL tests it; DMA-BUF needs kernel >= 5.12 and is
    probed by NCCL with ibv_reg_dmabuf_mr at run time, so passively it is only 'possible')."""
    ev = []
    src = None
    for parts in PEERMEM_PATHS:
        p = os.path.join(sysfs_root or "/sys", *parts)
        v = _read(p)
        if v is not None:
            src = "/" + "/".join(("sys",) + parts) + " = " + v
            break
    mods = parse_lsmod(lsmod_text) if lsmod_text else {}
    in_lsmod = any(m in mods for m in ("nvidia_peermem", "nv_peer_mem"))
    if src:
        ev.append(src)
    if lsmod_text is not None:
        ev.append("lsmod: nvidia_peermem %s" % ("loaded (users of ib_core: %s)" % ",".join(mods.get("ib_core", []))
                                                if in_lsmod else "not loaded"))
    peermem = bool(src) or in_lsmod
    dmabuf = _kernel_at_least(kernel_release, 5, 12) if kernel_release else None
    if kernel_release:
        ev.append("kernel %s: DMA-BUF %s" % (kernel_release, "possible (>= 5.12)" if dmabuf else "not available (< 5.12)"))
    mode = "peermem" if peermem else ("dmabuf" if dmabuf else "none")
    return {"peermem": peermem, "peermem_source": src, "dmabuf_possible": dmabuf, "mode": mode, "evidence": ev}
