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
#   2.4:   "NET/IB : Got completion with error 12, opcode 0, len 0, vendor err 129" (no peer)
_COMPLETION_RE = re.compile(
    r"NET/IB\s*:\s*Got completion (?:from peer (?P<peer>\S+) )?with (?:status=(?:(?P<sname>IBV_WC_[A-Z_]+)\()?(?P<status>\d+)\)?"
    r"|error (?P<status_old>\d+),)"
    r"(?:.*?vendor[ _]err[= ](?P<vendor>\d+))?"
    r"(?:.*?\bhca (?P<hca>[A-Za-z0-9_]+))?")
# net_ib async thread (src/transport/net_ib/common.cc ncclIbAsyncThreadMain):
#   2.19+: "NET/IB : mlx5_1:1 async fatal event on QP (0x7309dc3bb338): invalid request local work queue error"
#   2.1x:  "NET/IB : mlx5_0:1 Got async event : local access violation work queue error"
#   2.4:   "NET/IB : Got async event : local catastrophic error" (no HCA)
_ASYNC_RE = re.compile(r"NET/IB\s*:\s*(?P<hca>[A-Za-z0-9_]+):(?P<port>\d+) async fatal event(?: on (?P<what>[^:]+))?:?\s*(?P<text>.*)$")
_GOT_ASYNC_RE = re.compile(r"NET/IB\s*:\s*(?:(?P<hca>[A-Za-z0-9_]+):(?P<port>\d+) )?Got async event\s*:\s*(?P<text>.*)$")
# misc/ibvwrap.cc: "Call to ibv_create_qp failed[ with error Cannot allocate memory[ errno 12]]"
_IBV_FAIL_RE = re.compile(r"Call to (?P<verb>ibv_\w+) failed(?: with error (?P<error>.+?))?\s*$")
_COMM_ERR_RE = re.compile(r"NCCL WARN (?P<text>communicator encountered a fatal error.*?)\s*$")
# "NET/IB : GPU Direct RDMA Disabled for HCA 1 'mlx5_1' (no module)" (<= 2.18), "NET/IB : GPU Direct RDMA Disabled for
# HCA 0 'mlx5_0'", "NET/IB : GPU Direct RDMA (DMABUF) enabled for HCA 0 'mlx5_bond_0" (2.19+: lower case, and the
# format string has no closing quote), "NET/NCCL RDMA Plugin v10 : GPU Direct RDMA Disabled for HCA 0 'rocep1s0f0'"
_GDR_RE = re.compile(r"NET/(?P<transport>[^:]+?)\s*:\s*GPU Direct RDMA (?:\((?P<via>[^)]+)\) )?(?P<state>Enabled|enabled|Disabled|disabled) "
                     r"for HCA (?P<n>\d+) '(?P<hca>[^'\s]+)'?(?:\s*\((?P<reason>[^)]*)\))?")
# src/graph/paths.cc ncclTopoCheckGdr: "GPU Direct RDMA Disabled for GPU 0 / HCA 0 (distance 8 > 5)"
_GDR_GPU_RE = re.compile(r"GPU Direct RDMA (?P<state>Enabled|Disabled) for GPU (?P<gpu>[0-9a-fA-Fx]+) / HCA (?P<hca>[0-9a-fA-Fx]+) "
                         r"\(distance (?P<d>\d+) (?:[<>]=?) (?P<lvl>\d+)\)")
_NETWORK_RE = re.compile(r"Using network (?P<net>\S+)")
# PyTorch ProcessGroupNCCL watchdog (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp checkTimeout)
_WATCHDOG_RE = re.compile(r"(?:\[PG (?:ID )?(?P<pg>[^\]\s]+)[^\]]*?\] .*?)?\[Rank (?P<rank>\d+)\] Watchdog caught collective operation "
                          r"timeout: WorkNCCL\(SeqNum=(?P<seq>\d+), OpType=(?P<op>[A-Z_]+)[^)]*?Timeout\(ms\)=(?P<tmo>\d+)\) "
                          r"ran for (?P<ran>\d+) milliseconds")
