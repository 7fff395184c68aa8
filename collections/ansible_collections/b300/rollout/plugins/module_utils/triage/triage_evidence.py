# -*- coding: utf-8 -*-
"""Text an on-call engineer pastes beside the triage (``tools/triage --evidence [HOST=]FILE``), read with the same
parsers the triage uses on what it collects, and charged to the host's devices (stdlib only).

What a file may hold (several of them in one file is fine; each is recognised by its own format):
- kernel log text (``dmesg``, ``journalctl -k``, syslog, raw ``/dev/kmsg``; a previous boot's log the journal no
  longer has): :func:`triage_kmsg.scan` with the host's device maps, AER and link events of a PCIe port charged to
  the data NICs and GPUs below it (the collection's ``pcie_below``);
- a job's NCCL / PyTorch log: :func:`triage_traffic.parse_nccl_warns` (completion errors, async events, failed
  verbs, fatal communicator errors, ProcessGroupNCCL watchdog timeouts, GPU Direct RDMA lines);
- perftest output (``ib_write_bw`` / ``ib_read_bw`` / ``ib_send_bw``): :func:`triage_traffic.parse_perftest`, one
  result per table;
- ``ibqueryerrors`` and ``perfquery [-x]`` output: a port is this host's NIC when its node description names the
  host and the HCA (rdma-ndd's default ``%h %d``: ``b300b mlx5_3``) or its LID is one of the host's ports; other
  ports are the fabric's;
- ``ethtool -S <netdev>`` output: the netdev is the one the pasted command line names (``ethtool -S ibp60s0``), else
  the counters are the host's, netdev unknown.
:func:`read_evidence` returns the parsed pieces; the rules are in :mod:`triage_verdict` (``evidence_rules``).
"""
from __future__ import annotations

import re

from ansible_collections.b300.rollout.plugins.module_utils.triage import triage_counters as tc
from ansible_collections.b300.rollout.plugins.module_utils.triage import triage_kmsg as tk
from ansible_collections.b300.rollout.plugins.module_utils.triage import triage_traffic as tt

MAX_BYTES = 8 << 20      # ours: a pasted log larger than 8 MiB is refused (cut it to the window of the hang)
_ETHTOOL_CMD_RE = re.compile(r"ethtool\s+(?:-S|--statistics)\s+([A-Za-z0-9_.:@-]+)")
_NCCL_KEYS = ("completions", "async_events", "ibv_failures", "comm_errors", "watchdog", "gdr_events", "gdr_gpu")


def _merge_kinds(into, extra):
    """Merge two triage_kmsg.scan ``devices`` dicts (counts and sub/code tallies added, examples up to 3)."""
    for dev, kinds in (extra or {}).items():
        d = into.setdefault(dev, {})
        for kind, g in kinds.items():
            if kind not in d:
                d[kind] = {k: (dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v)
                           for k, v in g.items()}
                d[kind]["sub_codes"] = {sub: dict(c) for sub, c in (g.get("sub_codes") or {}).items()}
                continue
            h = d[kind]
            h["count"] += g["count"]
            h["first"] = min([x for x in (h.get("first"), g.get("first")) if x] or [None])
            h["last"] = max([x for x in (h.get("last"), g.get("last")) if x] or [None])
            for key in ("subs", "codes"):
                for k, n in (g.get(key) or {}).items():
                    h[key][k] = h[key].get(k, 0) + n
            for sub, codes in (g.get("sub_codes") or {}).items():
                hs = h.setdefault("sub_codes", {}).setdefault(sub, {})
                for k, n in codes.items():
                    hs[k] = hs.get(k, 0) + n
            for v in g.get("via") or []:
                if v not in h["via"]:
                    h["via"].append(v)
            h["examples"] = (h["examples"] + [e for e in g["examples"] if e not in h["examples"]])[:3]
    return into


def merge_kernel(collected, evidence):
    """The collection's kernel-log scan devices with the evidence's merged in (a new dict)."""
    out = _merge_kinds({}, collected or {})
    return _merge_kinds(out, evidence or {})


