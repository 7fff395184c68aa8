# -*- coding: utf-8 -*-
"""The triage's active part, parsed: perftest (``ib_write_bw``) output and NCCL's WARN lines (stdlib only).

``../shared/reference/oncall-triage-anchors.md`` R11: GPUDirect loopback per NIC (``ib_write_bw --use_cuda``; azhpc
passes at >= 360 Gb/s on 400G links, i.e. 90 % of line rate) and NCCL restricted to one NIC (``NCCL_IB_HCA``), its
``NET/IB: Got completion from peer ... status=IBV_WC_*`` WARN lines classified with NCCL's own hints
(``src/transport/net_ib/common.h:612-629``): 12 RETRY_EXC_ERR -> link / transport timeout, 4 LOC_PROT_ERR -> ACS or
GPUDirect registration, 5 WR_FLUSH_ERR -> flushed after an earlier error.
"""
from __future__ import annotations

import re

IBV_WC_STATUS = {
    0: "IBV_WC_SUCCESS", 1: "IBV_WC_LOC_LEN_ERR", 2: "IBV_WC_LOC_QP_OP_ERR", 3: "IBV_WC_LOC_EEC_OP_ERR",
    4: "IBV_WC_LOC_PROT_ERR", 5: "IBV_WC_WR_FLUSH_ERR", 6: "IBV_WC_MW_BIND_ERR", 7: "IBV_WC_BAD_RESP_ERR",
    8: "IBV_WC_LOC_ACCESS_ERR", 9: "IBV_WC_REM_INV_REQ_ERR", 10: "IBV_WC_REM_ACCESS_ERR", 11: "IBV_WC_REM_OP_ERR",
    12: "IBV_WC_RETRY_EXC_ERR", 13: "IBV_WC_RNR_RETRY_EXC_ERR", 14: "IBV_WC_LOC_RDD_VIOL_ERR",
    15: "IBV_WC_REM_INV_RD_REQ_ERR", 16: "IBV_WC_REM_ABORT_ERR", 17: "IBV_WC_INV_EECN_ERR",
    18: "IBV_WC_INV_EEC_STATE_ERR", 19: "IBV_WC_FATAL_ERR", 20: "IBV_WC_RESP_TIMEOUT_ERR", 21: "IBV_WC_GENERAL_ERR",
}
WC_HINT = {
    12: "transport retries exhausted (no ACK within NCCL_IB_TIMEOUT x NCCL_IB_RETRY_CNT): link, cable or NIC firmware",
    13: "receiver not ready retries exhausted",
    4: "local protection error: GPUDirect registration or ACS/IOMMU redirecting peer-to-peer traffic",
    5: "work request flushed after an earlier error on the same queue pair",
    10: "remote access error: the peer's memory registration or the fabric partition",
}

# every NCCL format seen in published logs:
#   2.19+: "NET/IB: Got completion from peer 10.1.2.3<40554> with status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_RDMA_WRITE(1)
#           vendor_err=129 localGid ... hca mlx5_1"
#   2.1x:  "NET/IB : Got completion from peer 10.1.2.3<54862> with status=12 opcode=0 len=0 vendor err 129 (Recv) ...
#           [hca mlx5_1]"
#   old:   "NET/IB : Got completion from peer 10.2.0.5<33092> with error 12, opcode 0, len 0, vendor err 129 (Recv)"
_COMPLETION_RE = re.compile(
    r"NET/IB\s*:\s*Got completion from peer (?P<peer>\S+) with (?:status=(?:(?P<sname>IBV_WC_[A-Z_]+)\()?(?P<status>\d+)\)?"
    r"|error (?P<status_old>\d+),)"
    r"(?:.*?vendor[ _]err[= ](?P<vendor>\d+))?"
    r"(?:.*?\bhca (?P<hca>[A-Za-z0-9_]+))?")
_ASYNC_RE = re.compile(r"NET/IB\s*:\s*(?P<hca>[A-Za-z0-9_]+):(?P<port>\d+) async fatal event(?: on (?P<what>[^:]+))?:?\s*(?P<text>.*)$")
_GDR_RE = re.compile(r"NET/IB\s*:\s*GPU Direct RDMA (?P<state>Enabled|Disabled) for HCA (?P<n>\d+) '(?P<hca>[^']+)'")
_WARN_HOST_RE = re.compile(r"(?:^|\]\s)(?P<host>[A-Za-z0-9_.-]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<rank>\d+)\]")


