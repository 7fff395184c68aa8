# -*- coding: utf-8 -*-
"""Parse nccl-tests 2.19.x ``all_reduce_perf`` output and classify repeated runs.

Pure stdlib functions (no Ansible import) so that they run on hosts that only have python3 and in
pytest. Used by ``plugins/modules/nccl_tests_result.py``.

Formats (checked against real 2.19.6 captures from 1xH200 and 2xH200 and the 2.19.6 sources):

* text: ``# nccl-tests version 2.19.6 ...`` header, ``# nThread 1 nGpus N minBytes ...``, one
  ``#  Rank  N Group  G Pid P on HOST device D [0000:00:06] GPU NAME`` line per rank, a 13-column table
  (size count type redop root | time algbw busbw #wrong | time algbw busbw #wrong), then
  ``# Out of bounds values : 0 OK|FAILED``, ``# Avg bus bandwidth    : X [OK|FAILED]`` and
  ``# Collective test concluded: all_reduce_perf``. ``NCCL INFO`` lines interleave with everything.
  Failures print ``HOST: Test NCCL failure FILE:LINE '...'`` / ``Test CUDA failure`` / ``Test timeout``.
* launcher prefixes: ``[1,0]<stdout>:`` (mpirun --tag-output) and ``0: `` (srun --label) in front of every line, and
  the same tags glued inside a row when ranks' writes interleave: stripped (``tagged_lines`` counts them); before
  them a log collector's lead (``kubectl logs --timestamps``/``--prefix``, ``podman logs -t``) is dropped too.
* header-driven cells: the ``size ...`` header fixes the cells of each half; ``-I 1`` (per-iteration timing) adds
  ``i_min i_max i_p99 i_cv%`` to both halves, ``-S 1`` a trailing ``timestamp`` column (``YYYY-MM-DD HH:MM:SS``),
  ``-C 1`` names the time column ``cputime``. ``#wrong`` is ``N/A`` where validation does not apply (alltoall in-place
  in 2.18+): kept as None. A header whose halves cannot be mapped makes its rows ``skipped_rows`` (never read with a
  guessed layout); ``Group`` in the rank lines is optional (before 2.10), so is ``nThread`` (``nGpus(perProc)``).
* older layouts: rows without the ``root`` column (``size count type redop time algbw busbw #wrong|error ...``) and
  without ``redop``; where the header says ``error`` (max relative error, a float) instead of ``#wrong``, the cell is
  kept as ``error`` and ``wrong`` is None (correctness then rests on ``# Out of bounds values``).
* JSON (``-J file.json``): ``results[]`` with ``size``, ``count``, ``type``, ``redop``, ``root``,
  ``out_of_place{time,alg_bw,bus_bw,nwrong}``, ``in_place{...}``; ``out_of_bounds{count,okay}``,
  ``average_bus_bandwidth{bandwidth,okay}``, ``errors[]``. nccl-tests writes it incrementally, so a hung
  or killed run leaves a truncated (invalid) file: the text table is then the source of the rows.

Gating rule: never the footer ``Avg bus bandwidth`` (it averages every size, 8 B included); the gated
figure is the MEDIAN over the largest sizes (sizes >= ``gate_min_bytes``, or the ``gate_top_n`` largest
when fewer qualify) of the OUT-OF-PLACE column of the gated metric (in-place is meaningless for one
rank: the real 1xH200 capture shows in-place "algbw" of 3e+06 GB/s for a no-op).
"""

from __future__ import absolute_import, division, print_function

import json
import re
import statistics

__metaclass__ = type

GIB = 1 << 30
STATUSES = ("ok", "slow", "wrong_results", "hang", "intermittent", "error")
FAILED_STATUSES = ("hang", "error")
COMPLETED_STATUSES = ("ok", "slow")
TIMEOUT_RCS = (124, 137)  # coreutils timeout: 124 = TERM sent, 137 = KILL after --kill-after

