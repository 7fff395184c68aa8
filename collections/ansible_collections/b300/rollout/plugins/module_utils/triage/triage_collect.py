# -*- coding: utf-8 -*-
"""What the triage reads on one host, read-only (the ``triage_collect`` module's logic).

Order (``../shared/reference/oncall-triage-anchors.md`` section 2: passive reads first, counters snapshotted so the
deltas cover the triage): counters of every data NIC (IB port ``counters/`` and ``hw_counters/``, the PHY counters
of ``ethtool -S <netdev>``), AER of every device on each GPU<->NIC path, ``nvidia-smi -q -x``; then the facts
(rdma_nics with mlxfwmanager, gpu_topology), the kernel log since the window (an AER or link event of a PCIe port is
charged to the data NICs and GPUs below it), devlink health, ACS on the path bridges, IOMMU, GPUDirect, the serving
units; then, at least ``delta_window_s`` after the first snapshot, the same counters again.

Every command is an argument list run through the caller's ``run(argv)`` (AnsibleModule.run_command in the module);
tools are looked up in ``bin_path`` first (the sandbox's emulated hardware), then PATH. Nothing is written.
"""
from __future__ import annotations

import calendar
import os
import re
import socket
import time

from ansible_collections.b300.rollout.plugins.module_utils.triage import triage_counters as tc
from ansible_collections.b300.rollout.plugins.module_utils.triage import triage_kmsg as tk
from ansible_collections.b300.rollout.plugins.module_utils.triage import triage_pcie as tp
from ansible_collections.b300.rollout.plugins.module_utils.hw.affinity import nic_distance, pci_path
from ansible_collections.b300.rollout.plugins.module_utils.hw.tools import ToolError, find_tool, gather_gpu_topology, \
    gather_rdma_nics
from ansible_collections.b300.rollout.plugins.module_utils.triage.triage_gpu import parse_gpu_extras

KERNEL_LINES_KEPT = 400


def parse_since(text):
    """'2h' / '90m' / '1d' / '45s' / '3600' -> seconds; ValueError otherwise."""
    m = re.match(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$", str(text or ""))
    if not m:
        raise ValueError("since %r: expected a duration like 2h, 90m, 1d, 3600s" % text)
    return int(float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)])


def nearest_gpu(gpu_topology, nic, sysfs_root):
    """Index of the GPU nearest to a NIC (usable or not: a port that is down still has a GPU), lowest index on ties."""
    best = None
    for g in (gpu_topology or {}).get("gpus") or []:
        rank, _src = nic_distance(g, nic, (gpu_topology or {}).get("topology"), sysfs_root)
        if best is None or rank < best[0]:
            best = (rank, g["index"])
    return best[1] if best and best[0] <= 2 else None   # PIX/PXB/PHB only: a NODE/SYS GPU is not "its" GPU


def _iso_epoch(ts):
    m = re.match(r"^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:[.,]\d+)?(?:([+-])(\d{2}):?(\d{2})|Z)?$", ts or "")
    if not m:
        return None
    t = calendar.timegm(tuple(int(x) for x in m.groups()[:6]) + (0, 0, 0))
    if m.group(7):
        off = int(m.group(8)) * 3600 + int(m.group(9)) * 60
        t -= off if m.group(7) == "+" else -off
    return t


def read_kernel_log(run, find, since_s, now=None):
    """(source, text, error): ``journalctl -k`` since the window (short-iso), else ``dmesg --time-format iso`` cut to
    the window in Python, else the error that stopped both."""
    now = now or time.time()
    start = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now - since_s))
    errors = []
    jc = find("journalctl")
    if jc:
        rc, out, err = run([jc, "-k", "--no-pager", "-q", "-o", "short-iso", "--since", start])
        if rc == 0:
            return "journalctl", out, None
        errors.append("journalctl -k rc %s: %s" % (rc, (err or out).strip()[:200]))
    dm = find("dmesg")
    if dm:
        rc, out, err = run([dm, "--time-format", "iso"])
        if rc == 0:
            kept = []
            for ln in out.splitlines():
                e = _iso_epoch(ln.split(" ", 1)[0].replace(",", "."))
                if e is None or e >= now - since_s:
                    kept.append(ln)
            return "dmesg", "\n".join(kept) + "\n", None
        errors.append("dmesg rc %s: %s" % (rc, (err or out).strip()[:200]))
    return None, "", "; ".join(errors) or "neither journalctl nor dmesg found"


