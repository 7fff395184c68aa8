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
journal line, e.g. a loading percentage) and, on exit 3 or 4, "journal_tail" (its last --tail-lines lines).
The API key, if any, is read from SGLANG_API_KEY in the instance env file (root-readable) so that it never appears
on a command line or in Ansible output.

  sglang_probe.py --drain --url http://10.0.0.11:30001 --env-file /etc/sglang/router.env --deadline EPOCH ...

waits (same slices and deadline) until a worker that left the router holds no request: GET /v1/loads?include=
core,disagg on every dp rank shows no running, waiting or still-to-prefill work and, on a PD worker, empty
bootstrap / KV-transfer queues (a prefill's requests whose KV is still moving to the decode are in
`disaggregation.prefill_inflight_queue_reqs` only), on two polls in a row whose snapshots were published one after
the other (see drain_state). Exit 0 drained, 1 not yet, 4 deadline passed, 5 the worker has neither /v1/loads nor
/get_load (the caller waits a fixed time), 6 the worker refused the key (401/403). "loads" in the JSON line holds
what is still on the worker.
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
    """Probe until the probe says anything but "not yet" (its rc: 0 ready, 3 failed ...), the deadline passed (4) or
    this slice of the wait is over (1).

    The deadline is absolute (wall clock) and shared by every slice of one wait, so the whole wait never exceeds it
    however long a single probe takes; a slice ends early at the deadline."""
    end = min(deadline, clock() + slice_s)
    while True:
        rc, res = probe()
        if rc != 1:          # 0 ready, 3 failed (probe_once); 0 / 5 / 6 (drain_probe)
            return rc, res
        now = clock()
        if now >= deadline:
            return 4, res
        if now >= end:
            return 1, res
        sleep(max(0.0, min(poll_s, end - now)))


# --- drain: what is still on a worker (SGLang 0.5.17/0.5.18 /v1/loads) -----------------------------------------------
# GET /v1/loads (srt/entrypoints/v1_loads.py get_loads, both versions): {"loads": [one LoadSnapshot.to_dict per dp
# rank]}; include=core,disagg adds "disaggregation" (srt/managers/load_snapshot.py DisaggregationMetrics). Counted by
# the scheduler (srt/managers/scheduler_components/load_inquirer.py get_loads): num_running_reqs = running batch;
# num_waiting_reqs = waiting queue + prefill bootstrap queue (PD prefill) or + prealloc/transfer/retracted queues (PD
# decode); num_waiting_uncached_tokens includes the rest of a request being prefilled in chunks; a prefill's requests
# whose KV is being sent to the decode are ONLY in disaggregation.prefill_inflight_queue_reqs. /v1/loads is a normal
# endpoint: with --api-key it needs "Authorization: Bearer KEY" (srt/utils/auth.py decide_request_auth; only /health*
# and /metrics are exempt). /get_load is a deprecated shim over the same snapshot that logs a WARNING per call and
# drops the inflight queue (http_server.py 17:809-834 / 18:829-853): used only when /v1/loads is missing.
LOADS_PATH = "/v1/loads?include=core,disagg"
LEGACY_PATH = "/get_load"
CORE_BUSY = ("num_running_reqs", "num_waiting_reqs", "num_waiting_uncached_tokens")
DISAGG_BUSY = ("prefill_bootstrap_queue_reqs", "prefill_inflight_queue_reqs", "decode_prealloc_queue_reqs",
               "decode_transfer_queue_reqs", "decode_retracted_queue_reqs")
LEGACY_BUSY = ("num_reqs", "num_waiting_reqs")


def _count(value):
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 1            # not a number: cannot prove it is empty


def parse_loads(body, legacy=False):
    """{"busy": {"dp0.<counter>": n, ...} (non-zero counters only), "ts": {dp: snapshot timestamp}, "ranks": n} of a
    /v1/loads (or, legacy=True, /get_load) body; raises ValueError for a body that is not such a list."""
    data = json.loads(body)
    loads = data if legacy else (data.get("loads") if isinstance(data, dict) else None)
    if not isinstance(loads, list) or not all(isinstance(x, dict) for x in loads):
        raise ValueError("no list of loads in %r" % body[:200])
    busy, ts = {}, {}
    for i, entry in enumerate(loads):
        dp = entry.get("dp_rank", i)
        counters = [(k, entry.get(k)) for k in (LEGACY_BUSY if legacy else CORE_BUSY)]
        if not legacy:
            disagg = entry.get("disaggregation") or {}
            counters += [(k, disagg.get(k)) for k in DISAGG_BUSY]
            if entry.get("timestamp") is not None:
                ts[str(dp)] = float(entry["timestamp"])
        for k, v in counters:
            if _count(v):
                busy["dp%s.%s" % (dp, k)] = _count(v)
    if not loads:
        busy["loads"] = "no dp rank reported a snapshot yet"
    return {"busy": busy, "ts": ts, "ranks": len(loads)}


