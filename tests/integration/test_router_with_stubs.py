"""The REAL sglang-router 0.3.2 in front of sglang-stub workers, all on 127.0.0.1 (no containers).

Proves that the stub meets the router's HTTP contract (../shared/reference/sglang-router-contract.md):
regular round_robin over 2 stubs, PD (2 prefill with bootstrap ports + 2 decode) with bootstrap pairing, and worker
removal / re-add through the /workers API. The router venv is built once from the wheelhouse
(tools/build-wheelhouse.sh) under .cache/router-venv-0.3.2. Every process is stopped by the PID kept at spawn
(the router renames itself `sglang::router`, so pgrep would not find it). Every wait is bounded.
"""
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

# loopback only (stub workers and a real router as local processes): runs beside the fleet tests
pytestmark = pytest.mark.controller

ROOT = pathlib.Path(__file__).resolve().parents[2]
STUB = ROOT / "sandbox" / "sglang_stub" / "bin"
ROUTER_VERSION = "0.3.2"
WHEELHOUSE = ROOT / ".cache" / "wheelhouse"
ROUTER_VENV = ROOT / ".cache" / ("router-venv-%s" % ROUTER_VERSION)
PYTHON = os.environ.get("ROUTER_TEST_PYTHON", "python3.11")

# ------------------------------------------------------------------------------------------------ helpers
def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method, url, body=None, timeout=10.0):
    """(status, parsed-json-or-text). Loopback only."""
    assert url.startswith("http://127.0.0.1:"), url
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw, code = resp.read(), resp.status
    except urllib.error.HTTPError as exc:
        raw, code = exc.read(), exc.code
    text = raw.decode(errors="replace")
    try:
        return code, json.loads(text)
    except ValueError:
        return code, text


def wait_for(pred, timeout, what, interval=0.2):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = pred()
            if last:
                return last
        except (OSError, urllib.error.URLError) as exc:
            last = exc
        time.sleep(interval)
    raise AssertionError("timed out after %ss waiting for %s (last: %r)" % (timeout, what, last))


class Procs:
    """Processes started by this test, stopped by PID (never by name)."""

    def __init__(self, logdir):
        self.logdir = logdir
        self.items = []

    def start(self, name, argv, env=None):
        log = open(self.logdir / ("%s.log" % name), "wb")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.items.append((name, proc, log))
        return proc

    def stop(self, proc, timeout=15):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        return proc.returncode

    def stop_all(self):
        for _name, proc, log in reversed(self.items):
            self.stop(proc)
            log.close()

    def log_of(self, name):
        return (self.logdir / ("%s.log" % name)).read_text(errors="replace")


