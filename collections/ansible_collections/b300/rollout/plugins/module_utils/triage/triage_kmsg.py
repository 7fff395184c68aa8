# -*- coding: utf-8 -*-
"""Kernel-log scan of the on-call triage: the RDMA / GPU signatures a hang leaves behind (stdlib only).

Reads the text of ``journalctl -k -o short-iso`` (also plain ``journalctl -k``), ``dmesg`` (``[  12.34]``,
``--time-format iso``, ``-T``), syslog, raw ``/dev/kmsg`` records, pdsh-prefixed dmesg (``host: [ 12.34] ...``) and
text a mail client or a reporter wrapped or quoted (:func:`logical_lines`: one message over several lines is one
event), and classifies the lines the triage rules judge. Patterns and rules: ``../shared/reference/
oncall-triage-anchors.md`` R1 (kernel message formats from the mlx5 driver's ``cmd.c`` / ``health.c``, gpud's kmsg
matchers, azhpc's flap rule, the NVIDIA Xid catalog) and ``docs/triage-real-world.md`` (PCIe AER records of
``aer.c``, pciehp / DPC / probe-time bandwidth lines, Ethernet-mode link lines, failed mlx5 commands and probes).

:func:`parse_line` -> one event or None; :func:`parse` -> the events of a text (an AER record's lines joined into one
event); :func:`scan` -> events grouped per device with count, first/last time and raw example lines;
:func:`attribute` maps ``mlx5_core <BDF>`` to ``mlx5_N`` and its nearest GPU, a netdev to its ``mlx5_N``, ``NVRM:
Xid (PCI:...)`` to the GPU index, and an event of a PCIe port to the data NICs and GPUs below it.
"""
from __future__ import annotations

import re

# --------------------------------------------------------------------------- line prefixes (time stamps, hosts)
_ISO_RE = re.compile(r"^(?P<ts>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:[+-]\d{2}:?\d{2}|Z)?)\s+(?P<rest>.*)$")
_SYSLOG_RE = re.compile(r"^(?P<ts>[A-Z][a-z]{2}\s+\d{1,2}\s+\d{2}:\d{2}:\d{2})\s+(?P<rest>.*)$")
# "[  12.345678]"; dmesg -H / --reltime: "[  +0.000844]" (util-linux dmesg.c prints "[  +0.000000] " for the lines
# after the first of a batch) and the batch's first line "[Sep 7 14:32]" / "[Dec10 14:32]" (strftime "%b%e %H:%M"; a
# localized month too: "[4月21 11:15]"); CONFIG_PRINTK_CALLER adds "[ T3356]" after the stamp
_MONO_RE = re.compile(r"^\[\s*(?P<ts>[+]?\d+\.\d+)\]\s?(?P<rest>.*)$")
_HUMAN_RE = re.compile(r"^\[(?P<ts>(?:[A-Z][a-z]{2}|\d{1,2}\u6708)\s?\d{1,2} \d{2}:\d{2})\]\s?(?P<rest>.*)$")
_CALLER_RE = re.compile(r"^\[\s*[TC]\d+\]\s?")
_CTIME_RE = re.compile(r"^\[(?P<ts>[A-Z][a-z]{2} [A-Z][a-z]{2}\s+\d{1,2} \d{2}:\d{2}:\d{2} \d{4})\]\s?(?P<rest>.*)$")
_PDSH_RE = re.compile(r"^(?P<host>[A-Za-z0-9_.-]+):\s+(?=\[)")
# journald / syslog: "<host> kernel: <msg>" (a reporter may condense hosts: "node{4,5,6} kernel:")
_KERNEL_TAG_RE = re.compile(r"^(?:(?P<host>\S+)\s+)?kernel:\s?(?P<msg>.*)$")
# raw /dev/kmsg records: "prio,seq,usec,flags[,key=value...];message" (Documentation/ABI/testing/dev-kmsg); the
# record's dictionary follows on lines that start with a space ("  SUBSYSTEM=pci", "  DEVICE=+pci:0000:04:02.0")
_KMSG_RE = re.compile(r"^(?P<pri>\d+),(?P<seq>\d+),(?P<usec>\d+),[^;,]*(?:,[^;]*)?;(?P<msg>.*)$")
_KMSG_DICT_RE = re.compile(r"^\s+[A-Z][A-Z0-9_]*=")
# quoted mail / forum text: "> > [   55.7] ..."
_QUOTE_RE = re.compile(r"^(?:[ \t]*>)+[ \t]?")


