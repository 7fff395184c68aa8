# -*- coding: utf-8 -*-
"""Kernel-log scan of the on-call triage: the RDMA / GPU signatures a hang leaves behind (stdlib only).

Reads the text of ``journalctl -k -o short-iso`` (also plain ``journalctl -k``), ``dmesg`` (``[  12.34]``,
``--time-format iso``, ``-T``) and pdsh-prefixed dmesg (``host: [ 12.34] ...``), and classifies the lines the
triage rules judge. Patterns and rules: ``../shared/reference/oncall-triage-anchors.md`` R1 (kernel message formats
from the mlx5 driver's ``cmd.c`` / ``health.c``, gpud's kmsg matchers, azhpc's flap rule, the NVIDIA Xid catalog).

:func:`parse_line` -> one event or None; :func:`scan` -> events grouped per device with count, first/last time and a
raw example line; :func:`attribute` maps ``mlx5_core <BDF>`` to ``mlx5_N`` and its nearest GPU, an IPoIB netdev to
its ``mlx5_N``, and ``NVRM: Xid (PCI:...)`` to the GPU index.
"""
from __future__ import annotations

import re

# --------------------------------------------------------------------------- line prefixes (time stamps, hosts)
_ISO_RE = re.compile(r"^(?P<ts>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:[+-]\d{2}:?\d{2}|Z)?)\s+(?P<rest>.*)$")
_SYSLOG_RE = re.compile(r"^(?P<ts>[A-Z][a-z]{2}\s+\d{1,2}\s+\d{2}:\d{2}:\d{2})\s+(?P<rest>.*)$")
_MONO_RE = re.compile(r"^\[\s*(?P<ts>\d+\.\d+)\]\s?(?P<rest>.*)$")
_CTIME_RE = re.compile(r"^\[(?P<ts>[A-Z][a-z]{2} [A-Z][a-z]{2}\s+\d{1,2} \d{2}:\d{2}:\d{2} \d{4})\]\s?(?P<rest>.*)$")
_PDSH_RE = re.compile(r"^(?P<host>[A-Za-z0-9_.-]+):\s+(?=\[)")
# journald / syslog: "<host> kernel: <msg>"
_KERNEL_TAG_RE = re.compile(r"^(?:(?P<host>\S+)\s+)?kernel:\s?(?P<msg>.*)$")


def split_prefix(line):
    """(timestamp text or None, message) of one kernel-log line in any of the formats above."""
    text = line.rstrip("\n")
    m = _PDSH_RE.match(text)
    if m:
        text = text[m.end():]
    ts = None
    for rx in (_ISO_RE, _SYSLOG_RE, _CTIME_RE, _MONO_RE):
        m = rx.match(text)
        if m:
            ts, text = m.group("ts"), m.group("rest")
            break
    m = _KERNEL_TAG_RE.match(text)
    if m:
        text = m.group("msg")
    # dmesg -x / journalctl with a monotonic stamp after the tag: "kernel: [  12.3] msg"
    m = _MONO_RE.match(text)
    if m:
        ts = ts or m.group("ts")
        text = m.group("rest")
    return ts, text.strip()


# --------------------------------------------------------------------------- devices named in a message
_BDF = r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]"
# "mlx5_core 0000:5f:00.0: ...", "mlx5_core 0000:ab:00.0 mlx5_5: ...", "mlx5_core 0000:5f:00.0 ibp95s0: ..."
_MLX5_DEV_RE = re.compile(r"^mlx5_(?:core|ib)\s+(?P<bdf>%s)(?:\s+(?P<name>[^\s:]+))?:\s*(?P<msg>.*)$" % _BDF)
_XID_RE = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F:.]+)\)[^:]*?:\s*(?P<code>\d+),\s*(?P<text>.*)$")
_SXID_RE = re.compile(r"(?P<sw>nvidia-nvswitch\d*)?:?\s*SXid \((?:PCI:)?(?P<pci>[0-9a-fA-F:.]+)\)[^:]*?:\s*"
                      r"(?P<code>\d+),\s*(?P<text>.*)$")
_FALLEN_RE = re.compile(r"NVRM: (?:The NVIDIA )?GPU (?:at PCI:)?(?P<pci>[0-9a-fA-F:.]+)\b.*?(?:has )?fallen off the bus")
_CARRIER_RE = re.compile(r"^(?P<netdev>[A-Za-z0-9_.-]+): lost carrier")
_PORT_STATE_RE = re.compile(r"Port: ?(?P<port>\d+) Link (?P<state>DOWN|INIT|ARMED|ACTIVE|ACTIVE_DEFER)\b")

