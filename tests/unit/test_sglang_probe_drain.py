"""roles/sglang/files/sglang_probe.py --drain: the rolling restart's wait until a worker that left the router holds
no request, including a PD prefill's KV transfers (GET /v1/loads). The bodies here have the shape of sglang's
v1_loads.get_loads; tests/parser/test_roles_contract.py feeds the reader bodies made by the real 0.5.17/0.5.18 code."""
import http.server
import json
import os
import subprocess
import sys
import threading
import types

import pytest

import sglang_probe as sp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROBE = os.path.join(ROOT, "roles", "sglang", "files", "sglang_probe.py")


def loads(ts=100.0, running=0, waiting=0, uncached=0, inflight=0, boot=0, transfer=0, mode="prefill", ranks=1):
    return json.dumps({"timestamp": "2026-01-01T00:00:00+00:00", "version": "0.5.17", "accelerator": None,
                       "num_accelerators": 4, "loads": [
                           {"timestamp": ts, "dp_rank": r, "num_running_reqs": running, "num_waiting_reqs": waiting,
                            "num_waiting_uncached_tokens": uncached, "num_used_tokens": 5000, "num_total_tokens": 5000,
                            "disaggregation": {"mode": mode, "prefill_bootstrap_queue_reqs": boot,
                                               "prefill_inflight_queue_reqs": inflight,
                                               "decode_prealloc_queue_reqs": 0, "decode_transfer_queue_reqs": transfer,
                                               "decode_retracted_queue_reqs": 0, "kv_transfer_speed_gb_s": 0.0,
                                               "kv_transfer_latency_ms": 0.0}}
                           for r in range(ranks)]})


def test_parse_loads_reports_only_what_is_still_on_the_worker():
    assert sp.parse_loads(loads()) == {"busy": {}, "ts": {"0": 100.0}, "ranks": 1}
    got = sp.parse_loads(loads(inflight=2, ranks=2))
    assert got["busy"] == {"dp0.prefill_inflight_queue_reqs": 2, "dp1.prefill_inflight_queue_reqs": 2}
    assert sp.parse_loads(loads(uncached=49152))["busy"] == {"dp0.num_waiting_uncached_tokens": 49152}
    # used KV tokens (the radix cache keeps them) are not work
    assert sp.parse_loads(loads())["busy"] == {}


def test_parse_loads_refuses_what_it_cannot_read():
    with pytest.raises(ValueError):
        sp.parse_loads(json.dumps({"error": "x"}))
    with pytest.raises(ValueError):
        sp.parse_loads("not json")
    assert sp.parse_loads(json.dumps({"loads": []}))["busy"] == {"loads": "no dp rank reported a snapshot yet"}
    # a counter that is not a number cannot prove an empty queue
    assert sp.parse_loads(json.dumps({"loads": [{"dp_rank": 0, "num_running_reqs": "?"}]}))["busy"]


def test_legacy_get_load():
    body = json.dumps([{"dp_rank": 0, "num_reqs": 3, "num_waiting_reqs": 1, "ts_tic": 5.0}])
    assert sp.parse_loads(body, legacy=True) == {"busy": {"dp0.num_reqs": 3, "dp0.num_waiting_reqs": 1}, "ts": {},
                                                 "ranks": 1}


def st(body):
    return sp.parse_loads(body)


def test_drain_state_needs_a_newer_empty_snapshot():
    assert not sp.drain_state(None, st(loads()))
    assert not sp.drain_state(st(loads(ts=100)), st(loads(ts=100))), "a stale 0 (prefill's last batch) proves nothing"
    assert sp.drain_state(st(loads(ts=100)), st(loads(ts=101)))
    assert not sp.drain_state(st(loads(ts=100, inflight=1)), st(loads(ts=101)))
    assert not sp.drain_state(st(loads(ts=100)), st(loads(ts=101, inflight=1)))
    # every dp rank must have published again
    two = st(loads(ts=100, ranks=2))
    newer = dict(two, ts={"0": 101.0, "1": 100.0})
    assert not sp.drain_state(two, newer)
    # no timestamps at all (legacy): two empty polls
    leg = sp.parse_loads(json.dumps([{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0}]), legacy=True)
    assert sp.drain_state(leg, leg)


class Fake:
    """A worker: per path a list of (status, body) answered in turn (the last one repeats); records auth headers."""

    def __init__(self, routes):
        self.routes, self.auth, self.hits = routes, [], []
        fake = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                fake.hits.append(self.path)
                fake.auth.append(self.headers.get("Authorization"))
                seq = fake.routes.get(self.path) or [(404, "{}")]
                status, body = seq.pop(0) if len(seq) > 1 else seq[0]
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass
        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = "http://127.0.0.1:%d" % self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