def _split(line):
    """(timestamp or None, message, had_prefix, is_kmsg) of one physical line."""
    text = line.rstrip("\r\n").strip()
    ts = None
    had = False
    m = _KMSG_RE.match(text)
    if m:
        return "%.6f" % (int(m.group("usec")) / 1e6), m.group("msg").strip(), True, True
    m = _PDSH_RE.match(text)
    if m:
        text = text[m.end():]
        had = True
    for rx in (_ISO_RE, _SYSLOG_RE, _CTIME_RE, _MONO_RE, _HUMAN_RE):
        m = rx.match(text)
        if m:
            ts, text = m.group("ts"), _CALLER_RE.sub("", m.group("rest"))
            had = True
            break
    m = _KERNEL_TAG_RE.match(text)
    if m:
        text = m.group("msg")
        had = True
    # dmesg -x / journalctl with a monotonic stamp after the tag: "kernel: [  12.3] msg"
    m = _MONO_RE.match(text)
    if m:
        ts = ts or m.group("ts")
        text = _CALLER_RE.sub("", m.group("rest"))
        had = True
    return ts, text.strip(), had, False


def split_prefix(line):
    """(timestamp text or None, message) of one kernel-log line in any of the formats above."""
    ts, msg, _had, _k = _split(line)
    return ts, msg


# --------------------------------------------------------------------------- one message over several lines
# A line without a prefix continues the message above it: dmesg prints the later lines of a multi-line record
# without a stamp ("NVRM: The NVIDIA GPU 0000:b3:00.0 / NVRM: (PCI ID: ...) installed ..."), journalctl indents
# them, and mail clients and reporters wrap long lines ("...:(pid" / "3122): Recovered 1 EQEs on cmd_eq"). Under a
# stamped message only a line that clearly starts another message (a device prefix, an Xid) starts a new one; in
# text without stamps every line that does not start like a kernel message ("word[ BDF][ name]: ") continues the one
# above. A blank line ends a message.
_BDF = r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]"
_STRONG_HEAD_RE = re.compile(r"^(?:NVRM: (?:Xid|GPU at|The NVIDIA GPU)|[\w.-]+ %s[\s:]|mlx5_(?:core|ib): |kernel: )" % _BDF)
_HEAD_RE = re.compile(r"^(?:[A-Za-z_][\w.\-]*(?: %s)?(?: [\w.\-{},]+)?: |#|\[|<\d+>)" % _BDF)


def logical_lines(text):
    """[(raw text of the physical lines, the message line to parse)] of a kernel-log text: quote markers removed,
    /dev/kmsg dictionary lines dropped, continuation lines joined to their message with one space."""
    out = []
    cur = None   # [raw lines, parse text, stamped, kmsg]
    for ln in (text or "").splitlines():
        raw = ln.rstrip("\r\n")
        body = _QUOTE_RE.sub("", raw) if raw.lstrip().startswith(">") else raw
        if not body.strip():
            if cur:
                out.append(cur)
            cur = None
            continue
        if cur and cur[3] and _KMSG_DICT_RE.match(body):
            cur[0].append(raw)
            continue
        ts, msg, had, is_kmsg = _split(body)
        if had:
            if cur:
                out.append(cur)
            cur = [[raw], body.strip(), True, is_kmsg]
            continue
        s = body.strip()
        if cur and ((cur[2] and not _STRONG_HEAD_RE.match(s)) or (not cur[2] and not _HEAD_RE.match(s))):
            cur[0].append(raw)
            cur[1] = cur[1] + " " + s
            continue
        if cur:
            out.append(cur)
        cur = [[raw], s, False, False]
    if cur:
        out.append(cur)
    return [("\n".join(c[0]), c[1]) for c in out]


