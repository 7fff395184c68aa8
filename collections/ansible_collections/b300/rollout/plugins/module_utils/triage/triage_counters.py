# -*- coding: utf-8 -*-
"""IB port state and error counters, RDMA transport counters and devlink health of the triage (stdlib only).

Sources (``../shared/reference/oncall-triage-anchors.md`` R2-R5):
  * ``<sysfs>/class/infiniband/<dev>/ports/<p>/{state,phys_state,rate}``, ``counters/*`` (IB port error counters) and
    ``hw_counters/*`` (mlx5 RDMA transport counters) -- :func:`read_port`;
  * ``rdma statistic show`` text (``link mlx5_0/1 rx_write_requests 0 ...``) -- `parse_rdma_stat`;
  * ``devlink health show`` text and ``devlink -j health show`` JSON -- :func:`parse_devlink_health`;
    ``devlink health diagnose ... reporter fw`` (``Syndrome: N``) -- :func:`parse_devlink_diagnose`;
  * the same IB port counters as on-call engineers collect them: ``perfquery [-x]`` (:func:`parse_perfquery`) and
    ``ibqueryerrors`` (:func:`parse_ibqueryerrors`), their PMA names mapped to the sysfs names above
    (:data:`PMA_TO_SYSFS`); ``ethtool -S <netdev>`` of an mlx5 netdev (:func:`parse_ethtool_stats`) and the PHY
    counters the rules judge (:data:`ETH_PHY_FAULT`, :data:`ETH_PHY_SUSPECT`, :func:`phy_counters`).
"""
from __future__ import annotations

import json
import os
import re

# IB port error counters the rules judge (anchors R4; names as sysfs and gpud spell them)
ERROR_COUNTERS = ("link_downed", "link_error_recovery", "symbol_error", "port_rcv_errors",
                  "port_rcv_remote_physical_errors", "local_link_integrity_errors", "excessive_buffer_overrun_errors",
                  "port_xmit_discards", "port_rcv_switch_relay_errors", "VL15_dropped", "port_rcv_constraint_errors",
                  "port_xmit_constraint_errors")
# the ones whose growth during the triage is a fault (R4); the rest are reported
ERROR_COUNTERS_FAULT = ("link_downed", "symbol_error", "link_error_recovery", "local_link_integrity_errors",
                        "port_rcv_errors", "excessive_buffer_overrun_errors")
REPORT_ONLY = ("port_xmit_wait", "port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets")
# RDMA transport counters (R5): growth of the first two during traffic is a fault on that NIC, the others a suspicion
HW_COUNTERS_FAULT = ("local_ack_timeout_err", "packet_seq_err")
HW_COUNTERS_SUSPECT = ("out_of_sequence", "implied_nak_seq_err", "rnr_nak_retry_err", "req_cqe_error",
                       "req_cqe_flush_error", "resp_cqe_error", "req_remote_access_errors", "resp_remote_access_errors",
                       "req_transport_retries_exceeded", "out_of_buffer", "duplicate_request")


# ethtool -S PHY counters of mlx5 netdevs (NVIDIA "Understanding mlx5 ethtool Counters"; docs/triage-real-world.md):
# growth of these during the triage fails the NIC like link_downed / symbol_error do (R4, ours for the Ethernet names):
# link down events, FCS (CRC) errors and symbol errors the FEC could not correct
ETH_PHY_FAULT = ("link_down_events_phy", "rx_crc_errors_phy", "rx_symbol_err_phy", "rx_pcs_symbol_err_phy")
# growth of these is a suspicion: discards (buffer / congestion), bad frames, PCIe signal integrity of the NIC's link
ETH_PHY_SUSPECT = ("rx_discards_phy", "tx_discards_phy", "tx_errors_phy", "rx_in_range_len_errors_phy",
                   "rx_out_of_range_len_phy", "rx_undersize_pkts_phy", "rx_fragments_phy", "rx_jabbers_phy",
                   "rx_pci_signal_integrity", "tx_pci_signal_integrity", "outbound_pci_stalled_rd",
                   "outbound_pci_stalled_wr", "module_bus_stuck", "module_high_temp", "module_bad_shorted")