def read_devlink(run, find, pcis):
    """{'health': parsed, 'diagnose': {pci: {reporter: parsed}}, 'error': str|None}; diagnose runs only for the
    reporters that counted an error."""
    dl = find("devlink")
    if not dl:
        return {"health": {}, "diagnose": {}, "error": "devlink not found (iproute2)"}
    rc, out, err = run([dl, "-j", "health", "show"])
    try:
        health = tc.parse_devlink_health(out) if rc == 0 else None
    except ValueError:
        health = None
    if health is None:
        rc, out, err = run([dl, "health", "show"])
        if rc != 0:
            return {"health": {}, "diagnose": {}, "error": "devlink health show rc %s: %s" % (rc, (err or out).strip()[:200])}
        try:
            health = tc.parse_devlink_health(out)
        except ValueError as exc:
            return {"health": {}, "diagnose": {}, "error": str(exc)}
    diag = {}
    for pci in pcis:
        for rep, st in tc.devlink_for_pci(health, pci).items():
            if rep in ("fw", "fw_fatal") and ((st.get("error") or 0) > 0 or (st.get("state") not in (None, "healthy"))):
                rc, out, err = run([dl, "health", "diagnose", "pci/%s" % pci, "reporter", rep])
                if rc == 0:
                    diag.setdefault(pci, {})[rep] = tc.parse_devlink_diagnose(out)
    return {"health": health, "diagnose": diag, "error": None}


def read_acs(run, find, bdfs):
    """{bdf: {'acs': ACSCtl dict or setpci word, 'acs_source'}} for the bridges: ONE ``lspci -vvv`` for all of them
    (root needed to see capabilities), ``setpci ECAP_ACS+0x6.w`` for a bridge lspci did not show."""
    out = {}
    lspci = find("lspci")
    setpci = find("setpci")
    parsed = {}
    if lspci and bdfs:
        rc, txt, _err = run([lspci, "-vvv"])
        if rc == 0:
            parsed = tp.parse_lspci_acs(txt)
    for b in bdfs:
        ent = parsed.get(b) or {}
        if "ACSCtl" in ent:
            out[b] = {"acs": ent["ACSCtl"], "acs_source": "lspci -vvv ACSCtl"}
            continue
        if setpci:
            rc, txt, _err = run([setpci, "-s", b, "ECAP_ACS+0x6.w"])
            if rc == 0 and tp.parse_setpci_acs(txt) is not None:
                out[b] = {"acs": tp.parse_setpci_acs(txt), "acs_source": "setpci ECAP_ACS+0x6.w"}
    return out


def serving_units(run, find, pattern):
    sc = find("systemctl")
    if not sc or not pattern:
        return []
    rc, out, _err = run([sc, "list-units", "--type=service", "--state=active", "--no-legend", "--plain",
                         "--no-pager", pattern])
    if rc != 0:
        return []
    return sorted(ln.split()[0] for ln in out.splitlines() if ln.strip() and ln.split()[0].endswith(".service"))


def snapshot(sysfs_root, nics, pcie_bdfs):
    return {"ports": tc.read_ports(sysfs_root, nics),
            "aer": {b: tp.read_aer(sysfs_root, b) for b in pcie_bdfs}, "epoch": time.time()}


def pcie_below(sysfs_root, devices):
    """{port BDF: [devices below it]} for the PCI bridges and ports on each device's path to its root complex
    (``devices``: [(name, bdf)]): a kernel-log AER or link event of such a port is charged to the devices below it."""
    out = {}
    for name, bdf in devices:
        for p in pci_path(sysfs_root, bdf)[:-1]:
            if not p.startswith("pci"):
                lst = out.setdefault(p.lower(), [])
                if name not in lst:
                    lst.append(name)
    return out


