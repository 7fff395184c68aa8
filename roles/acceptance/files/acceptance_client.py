#!/usr/bin/env python3
"""Acceptance run driver (stdlib only; roles/acceptance copies it, with sglang_metrics.py, to the client host and
starts it async).

    acceptance_client.py SPEC.json            (API key, when the router has one: one line on stdin, see below)

SPEC (spec.json, written by roles/acceptance; it never holds the API key):
  {"outdir", "argv" (the bench_serving command), "env" (added to the client's environment), "workers": [{"id", "url",
   "role"}], "router_url", "model", "total" (requests), "sample_s", "api_key_stdin" (bool),
   "flush": {"timeout_s", "attempts", "pause_s"}}

API key: with "api_key_stdin" the first line of stdin is the key (the role gives it through the command module's
stdin, never argv, a file or a log); otherwise OPENAI_API_KEY of the environment, if any. bench_serving reads it
from OPENAI_API_KEY in ITS environment (sglang/benchmark/serving.py get_auth_headers: OPENAI_API_KEY -> "Bearer
<key>"; API_KEY would be sent without "Bearer" and is removed), and this client sends it as a Bearer header on the
warm-up and the flushes. The key is written nowhere.

Steps:
 1. warm-up: one short /generate through the router (the key is checked here: a 401 stops the run at once);
 2. POST /flush_cache?timeout=<timeout_s> on every worker, retried: a real worker flushes only when its scheduler is
    fully idle and answers 400 otherwise (srt/managers/scheduler.py flush_cache; with ?timeout it waits up to that
    long for idle, scheduler_components/flush_wrapper.py). On glm52_pd the router's /health checks are themselves
    one-token generations, so a flush can meet a busy scheduler. After `attempts` tries the run stops (exit 3) and
    result.json / stderr name the worker (id, url, last status and text);
 3. /metrics of every worker (before) -> bench_serving as a child (stdout+stderr to bench.log, --warmup-requests 0
    and no --flush-cache: see module_utils/verdicts/acceptance.py bench_argv) while /metrics is sampled every sample_s into
    samples.jsonl and progress.json holds done/total/elapsed -> /metrics (after) -> result.json (rc, timings,
    before/after texts). The client's own JSON line is in the --output-file of argv.
Counters are read by sglang_metrics.py (the same reader as the controller's report).
"""
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

_HERE = os.path.dirname(os.path.abspath(__file__))
# on the client host the role puts sglang_metrics.py next to this file; in the repository it lives in the collection
for _d in (_HERE, os.path.join(_HERE, "..", "..", "..", "collections", "ansible_collections", "b300", "rollout",
                               "plugins", "module_utils", "sglang")):
    if os.path.exists(os.path.join(_d, "sglang_metrics.py")):
        sys.path.insert(0, os.path.abspath(_d))
        break
import sglang_metrics  # noqa: E402  its directory is only known after the search above

EXIT_FLUSH = 3
EXIT_WARMUP = 4


class ClientError(Exception):
    """A step that stops the run; the message names what failed and how to fix it."""
    exit_code = 1


class WarmupError(ClientError):
    exit_code = EXIT_WARMUP


class FlushError(ClientError):
    exit_code = EXIT_FLUSH


def http(method, url, key=None, timeout=30, body=None):
    """(status, text); an HTTP error status is returned, not raised. OSError for no answer at all."""
    data = None
    if body is not None:
        data = json.dumps(body).encode()
    elif method == "POST":
        data = b""
    req = urllib.request.Request(url, method=method, data=data)
    if body is not None:
        req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", "Bearer " + key)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")


def _short(text, n=200):
    text = " ".join((text or "").split())
    return text if len(text) <= n else text[:n] + "..."


def scrape(workers, key):
    out = {}
    for w in workers:
        try:
            status, text = http("GET", w["url"] + "/metrics", key, timeout=10)
            out[w["url"]] = text if status == 200 else "# scrape failed: HTTP %d %s\n" % (status, _short(text))
        except OSError as exc:
            out[w["url"]] = "# scrape failed: %s\n" % exc
    return out


def summarize(texts):
    """Per worker: {counter: value} summed over label sets by sglang_metrics (cached tokens: every cache_source;
    realtime tokens: mode="decode")."""
    return {url: sglang_metrics.summarize(text) for url, text in texts.items()}