_WARN_HOST_RE = re.compile(r"(?:^|[\]\s>:])(?P<host>[A-Za-z0-9_.-]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<rank>\d+)\]")
_WARN_LINE_RE = re.compile(r"NCCL WARN |\] \S+:\d+ WARN ")
_MD_LINK_RE = re.compile(r"\[([^\]]+)\]\((?:https?://)[^)]*\)")


_LOG_HEAD_RE = re.compile(r"^\s*(?:\S+:\d+:\d+\s+\[\d+\]|\[|NCCL |```|\S+\.(?:cc|cu|c|py):\d+ )|\bNCCL (?:INFO|WARN|TRACE)\b")


def _join_wrapped_completions(lines):
    """A `Got completion` WARN that the person who pasted it wrapped over several lines (real captures in
    tests/fixtures/real-world/nccl_warn/SOURCES.md: continuation lines indented by two, or the break right after
    `status=`) -> one line. A continuation is an indented line, or any line after one that ends in `=`; a blank line,
    the start of another log line (host:pid:tid [rank], `[rank0]`, `NCCL INFO`, a source file:line) or a message that
    is already whole (its `hca NAME` read: 2.2x prints the GIDs and the HCA after `(Recv)`) ends it."""
    out, i = [], 0
    while i < len(lines):
        ln = lines[i]
        if "Got completion" in ln:
            ln = ln.rstrip()
            j = i + 1
            while j < len(lines) and j <= i + 6:
                m = _COMPLETION_RE.search(ln)
                if m and m.group("hca"):
                    break                                   # the message is whole: nothing after it belongs to it
                nxt = lines[j]
                if not nxt.strip() or (not ln.endswith("=") and (not nxt[:1].isspace() or _LOG_HEAD_RE.match(nxt))):
                    break
                ln = ln + ("" if ln.endswith("=") else " ") + nxt.strip()
                j += 1
            out.append(ln)
            out.extend([None] * (j - i - 1))    # keep the indexes of the lines after it
            i = j
            continue
        out.append(ln)
        i += 1
    return out


def _clean(line):
    """A log line as NCCL printed it: quote markers and markdown link artefacts ([p2p.cc:648](https://...)) removed."""
    ln = re.sub(r"^(?:\s*>)+\s?", "", line) if line.lstrip().startswith(">") else line
    return _MD_LINK_RE.sub(r"\1", ln)