def _nic_by_desc(desc, hosts, names):
    """'b300b mlx5_3' -> 'mlx5_3' when the description names this host (its hostname or inventory name, short) and
    one of its HCAs."""
    if not desc:
        return None
    shorts = {(h or "").split(".")[0].lower() for h in hosts if h}
    words = re.split(r"[\s:]+", desc.strip())
    if not words or words[0].split(".")[0].lower() not in shorts:
        return None
    for w in words[1:]:
        if w in names:
            return w
    return None


def read_evidence(col, files):
    """``files``: [{path, text, host (the inventory name, optional)}] -> {kernel: scan devices, nccl: [(path, warns)], perftest: [(path, run)],
    ib_ports: [{path, source, nic (or None), where, counters}], phy: [(path, nic or None, netdev, counters)],
    files: [{path, read: [what was found]}]}."""
    rn = col.get("rdma_nics") or {}
    data = [d for d in rn.get("devices") or [] if d.get("role", "data") == "data"]
    names = {d["name"] for d in data}
    by_netdev = {nd: d["name"] for d in data for nd in d.get("netdevs") or []}
    by_lid = {}
    for nic, ports in (col.get("ports") or {}).items():
        for _pn, p in (ports or {}).items():
            if p.get("lid"):
                by_lid[p["lid"]] = nic
    maps = tk.device_maps(rn, col.get("gpu_topology"), col.get("nic_gpu"), col.get("pcie_below"))
    out = {"kernel": {}, "nccl": [], "perftest": [], "ib_ports": [], "phy": [], "files": []}
    for f in files or []:
        path, text = f["path"], f.get("text") or ""
        read = []
        sc = tk.scan(text, maps)
        if sc["events"]:
            _merge_kinds(out["kernel"], sc["devices"])
            read.append("kernel log: %d events" % len(sc["events"]))
        w = tt.parse_nccl_warns(text)
        n = sum(len(w.get(k) or []) for k in _NCCL_KEYS) + (1 if w.get("ib_no_device") else 0)
        if n:
            out["nccl"].append((path, w))
            read.append("NCCL/PyTorch: %d lines" % n)
        pt = tt.parse_perftest(text)
        runs = [r for r in pt.get("runs") or [] if r.get("rows")]
        for r in runs:
            out["perftest"].append((path, r))
        if runs:
            read.append("perftest: %d tables" % len(runs))
        ibq = tc.parse_ibqueryerrors(text)
        for p in ibq["ports"]:
            nic = _nic_by_desc(p.get("node"), (col.get("host"), f.get("host")), names)
            where = "%s port %s" % ('"%s"' % p["node"] if p.get("node") else p.get("guid"), p["port"])
            out["ib_ports"].append({"path": path, "source": "ibqueryerrors", "nic": nic, "where": where,
                                    "counters": p["counters"]})
        if ibq["ports"]:
            read.append("ibqueryerrors: %d ports" % len(ibq["ports"]))
        blocks = [b for b in tc.parse_perfquery(text) if b["counters"]]
        for b in blocks:
            nic = by_lid.get(b["lid"]) if b.get("lid") is not None else None
            where = "LID %s port %s" % (b.get("lid") if b.get("lid") is not None else "?", b.get("port"))
            out["ib_ports"].append({"path": path, "source": "perfquery%s" % (" -x" if b["extended"] else ""),
                                    "nic": nic, "where": where, "counters": b["counters"]})
        if blocks:
            read.append("perfquery: %d ports" % len(blocks))
        phy = tc.phy_counters(tc.parse_ethtool_stats(text))
        if phy:
            m = _ETHTOOL_CMD_RE.search(text)
            netdev = m.group(1) if m else None
            out["phy"].append((path, by_netdev.get(netdev), netdev, phy))
            read.append("ethtool -S %s: %d PHY counters" % (netdev or "(netdev not named)", len(phy)))
        out["files"].append({"path": path, "read": read or ["nothing the triage reads"]})
    return out