# per-lane raw errors BEFORE FEC (kernel mlx5 counters.rst, type Error: "physical raw errors per lane ... before FEC
# corrections. If this counter is increasing, it implies that the link ... is suffering from high BER, and that traffic
# might be lost. You may need to replace the cable/transceiver. Please check in accordance with rx_corrected_bits_phy"):
# growth during the triage is a suspicion on that lane (the FEC may still correct them: not a fault by itself)
ETH_PHY_PRE_FEC = ("rx_err_lane_0_phy", "rx_err_lane_1_phy", "rx_err_lane_2_phy", "rx_err_lane_3_phy",
                   "rx_err_lane_4_phy", "rx_err_lane_5_phy", "rx_err_lane_6_phy", "rx_err_lane_7_phy")
# reported, never judged: bits the FEC corrected (a healthy PAM4 link corrects some); and the lanes' values since boot
ETH_PHY_REPORT = ("rx_corrected_bits_phy",) + ETH_PHY_PRE_FEC

# PMA counter names (IBTA vol. 1 16.1.3.5 PortCounters / 16.1.4.11 PortCountersExtended, as perfquery and
# ibqueryerrors print them; old infiniband-diags spellings too) -> the sysfs names of ports/<p>/counters/
PMA_TO_SYSFS = {
    "SymbolErrorCounter": "symbol_error", "SymbolErrors": "symbol_error",
    "LinkErrorRecoveryCounter": "link_error_recovery", "LinkRecovers": "link_error_recovery",
    "LinkDownedCounter": "link_downed", "LinkDowned": "link_downed",
    "PortRcvErrors": "port_rcv_errors", "RcvErrors": "port_rcv_errors",
    "PortRcvRemotePhysicalErrors": "port_rcv_remote_physical_errors", "RcvRemotePhysErrors": "port_rcv_remote_physical_errors",
    "PortRcvSwitchRelayErrors": "port_rcv_switch_relay_errors", "RcvSwRelayErrors": "port_rcv_switch_relay_errors",
    "PortXmitDiscards": "port_xmit_discards", "XmtDiscards": "port_xmit_discards",
    "PortXmitConstraintErrors": "port_xmit_constraint_errors", "XmtConstraintErrors": "port_xmit_constraint_errors",
    "PortRcvConstraintErrors": "port_rcv_constraint_errors", "RcvConstraintErrors": "port_rcv_constraint_errors",
    "LocalLinkIntegrityErrors": "local_link_integrity_errors", "LinkIntegrityErrors": "local_link_integrity_errors",
    "ExcessiveBufferOverrunErrors": "excessive_buffer_overrun_errors", "ExcBufOverrunErrors": "excessive_buffer_overrun_errors",
    "VL15Dropped": "VL15_dropped", "PortXmitWait": "port_xmit_wait", "XmtWait": "port_xmit_wait",
    "PortXmitData": "port_xmit_data", "XmtData": "port_xmit_data", "PortRcvData": "port_rcv_data", "RcvData": "port_rcv_data",
    "PortXmitPkts": "port_xmit_packets", "XmtPkts": "port_xmit_packets", "PortRcvPkts": "port_rcv_packets",
    "RcvPkts": "port_rcv_packets", "PortUnicastXmitPkts": "unicast_xmit_packets",
    "PortUnicastRcvPkts": "unicast_rcv_packets", "PortMulticastXmitPkts": "multicast_xmit_packets",
    "PortMulticastRcvPkts": "multicast_rcv_packets",
}
_QUOTE_RE = re.compile(r"^(?:[ \t]*>)+[ \t]?")


def _unquote(line):
    return _QUOTE_RE.sub("", line) if line.lstrip().startswith(">") else line


def _read(path):
    try:
        with open(path) as fh:
            return fh.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _int(text):
    try:
        return int(str(text).strip(), 0)
    except (TypeError, ValueError):
        return None