# --------------------------------------------------------------------------- devices named in a message
# "mlx5_core 0000:5f:00.0: ...", "mlx5_core 0000:ab:00.0 mlx5_5: ...", "mlx5_core 0000:5f:00.0 ibp95s0: ...",
# "mlx5_core enp1s0f0np0: Link down" (no address), "mlx5_core: probe of 0000:0b:00.0 failed ..." (no device)
_MLX5_DEV_RE = re.compile(r"^mlx5_(?:core|ib)(?:\s+(?P<bdf>%s))?(?:\s+(?P<name>[^\s:]+))?:\s*(?P<msg>.*)$" % _BDF)
# any driver's device prefix: "pcieport 0000:00:02.0: ...", "nvidia 0000:07:00.0: ...", "pci 0000:01:00.0: ..."
_DEV_RE = re.compile(r"^(?P<drv>[\w.-]+) (?P<bdf>%s)(?: (?P<name>[^\s:]+))?:\s*(?P<msg>.*)$" % _BDF)
_XID_RE = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F:.]+)\)[^:]*?:\s*(?P<code>\d+),\s*(?P<text>.*)$")
_SXID_RE = re.compile(r"(?P<sw>nvidia-nvswitch\d*)?:?\s*SXid \((?:PCI:)?(?P<pci>[0-9a-fA-F:.]+)\)[^:]*?:\s*"
                      r"(?P<code>\d+),\s*(?P<text>.*)$")
_FALLEN_RE = re.compile(r"NVRM: (?:The NVIDIA )?GPU (?:at PCI:)?(?P<pci>[0-9a-fA-F:.]+)\b.*?(?:has )?fallen off the bus")
_CARRIER_RE = re.compile(r"^(?P<netdev>[A-Za-z0-9_.-]+): lost carrier")
_PORT_STATE_RE = re.compile(r"Port: ?(?P<port>\d+) Link (?P<state>DOWN|INIT|ARMED|ACTIVE|ACTIVE_DEFER)\b")
_ETH_LINK_RE = re.compile(r"^Link (?P<state>up|down)\b")
_TX_TIMEOUT_RE = re.compile(r"NETDEV WATCHDOG: (?P<netdev>[\w.-]+) \((?P<drv>[^)]*)\): transmit queue (?P<q>\d+) timed out")

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
    # mlx5_cmd_eq_recover (eq.c): the driver polled the command EQ after a lost interrupt; mlx5e's TX timeout path
    ("mlx5_eq_recover", "cmd_eq", re.compile(r"Recovered (?P<n>\d+) EQEs on cmd_eq")),
    ("mlx5_eq_recover", "eq", re.compile(r"Recovered (?P<n>\d+) eqes on EQ")),
    ("mlx5_health", "fatal_error", re.compile(r"Fatal error (?:(?P<n>\d+) )?detected")),
    ("mlx5_health", "health_compromised", re.compile(r"device's health compromised")),
    ("mlx5_health", "health_issue", re.compile(r"Health issue observed")),
    ("mlx5_health", "pci_slot_unavailable", re.compile(r"PCI slot (?:\d+ )?is unavailable")),
    # health.c print_health_info "synd 0x%x: %s" -- not ext_synd, not the "syndrome (0x...)" of a failed command
    ("mlx5_health", "syndrome", re.compile(r"(?<![\w(])synd (?P<synd>0x[0-9a-fA-F]+)\b")),
    ("mlx5_health", "recovery", re.compile(r"health recovery (?P<result>flow|failed|succeeded)")),
    ("mlx5_health", "error_state", re.compile(r"Driver is in error state\. Unloading")),
    ("mlx5_slot_power", "insufficient", re.compile(r"Detected insufficient power on the PCIe slot \((?P<watts>\d+W)\)")),
    ("mlx5_module_temp", "high_temperature", re.compile(r"Port module event.*High Temperature", re.I)),
    ("mlx5_module_error", None, re.compile(r"Port module event\[error\]: module (?P<module>\d+), (?P<what>.*)$")),
    ("mlx5_access_reg", "access_reg_failed",
     re.compile(r"mlx5_cmd_out_err.*ACCESS_REG.*failed|ACCESS_REG\(0x805\) op_mod\(0x[0-9a-f]+\) failed"
                r"(?:.*?syndrome \((?P<areg_synd>0x[0-9a-fA-F]+)\))?")),
    # cmd.c mlx5_cmd_out_err / mlx5_cmd_check: "CMD(0xOP) op_mod(0x..) failed, status TEXT(0x..), syndrome (0x..)";
    # cmd_status_print (6.x) adds "uid(N)" before "failed", older mlx5_cmd_check printed "erred" for "failed"
    ("mlx5_cmd_error", "failed",
     re.compile(r"%s op_mod\(0x[0-9a-fA-F]+\)(?: uid\(\d+\))? (?:failed|erred), \**status (?P<status>.+?\(0x[0-9a-fA-F]+\)),?\**,?\s*"
                r"syndrome \((?P<csynd>0x[0-9a-fA-F]+)\)" % _CMD)),
    ("mlx5_probe_failed", "probe_failed", re.compile(r"probe of (?P<pbdf>%s) failed with error (?P<err>-?\d+)" % _BDF)),
]
_PEERMEM_RE = re.compile(r"(?:nvidia[-_]peermem|nv_mem|peer_mem).*?ERROR detected invalid context, skipping further processing"
                         r"|ERROR detected invalid context, skipping further processing")