def read_phy_counters(run, find, nics):
    """({nic: PHY counters}, note): ``ethtool -S <netdev>`` of each data NIC's first netdev (an IPoIB netdev of mlx5
    carries the PHY group too, en/ipoib/ipoib.c mlx5i_stats_grps); a NIC whose netdev prints none is left out.
    ethtool missing is a note, not an error (the sysfs counters are read anyway)."""
    et = find("ethtool")
    if not et:
        return {}, "ethtool not found: PHY counters not read"
    out, notes = {}, []
    for d in nics:
        nds = d.get("netdevs") or []
        if not nds:
            continue
        rc, txt, err = run([et, "-S", nds[0]])
        if rc != 0:
            notes.append("ethtool -S %s rc %s: %s" % (nds[0], rc, (err or txt).strip()[:120]))
            continue
        phy = tc.phy_counters(tc.parse_ethtool_stats(txt))
        if phy:
            out[d["name"]] = phy
    return out, "; ".join(notes) or None


def collect(module, bin_path=None, sysfs_root="/sys", proc_root="/proc", since="2h", delta_window_s=10.0,
            fabric_manager_devices=(), serving_unit_pattern="sglang-*", read_kernel=True, run=None, sleep=time.sleep):
    """The collection of one host (see the module docstring). ``module``: an AnsibleModule (run_command,
    get_bin_path). Facts that cannot be read land in ``errors`` (the report says so); ToolError only when neither
    the NIC nor the GPU facts could be read."""
    run = run or module.run_command
    dirs = list(bin_path or [])

    def find(name):
        return find_tool(module, name, dirs)

    host = socket.gethostname()
    t0 = time.time()
    since_s = parse_since(since)
    errors = {}
    rdma = gpu = None
    raw = {}
    try:
        rdma, _tools = gather_rdma_nics(module, dirs, sysfs_root, ofed_info="auto",
                                        fabric_manager_devices=list(fabric_manager_devices or []))
    except ToolError as exc:
        errors["rdma_nics"] = str(exc)
    try:
        gpu, raw, _timing = gather_gpu_topology(module, dirs, sysfs_root, read_topo=True)
    except ToolError as exc:
        errors["gpu_topology"] = str(exc)
    if rdma is None and gpu is None:
        raise ToolError("triage on %s: neither the NIC facts (%s) nor the GPU facts (%s) could be read" % (
            host, errors.get("rdma_nics"), errors.get("gpu_topology")))
    data = [d for d in (rdma or {}).get("devices") or [] if d.get("role", "data") == "data"]
    nic_gpu = {d["name"]: nearest_gpu(gpu, d, sysfs_root) for d in data}
    pcie, gpu_pci = _pcie_paths(gpu, data, nic_gpu, sysfs_root)
    snap0 = snapshot(sysfs_root, [d["name"] for d in data], sorted(pcie))
    phy0, phy_note = read_phy_counters(run, find, data)
    extras = extras_after = None
    if raw.get("smi_xml"):
        try:
            extras = parse_gpu_extras(raw["smi_xml"])
        except ValueError as exc:
            errors["gpu_extras"] = str(exc)
    _read_pcie(pcie, snap0, sysfs_root, run, find)
    below = pcie_below(sysfs_root, [(d["name"], d["pci_address"]) for d in data if d.get("pci_address")] +
                       [("GPU %d" % gi, b) for gi, b in sorted(gpu_pci.items()) if b])
    kernel = _kernel_log(run, find, since, since_s, t0, read_kernel, rdma, gpu, nic_gpu, below)
    devlink = read_devlink(run, find, [d["pci_address"] for d in data if d.get("pci_address")])
    iommu, gdr = _iommu_gdr(run, find, proc_root, sysfs_root, pcie)
    units = serving_units(run, find, serving_unit_pattern)
    # second snapshot: deltas over the triage
    wait = delta_window_s - (time.time() - snap0["epoch"])
    if wait > 0:
        sleep(wait)
    snap1 = snapshot(sysfs_root, [d["name"] for d in data], sorted(b for b, e in pcie.items() if e["role"] != "upstream"))
    phy1, _note = read_phy_counters(run, find, data) if phy0 else ({}, None)
    smi = find("nvidia-smi")
    if smi and extras is not None:
        rc, out, _err = run([smi, "-q", "-x"])
        if rc == 0:
            try:
                extras_after = parse_gpu_extras(out)
            except ValueError:
                extras_after = None
    return {
        "host": host, "epoch": int(t0), "since": since, "since_s": since_s,
        "delta_window_s": round(snap1["epoch"] - snap0["epoch"], 1),
        "rdma_nics": rdma, "gpu_topology": gpu, "gpu_extras": extras, "gpu_extras_after": extras_after,
        "nic_gpu": nic_gpu, "ports": snap0["ports"], "ports_after": snap1["ports"],
        "pcie": pcie, "pcie_after": {b: {"aer": a} for b, a in snap1["aer"].items()},
        "pcie_below": below, "phy_counters": phy0, "phy_counters_after": phy1, "phy_note": phy_note,
        "kernel_log": kernel, "devlink": devlink, "iommu": iommu, "gdr": gdr, "serving_units": units,
        "errors": errors, "duration_s": round(time.time() - t0, 2),
    }