def _counters_dir(path):
    out = {}
    try:
        names = sorted(os.listdir(path))
    except OSError:
        return None
    for n in names:
        v = _int(_read(os.path.join(path, n)))
        if v is not None:
            out[n] = v
    return out


def parse_state(text):
    """``4: ACTIVE`` -> (4, 'ACTIVE'); ``5: LinkUp`` -> (5, 'LinkUp'); None parts when unreadable."""
    m = re.match(r"^\s*(\d+)\s*:\s*(\S+)", text or "")
    return (int(m.group(1)), m.group(2)) if m else (None, (text or None))


def parse_rate_gbps(text):
    """``400 Gb/sec (4X NDR)`` -> 400; ``12.5 Gb/sec`` -> 12.5; None otherwise."""
    m = re.match(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec", text or "")
    if not m:
        return None
    f = float(m.group(1))
    return int(f) if f.is_integer() else f


def read_port(sysfs_root, dev, port="1"):
    """One port's state and counters from sysfs. counters/hw_counters are None when the directory is missing."""
    p = os.path.join(sysfs_root or "/sys", "class", "infiniband", dev, "ports", str(port))
    sc, sn = parse_state(_read(os.path.join(p, "state")))
    pc, pn = parse_state(_read(os.path.join(p, "phys_state")))
    rate = _read(os.path.join(p, "rate"))
    lid = _read(os.path.join(p, "lid"))
    return {"device": dev, "port": str(port), "state": sn, "state_code": sc, "phys_state": pn, "phys_state_code": pc,
            "rate": rate, "rate_gbps": parse_rate_gbps(rate), "link_layer": _read(os.path.join(p, "link_layer")),
            "lid": int(lid, 16) if lid and re.match(r"^0x[0-9a-fA-F]+$", lid) else None,
            "counters": _counters_dir(os.path.join(p, "counters")),
            "hw_counters": _counters_dir(os.path.join(p, "hw_counters"))}


def read_ports(sysfs_root, devices):
    """{dev: {port: read_port(...)}} for the given device names (every port listed in sysfs)."""
    out = {}
    for dev in devices:
        base = os.path.join(sysfs_root or "/sys", "class", "infiniband", dev, "ports")
        try:
            ports = sorted(os.listdir(base), key=lambda x: (len(x), x))
        except OSError:
            ports = []
        out[dev] = {p: read_port(sysfs_root, dev, p) for p in ports}
    return out


def parse_rdma_stat(text):
    """``rdma statistic show`` (one line per link, or ``-p`` with one counter per indented line) ->
    {"mlx5_0/1": {counter: value}}. Lines wrapped between a counter name and its value (mail, terminals) are fine:
    the text of one link is joined before it is split."""
    out = {}
    blocks = re.split(r"(?m)^\s*link\s+", text or "")
    for b in blocks[1:]:
        toks = b.split()
        if not toks:
            continue
        name = toks[0]
        vals = out.setdefault(name, {})
        i = 1
        while i + 1 < len(toks):
            v = _int(toks[i + 1])
            if v is not None and _int(toks[i]) is None:
                vals[toks[i]] = v
                i += 2
            else:
                i += 1
    return out


# --------------------------------------------------------------------------- devlink health
_DL_DEV_RE = re.compile(r"^(?P<dev>(?:pci|auxiliary)/\S+?):\s*$")
_DL_REP_RE = re.compile(r"^\s*(?:reporter|name)\s+(?P<rep>\S+)\s*$")


def _kv_tokens(text):
    toks = text.split()
    out = {}
    i = 0
    while i < len(toks):
        k = toks[i]
        if i + 1 < len(toks):
            v = toks[i + 1]
            out[k] = _int(v) if _int(v) is not None else v
            i += 2
        else:
            i += 1
    return out


def parse_devlink_health(text):
    """``devlink health show`` text or ``devlink -j health show`` JSON -> {dev: {reporter: {state, error, recover,
    grace_period, auto_recover, auto_dump, last_dump_date, last_dump_time}}}. Raises ValueError on text that has
    neither a device line nor JSON."""
    t = (text or "").strip()
    if not t:
        return {}
    if t.startswith("{"):
        try:
            doc = json.loads(t)
        except ValueError as exc:
            raise ValueError("devlink JSON not parseable: %s" % exc) from exc
        health = doc.get("health", doc)
        out = {}
        for dev, reps in health.items():
            lst = reps if isinstance(reps, list) else [reps]
            for r in lst:
                name = r.get("reporter") or r.get("name")
                if not name:
                    continue
                out.setdefault(dev, {})[name] = {k: v for k, v in r.items() if k not in ("reporter", "name")}
        return out
    out = {}
    dev = rep = None
    for ln in t.splitlines():
        s = ln.strip().lstrip(">").strip() if ln.lstrip().startswith(">") else ln
        m = _DL_DEV_RE.match(s.strip())
        if m:
            dev = m.group("dev")
            out.setdefault(dev, {})
            rep = None
            continue
        m = _DL_REP_RE.match(s)
        if m and dev:
            rep = out[dev].setdefault(m.group("rep"), {})
            continue
        if rep is not None and s.strip():
            rep.update(_kv_tokens(s.strip()))
    if not out:
        raise ValueError("devlink health output has no device line (first line: %r)" % t.splitlines()[0][:120])
    return out


def parse_devlink_diagnose(text):
    """``devlink health diagnose DEV reporter fw`` -> {syndrome: int or None, description, fields: {...}}."""
    fields = {}
    for ln in (text or "").splitlines():
        for m in re.finditer(r"([A-Z][A-Za-z ]+?):\s*([^:]+?)(?=\s+[A-Z][A-Za-z ]+?:|$)", ln.strip()):
            fields[m.group(1).strip()] = m.group(2).strip()
    synd = fields.get("Syndrome")
    return {"syndrome": _int(synd) if synd is not None else None, "description": fields.get("Description"),
            "fields": fields}


def devlink_for_pci(health, pci_address):
    """The reporters of one PCI function from :func:`parse_devlink_health` output ({} when absent)."""
    return (health or {}).get("pci/%s" % (pci_address or "").lower()) or {}


# --------------------------------------------------------------------------- deltas
def deltas(before, after):
    """{name: after - before} for counters present in both (counters that went backwards -- a reset or a wrap --
    give their after value: growth since the reset)."""
    out = {}
    for k, a in (after or {}).items():
        b = (before or {}).get(k)
        if b is None or a is None:
            continue
        out[k] = a - b if a >= b else a
    return out


# --------------------------------------------------------------------------- counters as people collect them
_PQ_HDR_RE = re.compile(r"^#\s*Port (?P<ext>extended )?counters:\s*Lid (?P<lid>\d+) port (?P<port>\d+|ALL)", re.I)
_PQ_LINE_RE = re.compile(r"^(?P<name>[A-Za-z][A-Za-z0-9]*):\.*(?P<val>0x[0-9a-fA-F]+|\d+)\s*$")


def parse_perfquery(text):
    """``perfquery [-x] [lid port]`` text -> [{lid, port, extended, counters: {sysfs name: int}, other: {name: int}}],
    one block per ``# Port [extended] counters: Lid L port P`` header (a block pasted without its header takes its
    port from PortSelect). PortSelect/CounterSelect are not counters; PMA names the sysfs has no file for
    (QP1Dropped, ...) land in ``other``."""
    blocks = []
    cur = None
    for ln in (text or "").splitlines():
        s = _unquote(ln).strip()
        m = _PQ_HDR_RE.match(s)
        if m:
            cur = {"lid": int(m.group("lid")), "port": int(m.group("port")) if m.group("port").isdigit() else "ALL",
                   "extended": bool(m.group("ext")), "counters": {}, "other": {}}
            blocks.append(cur)
            continue
        m = _PQ_LINE_RE.match(s)
        if not m:
            continue
        if cur is None:
            cur = {"lid": None, "port": None, "extended": False, "counters": {}, "other": {}}
            blocks.append(cur)
        name, val = m.group("name"), int(m.group("val"), 0)
        if name == "PortSelect":
            if cur["port"] is None:
                cur["port"] = val
            continue
        if name.startswith("CounterSelect"):
            continue
        if name in PMA_TO_SYSFS:
            cur["counters"][PMA_TO_SYSFS[name]] = val
        else:
            cur["other"][name] = val
    for b in blocks:
        if b["lid"] is None and not b["extended"]:
            b["extended"] = any(k in b["counters"] for k in ("unicast_xmit_packets", "unicast_rcv_packets"))
    return blocks


_IBQ_NODE_RE = re.compile(r'^Errors for (?:(?P<guid>0x[0-9a-fA-F]+) )?"(?P<desc>[^"]*)"')
_IBQ_PORT_RE = re.compile(r"^GUID (?P<guid>0x[0-9a-fA-F]+) port (?P<port>\d+|ALL):(?P<rest>.*)$")
_IBQ_VAL_RE = re.compile(r"\[(?P<name>[A-Za-z0-9]+) == (?P<val>\d+)(?: \([^)]*\))?\]")
_IBQ_SUM_RE = re.compile(r"^##\s*(?:Summary:\s*)?(?P<n>\d+) (?P<what>nodes|ports) checked, (?P<bad>\d+) "
                         r"(?:bad nodes found|ports have errors beyond threshold)")


def parse_ibqueryerrors(text):
    """``ibqueryerrors`` text -> {ports: [{node, node_guid, guid, port, counters: {sysfs name: int}, other}],
    summary: {nodes_checked, bad_nodes, ports_checked, bad_ports}}. ``node`` is the node description of the
    ``Errors for`` header above the port (None for a port line pasted alone), ``node_guid`` the switch GUID that
    header carries (CA headers have none); ``port`` an int or "ALL" (a switch's sum over its ports)."""
    ports, summary = [], {}
    node = node_guid = None
    for ln in (text or "").splitlines():
        s = _unquote(ln).strip()
        m = _IBQ_NODE_RE.match(s)
        if m:
            node, node_guid = m.group("desc"), m.group("guid")
            continue
        m = _IBQ_PORT_RE.match(s)
        if m:
            counters, other = {}, {}
            for v in _IBQ_VAL_RE.finditer(m.group("rest")):
                name, val = v.group("name"), int(v.group("val"))
                if name in PMA_TO_SYSFS:
                    counters[PMA_TO_SYSFS[name]] = val
                else:
                    other[name] = val
            ports.append({"node": node, "node_guid": node_guid, "guid": m.group("guid"),
                          "port": int(m.group("port")) if m.group("port").isdigit() else "ALL",
                          "counters": counters, "other": other})
            continue
        m = _IBQ_SUM_RE.match(s)
        if m:
            if m.group("what") == "nodes":
                summary.update(nodes_checked=int(m.group("n")), bad_nodes=int(m.group("bad")))
            else:
                summary.update(ports_checked=int(m.group("n")), bad_ports=int(m.group("bad")))
    return {"ports": ports, "summary": summary}


_ETH_STAT_RE = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*):\s*(?P<val>\d+)(?:\s|$)")


def parse_ethtool_stats(text):
    """``ethtool -S <netdev>`` text -> {counter: int}: every ``name: value`` line, indented or not, with or without
    the ``NIC statistics:`` header; whatever follows the value (a reporter's ``# ...`` note) is not part of it.
    Per-queue ``[0]: name: value`` lines of other drivers keep their queue in the name."""
    out = {}
    for ln in (text or "").splitlines():
        s = _unquote(ln).strip()
        q = re.match(r"^\[(\d+)\]:\s*(.*)$", s)
        if q:
            s = "q%s_%s" % (q.group(1), q.group(2))
        m = _ETH_STAT_RE.match(s)
        if m:
            out[m.group("name")] = int(m.group("val"))
    return out


def phy_counters(stats):
    """The mlx5 PHY counters the rules judge or report, from :func:`parse_ethtool_stats` output ({} when none)."""
    keep = ETH_PHY_FAULT + ETH_PHY_SUSPECT + ETH_PHY_REPORT
    return {k: v for k, v in (stats or {}).items() if k in keep}