def parse_nccl_warns(text):
    """NCCL output (INFO/WARN interleaved; mpirun tags, timestamps fine) and PyTorch's watchdog lines -> {completions:
    [{host, peer, status, status_name, vendor_err, hca, hint, raw}], async_events: [{hca, port, kind, what, text, host,
    raw}], ibv_failures: [{verb, error, host, raw}], comm_errors: [{text, host, raw}], watchdog: [{pg, rank, seq, op,
    timeout_ms, ran_ms, raw}] (one per timeout), gdr: {hca: Enabled|Disabled} (the last word per HCA of the IB
    transports), gdr_events: [{hca, index, state, via, reason, transport, raw}], gdr_gpu: [{gpu, hca_index, state,
    distance, level}], network: the `Using network` NCCL chose, ib_no_device, warn_count}.
    A completion without ``hca`` (NCCL < 2.19) keeps hca None: the caller charges it to the only NIC of the run."""
    out = {"completions": [], "async_events": [], "ibv_failures": [], "comm_errors": [], "watchdog": [], "gdr": {},
           "gdr_events": [], "gdr_gpu": [], "network": None, "ib_no_device": False, "warn_count": 0}
    seen_wd = set()
    lines = _join_wrapped_completions([_clean(ln) for ln in (text or "").splitlines()])
    for i, ln in enumerate(lines):
        if ln is None:       # joined to the wrapped WARN above it
            continue
        if _WARN_LINE_RE.search(ln):
            out["warn_count"] += 1
        hm = _WARN_HOST_RE.search(ln)
        host = hm.group("host") if hm else None
        m = _COMPLETION_RE.search(ln)
        if m:
            st = m.group("status") or m.group("status_old")
            status = int(st)
            raw = ln
            vendor = m.group("vendor")
            # join a line broken inside "len\n0, vendor err" (terminal wrap in published logs)
            if vendor is None and i + 1 < len(lines) and lines[i + 1] and "vendor err" in lines[i + 1]:
                mv = re.search(r"vendor[ _]err[= ](\d+)", lines[i + 1])
                vendor = mv.group(1) if mv else None
                raw = ln + "\n" + lines[i + 1]
            out["completions"].append({
                "host": host, "peer": m.group("peer"), "status": status,
                "status_name": m.group("sname") or IBV_WC_STATUS.get(status, "status %d" % status),
                "vendor_err": int(vendor) if vendor is not None else None, "hca": m.group("hca"),
                "hint": WC_HINT.get(status, ""), "raw": raw.strip()})
            continue
        m = _ASYNC_RE.search(ln)
        if m:
            out["async_events"].append({"hca": m.group("hca"), "port": int(m.group("port")), "kind": "fatal_event",
                                        "what": (m.group("what") or "").strip(), "text": m.group("text").strip(),
                                        "host": host, "raw": ln.strip()})
            continue
        m = _GOT_ASYNC_RE.search(ln)
        if m:
            out["async_events"].append({"hca": m.group("hca"), "port": int(m.group("port")) if m.group("port") else None,
                                        "kind": "got_async_event", "what": "", "text": m.group("text").strip(),
                                        "host": host, "raw": ln.strip()})
            continue
        m = _IBV_FAIL_RE.search(ln)
        if m:
            out["ibv_failures"].append({"verb": m.group("verb"), "error": (m.group("error") or "").strip() or None,
                                        "host": host, "raw": ln.strip()})
            continue
        m = _COMM_ERR_RE.search(ln)
        if m:
            out["comm_errors"].append({"text": m.group("text"), "host": host, "raw": ln.strip()})
            continue
        m = _WATCHDOG_RE.search(ln)
        if m:
            key = (m.group("pg"), int(m.group("rank")), int(m.group("seq")), m.group("op"))
            if key not in seen_wd and not any(k[1:] == key[1:] and (k[0] is None or key[0] is None) for k in seen_wd):
                seen_wd.add(key)
                out["watchdog"].append({"pg": m.group("pg"), "rank": key[1], "seq": key[2], "op": key[3],
                                        "timeout_ms": int(m.group("tmo")), "ran_ms": int(m.group("ran")),
                                        "raw": ln.strip()})
            continue
        m = _GDR_RE.search(ln)
        if m:
            state = m.group("state").capitalize()
            transport = m.group("transport").strip()
            reason = (m.group("reason") or "").strip() or None
            out["gdr_events"].append({"hca": m.group("hca"), "index": int(m.group("n")), "state": state,
                                      "via": m.group("via"), "reason": reason, "transport": transport,
                                      "raw": ln.strip()})
            if transport != "Socket":
                out["gdr"][m.group("hca")] = state
            continue
        m = _GDR_GPU_RE.search(ln)
        if m:
            out["gdr_gpu"].append({"gpu": m.group("gpu"), "hca_index": int(m.group("hca"), 0),
                                   "state": m.group("state"), "distance": int(m.group("d")),
                                   "level": int(m.group("lvl")), "raw": ln.strip()})
            continue
        m = _NETWORK_RE.search(ln)
        if m:
            out["network"] = m.group("net")
        if "NET/IB : No device found" in ln:
            out["ib_no_device"] = True
    return out


def _perftest_run():
    return {"test": None, "device": None, "link_type": None, "cuda_device": None, "cuda_name": None, "rows": [],
            "largest": None, "unit": None, "errors": []}