def drain_state(prev, cur):
    """True when the worker is drained: this poll and the one before both show nothing on any dp rank AND every
    rank's snapshot is newer than the one the previous poll saw.

    Why two polls and a newer snapshot: the scheduler publishes its snapshot at the START of a batch's result
    processing (scheduler.py process_batch_result, 17:3819 / 18:3930), before that batch's finished prefills move to
    the KV-transfer queue, and while transfers are pending it publishes nothing (on_idle returns early unless
    is_fully_idle(), which counts the transfer and bootstrap queues, 17:3925-3962 / 18:4041-4078). A prefill's last
    batch can therefore leave a snapshot that says 0 while its KV still moves. A NEWER snapshot that says 0 came from
    on_idle of a fully idle scheduler (published at least every second then, IdleSleeper polls 1 s) or from another
    batch, and a worker that left the router gets no new batch: it proves the queues are empty. Without timestamps
    (an older endpoint) two empty polls in a row."""
    if prev is None or prev["busy"] or cur["busy"]:
        return False
    if cur["ts"] or prev["ts"]:
        return bool(cur["ts"]) and all(r in prev["ts"] and cur["ts"][r] > prev["ts"][r] for r in cur["ts"])
    return True


def drain_probe(a, state, now=time.time):
    """One drain poll; (rc, result) with rc 0 drained, 1 not yet, 5 no load endpoint, 6 key refused."""
    key = api_key(a.env_file)
    base = a.url.rstrip("/")
    legacy = state.get("legacy", False)
    status, body = call(base + (LEGACY_PATH if legacy else LOADS_PATH), key, timeout=a.timeout)
    if status == 404 and not legacy:
        state["legacy"] = legacy = True
        status, body = call(base + LEGACY_PATH, key, timeout=a.timeout)
    res = {"url": a.url, "endpoint": LEGACY_PATH if legacy else "/v1/loads", "status": status, "loads": None,
           "detail": ""}
    if status in (401, 403):
        res["detail"] = ("GET %s -> %s: the worker refused the key of %s" % (res["endpoint"], status, a.env_file))
        return 6, res
    if status == 404:
        res["detail"] = "neither /v1/loads nor /get_load (404): cannot see what is in flight"
        return 5, res
    if status is None and ("refused" in body.lower() or "errno 111" in body.lower()):
        # nothing listens on the port (a worker that crashed or still loads): nothing can be in flight there
        res["detail"] = "port closed (%s): nothing in flight" % body[:120]
        return 0, res
    if status != 200:
        state["prev"] = None
        res["detail"] = "GET %s -> %s %s" % (res["endpoint"], status, body[:200])
        return 1, res
    try:
        cur = parse_loads(body, legacy)
    except ValueError as exc:
        state["prev"] = None
        res["detail"] = "GET %s: %s" % (res["endpoint"], exc)
        return 1, res
    cur["t"] = now()
    res["loads"] = cur["busy"]
    done = drain_state(state.get("prev"), cur)
    state["prev"] = cur
    if done:
        res["detail"] = "idle on %d dp rank(s), twice in a row" % cur["ranks"]
        return 0, res
    res["detail"] = ("still on the worker: %s" % ", ".join("%s=%s" % kv for kv in sorted(cur["busy"].items()))
                     if cur["busy"] else "empty; confirming with a newer snapshot")
    return 1, res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--unit", help="systemd unit (required unless --drain)")
    ap.add_argument("--url", required=True)
    ap.add_argument("--path", default="/health", help="readiness path (the router: /readiness)")
    ap.add_argument("--generate", action="store_true")
    ap.add_argument("--env-file")
    ap.add_argument("--prompt", default="Say hello.")
    ap.add_argument("--max-tokens", type=int, default=8)
    # A real GET /health is a 1-token generation: >= 1 s, 503 after SGLANG_HEALTH_CHECK_TIMEOUT = 20 s without scheduler
    # output (http_server.py 17:192, 17:697-720 / 18:705-728); 25 s lets that verdict arrive instead of a client timeout.
    ap.add_argument("--timeout", type=float, default=25)
    ap.add_argument("--generate-timeout", type=float, default=300)
    ap.add_argument("--deadline", type=float, help="wall-clock deadline (epoch seconds) of the whole wait")
    ap.add_argument("--total", type=float, help="length of the whole wait in seconds (for 'elapsed')")
    ap.add_argument("--slice", type=float, default=30, help="return after this many seconds to show progress")
    ap.add_argument("--poll", type=float, default=10, help="seconds between probes within a slice")
    ap.add_argument("--tail-lines", type=int, default=30)
    ap.add_argument("--drain", action="store_true", help="wait until the worker holds no request (see above)")
    ap.add_argument("--role", help="the instance's role; PD roles (prefill, decode) refuse --generate")
    a = ap.parse_args()
    if not a.drain and not a.unit:
        ap.error("--unit is required")
    if a.generate and a.role in ("prefill", "decode"):
        # a PD worker answers a request without bootstrap_room with 400 "Disaggregated request received without
        # bootstrap room id" (srt/managers/scheduler.py 17:2373-2390 / 18:2446): only the router may send it one.
        # Its /health already is a generation with a fake bootstrap (http_server.py 17:672-686).
        ap.error("--generate on a %s worker: PD workers refuse a request without bootstrap_room" % a.role)
    if a.drain:
        if a.deadline is None:
            ap.error("--drain needs --deadline")
        state = {}
        rc, res = wait_slice(lambda: drain_probe(a, state), a.deadline, a.slice, a.poll)
        now = time.time()
        res["remaining"] = max(0, int(a.deadline - now))
        if a.total:
            res["elapsed"] = int(a.total - (a.deadline - now))
        if rc == 4:
            res["detail"] = "deadline passed; last state: " + res["detail"]
        print(json.dumps(res))
        return rc
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