def parse_nccl_warns(text):
    """NCCL output (INFO/WARN interleaved; mpirun tags, timestamps fine) -> {completions: [{host, peer, status,
    status_name, vendor_err, hca, hint, raw}], async_events: [...], gdr: {hca: Enabled|Disabled}, warn_count}.
    A completion without ``hca`` (NCCL < 2.19) keeps hca None: the caller charges it to the only NIC of the run."""
    out = {"completions": [], "async_events": [], "gdr": {}, "warn_count": 0}
    # join a line broken inside "len\n0, vendor err" (terminal wrap in published logs)
    lines = (text or "").splitlines()
    for i, ln in enumerate(lines):
        if "NCCL WARN" in ln:
            out["warn_count"] += 1
        m = _COMPLETION_RE.search(ln)
        if m:
            st = m.group("status") or m.group("status_old")
            status = int(st)
            raw = ln
            vendor = m.group("vendor")
            if vendor is None and i + 1 < len(lines) and "vendor err" in lines[i + 1]:
                mv = re.search(r"vendor[ _]err[= ](\d+)", lines[i + 1])
                vendor = mv.group(1) if mv else None
                raw = ln + "\n" + lines[i + 1]
            hm = _WARN_HOST_RE.search(ln)
            out["completions"].append({
                "host": hm.group("host") if hm else None, "peer": m.group("peer"), "status": status,
                "status_name": m.group("sname") or IBV_WC_STATUS.get(status, "status %d" % status),
                "vendor_err": int(vendor) if vendor is not None else None, "hca": m.group("hca"),
                "hint": WC_HINT.get(status, ""), "raw": raw.strip()})
            continue
        m = _ASYNC_RE.search(ln)
        if m:
            out["async_events"].append({"hca": m.group("hca"), "port": int(m.group("port")),
                                        "what": (m.group("what") or "").strip(), "text": m.group("text").strip(),
                                        "raw": ln.strip()})
            continue
        m = _GDR_RE.search(ln)
        if m:
            out["gdr"][m.group("hca")] = m.group("state")
    return out


def parse_perftest(text):
    """``ib_write_bw`` / ``ib_send_bw`` / ``ib_read_bw`` output -> {test, device, link_type, cuda_device, rows:
    [{bytes, iterations, bw_peak_gbps, bw_avg_gbps, msg_rate_mpps}], largest: last row or None, unit, errors: [...]}.
    The BW unit is Gb/s with --report_gbits (header ``BW peak[Gb/sec]``), else MB/s (``BW peak[MB/sec]``)."""
    out = {"test": None, "device": None, "link_type": None, "cuda_device": None, "cuda_name": None, "rows": [],
           "largest": None, "unit": None, "errors": []}
    in_table = False
    for ln in (text or "").splitlines():
        s = ln.strip()
        m = re.match(r"^(\S.*? BW Test)$", s)
        if m and out["test"] is None:
            out["test"] = m.group(1)
        m = re.search(r"Device\s*:\s*(\S+)", s)
        if m and out["device"] is None:
            out["device"] = m.group(1)
        m = re.match(r"^Link type\s*:\s*(\S+)", s)
        if m:
            out["link_type"] = m.group(1)
        m = re.match(r"^Picking device No\. (\d+)", s)
        if m:
            out["cuda_device"] = int(m.group(1))
        m = re.search(r"\[pid = \d+, dev = (\d+)\] device name = \[([^\]]+)\]", s)
        if m:
            out["cuda_device"] = int(m.group(1))
            out["cuda_name"] = m.group(2)
        if re.match(r"^#bytes\s+#iterations\s+BW peak\[(Gb|MB)/sec\]", s):
            out["unit"] = "Gb/s" if "Gb/sec" in s else "MB/s"
            in_table = True
            continue
        if in_table:
            parts = s.split()
            if len(parts) >= 4 and parts[0].isdigit() and parts[1].isdigit():
                try:
                    row = {"bytes": int(parts[0]), "iterations": int(parts[1]), "bw_peak": float(parts[2]),
                           "bw_avg": float(parts[3]), "msg_rate_mpps": float(parts[4]) if len(parts) > 4 else None}
                except ValueError:
                    continue
                out["rows"].append(row)
            elif s.startswith("---") and out["rows"]:
                in_table = False
        if re.search(r"(?i)\b(couldn't|failed|error|unable)\b", s) and not s.startswith("#"):
            out["errors"].append(s)
    if out["rows"]:
        out["largest"] = out["rows"][-1]
    return out


def perftest_gbps(parsed):
    """Average bandwidth of the largest message in Gb/s (MB/s converted), or None when no result row was printed."""
    row = (parsed or {}).get("largest")
    if not row:
        return None
    return round(row["bw_avg"] if parsed.get("unit") == "Gb/s" else row["bw_avg"] * 8 / 1000.0, 2)