# --------------------------------------------------------------------------- mlx5 signatures (anchors R1)
_CMD = r"(?P<cmd>[A-Z0-9_]+)\((?P<opcode>0x[0-9a-fA-F]+)\)"
MLX5_PATTERNS = [
    # (kind, sub-kind, regex) -- checked in order, first match wins
    ("mlx5_cmd_timeout", "no_done_completion", re.compile(r"cmd\[\d+\]: %s No done completion" % _CMD)),
    ("mlx5_cmd_timeout", "async_timeout", re.compile(r"cmd\[\d+\]: %s Async, timeout" % _CMD)),
    ("mlx5_cmd_timeout", "recovered_after_timeout", re.compile(r"cmd\[\d+\]: %s (?:Async, )?recovered after timeout" % _CMD)),
    ("mlx5_cmd_timeout", "timeout_leak", re.compile(r"%s timeout\. Will cause a leak of a command resource" % _CMD)),
    ("mlx5_cmd_timeout", "canceled", re.compile(r"%s canceled on out of queue timeout" % _CMD)),
    ("mlx5_cmd_timeout", "completion_after_timeout", re.compile(r"Command completion arrived after timeout")),
    ("mlx5_cmd_timeout", "exec_timeout", re.compile(r"wait_func_handle_exec_timeout.*?%s" % _CMD)),
    ("mlx5_health", "fatal_error", re.compile(r"Fatal error (?P<n>\d+) detected")),
    ("mlx5_health", "health_compromised", re.compile(r"device's health compromised")),
    ("mlx5_health", "health_issue", re.compile(r"Health issue observed")),
    ("mlx5_health", "syndrome", re.compile(r"\bsynd(?:rome)? (?P<synd>0x[0-9a-fA-F]+)")),
    ("mlx5_health", "recovery", re.compile(r"health recovery (?P<result>flow|failed|succeeded)")),
    ("mlx5_health", "error_state", re.compile(r"Driver is in error state\. Unloading")),
    ("mlx5_slot_power", "insufficient", re.compile(r"Detected insufficient power on the PCIe slot \((?P<watts>\d+W)\)")),
    ("mlx5_module_temp", "high_temperature", re.compile(r"Port module event.*High Temperature", re.I)),
    ("mlx5_access_reg", "access_reg_failed", re.compile(r"mlx5_cmd_out_err.*ACCESS_REG.*failed|ACCESS_REG\(0x805\) op_mod\(0x[0-9a-f]+\) failed")),
]
_PEERMEM_RE = re.compile(r"(?:nvidia[-_]peermem|nv_mem|peer_mem).*?ERROR detected invalid context, skipping further processing"
                         r"|ERROR detected invalid context, skipping further processing")

# --------------------------------------------------------------------------- NVIDIA Xid meaning (short)
# Meanings condensed from NVIDIA's Xid catalog as the anchors cite it (gpud N/xid catalog, aws 0-nvidia-smi-check.sh);
# "fatal" = azhpc's list of Xids that fail the node within 2 h (CT/azure_gpu_xid.nhc:10,15-19); action words are aws's.
XID_CATALOG = {
    13: ("Graphics engine exception (often the application)", "MONITOR"),
    31: ("GPU memory page fault (often the application)", "MONITOR"),
    43: ("GPU stopped processing (application fault)", "MONITOR"),
    45: ("Preemptive cleanup after a previous error", "MONITOR"),
    48: ("Double-bit ECC error", "RESET"),
    56: ("Display engine error", "RESET"),
    57: ("Error programming video memory interface", "RESET"),
    58: ("Unstable video memory interface detected", "RESET"),
    62: ("Internal micro-controller halt", "RESET"),
    63: ("ECC page retirement or row remapping recorded", "RESET"),
    64: ("ECC page retirement or row remapping failure", "RESET"),
    65: ("Video processor exception", "RESET"),
    68: ("Video processor exception", "RESET"),
    69: ("Graphics engine class error", "RESET"),
    73: ("NVENC2 error", "RESET"),
    74: ("NVLink error", "RESET"),
    79: ("GPU has fallen off the bus", "REBOOT"),
    80: ("Corrupted data sent to GPU", "RESET"),
    81: ("VGA subsystem error", "RESET"),
    92: ("High single-bit ECC error rate", "RESET"),
    94: ("Contained ECC error", "RESET"),
    95: ("Uncontained ECC error", "RESET"),
    109: ("Context switch timeout", "RESET"),
    119: ("GSP RPC timeout", "RESET"),
    120: ("GSP error", "RESET"),
    121: ("C2C link error", "RESET"),
    140: ("Unrecovered ECC error", "RESET"),
    144: ("NVLink: SAW/MSE error", "MONITOR"),
    145: ("NVLink: RLW error", "MONITOR"),
    146: ("NVLink: TLW error", "MONITOR"),
    147: ("NVLink: TREX error", "MONITOR"),
    148: ("NVLink: NVLPW_CTRL error", "MONITOR"),
    149: ("NVLink: NETIR error", "MONITOR"),
    150: ("NVLink: MSE watchdog / GIN error", "MONITOR"),
    154: ("GPU recovery action changed (see gpu_recovery_action)", "RESET"),
}
XID_FATAL = frozenset([48, 56, 57, 58, 62, 63, 64, 65, 68, 69, 73, 74, 79, 80, 81, 92, 119, 120])


