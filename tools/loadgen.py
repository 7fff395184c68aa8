#!/usr/bin/env python3
"""Bounded load generator: OpenAI chat completions through the router, for rolling-restart / reliability tests.

    tools/loadgen.py --url http://127.0.0.1:30000 --requests 200 --duration 60 --concurrency 8 \
        --out run.jsonl --summary run-summary.json

Bounds: it stops at --requests sent OR --duration seconds, whichever comes first (both are required to be finite
and are capped: requests <= 100000, duration <= 3600 s, concurrency <= 256, per-request timeout <= 600 s).
Target guard: the URL's host must be loopback (127.0.0.0/8, ::1, localhost) or an address of the sandbox network
10.89.30.0/24; a host name must resolve only to such addresses. Anything else is refused (exit 2) before any
traffic is sent.

Each request becomes one JSON line: seq, t_start / t_end (seconds since the run started), latency_s, status (HTTP
code, or null on a connection error / timeout), ok, error, answer_in ("content", or "reasoning_content" when a
reasoning model answered only with its think block, which counts as an answer), worker / worker_mode /
worker_version (parsed from the sglang-stub answer "stub <model> on <host:port> (sglang <ver>, <mode>)"; null for a
real model's answer).
The summary holds sent, ok, failed, errors by kind, latency p50/p95/p99 (of ok requests), per-worker counts and
per-window stats (--window seconds). Exit status: 0, or 1 with --fail-on-error when any request failed (or more than
--max-failures), 2 for a refused target or bad arguments. Standard library only.
"""

import argparse
import ipaddress
import json
import math
import re
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

SANDBOX_NET = ipaddress.ip_network("10.89.30.0/24")
MAX_REQUESTS = 100000
MAX_DURATION_S = 3600.0
MAX_CONCURRENCY = 256
MAX_TIMEOUT_S = 600.0
ANSWER_RE = re.compile(r"stub (?P<model>\S+) on (?P<worker>\S+) \(sglang (?P<version>[^,]+), (?P<mode>[^)]+)\)")


class TargetRefused(ValueError):
    pass


def address_allowed(addr):
    ip = ipaddress.ip_address(addr.split("%", 1)[0])
    if getattr(ip, "ipv4_mapped", None):
        ip = ip.ipv4_mapped
    return ip.is_loopback or (ip.version == 4 and ip in SANDBOX_NET)


def check_target(url, resolver=socket.getaddrinfo):
    """Return (scheme, host, port) when url is an allowed target, else raise TargetRefused."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise TargetRefused("only http(s) URLs are allowed: %r" % url)
    host = parts.hostname
    if not host:
        raise TargetRefused("no host in %r" % url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise TargetRefused("bad port in %r: %s" % (url, exc)) from None
    try:
        addrs = {host} if _is_ip(host) else {ai[4][0] for ai in resolver(host, port, 0, socket.SOCK_STREAM)}
    except OSError as exc:
        raise TargetRefused("cannot resolve %r: %s" % (host, exc)) from None
    if not addrs:
        raise TargetRefused("%r resolves to nothing" % host)
    bad = sorted(a for a in addrs if not address_allowed(a))
    if bad:
        raise TargetRefused("target %s (%s) is not loopback or the sandbox network %s: refused"
                            % (host, ", ".join(bad), SANDBOX_NET))
    return parts.scheme, host, port


def _is_ip(host):
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
        return True
    except ValueError:
        return False


def check_bounds(requests, duration, concurrency, timeout):
    if not 1 <= requests <= MAX_REQUESTS:
        raise ValueError("--requests must be 1..%d (got %s)" % (MAX_REQUESTS, requests))
    if not (isinstance(duration, (int, float)) and math.isfinite(duration) and 0 < duration <= MAX_DURATION_S):
        raise ValueError("--duration must be > 0 and <= %d s (got %s)" % (MAX_DURATION_S, duration))
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        raise ValueError("--concurrency must be 1..%d (got %s)" % (MAX_CONCURRENCY, concurrency))
    if not (math.isfinite(timeout) and 0 < timeout <= MAX_TIMEOUT_S):
        raise ValueError("--timeout must be > 0 and <= %d s (got %s)" % (MAX_TIMEOUT_S, timeout))


def parse_answer(text):
    m = ANSWER_RE.search(text or "")
    if not m:
        return {"worker": None, "worker_mode": None, "worker_version": None}
    return {"worker": m.group("worker"), "worker_mode": m.group("mode"), "worker_version": m.group("version")}


def extract_answer(body, stream):
    """(content, reasoning_content) of a chat completion (JSON) or its SSE stream.

    A reasoning model (SGLang --reasoning-parser glm45 / kimi_k3) puts the think block in `reasoning_content` and keeps
    `content` "" until the block closes (srt/entrypoints/openai/serving_chat.py 17:1836-1843 / 18:1862-1869; streamed
    as delta.reasoning_content, 17:711-718 / 18:719-726); Kimi-K3's parser starts in reasoning mode
    (srt/parser/reasoning_parser.py KimiK3Detector force_reasoning=True). A short answer (max_tokens 16) is then all
    reasoning: it is an answer, not an empty one."""
    if not stream:
        msg = json.loads(body)["choices"][0]["message"]
        return msg.get("content") or "", msg.get("reasoning_content") or ""
    content, reasoning = [], []
    for line in body.splitlines():
        if not line.startswith("data: ") or line.strip() == "data: [DONE]":
            continue
        try:
            ev = json.loads(line[6:])
        except ValueError:
            continue
        for ch in ev.get("choices") or []:
            delta = ch.get("delta") or {}
            content.append(delta.get("content") or "")
            reasoning.append(delta.get("reasoning_content") or "")
    return "".join(content), "".join(reasoning)


def extract_text(body, stream):
    """The answer's text: its content, or the reasoning when the content is still empty (see extract_answer)."""
    content, reasoning = extract_answer(body, stream)
    return content or reasoning


