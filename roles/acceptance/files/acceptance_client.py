#!/usr/bin/env python3
"""Acceptance run driver (stdlib only; roles/acceptance copies it to the client host and starts it async).

    acceptance_client.py SPEC.json

SPEC: {"outdir", "argv" (the bench_serving command), "env" (added), "workers": [{"id", "url", "role"}],
       "total" (requests), "sample_s", "api_key"}
Steps: POST /flush_cache on every worker (caches flushed first; bench_serving also flushes through the router with
--flush-cache) -> /metrics of every worker (before) -> bench_serving as a child (stdout+stderr to bench.log) while
/metrics is sampled every sample_s into samples.jsonl and progress.json holds done/total/elapsed -> /metrics (after)
-> result.json (rc, timings, before/after texts). The client's own JSON line is in the --output-file of argv.
"""
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

COUNTERS = ("sglang:num_requests_total", "sglang:realtime_tokens_total", "sglang:generation_tokens_total",
            "sglang:prompt_tokens_total", "sglang:cached_tokens_total")


def http(method, url, key=None, timeout=30):
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    if key:
        req.add_header("Authorization", "Bearer " + key)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.status, resp.read().decode("utf-8", "replace")


def scrape(workers, key):
    out = {}
    for w in workers:
        try:
            out[w["url"]] = http("GET", w["url"] + "/metrics", key, timeout=10)[1]
        except OSError as exc:
            out[w["url"]] = "# scrape failed: %s\n" % exc
    return out


LINE = re.compile(r'^(sglang:[a-z_]+)(\{[^}]*\})?\s+([0-9.eE+-]+)')


def summarize(texts):
    """Per worker: {counter: value} summed over label sets (cached: cache_source total; realtime: mode decode)."""
    out = {}
    for url, text in texts.items():
        vals = {}
        for line in text.splitlines():
            m = LINE.match(line)
            if not m or m.group(1) not in COUNTERS:
                continue
            labels = m.group(2) or ""
            if m.group(1) == "sglang:realtime_tokens_total" and 'mode="decode"' not in labels:
                continue
            if m.group(1) == "sglang:cached_tokens_total" and "cache_source=" in labels \
                    and 'cache_source="total"' not in labels:
                continue
            vals[m.group(1)] = vals.get(m.group(1), 0.0) + float(m.group(3))
        out[url] = vals
    return out


def main(spec_path):
    with open(spec_path, encoding="utf-8") as fh:
        spec = json.load(fh)
    outdir = spec["outdir"]
    os.makedirs(outdir, exist_ok=True)
    key = spec.get("api_key") or None
    workers = spec["workers"]
    flushed = {}
    for w in workers:
        try:
            flushed[w["id"]] = http("POST", w["url"] + "/flush_cache", key)[0]
        except OSError as exc:
            flushed[w["id"]] = str(exc)
    time.sleep(1)
    before = scrape(workers, key)
    env = dict(os.environ)
    env.update(spec.get("env") or {})
    t0 = time.time()
    with open(os.path.join(outdir, "bench.log"), "wb") as log, \
            open(os.path.join(outdir, "samples.jsonl"), "w", encoding="utf-8") as samples:
        proc = subprocess.Popen(spec["argv"], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=outdir)
        first = summarize(before)
        while True:
            rc = proc.poll()
            now = time.time()
            cur = summarize(scrape(workers, key))
            samples.write(json.dumps({"t": round(now - t0, 3), "workers": cur}) + "\n")
            samples.flush()
            done = 0
            for w in workers:
                if w.get("role") in ("decode", "worker"):
                    done += cur.get(w["url"], {}).get("sglang:num_requests_total", 0) - \
                        first.get(w["url"], {}).get("sglang:num_requests_total", 0)
            prog = {"done": int(done), "total": spec.get("total"), "elapsed_s": round(now - t0, 1),
                    "finished": rc is not None}
            with open(os.path.join(outdir, "progress.json.tmp"), "w", encoding="utf-8") as fh:
                json.dump(prog, fh)
            os.replace(os.path.join(outdir, "progress.json.tmp"), os.path.join(outdir, "progress.json"))
            if rc is not None:
                break
            time.sleep(spec.get("sample_s", 2))
    time.sleep(1)
    after = scrape(workers, key)
    result = {"rc": rc, "start_epoch": t0, "end_epoch": time.time(), "flushed": flushed, "argv": spec["argv"],
              "metrics_before": before, "metrics_after": after}
    with open(os.path.join(outdir, "result.json"), "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