# --------------------------------------------------------------------------- PCIe (drivers/pci/pcie/aer.c, dpc.c, pciehp, probe.c)
_SEV_RE = r"Corrected|Correctable|Uncorrected \(Non-Fatal\)|Uncorrectable \(Non-Fatal\)|Uncorrected \(Fatal\)|Uncorrectable \(Fatal\)"
_AER_HDR_RE = re.compile(r"^AER: (?P<multi>Multiple )?(?P<sev>%s) error (?:message )?received(?:: | from |:)\s*"
                         r"(?:id=(?P<id>[0-9a-fA-F]{4})|(?P<src>%s))?" % (_SEV_RE, _BDF))
_AER_REC_RE = re.compile(r"^(?:AER: )?PCIe Bus Error: severity=(?P<sev>[^,]+), type=(?P<type>[^,]+)")
_AER_STATUS_RE = re.compile(r"^(?:AER: )?\s*device \[[0-9a-fA-F:]+\] error status/mask=")
_AER_BIT_RE = re.compile(r"^(?:AER: )?\s*\[\s*(?P<bit>\d+)\]\s*(?P<name>.+?)\s*(?:\(First\))?\s*$")
_AER_TLP_RE = re.compile(r"^(?:AER: )?\s*TLP Header:")
PCIE_PATTERNS = [
    ("pcie_link", "link_down", re.compile(r"pciehp: Slot\([^)]*\): Link Down")),
    ("pcie_link", "card_not_present", re.compile(r"pciehp: Slot\([^)]*\): Card not present")),
    ("pcie_link", "dpc_containment", re.compile(r"DPC: containment event")),
    ("pcie_link", "recovery_failed", re.compile(r"AER: device recovery failed")),
    ("pcie_link", "inaccessible", re.compile(r"(?:can't|Unable to) change power state from D3\w* to D0.*inaccessible")),
    # pcie_print_link_status (probe.c; mlx5 calls it at probe): "... limited by 8.0 GT/s PCIe x8 link at BDF (capable
    # of ... with 16.0 GT/s PCIe x16 link)"; kernels before the PCIE_SPEED2STR change print "8 GT/s x8 link" (no
    # "PCIe", no ".0": the linux-pci patch mail in docs/triage-real-world.md), and a pasted line may hold a tab
    ("pcie_link", "bandwidth_limited", re.compile(
        r"(?P<avail>[\d.]+)\s+Gb/s available PCIe bandwidth, limited by (?P<ls>[\d.]+) GT/s (?:PCIe )?x(?P<lw>\d+) "
        r"link at (?P<at>%s|<unknown>) \(capable of (?P<cap>[\d.]+)\s+Gb/s with (?P<cs>[\d.]+) GT/s (?:PCIe )?"
        r"x(?P<cw>\d+) link\)" % _BDF)),
]
# the PCIe spec's error names by status bit (AER correctable / uncorrectable status registers, PCIe r6.0 7.8.4), with
# the names kernels print for them (aer.c aer_correctable_error_string / aer_uncorrectable_error_string, old and new)
AER_COR_NAMES = {0: ("Receiver Error", "RxErr"), 6: ("Bad TLP", "BadTLP"), 7: ("Bad DLLP", "BadDLLP"),
                 8: ("Replay Num Rollover", "Rollover", "RELAY_NUM Rollover", "REPLAY_NUM Rollover"),
                 12: ("Replay Timer Timeout", "Timeout"), 13: ("Advisory Non-Fatal", "NonFatalErr"),
                 14: ("Corrected Internal Error", "CorrIntErr"), 15: ("Header Log Overflow", "HeaderOF")}