_NUM = r"(\S+)"
ROW_RE = re.compile(
    r"(?:^|\s)(\d+)\s+(\d+)\s+([A-Za-z][A-Za-z0-9_]*)\s+([A-Za-z][A-Za-z0-9_]*)\s+(-?\d+)"
    + r"\s+" + r"\s+".join([_NUM] * 8) + r"(?:\s|$)"
)
VERSION_RE = re.compile(r"^#\s*nccl-tests version\s+(\S+)(?:\s+nccl-headers=(\d+))?(?:\s+nccl-library=(\d+))?")
START_RE = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
CONCLUDED_RE = re.compile(r"^#\s*Collective test concluded:\s*(\S+)")
# `# nThread 1 nGpus 8 minBytes ...`; some wrappers print `# nGpus(perProc) 1 minBytes ...` without nThread
NTHREAD_RE = re.compile(
    r"^#\s*(?:nThread\s+(\d+)\s+)?nGpus(?:\(perProc\))?\s+(\d+)\s+minBytes\s+(\d+)\s+maxBytes\s+(\d+)"
    r"(?:.*?warmup iters:\s*(\d+))?(?:.*?\biters:\s*(\d+))?(?:.*?validation:\s*(\d+))?"
)
# `Group G` is absent in nccl-tests before 2.10 (`#   Rank  0 Pid     26 on host device  0 [0x10] A100-SXM4-40GB`)
RANK_RE = re.compile(
    r"^#\s*Rank\s+(\d+)\s+(?:Group\s+(\d+)\s+)?Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)\s+\[([^\]]*)\]\s*(.*?)\s*$"
)
OOB_RE = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)\s*(OK|FAILED)?")
AVG_RE = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)\s*(OK|FAILED)?")
REDUCED_RE = re.compile(r"^#\s*Reducing maxBytes to\s+(\d+)")
FAILURE_RE = re.compile(r"(Test (?:NCCL|CUDA) failure.*|Test failure.*|Test timeout.*)$")
TIMEOUT_MSG_RE = re.compile(r"Test timeout \(")
INFO_RE = re.compile(r"\bNCCL (?:INFO|WARN|TRACE)\b")
NOT_FOUND_RE = re.compile(r"(No such file or directory|command not found|failed to run command)", re.I)


# Launcher prefixes: mpirun --tag-output `[1,0]<stdout>:`, srun --label `0: `, and the same tags glued inside a row
# when two ranks' writes interleave (`... sum      -1[1,0]<stdout>:   1626.5 ...`, `-1[0]   1626.5`).
TAG_LEAD_RE = re.compile(r"^\s*(?:\[\d+(?:,\d+)*\](?:<std(?:out|err)>)?:?|\d+:(?=\s))\s?")
TAG_ANY_RE = re.compile(r"\[\d+(?:,\d+)*\](?:<std(?:out|err)>)?:?")
_INT_RE = re.compile(r"^\d+$")
_TYPE_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_CELL_RE = re.compile(r"^(?:-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|N/A|nan|-?inf)$", re.I)
# `-S 1` (report timestamps) appends `YYYY-MM-DD HH:MM:SS` to every row
_ROW_STAMP_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_ROW_CLOCK_RE = re.compile(r"^\d{2}:\d{2}:\d{2}$")
# the cells of one half (out-of-place / in-place) by header name; -C 1 prints `cputime`, old versions `error`
_HALF_KEYS = {"time": "time_us", "cputime": "time_us", "algbw": "algbw", "busbw": "busbw", "#wrong": "wrong",
              "error": "wrong"}
DEFAULT_LAYOUT = {"width": 4, "index": {"time_us": 0, "algbw": 1, "busbw": 2, "wrong": 3}}


# What log collectors put in front of every line: `kubectl logs --timestamps` (RFC 3339, nanoseconds), `--prefix`
# (`[pod/<name>/<container>] `), docker/podman `logs -t`. Dropped before the launcher tag; not counted as tags.
LOG_LEAD_RE = re.compile(r"^(?:\[pod/[^\]\s]+\]\s)?(?:\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?\s)?")


def strip_launcher_tag(line):
    """Drop a log collector's lead (see LOG_LEAD_RE) and a leading mpirun/srun rank tag; returns (line, tagged)."""
    line = line[LOG_LEAD_RE.match(line).end():]
    m = TAG_LEAD_RE.match(line)
    if not m:
        return line, False
    return line[m.end():], True