@pytest.fixture
def envfile(tmp_path):
    p = tmp_path / "router.env"
    p.write_text('RUST_LOG=info\nSGLANG_API_KEY="sk-drain-1"\n')
    return str(p)


def opts(url, env_file):
    return types.SimpleNamespace(url=url, env_file=env_file, timeout=5)


def test_drain_probe_waits_for_kv_transfers_then_a_newer_idle_snapshot(envfile):
    w = Fake({sp.LOADS_PATH: [(200, loads(ts=1, inflight=2)), (200, loads(ts=2)), (200, loads(ts=2)),
                              (200, loads(ts=3))]})
    try:
        state, rcs = {}, []
        for _ in range(4):
            rc, res = sp.drain_probe(opts(w.url, envfile), state)
            rcs.append(rc)
        assert rcs == [1, 1, 1, 0], rcs          # busy; empty but first; same snapshot again; newer and empty
        assert res["detail"].startswith("idle on 1 dp rank")
        assert set(w.auth) == {"Bearer sk-drain-1"} and set(w.hits) == {sp.LOADS_PATH}
    finally:
        w.close()


def test_drain_probe_busy_detail_names_the_counters(envfile):
    w = Fake({sp.LOADS_PATH: [(200, loads(inflight=2))]})
    try:
        rc, res = sp.drain_probe(opts(w.url, envfile), {})
        assert rc == 1 and res["loads"] == {"dp0.prefill_inflight_queue_reqs": 2}
        assert "prefill_inflight_queue_reqs=2" in res["detail"]
    finally:
        w.close()


def test_drain_probe_falls_back_to_get_load_then_to_a_fixed_wait(envfile):
    w = Fake({sp.LEGACY_PATH: [(200, json.dumps([{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0}]))]})
    try:
        state = {}
        assert sp.drain_probe(opts(w.url, envfile), state)[0] == 1
        rc, res = sp.drain_probe(opts(w.url, envfile), state)
        assert rc == 0 and res["endpoint"] == "/get_load"
        assert w.hits == [sp.LOADS_PATH, sp.LEGACY_PATH, sp.LEGACY_PATH]   # /v1/loads asked once only
    finally:
        w.close()
    w = Fake({})
    try:
        assert sp.drain_probe(opts(w.url, envfile), {})[0] == 5
    finally:
        w.close()


def test_drain_probe_key_refused_and_port_closed(envfile):
    w = Fake({sp.LOADS_PATH: [(401, '{"error": "Unauthorized"}')]})
    try:
        rc, res = sp.drain_probe(opts(w.url, envfile), {})
        assert rc == 6 and envfile in res["detail"] and "sk-drain-1" not in json.dumps(res)
    finally:
        w.close()
    rc, res = sp.drain_probe(opts(w.url, envfile), {})      # server gone: connection refused
    assert rc == 0 and "nothing in flight" in res["detail"]


def test_drain_main_prints_progress_and_stops_at_the_deadline(envfile):
    import time
    w = Fake({sp.LOADS_PATH: [(200, loads(inflight=1))]})
    try:
        t = time.time()
        p = subprocess.run([sys.executable, PROBE, "--drain", "--url", w.url, "--env-file", envfile, "--deadline",
                            "%.0f" % (t + 2), "--total", "2", "--slice", "30", "--poll", "0.5"],
                           capture_output=True, text=True, timeout=30)
        out = json.loads(p.stdout)
        assert p.returncode == 4, p.stderr
        assert out["detail"].startswith("deadline passed; last state: still on the worker")
        assert out["loads"] == {"dp0.prefill_inflight_queue_reqs": 1} and "elapsed" in out
        assert "sk-drain-1" not in p.stdout + p.stderr
    finally:
        w.close()


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_probe_refuses_a_direct_generation_on_a_pd_worker(role):
    """A PD worker answers /generate without bootstrap_room with 400 (scheduler.py 17:2373-2390): the probe never
    sends one, whatever the caller asks."""
    p = subprocess.run([sys.executable, PROBE, "--unit", "x.service", "--url", "http://127.0.0.1:9", "--generate",
                        "--role", role], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "bootstrap_room" in p.stderr


def test_wait_one_generates_only_on_regular_workers_and_passes_the_role():
    text = open(os.path.join(ROOT, "roles", "sglang", "tasks", "start_and_wait.yml"), encoding="utf-8").read()
    assert "--role {{ inst.role | quote }}" in text
    assert "{{ '' if inst.role in ['prefill', 'decode'] else '--generate' }}" in text