def warm_up(spec, key, sleep=time.sleep):
    """One short generation through the router; a refused key stops the run before minutes of prompt generation."""
    url = spec.get("router_url")
    if not url:
        return None
    body = {"text": "acceptance warm-up", "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    last = None
    for attempt in range(3):
        try:
            status, text = http("POST", url + "/generate", key, timeout=120, body=body)
        except OSError as exc:
            status, text = None, str(exc)
        last = (status, text)
        if status == 200:
            return {"status": 200, "attempts": attempt + 1}
        if status in (401, 403):
            raise WarmupError(
                "the router %s refused the warm-up request with HTTP %d (%s): %s. Fix: the client must get the "
                "router's --api-key (sglang_api_key of the deploy)" % (
                    url, status, _short(text), "no API key was given to the client" if not key else
                    "the API key given to the client is not the router's"))
        sleep(2)
    raise WarmupError("the router %s did not answer the warm-up request with 200 after 3 attempts: last %s %s. "
                      "Fix: check `GET %s/readiness` and the router's journal" % (url, last[0], _short(last[1]), url))


def flush_one(worker, key, timeout_s=10.0, attempts=6, pause_s=5.0, sleep=time.sleep):
    """Flush one worker's prefix cache, waiting for an idle scheduler. Returns {status, attempts, waited_s};
    raises ClientError naming the worker when it gives up."""
    t0 = time.monotonic()
    url = worker["url"] + "/flush_cache?timeout=%g" % timeout_s
    last = (None, "")
    for attempt in range(1, attempts + 1):
        try:
            last = http("POST", url, key, timeout=timeout_s + 30)
        except OSError as exc:
            last = (None, str(exc))
        status = last[0]
        if status == 200:
            return {"status": 200, "attempts": attempt, "waited_s": round(time.monotonic() - t0, 1)}
        if status in (401, 403, 404, 405):
            break   # retrying cannot help
        if attempt < attempts:
            sleep(pause_s)
    status, text = last
    why = {400: "its scheduler never became idle (requests running or waiting: another client, or the router's "
                "/health generations, kept it busy)",
           401: "the worker refused the API key", 403: "the worker refused the API key",
           None: "no answer"}.get(status, "unexpected status")
    raise FlushError(
        "worker %s (%s) did not flush its prefix cache: %d attempt(s) over %.0f s (POST /flush_cache?timeout=%g), "
        "last answer %s %r: %s. Fix: stop other traffic to this worker (or raise acceptance_flush.attempts / "
        "timeout_s) and run the acceptance again; nothing was measured" % (
            worker.get("id"), worker["url"], attempt, time.monotonic() - t0, timeout_s,
            status if status is not None else "none", _short(text), why))


def read_key(spec, stdin=None):
    if spec.get("api_key_stdin"):
        line = (stdin or sys.stdin).readline()
        return line.strip() or None
    return os.environ.get("OPENAI_API_KEY") or None


def child_env(spec, key):
    env = dict(os.environ)
    env.update(spec.get("env") or {})
    env.pop("API_KEY", None)            # bench_serving would send it without "Bearer"
    env.pop("OPENAI_API_KEY", None)
    if key:
        env["OPENAI_API_KEY"] = key
    return env


def _write_json(path, obj):
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(obj, fh)
    os.replace(path + ".tmp", path)


def run(spec, key):
    outdir = spec["outdir"]
    os.makedirs(outdir, exist_ok=True)
    workers = spec["workers"]
    result = {"rc": None, "argv": spec["argv"], "flushed": {}, "warmup": None, "error": None}
    try:
        result["warmup"] = warm_up(spec, key)
        fl = spec.get("flush") or {}
        for w in workers:
            result["flushed"][w["id"]] = flush_one(w, key, float(fl.get("timeout_s", 10)),
                                                   int(fl.get("attempts", 6)), float(fl.get("pause_s", 5)))
    except ClientError as exc:
        result["error"] = str(exc)
        result["end_epoch"] = time.time()
        _write_json(os.path.join(outdir, "result.json"), result)
        _write_json(os.path.join(outdir, "progress.json"), {"done": 0, "total": spec.get("total"), "elapsed_s": 0,
                                                            "finished": True, "error": str(exc)})
        sys.stderr.write("acceptance client: %s\n" % exc)
        return exc.exit_code
    time.sleep(1)
    before = scrape(workers, key)
    env = child_env(spec, key)
    t0 = time.time()
    with open(os.path.join(outdir, "bench.log"), "wb") as log, \
            open(os.path.join(outdir, "samples.jsonl"), "w", encoding="utf-8") as samples:
        proc = subprocess.Popen(spec["argv"], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=outdir)
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
                    done += cur.get(w["url"], {}).get(sglang_metrics.NUM_REQUESTS, 0) - \
                        first.get(w["url"], {}).get(sglang_metrics.NUM_REQUESTS, 0)
            _write_json(os.path.join(outdir, "progress.json"),
                        {"done": int(done), "total": spec.get("total"), "elapsed_s": round(now - t0, 1),
                         "finished": rc is not None})
            if rc is not None:
                break
            time.sleep(spec.get("sample_s", 2))
    time.sleep(1)
    after = scrape(workers, key)
    result.update(rc=rc, start_epoch=t0, end_epoch=time.time(), metrics_before=before, metrics_after=after)
    _write_json(os.path.join(outdir, "result.json"), result)
    return 0


def main(spec_path):
    with open(spec_path, encoding="utf-8") as fh:
        spec = json.load(fh)
    return run(spec, read_key(spec))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