def header_layout(tokens):
    """Per-half cell layout from a table header (`size count type redop root time algbw busbw #wrong ...`), or None.

    Current nccl-tests print 4 cells per half; `-I 1` (per-iteration timing) adds i_min i_max i_p99 i_cv% to each
    half and `-S 1` a trailing `timestamp` column. The two halves have the same names; a header whose halves differ,
    or that lacks time/algbw/busbw, is not a layout this parser knows (None: rows are then not read).
    """
    toks = [t for t in tokens if t != "timestamp"]
    if toks[:1] != ["size"]:
        return None
    cells = [t for t in toks[1:] if t not in ("count", "type", "redop", "root")]
    if not cells or len(cells) % 2:
        return None
    width = len(cells) // 2
    first, second = cells[:width], cells[width:]
    if first != second:
        return None
    index = {}
    for i, name in enumerate(first):
        key = _HALF_KEYS.get(name)
        if key and key not in index:
            index[key] = i
    if not all(k in index for k in ("time_us", "algbw", "busbw")):
        return None
    return {"width": width, "index": index}


def parse_row(line, layout=None):
    """One result row in any nccl-tests layout, or None.

    Layouts (columns after size/count/type): ``redop root`` + 2 halves (2.x with root), ``redop`` + 2 halves (older,
    no root), 2 halves (oldest, no redop; also all_gather-style tests of old versions). A half is 4 cells (time algbw
    busbw #wrong) unless ``layout`` (from :func:`header_layout`) says otherwise (per-iteration columns). A rank tag
    glued into the row is removed first; a trailing ``YYYY-MM-DD HH:MM:SS`` timestamp is kept as ``timestamp``.
    The 4th cell of each half is ``#wrong`` (a count) in current versions, ``error`` (max relative error, a float)
    in old ones: both are returned as ``wrong`` as printed; ``error_column`` is for the caller to tell them apart.
    """
    layout = layout or DEFAULT_LAYOUT
    width = layout["width"]
    toks = TAG_ANY_RE.sub(" ", line).split()
    stamp = None
    if len(toks) >= 2 and _ROW_STAMP_RE.match(toks[-2]) and _ROW_CLOCK_RE.match(toks[-1]):
        stamp = toks[-2] + " " + toks[-1]
        toks = toks[:-2]
    for i in range(0, max(0, len(toks) - 2 * width - 2)):
        if not (_INT_RE.match(toks[i]) and _INT_RE.match(toks[i + 1]) and _TYPE_RE.match(toks[i + 2])):
            continue
        j = i + 3
        redop = None
        if j < len(toks) and _TYPE_RE.match(toks[j]) and toks[j].lower() not in ("nan", "inf"):
            redop = toks[j]
            j += 1
        rest = toks[j:]
        root = None
        if len(rest) == 2 * width + 1 and re.match(r"^-?\d+$", rest[0]):
            root, rest = int(rest[0]), rest[1:]
        if len(rest) != 2 * width or not all(_CELL_RE.match(c) for c in rest):
            continue
        row = {"size": int(toks[i]), "count": int(toks[i + 1]), "type": toks[i + 2], "redop": redop, "root": root,
               "out_of_place": _half(rest[:width], layout), "in_place": _half(rest[width:], layout)}
        if stamp:
            row["timestamp"] = stamp
        return row
    return None


def _num(token):
    """Float from a table cell; None for N/A or garbage."""
    try:
        return float(token)
    except (TypeError, ValueError):
        return None


def _half(cells, layout=None):
    index = (layout or DEFAULT_LAYOUT)["index"]
    return {key: (_num(cells[index[key]]) if key in index else None)
            for key in ("time_us", "algbw", "busbw", "wrong")}


def _looks_like_row(line):
    """size count type ... : the start of a result row whatever follows (for counting rows of unknown layouts)."""
    toks = TAG_ANY_RE.sub(" ", line).split()
    return len(toks) > 4 and bool(_INT_RE.match(toks[0]) and _INT_RE.match(toks[1]) and _TYPE_RE.match(toks[2]))