def xid_meaning(code):
    """(meaning, action) for an Xid code; unknown codes say so (never guessed)."""
    return XID_CATALOG.get(int(code), ("Xid %s (not in the triage's catalog: see NVIDIA's Xid documentation)" % code,
                                       "MONITOR"))


def _pci_norm(text):
    """'0000:5d:00' / '0000:5D:00.0' / '5d:00.0' -> '0000:5d:00.0'; None when not an address."""
    t = (text or "").strip().lower().rstrip(".")
    m = re.match(r"^(?:([0-9a-f]{4,8}):)?([0-9a-f]{2}):([0-9a-f]{2})(?:\.([0-7]))?$", t)
    if not m:
        return None
    return "%04x:%s:%s.%s" % (int(m.group(1) or "0", 16), m.group(2), m.group(3), m.group(4) or "0")


def parse_line(line):
    """One classified kernel-log event, or None when the line carries no triage signature.

    Returns {kind, sub, ts, bdf, name, netdev, gpu_pci, code, meaning, action, detail, raw}. ``kind``:
    mlx5_cmd_timeout, mlx5_health, mlx5_slot_power, mlx5_module_temp, mlx5_access_reg, ib_port_state, ib_carrier_lost,
    xid, sxid, gpu_fallen_off_bus, peermem_invalid_context."""
    ts, msg = split_prefix(line)
    if not msg:
        return None
    ev = {"kind": None, "sub": None, "ts": ts, "bdf": None, "name": None, "netdev": None, "gpu_pci": None,
          "code": None, "meaning": None, "action": None, "detail": None, "raw": line.rstrip("\n")}
    m = _XID_RE.search(msg)
    if m:
        code = int(m.group("code"))
        meaning, action = xid_meaning(code)
        ev.update(kind="xid", code=code, gpu_pci=_pci_norm(m.group("pci")), meaning=meaning, action=action,
                  detail=m.group("text").strip(), sub="fatal" if code in XID_FATAL else "other")
        return ev
    m = _SXID_RE.search(msg)
    if m and "SXid" in msg:
        ev.update(kind="sxid", code=int(m.group("code")), bdf=_pci_norm(m.group("pci")), name=m.group("sw"),
                  detail=m.group("text").strip(), sub="fatal" if "fatal" in m.group("text").lower()
                  and "non-fatal" not in m.group("text").lower() else "non_fatal")
        return ev
    m = _FALLEN_RE.search(msg)
    if m:
        ev.update(kind="gpu_fallen_off_bus", gpu_pci=_pci_norm(m.group("pci")), code=79,
                  meaning=XID_CATALOG[79][0], action=XID_CATALOG[79][1], sub="fatal")
        return ev
    if _PEERMEM_RE.search(msg):
        ev.update(kind="peermem_invalid_context", sub="invalid_context", detail=msg)
        return ev
    dm = _MLX5_DEV_RE.match(msg)
    body = msg
    if dm:
        ev["bdf"] = _pci_norm(dm.group("bdf"))
        name = dm.group("name")
        if name:
            if re.match(r"^mlx5_\d+$", name):
                ev["name"] = name
            else:
                ev["netdev"] = name
        body = dm.group("msg")
    for kind, sub, rx in MLX5_PATTERNS:
        mm = rx.search(body)
        if mm:
            ev.update(kind=kind, sub=sub, detail=body)
            gd = mm.groupdict()
            if gd.get("cmd"):
                ev["code"] = "%s(%s)" % (gd["cmd"], gd["opcode"])
            elif gd.get("synd"):
                ev["code"] = gd["synd"]
            elif gd.get("watts"):
                ev["code"] = gd["watts"]
            elif gd.get("n"):
                ev["code"] = gd["n"]
            return ev
    mm = _PORT_STATE_RE.search(body)
    if mm and dm:
        ev.update(kind="ib_port_state", sub=mm.group("state").lower(), code=int(mm.group("port")), detail=body)
        return ev
    mm = _CARRIER_RE.match(body)
    if mm:
        ev.update(kind="ib_carrier_lost", sub="lost_carrier", netdev=ev["netdev"] or mm.group("netdev"), detail=body)
        return ev
    return None