AER_UNCOR_NAMES = {0: ("Undefined",), 4: ("Data Link Protocol Error", "DLP", "Data Link Protocol"),
                   5: ("Surprise Down Error", "SDES"), 12: ("Poisoned TLP", "TLP"),
                   13: ("Flow Control Protocol Error", "FCP", "Flow Control Protocol"),
                   14: ("Completion Timeout", "CmpltTO"), 15: ("Completer Abort", "CmpltAbrt"),
                   16: ("Unexpected Completion", "UnxCmplt"), 17: ("Receiver Overflow", "RxOF"),
                   18: ("Malformed TLP", "MalfTLP"), 19: ("ECRC Error", "ECRC"),
                   20: ("Unsupported Request", "UnsupReq", "Unsupported Request Error"),
                   21: ("ACS Violation", "ACSViol"), 22: ("Uncorrectable Internal Error", "UncorrIntErr"),
                   23: ("MC Blocked TLP", "BlockedTLP"), 24: ("AtomicOp Egress Blocked", "AtomicOpBlocked"),
                   25: ("TLP Prefix Blocked", "TLPBlockedErr"), 26: ("Poisoned TLP Egress Blocked", "PoisonTLPBlocked")}


def aer_severity(text):
    """'Corrected' / 'Uncorrectable (Non-Fatal)' / ... -> correctable | nonfatal | fatal (None when not AER)."""
    t = (text or "").strip().lower()
    if t.startswith("correct"):
        return "correctable"
    if "non-fatal" in t:
        return "nonfatal"
    if "fatal" in t:
        return "fatal"
    return None


def aer_error_name(sev, bit, printed):
    """The spec's name of an AER status bit when the kernel printed one of its names, else the printed text."""
    names = (AER_COR_NAMES if sev == "correctable" else AER_UNCOR_NAMES).get(int(bit), ())
    p = re.sub(r"\s+", " ", printed or "").strip()
    return names[0] if any(p.lower() == n.lower() for n in names) else p


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


def _event(ts, raw):
    return {"kind": None, "sub": None, "ts": ts, "bdf": None, "name": None, "netdev": None, "gpu_pci": None,
            "code": None, "meaning": None, "action": None, "detail": None, "raw": raw}