def parse_text(text):
    """Parse the stdout of all_reduce_perf (NCCL INFO lines may be interleaved, output may be truncated)."""
    out = {
        "version": None, "nccl_headers": None, "nccl_library": None, "collective": None,
        "nthreads": None, "ngpus": None, "min_bytes": None, "max_bytes": None,
        "warmup_iters": None, "iters": None, "validation": None, "reduced_max_bytes": None,
        "ranks": [], "rows": [], "out_of_bounds": None, "avg_busbw": None, "avg_bw_check": None,
        "concluded": False, "failures": [], "timeout_reported": False, "info_lines": 0, "started": False,
        "tagged_lines": 0, "wrong_column": None, "root_column": None,
        "layout": None, "unknown_headers": [], "skipped_rows": 0,
    }
    for raw in (text or "").splitlines():
        line, tagged = strip_launcher_tag(raw.rstrip())
        if tagged:
            out["tagged_lines"] += 1
        if not line.strip():
            continue
        if INFO_RE.search(line):
            out["info_lines"] += 1
            # a table row glued after an INFO fragment on the same line is still a row (handled below)
        stripped = line.strip()
        if stripped.startswith("#"):
            m = VERSION_RE.match(stripped)
            if m:
                out["version"] = m.group(1)
                out["nccl_headers"] = int(m.group(2)) if m.group(2) else None
                out["nccl_library"] = int(m.group(3)) if m.group(3) else None
                continue
            m = START_RE.match(stripped)
            if m:
                out["collective"] = m.group(1)
                out["started"] = True
                continue
            m = CONCLUDED_RE.match(stripped)
            if m:
                out["concluded"] = True
                continue
            m = NTHREAD_RE.match(stripped)
            if m:
                out["nthreads"] = int(m.group(1)) if m.group(1) else None
                out["ngpus"] = int(m.group(2))
                out["min_bytes"], out["max_bytes"] = int(m.group(3)), int(m.group(4))
                out["warmup_iters"] = int(m.group(5)) if m.group(5) else None
                out["iters"] = int(m.group(6)) if m.group(6) else None
                out["validation"] = int(m.group(7)) if m.group(7) else None
                continue
            m = RANK_RE.match(stripped)
            if m:
                out["ranks"].append({
                    "rank": int(m.group(1)), "group": int(m.group(2)) if m.group(2) else None, "pid": int(m.group(3)),
                    "host": m.group(4), "device": int(m.group(5)), "bus_id": m.group(6), "gpu_name": m.group(7),
                })
                continue
            m = OOB_RE.match(stripped)
            if m:
                count = int(m.group(1))
                out["out_of_bounds"] = {"count": count, "ok": m.group(2) != "FAILED" and count == 0}
                continue
            m = AVG_RE.match(stripped)
            if m:
                out["avg_busbw"] = _num(m.group(1))
                out["avg_bw_check"] = m.group(2)
                continue
            m = REDUCED_RE.match(stripped)
            if m:
                out["reduced_max_bytes"] = int(m.group(1))
                continue
            toks = stripped.lstrip("#").split()
            if toks[:1] == ["size"]:
                out["wrong_column"] = "#wrong" if "#wrong" in toks else ("error" if "error" in toks else None)
                out["root_column"] = "root" in toks
                layout = header_layout(toks)
                out["layout"] = layout
                if layout is None:
                    out["unknown_headers"].append(stripped)
            continue
        if out["unknown_headers"] and out["layout"] is None and _looks_like_row(line):
            # a table header we cannot map: reading its rows with the default layout could misplace the columns
            out["skipped_rows"] += 1
            continue
        row = parse_row(line, out["layout"])
        if row:
            if out["wrong_column"] == "error":
                # old nccl-tests: the 4th cell is the max error (e.g. 5e-07), not a count of wrong elements
                for key in ("out_of_place", "in_place"):
                    row[key]["error"] = row[key]["wrong"]
                    row[key]["wrong"] = None
            out["rows"].append(row)
            continue
        f = FAILURE_RE.search(line)
        if f:
            out["failures"].append(stripped)
            if TIMEOUT_MSG_RE.search(line):
                out["timeout_reported"] = True
    return out