def parse(text):
    """Every classified event of a kernel-log text, in order."""
    out = []
    for ln in (text or "").splitlines():
        ev = parse_line(ln)
        if ev:
            out.append(ev)
    return out


def device_maps(rdma_nics=None, gpu_topology=None, nic_gpu=None):
    """Lookup tables for :func:`attribute`: bdf->mlx5 name, netdev->mlx5 name, gpu bdf->index, mlx5 name->GPU."""
    by_bdf, by_netdev, gpu_by_pci = {}, {}, {}
    for d in (rdma_nics or {}).get("devices") or []:
        if d.get("pci_address"):
            by_bdf[d["pci_address"].lower()] = d["name"]
        for nd in d.get("netdevs") or []:
            by_netdev[nd] = d["name"]
    for g in (gpu_topology or {}).get("gpus") or []:
        p = _pci_norm((g.get("pci_bus_id") or "")[-12:]) if g.get("pci_bus_id") else None
        if p:
            gpu_by_pci[p] = g["index"]
    return {"nic_by_bdf": by_bdf, "nic_by_netdev": by_netdev, "gpu_by_pci": gpu_by_pci,
            "gpu_of_nic": dict(nic_gpu or {})}


def attribute(ev, maps):
    """The device key an event belongs to: ``mlx5_N``, ``GPU i``, ``pci <bdf>`` or ``host``; also sets
    ev['device'] and ev['gpu'] (the NIC's nearest GPU, or the GPU itself)."""
    nic = None
    if ev.get("name") and ev["name"].startswith("mlx5_"):
        nic = ev["name"]
    elif ev.get("bdf") and ev["bdf"] in maps["nic_by_bdf"]:
        nic = maps["nic_by_bdf"][ev["bdf"]]
    elif ev.get("netdev") and ev["netdev"] in maps["nic_by_netdev"]:
        nic = maps["nic_by_netdev"][ev["netdev"]]
    if nic:
        ev["device"] = nic
        ev["gpu"] = maps["gpu_of_nic"].get(nic)
        return nic
    if ev.get("gpu_pci"):
        idx = maps["gpu_by_pci"].get(ev["gpu_pci"])
        if idx is not None:
            ev["device"] = "GPU %d" % idx
            ev["gpu"] = idx
            return ev["device"]
        ev["device"] = "pci %s" % ev["gpu_pci"]
        ev["gpu"] = None
        return ev["device"]
    if ev.get("bdf"):
        ev["device"] = "pci %s" % ev["bdf"]
        ev["gpu"] = None
        return ev["device"]
    ev["device"] = "host"
    ev["gpu"] = None
    return "host"


def scan(text, maps=None, max_examples=3):
    """Group the events of a kernel-log text: {device: {kind: {count, first, last, subs: {sub: n}, codes: {code: n},
    examples: [raw lines], gpu}}} plus the flat event list. ``maps``: :func:`device_maps` (None: no attribution)."""
    maps = maps or device_maps()
    events = parse(text)
    grouped = {}
    for ev in events:
        dev = attribute(ev, maps)
        g = grouped.setdefault(dev, {}).setdefault(ev["kind"], {
            "count": 0, "first": None, "last": None, "subs": {}, "codes": {}, "examples": [], "gpu": ev.get("gpu")})
        g["count"] += 1
        g["first"] = g["first"] or ev["ts"]
        g["last"] = ev["ts"] or g["last"]
        g["subs"][ev["sub"]] = g["subs"].get(ev["sub"], 0) + 1
        if ev.get("code") is not None:
            key = str(ev["code"])
            g["codes"][key] = g["codes"].get(key, 0) + 1
        if len(g["examples"]) < max_examples:
            g["examples"].append(ev["raw"])
    return {"events": events, "devices": grouped}