def parse_line(line, raw=None):
    """One classified kernel-log event, or None when the line carries no triage signature.

    Returns {kind, sub, ts, bdf, name, netdev, gpu_pci, code, meaning, action, detail, raw} (+ kind-specific fields).
    ``kind``: mlx5_cmd_timeout, mlx5_eq_recover, mlx5_health, mlx5_slot_power, mlx5_module_temp, mlx5_module_error,
    mlx5_access_reg, mlx5_cmd_error, mlx5_probe_failed, ib_port_state, ib_carrier_lost, eth_link, netdev_tx_timeout,
    pcie_aer (one record line; :func:`parse` joins a record's lines), pcie_link, xid, sxid, gpu_fallen_off_bus,
    peermem_invalid_context."""
    ts, msg = split_prefix(line)
    if not msg:
        return None
    ev = _event(ts, raw if raw is not None else line.rstrip("\r\n"))
    got = _gpu_or_netdev_event(ev, msg)
    if got:
        return got
    dm = _MLX5_DEV_RE.match(msg)
    body = msg
    if dm:
        ev["bdf"] = _pci_norm(dm.group("bdf")) if dm.group("bdf") else None
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
                _mlx5_fields(ev, kind, sub, mm, body)
                return ev
        mm = _PORT_STATE_RE.search(body)
        if mm:
            ev.update(kind="ib_port_state", sub=mm.group("state").lower(), code=int(mm.group("port")), detail=body)
            return ev
        mm = _ETH_LINK_RE.match(body)
        if mm and ev["netdev"]:
            ev.update(kind="eth_link", sub=mm.group("state"), detail=body)
            return ev
        if re.search(r"\bTX timeout detected\b", body):
            ev.update(kind="netdev_tx_timeout", sub="tx_timeout", detail=body)
            return ev
    gd = _DEV_RE.match(msg)
    if gd:
        ev["bdf"] = ev["bdf"] or _pci_norm(gd.group("bdf"))
        body = gd.group("msg")
        if _pcie_device_event(ev, body):
            return ev
    if not dm:
        # a message without any device prefix (wrapped away from it, or printed so): the mlx5 signatures still count
        for kind, sub, rx in MLX5_PATTERNS:
            mm = rx.search(msg)
            if mm:
                _mlx5_fields(ev, kind, sub, mm, msg)
                return ev
    mm = _CARRIER_RE.match(body)
    if mm:
        ev.update(kind="ib_carrier_lost", sub="lost_carrier", netdev=ev["netdev"] or mm.group("netdev"), detail=body)
        return ev
    return None


def _gpu_or_netdev_event(ev, msg):
    """The NVIDIA driver's lines (Xid, SXid, fallen off the bus, nvidia_peermem) and a netdev's TX timeout: ev filled
    in, or None."""
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
    m = _TX_TIMEOUT_RE.search(msg)
    if m:
        ev.update(kind="netdev_tx_timeout", sub="tx_timeout", netdev=m.group("netdev"), code=int(m.group("q")),
                  detail=msg)
        return ev
    return None


def _pcie_device_event(ev, body):
    """A PCIe device line (pcieport, pciehp, DPC, the probe-time bandwidth limit, an AER record or its header): True
    with ev filled in."""
    for kind, sub, rx in PCIE_PATTERNS:
        mm = rx.search(body)
        if mm:
            ev.update(kind=kind, sub=sub, detail=body)
            if sub == "bandwidth_limited":
                # "8 GT/s" (old kernels) and "8.0 GT/s" are the same speed: one spelling in the event
                ev.update(code="%.1f GT/s x%s" % (float(mm.group("ls")), mm.group("lw")),
                          limiting=_pci_norm(mm.group("at")) or mm.group("at"),
                          capable="%.1f GT/s x%s" % (float(mm.group("cs")), mm.group("cw")),
                          limit_speed=float(mm.group("ls")), limit_width=int(mm.group("lw")),
                          cap_speed=float(mm.group("cs")), cap_width=int(mm.group("cw")),
                          avail_gbps=float(mm.group("avail")), cap_gbps=float(mm.group("cap")))
            return True
    mm = _AER_REC_RE.match(body)
    if mm and aer_severity(mm.group("sev")):
        ev.update(kind="pcie_aer", sub=aer_severity(mm.group("sev")), layer=mm.group("type").strip(), errors=[],
                  reporter=None, detail=body)
        return True
    mm = _AER_HDR_RE.match(body)
    if mm:
        ev.update(kind="pcie_aer", sub=aer_severity(mm.group("sev")), layer=None, errors=[],
                  reporter=ev["bdf"], bdf=_aer_source(mm, ev["bdf"]), detail=body, header=True)
        return True
    return False


