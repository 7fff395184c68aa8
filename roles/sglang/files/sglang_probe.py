#!/usr/bin/env python3
"""One readiness probe of an SGLang instance (run on its host by the sglang role, stdlib only).

  sglang_probe.py --unit sglang-kimi_k3-w0.service --url http://10.0.0.11:30000 [--generate] [--env-file F]

Prints one JSON line {"unit", "active_state", "sub_state", "n_restarts", "health", "generate", "detail"} and exits
0 when ready (unit active, GET /health 200 and, with --generate, POST /generate 200 with text), 1 when not yet,
3 when the unit has failed (no point in waiting further).

With --deadline EPOCH (a wall-clock deadline computed ONCE by the caller for the whole wait) the probe repeats itself
every --poll seconds for at most --slice seconds (default 30), then returns so that the caller can show progress:
exit 1 = not ready yet and the deadline not reached (call again), 4 = the deadline passed. The JSON line then also
has "elapsed" (seconds since the wait began, with --total: the wait's full length), "journal_last" (the unit's last
journal line, e.g. a loading percentage) and, on exit 3 or 4, "journal_tail" (its last --tail-lines lines). The API key, if any, is read from SGLANG_API_KEY in the
instance env file (root-readable) so that it never appears on a command line or in Ansible output.
"""
import argparse
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request


def unit_state(unit):
    try:
        out = subprocess.run(["systemctl", "show", "-p", "ActiveState,SubState,NRestarts,Result", unit],
                             capture_output=True, text=True, timeout=15, check=False).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"ActiveState": "unknown", "detail": str(exc)}
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def api_key(env_file):
    if not env_file:
        return None
    try:
        with open(env_file) as fh:
            for line in fh:
                if line.startswith("SGLANG_API_KEY="):
                    return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        return None
    return None


def call(url, key, body=None, timeout=10):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers=headers, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")[:300]
    except (urllib.error.URLError, OSError) as exc:
        return None, str(getattr(exc, "reason", exc))


def journal(unit, lines):
    try:
        out = subprocess.run(["journalctl", "-u", unit, "-n", str(lines), "-o", "cat", "--no-pager", "-q"],
                             capture_output=True, text=True, timeout=15, check=False).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return ["(journalctl: %s)" % exc]
    return out.splitlines()[-lines:]


def probe_once(a, deadline=None, clock=time.time):
    """(rc, result) of one readiness probe: rc 0 ready, 1 not yet, 3 unit failed."""
    st = unit_state(a.unit)
    res = {"unit": a.unit, "active_state": st.get("ActiveState"), "sub_state": st.get("SubState"),
           "n_restarts": st.get("NRestarts"), "result": st.get("Result"), "health": None, "generate": None, "detail": ""}
    if st.get("ActiveState") == "failed":
        res["detail"] = "unit failed (Result=%s); see journalctl -u %s" % (st.get("Result"), a.unit)
        return 3, res
    if st.get("ActiveState") != "active":
        res["detail"] = "unit is %s/%s" % (st.get("ActiveState"), st.get("SubState"))
        return 1, res
    key = api_key(a.env_file)
    status, body = call(a.url.rstrip("/") + a.path, key, timeout=a.timeout)
    res["health"] = status
    if status != 200:
        res["detail"] = "GET %s -> %s %s" % (a.path, status, body[:200])
        return 1, res
    if a.generate:
        gen_timeout = a.generate_timeout
        if deadline is not None:
            gen_timeout = max(a.timeout, min(gen_timeout, deadline - clock()))
        status, body = call(a.url.rstrip("/") + "/generate", key, timeout=gen_timeout,
                            body={"text": a.prompt, "sampling_params": {"max_new_tokens": a.max_tokens, "temperature": 0}})
        res["generate"] = status
        text = None
        try:
            text = json.loads(body).get("text") if status == 200 else None
        except (ValueError, AttributeError):
            text = None
        if status != 200 or not isinstance(text, str):
            res["detail"] = "POST /generate -> %s %s" % (status, body[:200])
            return 1, res
        res["detail"] = "generated: %r" % text[:120]
    return 0, res


def wait_slice(probe, deadline, slice_s, poll_s, clock=time.time, sleep=time.sleep):
    """Probe until ready (0), failed (3), the deadline passed (4) or this slice of the wait is over (1).

    The deadline is absolute (wall clock) and shared by every slice of one wait, so the whole wait never exceeds it
    however long a single probe takes; a slice ends early at the deadline."""
    end = min(deadline, clock() + slice_s)
    while True:
        rc, res = probe()
        if rc in (0, 3):
            return rc, res
        now = clock()
        if now >= deadline:
            return 4, res
        if now >= end:
            return 1, res
        sleep(max(0.0, min(poll_s, end - now)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--unit", required=True)
    ap.add_argument("--url", required=True)
    ap.add_argument("--path", default="/health", help="readiness path (the router: /readiness)")
    ap.add_argument("--generate", action="store_true")
    ap.add_argument("--env-file")
    ap.add_argument("--prompt", default="Say hello.")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=10)
    ap.add_argument("--generate-timeout", type=float, default=300)
    ap.add_argument("--deadline", type=float, help="wall-clock deadline (epoch seconds) of the whole wait")
    ap.add_argument("--total", type=float, help="length of the whole wait in seconds (for 'elapsed')")
    ap.add_argument("--slice", type=float, default=30, help="return after this many seconds to show progress")
    ap.add_argument("--poll", type=float, default=10, help="seconds between probes within a slice")
    ap.add_argument("--tail-lines", type=int, default=30)
    a = ap.parse_args()
    if a.deadline is None:
        rc, res = probe_once(a)
        print(json.dumps(res))
        return rc
    rc, res = wait_slice(lambda: probe_once(a, a.deadline), a.deadline, a.slice, a.poll)
    now = time.time()
    res["remaining"] = max(0, int(a.deadline - now))
    if a.total:
        res["elapsed"] = int(a.total - (a.deadline - now))
    last = journal(a.unit, 1)
    res["journal_last"] = last[-1][:200] if last else ""
    if rc in (3, 4):
        res["journal_tail"] = journal(a.unit, a.tail_lines)
        if rc == 4:
            res["detail"] = "deadline passed; last state: " + res["detail"]
    print(json.dumps(res))
    return rc


if __name__ == "__main__":
    sys.exit(main())