def percentile(values, q):
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    vals = sorted(values)
    k = max(1, int(math.ceil(q / 100.0 * len(vals))))
    return vals[min(k, len(vals)) - 1]


def error_kind(rec):
    if rec["ok"]:
        return None
    if rec["status"] is None:
        return rec["error"].split(":", 1)[0] if rec.get("error") else "error"
    return "http_%d" % rec["status"]


def summarize(records, window_s=1.0, bounds=None):
    lat = [r["latency_s"] for r in records if r["ok"]]
    errors, workers = {}, {}
    for r in records:
        k = error_kind(r)
        if k:
            errors[k] = errors.get(k, 0) + 1
        if r.get("worker"):
            workers[r["worker"]] = workers.get(r["worker"], 0) + 1
    windows = []
    if records:
        last = max(r["t_start"] for r in records)
        for w in range(int(last // window_s) + 1):
            lo, hi = w * window_s, (w + 1) * window_s
            rs = [r for r in records if lo <= r["t_start"] < hi]
            wl = [r["latency_s"] for r in rs if r["ok"]]
            ww = {}
            for r in rs:
                if r.get("worker"):
                    ww[r["worker"]] = ww.get(r["worker"], 0) + 1
            windows.append({"t0": round(lo, 3), "sent": len(rs), "ok": sum(1 for r in rs if r["ok"]),
                            "failed": sum(1 for r in rs if not r["ok"]),
                            "p50_s": _r(percentile(wl, 50)), "max_s": _r(max(wl) if wl else None), "workers": ww})
    ok = sum(1 for r in records if r["ok"])
    return {"sent": len(records), "ok": ok, "failed": len(records) - ok, "errors": errors,
            "answers_in_reasoning_content": sum(1 for r in records if r.get("answer_in") == "reasoning_content"),
            "latency_s": {"p50": _r(percentile(lat, 50)), "p95": _r(percentile(lat, 95)),
                          "p99": _r(percentile(lat, 99)), "max": _r(max(lat) if lat else None)},
            "workers": workers, "window_s": window_s, "windows": windows, "bounds": bounds or {}}


def _r(x):
    return None if x is None else round(x, 4)


# chat_template_kwargs that turn a reasoning model's thinking off: SGLang's serving_chat reads "thinking" (kimi_k3)
# or "enable_thinking" (glm45) from them (_get_reasoning_from_request); the other key is ignored by the template.
NO_THINKING = {"chat_template_kwargs": {"thinking": False, "enable_thinking": False}}


def one_request(url, seq, t0, timeout, stream, model, prompt, headers, extra_body=None):
    body = {"model": model, "messages": [{"role": "user", "content": "%s #%d" % (prompt, seq)}],
            "max_tokens": 16, "stream": stream}
    body.update(extra_body or {})
    req = urllib.request.Request(url.rstrip("/") + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 method="POST", headers=dict({"Content-Type": "application/json"}, **headers))
    start = time.monotonic()
    rec = {"seq": seq, "t_start": round(start - t0, 4), "status": None, "ok": False, "error": None}
    text = None
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read().decode(errors="replace")
            rec["status"] = resp.status
        content, reasoning = extract_answer(raw, stream)
        text = content or reasoning
        rec["answer_in"] = "content" if content else ("reasoning_content" if reasoning else None)
        rec["ok"] = 200 <= rec["status"] < 300 and bool(text)
        if not rec["ok"]:
            rec["error"] = "empty answer (no content, no reasoning_content)"
    except urllib.error.HTTPError as exc:
        rec["status"] = exc.code
        rec["error"] = "HTTP %d: %s" % (exc.code, exc.read()[:200].decode(errors="replace"))
    except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError) as exc:
        reason = getattr(exc, "reason", exc)
        rec["error"] = "%s: %s" % (type(reason).__name__, reason)
    end = time.monotonic()
    rec["t_end"] = round(end - t0, 4)
    rec["latency_s"] = round(end - start, 4)
    rec.update(parse_answer(text))
    return rec


def run(url, requests, duration, concurrency, timeout=30.0, rps=None, stream=False, model="default",
        prompt="loadgen", headers=None, on_record=None, clock=time.monotonic, extra_body=None):
    """Send at most `requests` requests within `duration` seconds; returns the records (sorted by seq)."""
    check_target(url)
    check_bounds(requests, duration, concurrency, timeout)
    t0 = clock()
    stop_at = t0 + duration
    lock = threading.Lock()
    state = {"next": 0}
    records = []

    def worker():
        while True:
            with lock:
                seq = state["next"]
                if seq >= requests or clock() >= stop_at:
                    return
                state["next"] += 1
            if rps:
                wait = t0 + seq / float(rps) - clock()
                if wait > 0:
                    if clock() + wait >= stop_at:
                        return
                    time.sleep(wait)
            rec = one_request(url, seq, t0, timeout, stream, model, prompt, headers or {}, extra_body)
            with lock:
                records.append(rec)
                if on_record:
                    on_record(rec)

    threads = [threading.Thread(target=worker, daemon=True, name="loadgen-%d" % i) for i in range(concurrency)]
    for t in threads:
        t.start()
    hard_deadline = stop_at + timeout + 5
    for t in threads:
        t.join(max(0.0, hard_deadline - clock()))
    with lock:
        return sorted(records, key=lambda r: r["seq"])


def loadgen_no_thinking(flag):
    return dict(NO_THINKING) if flag else None


def main(argv=None):
    ap = argparse.ArgumentParser(description="bounded chat-completion load through the router (loopback/sandbox)")
    ap.add_argument("--url", required=True, help="router base URL, e.g. http://127.0.0.1:30000")
    ap.add_argument("--requests", type=int, required=True, help="most requests to send (<= %d)" % MAX_REQUESTS)
    ap.add_argument("--duration", type=float, required=True, help="most seconds to send for (<= %d)"
                    % MAX_DURATION_S)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=30.0, help="per request, seconds")
    ap.add_argument("--rps", type=float, help="pace the starts at this rate (default: as fast as concurrency allows)")
    ap.add_argument("--stream", action="store_true", help="use SSE streaming")
    ap.add_argument("--model", default="default")
    ap.add_argument("--api-key", help="sent as Authorization: Bearer")
    ap.add_argument("--no-thinking", action="store_true",
                    help="ask a reasoning model not to think (chat_template_kwargs thinking/enable_thinking false)")
    ap.add_argument("--window", type=float, default=1.0, help="seconds per window in the summary")
    ap.add_argument("--out", help="JSON lines, one per request")
    ap.add_argument("--summary", help="write the summary JSON here (always printed)")
    ap.add_argument("--fail-on-error", action="store_true", help="exit 1 when more than --max-failures failed")
    ap.add_argument("--max-failures", type=int, default=0)
    opts = ap.parse_args(argv)
    try:
        check_target(opts.url)
        check_bounds(opts.requests, opts.duration, opts.concurrency, opts.timeout)
        if opts.window <= 0:
            raise ValueError("--window must be > 0")
    except (TargetRefused, ValueError) as exc:
        print("loadgen: %s" % exc, file=sys.stderr)
        return 2
    headers = {"Authorization": "Bearer %s" % opts.api_key} if opts.api_key else {}
    out = open(opts.out, "w", encoding="utf-8") if opts.out else None

    def on_record(rec):
        if out:
            out.write(json.dumps(rec) + "\n")
            out.flush()

    try:
        records = run(opts.url, opts.requests, opts.duration, opts.concurrency, opts.timeout, opts.rps, opts.stream,
                      opts.model, headers=headers, on_record=on_record,
                      extra_body=loadgen_no_thinking(opts.no_thinking))
    finally:
        if out:
            out.close()
    summary = summarize(records, opts.window, bounds={"requests": opts.requests, "duration_s": opts.duration,
                                                      "concurrency": opts.concurrency, "url": opts.url})
    text = json.dumps(summary, indent=1)
    if opts.summary:
        with open(opts.summary, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    print(text)
    if opts.fail_on_error and summary["failed"] > opts.max_failures:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