def parse_json(text):
    """Parse the -J output. Returns {'valid': False, 'error': ...} for missing/truncated/invalid JSON."""
    if text is None or not str(text).strip():
        return {"valid": False, "error": "empty or missing JSON output", "rows": []}
    try:
        doc = json.loads(text)
    except ValueError as exc:
        return {"valid": False, "error": "invalid JSON (truncated run?): %s" % exc, "rows": []}
    if not isinstance(doc, dict):
        return {"valid": False, "error": "JSON top level is not an object", "rows": []}
    rows = []
    for r in doc.get("results") or []:
        if not isinstance(r, dict):
            continue

        def half(key, r=r):
            h = r.get(key) or {}
            return {"time_us": _num(h.get("time")), "algbw": _num(h.get("alg_bw")),
                    "busbw": _num(h.get("bus_bw")), "wrong": _num(h.get("nwrong"))}
        try:
            root = int(str(r.get("root", "-1")).strip())
        except ValueError:
            root = None
        rows.append({"size": int(r.get("size", 0)), "count": int(r.get("count", 0)), "type": r.get("type"),
                     "redop": r.get("redop"), "root": root,
                     "out_of_place": half("out_of_place"), "in_place": half("in_place")})
    oob = doc.get("out_of_bounds")
    out_of_bounds = None
    if isinstance(oob, dict):
        count = int(oob.get("count") or 0)
        out_of_bounds = {"count": count, "ok": str(oob.get("okay", "true")).lower() == "true" and count == 0}
    avg = doc.get("average_bus_bandwidth") or {}
    avg_check = avg.get("okay")
    if isinstance(avg_check, bool) or str(avg_check).lower() in ("true", "false"):
        avg_check = "OK" if str(avg_check).lower() == "true" else "FAILED"
    else:
        avg_check = None
    config = doc.get("config") or {}
    errors = [e for e in (doc.get("errors") or []) if isinstance(e, str) and e.strip()]
    return {
        "valid": True, "error": None, "rows": rows, "out_of_bounds": out_of_bounds,
        "avg_busbw": _num(avg.get("bandwidth")), "avg_bw_check": avg_check,
        "ngpus": config.get("ngpus"), "nthreads": config.get("nthreads"),
        "nccl_version": doc.get("nccl_version"), "errors": errors,
        "devices": config.get("devices") or [],
    }


def merge_run(text_parsed, json_parsed):
    """One view of a run: rows from JSON when it is complete, else from the text; header from the text."""
    run = dict(text_parsed)
    run["rows_source"] = "text"
    run["json_valid"] = bool(json_parsed and json_parsed.get("valid"))
    run["json_error"] = json_parsed.get("error") if json_parsed else "no JSON output requested"
    run["errors"] = []
    if run["json_valid"]:
        if json_parsed["rows"] and len(json_parsed["rows"]) >= len(text_parsed["rows"]):
            run["rows"] = json_parsed["rows"]
            run["rows_source"] = "json"
        if json_parsed.get("out_of_bounds") is not None:
            oob_t = text_parsed.get("out_of_bounds")
            oob_j = json_parsed["out_of_bounds"]
            # keep the worse of the two views
            if oob_t is None or oob_j["count"] > oob_t["count"] or not oob_j["ok"]:
                run["out_of_bounds"] = oob_j
        if run.get("avg_busbw") is None:
            run["avg_busbw"] = json_parsed.get("avg_busbw")
        if run.get("avg_bw_check") is None:
            run["avg_bw_check"] = json_parsed.get("avg_bw_check")
        run["errors"] = json_parsed.get("errors", [])
        if run.get("ngpus") is None:
            run["ngpus"] = json_parsed.get("ngpus")
    return run


def wrong_total(rows):
    """Sum of #wrong over every size, out-of-place and in-place."""
    total = 0
    for r in rows:
        for key in ("out_of_place", "in_place"):
            w = r[key].get("wrong")
            if w:
                total += int(w)
    return total


def _median(values):
    """Median of the values that are not None; None when there are none."""
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def gate_rows(rows, metric="busbw", gate_min_bytes=GIB, gate_top_n=3):
    """Select the gated sizes and compute the gated figure (median of the out-of-place metric)."""
    if metric not in ("busbw", "algbw"):
        raise ValueError("metric must be busbw or algbw, not %r" % (metric,))
    by_size = sorted(rows, key=lambda r: r["size"])
    if not by_size:
        return {"metric": metric, "sizes": [], "values": [], "gated": None, "max_size": None,
                "max_size_busbw": None, "max_size_algbw": None}
    chosen = [r for r in by_size if r["size"] >= int(gate_min_bytes)]
    if len(chosen) < int(gate_top_n):
        chosen = by_size[-int(gate_top_n):]
    values = [r["out_of_place"].get(metric) for r in chosen]
    last = by_size[-1]
    return {
        "metric": metric,
        "sizes": [r["size"] for r in chosen],
        "values": values,
        "gated": _round(_median(values)),
        "max_size": last["size"],
        "max_size_busbw": last["out_of_place"].get("busbw"),
        "max_size_algbw": last["out_of_place"].get("algbw"),
    }