def _pcie_paths(gpu, data, nic_gpu, sysfs_root):
    """The PCIe entries (BDF -> role, of): every data NIC, every GPU, and the bridges between each NIC and its GPU;
    and the GPUs' BDFs by index."""
    pcie = {}
    gpu_pci = {g["index"]: (g.get("pci_bus_id") or "")[-12:].lower() for g in (gpu or {}).get("gpus") or []}
    for gi, b in sorted(gpu_pci.items()):
        if b:
            pcie[b] = {"role": "gpu", "of": "GPU %d" % gi}
    for d in data:
        if d.get("pci_address"):
            pcie[d["pci_address"]] = {"role": "nic", "of": d["name"]}
        gi = nic_gpu.get(d["name"])
        if gi is None or not d.get("pci_address") or not gpu_pci.get(gi):
            continue
        for b in tp.path_between(sysfs_root, gpu_pci[gi], d["pci_address"]):
            if b not in pcie:
                pcie[b] = {"role": "bridge", "of": None, "between": ["GPU %d" % gi, d["name"]]}
    return pcie, gpu_pci


def _read_pcie(pcie, snap0, sysfs_root, run, find):
    """Each entry's link, upstream port, AER counters (the first snapshot) and, for bridges, ACS; the upstream ports
    not on a path are added with their link (they give R6's "upstream max")."""
    for b, e in pcie.items():
        e["link"] = tp.read_link(sysfs_root, b)
        e["upstream"] = tp.upstream_of(sysfs_root, b)
        e["aer"] = snap0["aer"].get(b)
    for b, a in read_acs(run, find, sorted(b for b, e in pcie.items() if e["role"] == "bridge")).items():
        pcie[b].update(a)
    # upstream ports not on a path still give the "upstream max" of R6: read their link too
    for e in list(pcie.values()):
        up = e.get("upstream")
        if up and up not in pcie:
            pcie[up] = {"role": "upstream", "of": None, "link": tp.read_link(sysfs_root, up), "aer": None,
                        "upstream": None}


def _kernel_log(run, find, since, since_s, t0, read_kernel, rdma, gpu, nic_gpu, below):
    """The kernel log since since_s, scanned per device (the last KERNEL_LINES_KEPT matching lines kept)."""
    kernel = {"source": None, "error": None, "lines": [], "scan": {"devices": {}}, "since": since}
    if read_kernel:
        src, text, err = read_kernel_log(run, find, since_s, now=t0)
        maps = tk.device_maps(rdma, gpu, nic_gpu, below)
        sc = tk.scan(text, maps)
        kernel.update(source=src, error=err, scan={"devices": sc["devices"]},
                      lines=[e["raw"] for e in sc["events"]][-KERNEL_LINES_KEPT:])
    return kernel


def _iommu_gdr(run, find, proc_root, sysfs_root, pcie):
    """The IOMMU mode (kernel command line, sysfs) and the GPUDirect RDMA state (loaded modules: lsmod, else
    /proc/modules)."""
    cmdline = None
    try:
        with open(os.path.join(proc_root or "/proc", "cmdline")) as fh:
            cmdline = fh.read().strip()
    except OSError:
        pass
    iommu = tp.iommu_mode(cmdline, sysfs_root, [b for b, e in pcie.items() if e["role"] in ("gpu", "nic")])
    lsmod_text = None
    lsmod = find("lsmod")
    if lsmod:
        rc, out, _err = run([lsmod])
        lsmod_text = out if rc == 0 else None
    if lsmod_text is None:
        try:
            with open(os.path.join(proc_root or "/proc", "modules")) as fh:
                lsmod_text = fh.read()
        except OSError:
            pass
    gdr = tp.gdr_state(sysfs_root, lsmod_text, os.uname()[2])
    return iommu, gdr