def _aer_source(m, reporter):
    """The device an AER 'received' line names: 'from BDF', 'received: BDF', or 'id=XXXX' (bus<<8 | devfn, in the
    reporting port's PCI domain)."""
    if m.group("src"):
        return _pci_norm(m.group("src"))
    if m.group("id"):
        v = int(m.group("id"), 16)
        dom = (reporter or "0000:00:00.0").split(":")[0]
        return "%s:%02x:%02x.%d" % (dom, v >> 8, (v >> 3) & 0x1f, v & 0x7)
    return reporter


def _mlx5_fields(ev, kind, sub, mm, body):
    gd = mm.groupdict()
    ev.update(kind=kind, sub=sub, detail=body)
    if gd.get("cmd"):
        ev["code"] = "%s(%s)" % (gd["cmd"], gd["opcode"])
    elif gd.get("synd"):
        ev["code"] = gd["synd"]
    elif gd.get("watts"):
        ev["code"] = gd["watts"]
    elif gd.get("n"):
        ev["code"] = gd["n"]
    elif gd.get("areg_synd"):
        ev["code"] = gd["areg_synd"]
    if kind == "mlx5_cmd_error":
        ev.update(syndrome=gd["csynd"], status=gd["status"].strip("* "))
    elif kind == "mlx5_probe_failed":
        ev.update(bdf=_pci_norm(gd["pbdf"]), code=gd["err"])
    elif kind == "mlx5_module_error":
        what = gd["what"].strip().rstrip(".")
        ev.update(sub=re.sub(r"[^a-z0-9]+", "_", what.split(",")[-1].strip().lower()).strip("_") or "error",
                  code="module %s" % gd["module"])


def parse(text):
    """Every classified event of a kernel-log text, in order: one per message (continuation lines joined, see
    :func:`logical_lines`), and one per PCIe AER error record with its status, error-bit and TLP lines; the
    '... error received ...' line of the root port belongs to the record that follows it, or is an event of its own
    when no record follows (rate-limited, or the kernel could not find the source)."""
    out = []
    header = None      # the AER 'received' event no record has claimed yet
    record = None      # the AER record whose detail lines may follow
    for raw, line in logical_lines(text):
        ev = parse_line(line, raw)
        if ev and ev["kind"] == "pcie_aer":
            if ev.pop("header", False):
                out.append(ev)
                header, record = ev, None
                continue
            if header is not None and header["sub"] == ev["sub"]:
                header.update(bdf=ev["bdf"], layer=ev["layer"], detail=ev["detail"], raw=header["raw"] + "\n" + raw)
                record, header = header, None
            else:
                out.append(ev)
                record, header = ev, None
            continue
        if ev is None and record is not None:
            ts, msg = split_prefix(line)
            gd = _DEV_RE.match(msg)
            if gd and _pci_norm(gd.group("bdf")) == record["bdf"]:
                body = gd.group("msg")
                mb = _AER_BIT_RE.match(body)
                if mb:
                    record["errors"].append(aer_error_name(record["sub"], mb.group("bit"), mb.group("name")))
                    record["raw"] += "\n" + raw
                    continue
                if _AER_STATUS_RE.match(body) or _AER_TLP_RE.match(body):
                    record["raw"] += "\n" + raw
                    continue
        if ev:
            out.append(ev)
    for ev in out:
        if ev["kind"] == "pcie_aer":
            ev["code"] = "+".join(ev["errors"]) or None
    return out


