#!/usr/bin/env python3
"""How long the REAL sglang-router keeps an idle pooled connection to a worker (loopback only, no sandbox).

    .venv/bin/python tools/router_pool_idle.py [--router-python .cache/router-venv-0.3.2/bin/python] [--watch-s 400]

One sglang-stub worker with SGLANG_TIMEOUT_KEEP_ALIVE=3600 (so the worker never closes first), the router in front of
it (health checks every hour, so they add no traffic), ONE chat completion through the router, then `ss` every 0.5 s
until every router->worker connection is closed. Prints, per connection, the seconds after the answer at which it
was first seen and closed. Why: uvicorn in SGLang closes an idle connection after SGLANG_TIMEOUT_KEEP_ALIVE (5 s by
default); a router that keeps its end longer can send a request on a connection the worker is closing (H1 in
../shared/reference/sglang-real-contract.md). The profiles' SGLANG_TIMEOUT_KEEP_ALIVE must exceed the figure printed.
Every process is started and stopped by this script by PID; every wait is bounded.
"""
import argparse
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[1]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def connections(port):
    out = subprocess.run(["ss", "-Htn", "state", "established", "( dport = :%d )" % port], capture_output=True,
                         text=True, check=False, timeout=10).stdout
    return sorted(line.split()[-2] for line in out.splitlines() if line.strip())


def get(url, timeout=2):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--router-python", default=str(ROOT / ".cache" / "router-venv-0.3.2" / "bin" / "python"))
    ap.add_argument("--watch-s", type=float, default=400.0)
    o = ap.parse_args(argv)
    wport, rport, prom = free_port(), free_port(), free_port()
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="router-pool-idle-"))
    env = dict(os.environ, SGLANG_STUB_LOAD_SECONDS="0.5", SGLANG_TIMEOUT_KEEP_ALIVE="3600",
               SGLANG_STUB_CONTROL_DIR=str(tmp / "ctl"))
    procs = []
    try:
        procs.append(subprocess.Popen(
            [sys.executable, str(ROOT / "sandbox" / "sglang_stub" / "bin" / "sglang-0.5.18"), "serve", "--model-path",
             "/models/stub", "--served-model-name", "StubModel", "--host", "127.0.0.1", "--port", str(wport)],
            env=env, stdout=open(tmp / "worker.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True))
        procs.append(subprocess.Popen(
            [o.router_python, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(rport),
             "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prom), "--worker-urls",
             "http://127.0.0.1:%d" % wport, "--health-check-interval-secs", "3600", "--disable-retries"],
            stdout=open(tmp / "router.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + 120
        while True:
            try:
                if get("http://127.0.0.1:%d/readiness" % rport) == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                print("router not ready within 120 s; logs in %s" % tmp, file=sys.stderr)
                return 1
            time.sleep(0.5)
        time.sleep(3)
        body = json.dumps({"model": "StubModel", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        req = urllib.request.Request("http://127.0.0.1:%d/v1/chat/completions" % rport, data=body.encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            status = r.status
        t0, seen, closed = time.monotonic(), {}, {}
        while time.monotonic() - t0 < o.watch_s:
            now = connections(wport)
            for c in now:
                seen.setdefault(c, round(time.monotonic() - t0, 1))
            for c in seen:
                if c not in now and c not in closed:
                    closed[c] = round(time.monotonic() - t0, 1)
            if seen and len(closed) == len(seen):
                break
            time.sleep(0.5)
        print(json.dumps({"chat_status": status, "watch_s": o.watch_s,
                          "connections": {c: {"first_seen_s": seen[c], "closed_s": closed.get(c)} for c in seen}},
                         indent=1))
        return 0
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)


if __name__ == "__main__":
    sys.exit(main())