def ensure_router_python():
    """Venv with sglang-router==0.3.2 installed offline from the wheelhouse (built if missing)."""
    py = ROUTER_VENV / "bin" / "python"
    done = ROUTER_VENV / ".done"
    if done.exists() and py.exists():
        return py
    if not list(WHEELHOUSE.glob("sglang_router-%s-*.whl" % ROUTER_VERSION)):
        subprocess.run([str(ROOT / "tools" / "build-wheelhouse.sh")], check=True, timeout=900)
    subprocess.run([PYTHON, "-m", "venv", "--clear", str(ROUTER_VENV)], check=True, timeout=300)
    subprocess.run([str(ROUTER_VENV / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", "--no-index",
                    "--find-links", str(WHEELHOUSE), "sglang-router==%s" % ROUTER_VERSION], check=True, timeout=600)
    done.write_text(ROUTER_VERSION + "\n")
    return py


@pytest.fixture(scope="module")
def router_python():
    return ensure_router_python()


@pytest.fixture()
def procs(tmp_path):
    p = Procs(tmp_path)
    yield p
    p.stop_all()


def start_stub(procs, tmp_path, name, version="0.5.18", mode=None, bootstrap_port=None, extra_env=None):
    port = free_port()
    argv = [str(STUB / ("sglang-%s" % version)), "serve", "--model-path", "/models/stub", "--served-model-name",
            "StubModel", "--host", "127.0.0.1", "--port", str(port), "--tp-size", "4", "--enable-metrics"]
    if mode:
        argv += ["--disaggregation-mode", mode, "--disaggregation-transfer-backend", "mooncake"]
    if bootstrap_port:
        argv += ["--disaggregation-bootstrap-port", str(bootstrap_port)]
    env = dict(os.environ, SGLANG_STUB_LOAD_SECONDS="0.5", SGLANG_STUB_CONTROL_DIR=str(tmp_path / ("ctl-" + name)))
    env.update(extra_env or {})
    proc = procs.start(name, [sys.executable] + argv, env=env)
    url = "http://127.0.0.1:%d" % port
    wait_for(lambda: http("GET", url + "/health", timeout=2)[0] == 200, 30, "stub %s healthy" % name)
    return {"name": name, "url": url, "port": port, "proc": proc, "bootstrap_port": bootstrap_port,
            "instance": "127.0.0.1:%d" % port}


def start_router(procs, router_python, args, workers):
    port, prom = free_port(), free_port()
    argv = [str(router_python), "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prom), "--health-check-interval-secs", "2",
            "--worker-startup-timeout-secs", "30", "--log-level", "info"] + args
    proc = procs.start("router", argv)
    url = "http://127.0.0.1:%d" % port

    def ready():
        # /readiness answers 200 once ONE worker is healthy: the router registers its start-up workers one by one
        # (a fresh-clone CI run read {'healthy_workers': 1, 'total_workers': 1} with two given), so wait for all
        assert proc.poll() is None, "router exited: %s" % procs.log_of("router")[-2000:]
        code, body = http("GET", url + "/readiness", timeout=2)
        if code != 200 or not isinstance(body, dict) or body.get("healthy_workers", workers) < workers:
            return None
        code, listing = http("GET", url + "/workers", timeout=2)
        return body if code == 200 and isinstance(listing, dict) and len(listing.get("workers") or []) == workers \
            else None

    wait_for(ready, 60, "router /readiness 200 with %d workers registered" % workers)
    return {"url": url, "proc": proc, "prom": prom}


def chat(router, content="hello", stream=False, timeout=20):
    return http("POST", router["url"] + "/v1/chat/completions",
                {"model": "StubModel", "messages": [{"role": "user", "content": content}], "max_tokens": 8,
                 "stream": stream}, timeout=timeout)


def answered_by(text):
    """'stub StubModel on 127.0.0.1:PORT (sglang VER, MODE)' -> ('127.0.0.1:PORT', MODE)."""
    assert text.startswith("stub StubModel on "), text
    inst = text.split(" on ", 1)[1].split(" ", 1)[0]
    mode = text.rsplit(", ", 1)[1].rstrip(")")
    return inst, mode


# ------------------------------------------------------------------------------------------------ tests
def test_regular_round_robin_and_worker_management(procs, tmp_path, router_python):
    w1 = start_stub(procs, tmp_path, "w1")
    w2 = start_stub(procs, tmp_path, "w2")
    router = start_router(procs, router_python, ["--worker-urls", w1["url"], w2["url"], "--policy", "round_robin"],
                          workers=2)

    code, body = http("GET", router["url"] + "/readiness")
    assert code == 200 and body["healthy_workers"] == 2, body

    seen = []
    for i in range(6):
        code, body = chat(router, "question %d" % i)
        assert code == 200, body
        content = body["choices"][0]["message"]["content"]
        inst, mode = answered_by(content)
        assert mode == "null"
        seen.append(inst)
    assert set(seen) == {w1["instance"], w2["instance"]}, seen
    assert all(a != b for a, b in zip(seen, seen[1:])), "round_robin must alternate: %s" % seen

    # Streaming passes through the router.
    code, text = chat(router, "stream please", stream=True)
    assert code == 200 and isinstance(text, str) and text.rstrip().endswith("data: [DONE]"), text

    # The router's /workers API: remove w1, all traffic goes to w2, re-add w1, both serve again.
    code, listing = http("GET", router["url"] + "/workers")
    assert code == 200 and listing["total"] == 2, listing
    ids = {w["url"]: w["id"] for w in listing["workers"]}
    assert set(ids) == {w1["url"], w2["url"]}
    models = {w["model_id"] for w in listing["workers"]}
    assert models == {"StubModel"}, "served_model_name must become model_id: %s" % models

    code, body = http("DELETE", router["url"] + "/workers/" + ids[w1["url"]])
    assert code == 202, body
    wait_for(lambda: [w["url"] for w in http("GET", router["url"] + "/workers")[1]["workers"]] == [w2["url"]],
             10, "w1 gone from /workers")
    after = [answered_by(chat(router, "after removal %d" % i)[1]["choices"][0]["message"]["content"])[0]
             for i in range(4)]
    assert after == [w2["instance"]] * 4, after

    code, body = http("POST", router["url"] + "/workers", {"url": w1["url"]})
    assert code == 202, body

    def both_back():
        ws = http("GET", router["url"] + "/workers")[1]["workers"]
        return len(ws) == 2 and all(w["is_healthy"] for w in ws)

    wait_for(both_back, 20, "w1 re-added and healthy")
    again = {answered_by(chat(router, "re-added %d" % i)[1]["choices"][0]["message"]["content"])[0]
             for i in range(4)}
    assert again == {w1["instance"], w2["instance"]}, again

    # The router fans /flush_cache out to every worker, and its Prometheus exporter is on the loopback port we gave.
    code, body = http("POST", router["url"] + "/flush_cache")
    assert code == 200, body
    code, metrics = http("GET", "http://127.0.0.1:%d/metrics" % router["prom"])
    assert code == 200 and "smg_" in metrics

    # SIGTERM of the stub: like SGLang it drains, then kill_process_tree ends it by SIGKILL (never exit 0).
    assert procs.stop(w2["proc"]) == -signal.SIGKILL


def last_bootstrap(stub):
    """The stub's last_bootstrap. It records a request after sending its response (sandbox/sglang_stub/sglang_stub.py
    _run: _send, then st.record), so a client reading right after its answer can be first on a loaded machine: the
    callers wait for it (wait_for)."""
    return http("GET", stub["url"] + "/stub/last_requests")[1]["last_bootstrap"]


def test_pd_pairing_bootstrap(procs, tmp_path, router_python):
    prefills = [start_stub(procs, tmp_path, "p%d" % i, version="0.5.17", mode="prefill",
                           bootstrap_port=free_port()) for i in range(2)]
    decodes = [start_stub(procs, tmp_path, "d%d" % i, version="0.5.17", mode="decode") for i in range(2)]
    # The prefill stubs listen on their bootstrap ports too.
    for p in prefills:
        with socket.create_connection(("127.0.0.1", p["bootstrap_port"]), timeout=2):
            pass
    args = ["--pd-disaggregation"]
    for p in prefills:
        args += ["--prefill", p["url"], str(p["bootstrap_port"])]
    for d in decodes:
        args += ["--decode", d["url"]]
    args += ["--prefill-policy", "round_robin", "--decode-policy", "round_robin"]
    router = start_router(procs, router_python, args, workers=len(prefills + decodes))

    code, listing = http("GET", router["url"] + "/workers")
    assert code == 200, listing
    kinds = sorted(w["worker_type"] for w in listing["workers"])
    assert kinds == ["decode", "decode", "prefill", "prefill"], listing

    by_inst = {s["instance"]: s for s in prefills + decodes}
    for i, path in enumerate(["chat", "generate", "chat"]):
        for s in prefills + decodes:
            http("POST", s["url"] + "/stub/reset")
        if path == "chat":
            code, body = chat(router, "pd question %d" % i)
            assert code == 200, body
            text = body["choices"][0]["message"]["content"]
        else:
            code, body = http("POST", router["url"] + "/generate",
                              {"text": "pd generate %d" % i, "sampling_params": {"max_new_tokens": 8}})
            assert code == 200, body
            text = body["text"]
        inst, mode = answered_by(text)
        assert mode == "decode", "the answer must come from a decode stub: %s" % text
        decode = by_inst[inst]
        d_last = wait_for(lambda decode=decode: last_bootstrap(decode), 5, "%s to record the PD request" % inst)
        assert isinstance(d_last["bootstrap_room"], int), d_last
        room = d_last["bootstrap_room"]
        paired = wait_for(lambda room=room: [(p, b) for p, b in ((p, last_bootstrap(p)) for p in prefills)
                                   if b and b["bootstrap_room"] == room], 5, "a prefill to record room %s" % room)
        assert len(paired) == 1, "exactly one prefill must have seen room %s" % d_last["bootstrap_room"]
        p, p_last = paired[0]
        assert p_last["bootstrap_port"] == p["bootstrap_port"], (p_last, p["bootstrap_port"])
        assert p_last["bootstrap_host"] == "127.0.0.1"
        assert d_last["bootstrap_port"] == p["bootstrap_port"] and d_last["bootstrap_host"] == "127.0.0.1"

    # Streaming through PD: the decode stream comes back.
    code, text = chat(router, "pd stream", stream=True)
    assert code == 200 and isinstance(text, str), text
    assert '"content": " decode)"' in text and text.rstrip().endswith("data: [DONE]"), text