def device_maps(rdma_nics=None, gpu_topology=None, nic_gpu=None, below=None):
    """Lookup tables for :func:`attribute`: bdf->mlx5 name, netdev->mlx5 name, gpu bdf->index, mlx5 name->GPU, and
    ``below``: {PCI bridge/port BDF: [the data NICs and GPUs below it]} (the ports on each device's PCIe path)."""
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
            "gpu_of_nic": dict(nic_gpu or {}), "below": {k.lower(): list(v) for k, v in (below or {}).items()}}


def attribute(ev, maps):
    """The device key an event belongs to: ``mlx5_N``, ``GPU i``, ``pci <bdf>`` or ``host``; also sets
    ev['device'], ev['gpu'] (the NIC's nearest GPU, or the GPU itself) and ev['devices'] (every device it is charged
    to: an event on a PCIe port is charged to each data NIC and GPU below that port, ev['via'] = the port)."""
    nic = None
    ev["devices"] = []
    if ev.get("name") and ev["name"].startswith("mlx5_"):
        nic = ev["name"]
    elif ev.get("bdf") and ev["bdf"] in maps["nic_by_bdf"]:
        nic = maps["nic_by_bdf"][ev["bdf"]]
    elif ev.get("netdev") and ev["netdev"] in maps["nic_by_netdev"]:
        nic = maps["nic_by_netdev"][ev["netdev"]]
    if nic:
        ev["device"] = nic
        ev["gpu"] = maps["gpu_of_nic"].get(nic)
        ev["devices"] = [nic]
        return nic
    gpci = ev.get("gpu_pci") or (ev.get("bdf") if ev.get("bdf") in maps["gpu_by_pci"] else None)
    if gpci:
        idx = maps["gpu_by_pci"].get(gpci)
        if idx is not None:
            ev["device"] = "GPU %d" % idx
            ev["gpu"] = idx
            ev["devices"] = [ev["device"]]
            return ev["device"]
        ev["device"] = "pci %s" % gpci
        ev["gpu"] = None
        ev["devices"] = [ev["device"]]
        return ev["device"]
    if ev.get("bdf"):
        below = maps.get("below", {}).get(ev["bdf"])
        if below:
            ev["device"] = below[0]
            ev["devices"] = list(below)
            ev["via"] = ev["bdf"]
            ev["gpu"] = None
            return ev["device"]
        ev["device"] = "pci %s" % ev["bdf"]
        ev["gpu"] = None
        ev["devices"] = [ev["device"]]
        return ev["device"]
    ev["device"] = "host"
    ev["gpu"] = None
    ev["devices"] = ["host"]
    return "host"


def scan(text, maps=None, max_examples=3):
    """Group the events of a kernel-log text: {device: {kind: {count, first, last, subs: {sub: n}, codes: {code: n},
    sub_codes: {sub: {code: n}}, examples: [raw lines], gpu, via: [ports]}}} plus the flat event list. An event on a PCIe port above several
    devices is counted on each of them. ``maps``: :func:`device_maps` (None: no attribution)."""
    maps = maps or device_maps()
    events = parse(text)
    grouped = {}
    for ev in events:
        attribute(ev, maps)
        for dev in ev["devices"]:
            g = grouped.setdefault(dev, {}).setdefault(ev["kind"], {
                "count": 0, "first": None, "last": None, "subs": {}, "codes": {}, "examples": [], "via": [],
                "gpu": ev.get("gpu") if dev == ev["device"] else None})
            g["count"] += 1
            g["first"] = g["first"] or ev["ts"]
            g["last"] = ev["ts"] or g["last"]
            g["subs"][ev["sub"]] = g["subs"].get(ev["sub"], 0) + 1
            if ev.get("code") is not None:
                key = str(ev["code"])
                g["codes"][key] = g["codes"].get(key, 0) + 1
                sc = g.setdefault("sub_codes", {}).setdefault(str(ev["sub"]), {})
                sc[key] = sc.get(key, 0) + 1
            if ev.get("via") and ev["via"] not in g["via"]:
                g["via"].append(ev["via"])
            if len(g["examples"]) < max_examples:
                g["examples"].append(ev["raw"])
    return {"events": events, "devices": grouped}