def parse_perftest(text):
    """``ib_write_bw`` / ``ib_send_bw`` / ``ib_read_bw`` / ``ib_atomic_bw`` output -> the first run as {test, device,
    link_type, cuda_device, cuda_name, rows: [{bytes, iterations, bw_peak, bw_avg, msg_rate_mpps}], largest: last
    row or None, unit, errors: [...]} plus ``runs``: every run of the text, one per ``... BW Test`` header (a file
    that holds an ib_read_bw and an ib_write_bw table gives two runs, never one merged table; latency tables are not
    runs). The BW unit is Gb/s with --report_gbits (``BW peak[Gb/sec]``), else MB/s or MiB/s (``BW peak[MB/sec]``,
    newer perftest ``[MiB/sec]``): both are 2^20 bytes (perftest_parameters.c: format_factor 0x100000)."""
    runs = []
    cur = _perftest_run()
    pre = {"cuda_device": None, "cuda_name": None}   # CUDA lines come before the test header
    in_table = False
    for ln in (text or "").splitlines():
        s = ln.strip()
        m = re.match(r"^(\S.*? BW Test)$", s)
        if m:
            if cur["test"] is not None or cur["rows"]:
                runs.append(cur)
                cur = _perftest_run()
            cur["test"] = m.group(1)
            cur.update({k: v for k, v in pre.items() if v is not None})
            pre = {"cuda_device": None, "cuda_name": None}
            in_table = False
            continue
        m = re.search(r"Device\s*:\s*(\S+)", s)
        if m and cur["device"] is None:
            cur["device"] = m.group(1)
        m = re.match(r"^Link type\s*:\s*(\S+)", s)
        if m:
            cur["link_type"] = m.group(1)
        m = re.match(r"^Picking device No\. (\d+)", s)
        if m:
            pre["cuda_device"] = cur["cuda_device"] = int(m.group(1))
        m = re.search(r"\[pid = \d+, dev = (\d+)\] device name = \[([^\]]+)\]", s)
        if m:
            pre["cuda_device"] = cur["cuda_device"] = int(m.group(1))
            pre["cuda_name"] = cur["cuda_name"] = m.group(2)
        m = re.match(r"^#bytes\s+#iterations\s+BW peak\[(Gb|MB|MiB)/sec\]", s)
        if m:
            cur["unit"] = {"Gb": "Gb/s", "MB": "MB/s", "MiB": "MiB/s"}[m.group(1)]
            in_table = True
            continue
        if re.match(r"^#bytes\s+#iterations\s+t_min", s):
            in_table = False
            continue
        if in_table:
            parts = s.split()
            if len(parts) >= 4 and parts[0].isdigit() and parts[1].isdigit():
                try:
                    row = {"bytes": int(parts[0]), "iterations": int(parts[1]), "bw_peak": float(parts[2]),
                           "bw_avg": float(parts[3]), "msg_rate_mpps": float(parts[4]) if len(parts) > 4 else None}
                except ValueError:
                    continue
                cur["rows"].append(row)
            elif s.startswith("---") and cur["rows"]:
                in_table = False
        if re.search(r"(?i)\b(couldn't|failed|error|unable)\b", s) and not s.startswith("#"):
            cur["errors"].append(s)
    runs.append(cur)
    for r in runs:
        r["largest"] = r["rows"][-1] if r["rows"] else None
    first = dict(runs[0])
    first["runs"] = [r for r in runs if r["test"] is not None or r["rows"]]
    return first


def perftest_gbps(parsed):
    """Average bandwidth of the largest message in Gb/s (MB/s and MiB/s are 2^20 bytes: x 2^20 x 8 / 1e9), or None
    when no result row was printed."""
    row = (parsed or {}).get("largest")
    if not row:
        return None
    if parsed.get("unit") == "Gb/s":
        return round(row["bw_avg"], 2)
    return round(row["bw_avg"] * 1048576 * 8 / 1e9, 2)