def _round(v, nd=3):
    return None if v is None else round(float(v), nd)


def _fmt_size(n):
    if n is None:
        return "none"
    for unit, div in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return "%d %s" % (n // div, unit)
    return "%d B" % n


def analyze_repeat(index, rc, timed_out, stdout, json_text, threshold=None, gate_min_bytes=GIB, gate_top_n=3,
                   stdout_missing=False):
    """Classify ONE repeat: ok | slow | wrong_results | hang | error (+ the numbers and the rule that fired)."""
    threshold = threshold or {}
    metric = threshold.get("metric") or "busbw"
    min_gbps = threshold.get("min_gbps")
    text = parse_text(stdout or "")
    js = parse_json(json_text) if json_text is not None else None
    run = merge_run(text, js)
    if timed_out is None:
        timed_out = rc in TIMEOUT_RCS
    rows = run["rows"]
    gate = gate_rows(rows, metric, gate_min_bytes, gate_top_n)
    wrong = wrong_total(rows)
    oob = run.get("out_of_bounds")
    res = {
        "index": index, "rc": rc, "timed_out": bool(timed_out), "rows": len(rows), "rows_source": run["rows_source"],
        "json_valid": run["json_valid"], "json_error": run["json_error"],
        "last_size": rows[-1]["size"] if rows else None,
        "max_size": gate["max_size"], "max_size_busbw_gbps": gate["max_size_busbw"],
        "max_size_algbw_gbps": gate["max_size_algbw"],
        "gated_gbps": gate["gated"], "gate_sizes": gate["sizes"], "gate_values": gate["values"], "metric": metric,
        "wrong_total": wrong, "out_of_bounds": oob, "avg_busbw_all_sizes": run.get("avg_busbw"),
        "concluded": run["concluded"], "failures": run["failures"][:10], "json_errors": run["errors"][:10],
        "ngpus": run.get("ngpus"), "ranks": len(run["ranks"]),
        "gpu_names": sorted(set(r["gpu_name"] for r in run["ranks"])),
        "info_lines": run["info_lines"], "version": run.get("version"),
    }
    if wrong > 0 or (oob is not None and not oob["ok"]):
        bad = [r["size"] for r in rows if (r["out_of_place"].get("wrong") or 0) > 0 or (r["in_place"].get("wrong") or 0) > 0]
        res.update(status="wrong_results", rule="wrong_results",
                   detail="#wrong=%d over sizes %s, out-of-bounds=%s" % (
                       wrong, ",".join(_fmt_size(s) for s in bad[:6]) or "-", oob["count"] if oob else "n/a"))
        return res
    if timed_out or run["timeout_reported"]:
        res.update(status="hang", rule="timeout",
                   detail="no completion before the timeout (rc=%s); last finished size %s (%d rows)" % (
                       rc, _fmt_size(res["last_size"]), len(rows)))
        return res
    if stdout_missing:
        res.update(status="error", rule="no_output", detail="stdout of the run is missing (rc=%s)" % rc)
        return res
    if rc not in (0, None):
        if run.get("avg_bw_check") == "FAILED" and rows and run["concluded"]:
            res.update(status="slow", rule="nccl_tests_min_bw",
                       detail="NCCL_TESTS_MIN_BW check failed in nccl-tests (all-sizes average %s)" % run.get("avg_busbw"))
            return res
        if rc == 127 or (not rows and NOT_FOUND_RE.search(stdout or "")):
            why = "all_reduce_perf (or a library it needs) not found"
        elif run["failures"]:
            why = run["failures"][0]
        else:
            tail = [ln for ln in (stdout or "").splitlines() if ln.strip()][-1:]
            why = tail[0].strip()[:200] if tail else "no output"
        res.update(status="error", rule="exit_status", detail="rc=%s: %s" % (rc, why))
        return res
    if not rows:
        if run.get("skipped_rows"):
            why = "%d rows under a table header of unknown layout: %s" % (
                run["skipped_rows"], run["unknown_headers"][0][:160])
        else:
            why = "no result rows in the output"
        res.update(status="error", rule="unparsable", detail="%s (rc=%s)" % (why, rc))
        return res
    if not run["concluded"] and run["started"]:
        res.update(status="error", rule="truncated",
                   detail="output ends after size %s without the concluding footer" % _fmt_size(res["last_size"]))
        return res
    if min_gbps is not None and (gate["gated"] is None or gate["gated"] < float(min_gbps)):
        res.update(status="slow", rule="below_threshold",
                   detail="%s %s GB/s (median over %s) < %s GB/s" % (
                       metric, gate["gated"], ",".join(_fmt_size(s) for s in gate["sizes"]), min_gbps))
        return res
    res.update(status="ok", rule="within_threshold" if min_gbps is not None else "correctness_only",
               detail="%s %s GB/s over %s" % (metric, gate["gated"], ",".join(_fmt_size(s) for s in gate["sizes"])))
    return res


def baseline_comparable(baseline, metric, gpu_count, nodes):
    """A baseline is only comparable when it measured the same thing (metric, GPUs, nodes)."""
    if not isinstance(baseline, dict) or baseline.get("gated_gbps") in (None, 0, 0.0):
        return False
    return (baseline.get("metric") == metric and int(baseline.get("gpu_count") or 0) == int(gpu_count or 0)
            and int(baseline.get("nodes") or 1) == int(nodes or 1))


def classify(repeats, threshold=None, gpu_count=None, nodes=1, baseline=None, max_drop_pct=10.0):
    """Verdict over K analysed repeats (outputs of analyze_repeat).

    Precedence: wrong_results (any repeat, corruption is never forgiven) > intermittent (some repeats
    completed, some hung/errored) > hang (none completed, at least one hang) > error (none completed) >
    slow (median of the per-repeat gated figures below the threshold, or > max_drop_pct below this host's
    comparable baseline) > ok. Mixed ok/slow repeats are NOT intermittent: performance is judged on the median.
    """
    threshold = threshold or {}
    metric = threshold.get("metric") or "busbw"
    min_gbps = threshold.get("min_gbps")
    counts = {}
    for r in repeats:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    completed = [r for r in repeats if r["status"] in COMPLETED_STATUSES]
    failed = [r for r in repeats if r["status"] in FAILED_STATUSES]
    gated = _round(_median([r["gated_gbps"] for r in completed]))
    verdict = {
        "status": None, "rule": None, "message": None,
        "repeats_total": len(repeats), "counts": counts,
        "metric": metric, "gated_gbps": gated, "threshold_gbps": min_gbps,
        "threshold_id": threshold.get("id"), "threshold_source": threshold.get("source"),
        "gate_sizes": completed[0]["gate_sizes"] if completed else [],
        "per_repeat_gated_gbps": [r["gated_gbps"] for r in repeats],
        "per_repeat_max_size_busbw_gbps": [r["max_size_busbw_gbps"] for r in repeats],
        "per_repeat_max_size_algbw_gbps": [r["max_size_algbw_gbps"] for r in repeats],
        "per_repeat_status": [r["status"] for r in repeats],
        "max_size": max([r["max_size"] for r in repeats if r["max_size"]] or [0]) or None,
        "gpu_count": gpu_count, "nodes": nodes,
        "regression": {"baseline_gbps": None, "drop_pct": None, "max_drop_pct": max_drop_pct, "fired": False,
                       "compared": False},
        "repeats": repeats,
    }
    summary = ", ".join("%d %s" % (counts[k], k) for k in STATUSES if k in counts)
    if not repeats:
        verdict.update(status="error", rule="no_repeats", message="no repeat was run")
    elif counts.get("wrong_results"):
        bad = [r for r in repeats if r["status"] == "wrong_results"]
        verdict.update(status="wrong_results", rule="wrong_results",
                       message="wrong results in %d/%d repeats: %s" % (len(bad), len(repeats), bad[0]["detail"]))
    elif failed and completed:
        verdict.update(status="intermittent", rule="mixed_outcomes",
                       message="mixed outcomes over %d repeats (%s); first failure: %s" % (
                           len(repeats), summary, failed[0]["detail"]))
    elif failed:
        status = "hang" if counts.get("hang") else "error"
        first = [r for r in failed if r["status"] == status][0]
        verdict.update(status=status, rule=first["rule"],
                       message="%s in %d/%d repeats: %s" % (status, len(failed), len(repeats), first["detail"]))
    elif min_gbps is not None and (gated is None or gated < float(min_gbps)):
        verdict.update(status="slow", rule="below_threshold",
                       message="median gated %s %s GB/s < threshold %s GB/s (%s; per repeat %s)" % (
                           metric, gated, min_gbps, threshold.get("id") or "threshold",
                           verdict["per_repeat_gated_gbps"]))
    else:
        verdict.update(status="ok", rule="within_threshold" if min_gbps is not None else "correctness_only",
                       message="gated %s %s GB/s%s over %d repeats" % (
                           metric, gated, (" >= threshold %s GB/s" % min_gbps) if min_gbps is not None
                           else " (no absolute threshold: correctness only)", len(repeats)))
    if verdict["status"] in ("ok", "slow") and baseline_comparable(baseline, metric, gpu_count, nodes) and gated is not None:
        base = float(baseline["gated_gbps"])
        drop = round((base - gated) / base * 100.0, 2)
        fired = drop > float(max_drop_pct)
        verdict["regression"].update(baseline_gbps=base, drop_pct=drop, fired=fired, compared=True,
                                     baseline_run_id=baseline.get("run_id"))
        if fired and verdict["status"] == "ok":
            verdict.update(status="slow", rule="regression",
                           message="gated %s %s GB/s is %.1f%% below this host's baseline %s GB/s (max drop %s%%)" % (
                               metric, gated, drop, base, max_drop_pct))
    verdict["baseline_update"] = verdict["status"] == "ok"
    return verdict


def select_threshold(table, gpu_name, gpu_count, nodes=1, nic_count=None, nic_rate_gbps=None):
    """Pick the threshold entry for this GPU model/count (single node) or NIC set (multi-node).

    Returns a dict {id, metric, min_gbps, source, reasoning} or None when nothing matches.
    """
    table = table or {}
    if int(nodes or 1) > 1:
        for entry in table.get("multi_node") or []:
            if entry.get("gpu_match") and not re.search(entry["gpu_match"], gpu_name or "", re.I):
                continue
            if entry.get("min_gbps") is not None:
                return _entry(entry, entry["min_gbps"])
            per_nic = entry.get("per_nic_busbw_gbps") or {}
            rate_key = None
            for k in per_nic:
                if nic_rate_gbps is not None and int(float(k)) == int(float(nic_rate_gbps)):
                    rate_key = k
            if rate_key is None or not nic_count:
                continue
            margin = float(entry.get("margin_pct", 10))
            expected = float(per_nic[rate_key]) * int(nic_count)
            e = _entry(entry, round(expected * (1 - margin / 100.0), 1))
            e["expected_gbps"] = expected
            e["derived_from"] = "%d NICs x %s GB/s (%s Gb/s links) - %s%%" % (int(nic_count), per_nic[rate_key],
                                                                              rate_key, margin)
            return e
        return None
    for entry in table.get("single_node") or []:
        if entry.get("gpu_match") and not re.search(entry["gpu_match"], gpu_name or "", re.I):
            continue
        if entry.get("gpu_count") is not None and int(entry["gpu_count"]) != int(gpu_count or 0):
            continue
        return _entry(entry, entry.get("min_gbps"))
    return None


def _entry(entry, min_gbps):
    return {
        "id": entry.get("id"), "metric": entry.get("metric", "busbw"),
        "min_gbps": None if min_gbps is None else float(min_gbps),
        "expected_gbps": entry.get("expected_gbps"), "source": entry.get("source"),
        "reasoning": entry.get("reasoning"),
    }


def ib_hca_list(devices, usable_devices):
    """NCCL_IB_HCA value ('=' exact-match prefix) from rdma_nics facts; never a fabric-manager NIC."""
    fm = set(d.get("name") for d in (devices or []) if d.get("role") == "fabric_manager")
    names = [n for n in (usable_devices or []) if n not in fm]
    return ("=" + ",".join(sorted(names))) if names else ""
