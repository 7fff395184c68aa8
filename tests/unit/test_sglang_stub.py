"""sglang-stub (sandbox/sglang_stub): catalog-based argv parsing and the HTTP API, on 127.0.0.1 only.

The stub is a TEST DOUBLE; its accept/refuse parity with the real parser is proven in tests/parser. Here: its own
behaviour, one test per point of the contract with real SGLang 0.5.17/0.5.18 (sandbox/sglang_stub/README.md
"Contract"): port bound after load, warm-up and its timeout, /health as a generation, /flush_cache only when idle,
metric families checked against the REAL collector's exposition (contract/), /v1/loads, PD bootstrap_room and the
prefill's KV-transfer queue, reasoning output, SIGTERM (main only vs the whole group), keep-alive, fault knobs.
"""
import argparse
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

import sglang_stub as st
import seed_commands

ROOT = pathlib.Path(__file__).resolve().parents[2]
STUB_DIR = ROOT / "sandbox" / "sglang_stub"
BIN = STUB_DIR / "bin"


# ------------------------------------------------------------------------------------------------ parsing
def test_version_from_executable_name():
    assert st.version_from_name("/opt/sglang-stub/bin/sglang-0.5.17", env={}) == "0.5.17"
    assert st.version_from_name("sglang-0.5.18", env={}) == "0.5.18"
    assert st.version_from_name("/usr/bin/sglang", env={}) is None
    assert st.version_from_name("/usr/bin/sglang", env={"SGLANG_STUB_VERSION": "0.5.18"}) == "0.5.18"
    assert st.available_versions() == ["0.5.17", "0.5.18"]


def test_catalogs_are_the_reference_dumps():
    ref = ROOT.parent / "shared" / "reference" / "sglang"
    if not ref.is_dir():
        # provenance check only: the catalogs themselves are in the repository (and checked by the parser tests)
        pytest.skip("reference dumps (../shared/reference/sglang) not next to this checkout: provenance not checked")
    for ver in ("0.5.17", "0.5.18"):
        mine = json.loads((pathlib.Path(st.OPTIONS_DIR) / ("server-options-%s.json" % ver)).read_text())
        assert mine == json.loads((ref / ("server-options-%s.json" % ver)).read_text())


@pytest.mark.parametrize("cmd", seed_commands.load(str(ROOT)), ids=lambda c: c["name"])
def test_seed_lines_accepted_with_abbreviation_warnings(cmd):
    ns, warnings = st.parse_serve_args(cmd["version"], cmd["argv"])
    assert ns.served_model_name in ("GLM-5.2-NVFP4", "Kimi-K3")
    if cmd["name"].startswith("GLM"):
        assert ns.tp_size == 4 and ns.dp_size == 1 and ns.context_length == 262144
        assert any("--tp is an abbreviation of --tp-size" in w for w in warnings), warnings
        assert any("--dp is an abbreviation of --dp-size" in w for w in warnings), warnings
    else:
        assert ns.tp_size == 8 and ns.dcp_replicate_q_proj is True and warnings == []


@pytest.mark.parametrize("argv,expected", [
    (["--model-path", "/m", "--bogus", "1"], "sglang serve: error: unrecognized arguments: --bogus 1"),
    (["--model-path", "/m", "--disaggregation-mode", "both"],
     "sglang serve: error: argument --disaggregation-mode: invalid choice: 'both' (choose from 'null', 'prefill', "
     "'decode')"),
    (["--model-path", "/m", "--port", "x"], "sglang serve: error: argument --port: invalid int value: 'x'"),
    (["--model-path", "/m", "--hicache-ratio", "two"],
     "sglang serve: error: argument --hicache-ratio: invalid float value: 'two'"),
    ([], "sglang serve: error: the following arguments are required: --model-path/--model"),
    (["--model-path", "/m", "--context-length", "1.5Ki"], "Decimals are not allowed with IEC suffixes"),
    (["--model-path", "/m", "--enable-p"], "ambiguous option: --enable-p could match"),
])
def test_refused_like_argparse(argv, expected):
    rc, msg = st.check_argv("0.5.18", argv)
    assert rc == 2
    assert expected in msg, msg


def test_accepted_forms():
    assert st.check_argv("0.5.18", ["/models/x", "--tp", "2"]) == (0, "")          # positional model path
    ns, _ = st.parse_serve_args("0.5.18", ["--model", "/m", "--context-length", "256k", "--port=31000",
                                           "--no-dcp-replicate-q-proj", "--cuda-graph-bs", "1", "2"])
    assert (ns.model_path, ns.context_length, ns.port) == ("/m", 256000, 31000)
    assert ns.dcp_replicate_q_proj is False and ns.cuda_graph_bs_decode == [1, 2]
    # version-specific options
    assert st.check_argv("0.5.18", ["--model-path", "/m", "--startup-weight-load-mode", "serial"])[0] == 0
    assert st.check_argv("0.5.17", ["--model-path", "/m", "--startup-weight-load-mode", "serial"])[0] == 2


def test_human_readable_int_matches_sglang_rules():
    assert st.human_readable_int("262144") == 262144
    assert st.human_readable_int("25.6k") == 25600
    assert st.human_readable_int("1Ki") == 1024
    assert st.human_readable_int("2M") == 2000000
    for bad in ("1.5Ki", "12abc", "1m"):
        with pytest.raises(argparse.ArgumentTypeError):  # what sglang's own human_readable_int raises
            st.human_readable_int(bad)


def test_cli_exit_codes_and_version():
    out = subprocess.run([str(BIN / "sglang-0.5.17"), "version"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout.splitlines()[0] == "sglang version: 0.5.17"
    bad = subprocess.run([str(BIN / "sglang-0.5.18"), "serve", "--model-path", "/m", "--nope"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "unrecognized arguments: --nope" in bad.stderr
    chk = dict(os.environ, SGLANG_STUB_CHECK_ONLY="1")
    ok = subprocess.run([str(BIN / "sglang-0.5.17"), "serve", "--model-path", "/m", "--tp", "4", "--port", "1"],
                        capture_output=True, text=True, timeout=30, env=chk)
    assert ok.returncode == 0 and ok.stdout.startswith("OK:") and "--tp is an abbreviation of --tp-size" in ok.stderr
    refused = subprocess.run([str(BIN / "sglang-0.5.17"), "serve", "--model-path", "/m", "--nope-flag", "x"],
                             capture_output=True, text=True, timeout=30, env=chk)
    assert refused.returncode == 2 and "unrecognized arguments" in refused.stderr
    nover = subprocess.run([str(BIN / "sglang"), "version"], capture_output=True, text=True, timeout=30,
                           env={k: v for k, v in os.environ.items() if k != "SGLANG_STUB_VERSION"})
    assert nover.returncode == 2 and "no version" in nover.stderr


# ------------------------------------------------------------------------------------------------ HTTP
def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method, url, body=None, headers=None, timeout=10):
    assert url.startswith("http://127.0.0.1:")
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode(), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), dict(exc.headers)


SCALE = "0.02"   # SGLANG_STUB_TIME_SCALE for these tests: real 1 s health loop -> 20 ms, 20 s health timeout -> 0.4 s


class Stub:
    def __init__(self, tmp_path, args=(), env=None, version="0.5.18", wait_healthy=True, new_session=False,
                 model_path="/models/M"):
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.ctl = tmp_path / ("ctl-%d" % self.port)
        self.log_path = tmp_path / ("stub-%d.log" % self.port)
        self.log = open(self.log_path, "wb")
        e = dict(os.environ, SGLANG_STUB_LOAD_SECONDS="0.3", SGLANG_STUB_CONTROL_DIR=str(self.ctl),
                 SGLANG_STUB_TIME_SCALE=SCALE)
        e.update(env or {})
        argv = [str(BIN / ("sglang-%s" % version)), "serve", "--model-path", model_path, "--served-model-name",
                "M", "--host", "127.0.0.1", "--port", str(self.port), "--enable-metrics"] + list(args)
        self.proc = subprocess.Popen([sys.executable] + argv, stdout=self.log, stderr=subprocess.STDOUT, env=e,
                                     start_new_session=new_session)
        self.wait_listening()
        if wait_healthy:
            self.wait(lambda: http("GET", self.url + "/health", timeout=5)[0] == 200, 20)

    def wait_listening(self, timeout=20):
        def up():
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        self.wait(up, timeout)

    def wait(self, pred, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None or pred is None, "stub exited rc=%s: %s" % (
                self.proc.returncode, self.text()[-2000:])
            try:
                if pred():
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError("timeout: %s" % self.text()[-2000:])

    def text(self):
        self.log.flush()
        return self.log_path.read_text(errors="replace")

    def state(self):
        return json.loads(http("GET", self.url + "/stub/state")[1])

    def control(self, name, value):
        self.ctl.mkdir(parents=True, exist_ok=True)
        path = self.ctl / name
        if value is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(value)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.log.close()
        return self.proc.returncode


@pytest.fixture()
def stubs(tmp_path):
    started = []

    def make(*args, **kw):
        s = Stub(tmp_path, *args, **kw)
        started.append(s)
        return s

    yield make
    for s in started:
        s.stop()


def in_thread(fn, *args, **kw):
    out = {}

    def run():
        try:
            out["r"] = fn(*args, **kw)
        except Exception as exc:  # any exception: the test inspects it
            out["exc"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


# ------------------------------------------------------------------------------------------------ start-up
def test_port_unbound_during_load_then_warmup_503_then_up_and_info_endpoints(tmp_path, stubs):
    """engine.py wait_for_ready before uvicorn.run: connection refused for the whole load; then /health 503 while
    server_status is Starting (the warm-up request's first forward is slow), 200 once it passed."""
    s = Stub.__new__(Stub)
    s.port, s.ctl = free_port(), tmp_path / "ctl-load"
    s.url = "http://127.0.0.1:%d" % s.port
    s.log_path = tmp_path / "load.log"
    s.log = open(s.log_path, "wb")
    env = dict(os.environ, SGLANG_STUB_LOAD_SECONDS="1.0", SGLANG_STUB_CONTROL_DIR=str(s.ctl),
               SGLANG_STUB_TIME_SCALE="0.1", SGLANG_STUB_WARMUP_SECONDS="15")      # warm-up forward 1.5 s
    s.proc = subprocess.Popen([sys.executable, str(BIN / "sglang-0.5.17"), "serve", "--model-path", "/m",
                               "--served-model-name", "M", "--host", "127.0.0.1", "--port", str(s.port)],
                              stdout=s.log, stderr=subprocess.STDOUT, env=env)
    try:
        time.sleep(0.5)
        with pytest.raises(OSError):                              # loading: nothing listens
            socket.create_connection(("127.0.0.1", s.port), timeout=1).close()
        s.wait_listening()
        code, _, _ = http("GET", s.url + "/health")
        assert code == 503                                         # Starting (warm-up running)
        assert http("GET", s.url + "/model_info")[0] == 200        # static endpoints answer meanwhile
        s.wait(lambda: http("GET", s.url + "/health", timeout=5)[0] == 200, 20)
        log_text = s.text()
        assert log_text.index("Load weight end") < log_text.index("Uvicorn running")
        assert "POST /generate" in log_text and "The server is fired up and ready to roll!" in log_text
        info = json.loads(http("GET", s.url + "/model_info")[1])
        assert set(info) - {"test_double"} == {
            "model_path", "tokenizer_path", "is_generation", "preferred_sampling_params", "weight_version",
            "has_image_understanding", "has_audio_understanding", "model_type", "architectures"}   # 0.5.17 set
        assert info["model_path"] is None and info["tokenizer_path"] is None     # withheld: the router would load them
        server = json.loads(http("GET", s.url + "/server_info")[1])
        for key in ("served_model_name", "tp_size", "dp_size", "disaggregation_mode", "model_path", "tokenizer_path",
                    "api_key", "internal_states", "version", "kv_events", "disaggregation_bootstrap_port"):
            assert key in server, key
        assert server["version"] == "0.5.17" and server["model_path"] is None
        assert http("GET", s.url + "/get_model_info")[0] == 200
        assert "Endpoint '/get_model_info' is deprecated" in s.text()
    finally:
        s.stop()


def test_model_info_fields_018_and_paths_on_request(stubs):
    s = stubs(env={"SGLANG_STUB_REPORT_PATHS": "1"}, args=["--reasoning-parser", "kimi_k3"])
    info = json.loads(http("GET", s.url + "/model_info")[1])
    assert {"served_model_name", "load_format", "reasoning_parser", "tool_call_parser"} <= set(info)
    assert info["reasoning_parser"] == "kimi_k3" and info["model_path"] == "/models/M"


def test_warmup_timeout_kills_the_server(tmp_path):
    """SGLANG_WARMUP_TIMEOUT: a warm-up request slower than the timeout -> 'Initialization failed' and
    kill_process_tree: the process dies of SIGKILL (systemd: status=9/KILL, Restart=on-failure restarts it)."""
    port = free_port()
    env = dict(os.environ, SGLANG_STUB_LOAD_SECONDS="0.1", SGLANG_STUB_CONTROL_DIR=str(tmp_path / "ctl"),
               SGLANG_STUB_TIME_SCALE="0.005", SGLANG_WARMUP_TIMEOUT="100", SGLANG_STUB_WARMUP_SECONDS="150")
    proc = subprocess.run([sys.executable, str(BIN / "sglang-0.5.18"), "serve", "--model-path", "/m", "--host",
                           "127.0.0.1", "--port", str(port)], capture_output=True, text=True, timeout=30, env=env)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert "Initialization failed. warmup error" in proc.stderr and "kill_process_tree called" in proc.stderr
    # the default (-1) is 600 s non-PD: a 150 s warm-up passes
    env.update(SGLANG_WARMUP_TIMEOUT="-1")
    s = subprocess.Popen([sys.executable, str(BIN / "sglang-0.5.18"), "serve", "--model-path", "/m", "--host",
                          "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         env=env)
    try:
        deadline = time.monotonic() + 20
        code = None
        while time.monotonic() < deadline and code != 200:
            try:
                code = http("GET", "http://127.0.0.1:%d/health" % port, timeout=5)[0]
            except OSError:
                pass
            time.sleep(0.1)
        assert code == 200 and s.poll() is None
    finally:
        s.kill()
        s.wait(5)


# ------------------------------------------------------------------------------------------------ /health
def test_health_is_a_generation_and_fails_when_the_scheduler_stalls(stubs):
    s = stubs()
    t0 = time.monotonic()
    assert http("GET", s.url + "/health")[0] == 200
    assert time.monotonic() - t0 >= 0.02                     # the 1 s (scaled) loop before the first check
    assert http("GET", s.url + "/health_generate")[0] == 200
    s.control("fault", "hang")                               # a stalled scheduler: no output any more
    t0 = time.monotonic()
    assert http("GET", s.url + "/health", timeout=10)[0] == 503
    assert time.monotonic() - t0 >= 0.4                      # SGLANG_HEALTH_CHECK_TIMEOUT 20 s, scaled
    assert "Health check failed. Server couldn't get a response from detokenizer for last 20 seconds" in s.text()
    assert s.state()["server_status"] == "UnHealthy"
    s.control("fault", None)
    assert http("GET", s.url + "/health")[0] == 200          # output again: Up
    assert s.state()["server_status"] == "Up"
    # a /health while another request runs piggybacks on it (HealthCheckOutput): 200 without its own forward
    s.control("latency_ms", "1500")
    t, out = in_thread(http, "POST", s.url + "/generate", {"text": "busy"}, timeout=20)
    time.sleep(0.3)
    assert http("GET", s.url + "/health")[0] == 200
    assert s.state()["health_running"] == 0
    t.join(10)
    assert out["r"][0] == 200


def test_health_cheap_without_generation_env(stubs):
    s = stubs(env={"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "0"})
    s.control("fault", "hang")
    t0 = time.monotonic()
    assert http("GET", s.url + "/health")[0] == 200          # no generation: cheap, blind to the stall
    assert time.monotonic() - t0 < 0.3
    assert http("GET", s.url + "/health_generate", timeout=10)[0] == 503    # /health_generate still generates
    s.control("fault", None)


def test_health_requests_are_not_counted_but_the_warmup_is(stubs):
    """/health generations carry log_metrics=False; the warm-up request is an ordinary one (counted)."""
    s = stubs()
    before = samples(http("GET", s.url + "/metrics")[1], "sglang:num_requests_total")
    assert before == {'sglang:num_requests_total{engine_type="unified",is_streaming="false",model_name="M"}': 1.0}
    for _ in range(3):
        assert http("GET", s.url + "/health")[0] == 200
    assert samples(http("GET", s.url + "/metrics")[1], "sglang:num_requests_total") == before


# ------------------------------------------------------------------------------------------------ /flush_cache
def test_flush_cache_400_unless_idle_get_and_post_and_timeout(stubs):
    s = stubs(env={"SGLANG_STUB_HEALTH_FORWARD_MS": "300"})      # under the 0.4 s (scaled) health timeout
    s.wait(lambda: s.state()["health_running"] == 0, 10)
    assert http("GET", s.url + "/flush_cache")[0] == 200
    assert http("POST", s.url + "/flush_cache")[1].startswith("Cache flushed.")
    # a /health generation running on an idle scheduler makes it busy
    t, out = in_thread(http, "GET", s.url + "/health", timeout=10)
    time.sleep(0.1)
    code, body, _ = http("POST", s.url + "/flush_cache")
    assert (code, body) == (400, "Flush cache failed.\n")
    assert "Cache not flushed because there are pending requests" in s.text()
    t.join(10)
    s.control("latency_ms", "1000")
    t, out = in_thread(http, "POST", s.url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]},
                       timeout=20)
    time.sleep(0.2)
    assert http("GET", s.url + "/flush_cache")[0] == 400
    assert http("GET", s.url + "/flush_cache?timeout=0.2")[1] == "Timed out waiting for idle state."
    t0 = time.monotonic()
    assert http("GET", s.url + "/flush_cache?timeout=10", timeout=20)[0] == 200       # waits until idle
    assert time.monotonic() - t0 > 0.3
    t.join(10)
    assert out["r"][0] == 200


# ------------------------------------------------------------------------------------------------ metrics contract
def families(text):
    """{name: (type, help, {frozenset(label names)})} of a Prometheus exposition."""
    out = {}
    for ln in text.splitlines():
        if ln.startswith("# HELP "):
            name, help_ = ln[7:].split(" ", 1)
            out.setdefault(name, [None, help_, set()])[1] = help_
        elif ln.startswith("# TYPE "):
            name, typ = ln[7:].split(" ", 1)
            out.setdefault(name, [None, None, set()])[0] = typ
        elif ln and not ln.startswith("#"):
            series = ln.rsplit(" ", 1)[0]
            name = series.split("{", 1)[0]
            labels = frozenset(re.findall(r'(\w+)="', series.split("{", 1)[1])) if "{" in series else frozenset()
            for suffix in ("_bucket", "_sum", "_count"):
                if name.endswith(suffix) and name[:-len(suffix)] in out:
                    name = name[:-len(suffix)]
                    labels = labels - {"le"}
            out.setdefault(name, [None, None, set()])[2].add(labels)
    return out


def samples(text, name):
    return {ln.rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
            if ln.startswith(name + "{")}


CONTRACT = STUB_DIR / "contract"


@pytest.mark.parametrize("version", ["0.5.17", "0.5.18"])
@pytest.mark.parametrize("mode", ["null", "prefill", "decode"])
def test_metrics_families_match_the_real_collector(tmp_path, version, mode):
    """Every family the stub writes exists in the REAL collector's exposition (contract/metrics-*.txt, written by
    SGLang's own metrics_collector.py) with the same type, HELP text and label names."""
    real = families((CONTRACT / ("metrics-%s-%s.txt" % (version, mode))).read_text())
    args = [] if mode == "null" else ["--disaggregation-mode", mode, "--disaggregation-bootstrap-port",
                                      str(free_port()), "--disaggregation-transfer-backend", "fake"]
    s = Stub(tmp_path, args=args, version=version)
    try:
        sysp = " ".join("w%d" % i for i in range(40))
        for q in ("a", "b"):
            for stream in (False, True):
                body = {"text": sysp + " " + q, "sampling_params": {"max_new_tokens": 3}, "stream": stream}
                assert http("POST", s.url + "/generate", body, timeout=20)[0] == 200
        mine = families(http("GET", s.url + "/metrics")[1])
    finally:
        s.stop()
    assert mine, "no metrics"
    for name, (typ, help_, labelsets) in mine.items():
        assert name in real, "%s is not a metric of sglang %s" % (name, version)
        assert typ == real[name][0] and help_ == real[name][1], name
        assert labelsets <= real[name][2], (name, labelsets, real[name][2])
    if mode != "decode":
        assert "sglang:cached_tokens_total" in mine


def test_cached_tokens_by_source_device_and_host_never_total(stubs):
    """observe_one_finished_request: the scheduler always sends cached_tokens_details on a hit, so the counter is
    split into cache_source device/host; "total" (the fallback) never appears. A HiCache host tier keeps blocks the
    device evicted and serves them as host hits."""
    s = stubs(args=["--enable-hierarchical-cache", "--page-size", "1"], env={"SGLANG_STUB_CACHE_TOKENS": "60"})
    a = " ".join("a%d" % i for i in range(50))
    b = " ".join("b%d" % i for i in range(50))
    metrics = http("GET", s.url + "/metrics")[1]
    assert "sglang:cached_tokens_total{" not in metrics                   # absent before the first hit
    for text in (a + " x", b + " y", a + " z"):
        out = json.loads(http("POST", s.url + "/generate", {"text": text})[1])
    assert out["meta_info"]["cached_tokens"] == 50
    details = out["meta_info"]["cached_tokens_details"]
    assert details["host"] > 0 and details["device"] + details["host"] == 50
    # the stub counts a request after its answer is written (a loaded machine read /metrics before that): wait briefly
    deadline = time.monotonic() + 10
    while True:
        got = samples(http("GET", s.url + "/metrics")[1], "sglang:cached_tokens_total")
        if sum(got.values()) >= 50 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert got == {'sglang:cached_tokens_total{cache_source="device",engine_type="unified",model_name="M"}':
                   float(details["device"]),
                   'sglang:cached_tokens_total{cache_source="host",engine_type="unified",model_name="M"}':
                   float(details["host"])}


# ------------------------------------------------------------------------------------------------ loads
def test_v1_loads_and_deprecated_get_load(stubs):
    s = stubs(args=["--dp-size", "2"])
    code, body, _ = http("GET", s.url + "/v1/loads")
    doc = json.loads(body)
    assert code == 200 and {"timestamp", "version", "accelerator", "num_accelerators", "loads"} <= set(doc)
    assert [ld["dp_rank"] for ld in doc["loads"]] == [0, 1]
    assert {"disaggregation", "queues", "memory"} <= set(doc["loads"][0])
    core = json.loads(http("GET", s.url + "/v1/loads?include=core&dp_rank=1")[1])["loads"]
    assert len(core) == 1 and "disaggregation" not in core[0] and core[0]["num_running_reqs"] == 0
    assert http("GET", s.url + "/v1/loads?include=bogus")[0] == 500
    prom = http("GET", s.url + "/v1/loads?format=prometheus&include=disagg")[1]
    assert 'sglang_disagg_prefill_inflight_queue_reqs{dp_rank="0"} 0' in prom
    load = json.loads(http("GET", s.url + "/get_load")[1])
    assert [sorted(x) for x in load] == [sorted(["dp_rank", "num_reqs", "num_waiting_reqs", "num_tokens",
                                                 "num_pending_tokens", "ts_tic"])] * 2
    assert "Endpoint '/get_load' is deprecated and will be removed in a future version. Please use '/v1/loads' " \
           "instead." in s.text()


# ------------------------------------------------------------------------------------------------ inference
def test_inference_endpoints_answer_names_instance(stubs):
    s = stubs(args=["--tp-size", "4", "--dp-size", "2", "--enable-cache-report"])
    expected = "stub M on 127.0.0.1:%d (sglang 0.5.18, null)" % s.port
    code, body, _ = http("POST", s.url + "/v1/chat/completions",
                         {"model": "unknown", "messages": [{"role": "user", "content": "hi there"}],
                          "max_completion_tokens": 50, "separate_reasoning": True, "whatever_new_field": [1]})
    chat = json.loads(body)
    assert code == 200 and chat["object"] == "chat.completion" and chat["model"] == "unknown"
    assert chat["choices"][0]["message"]["content"] == expected
    assert chat["choices"][0]["message"]["reasoning_content"] is None          # no --reasoning-parser
    assert chat["usage"]["completion_tokens"] == len(expected.split())
    assert chat["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}       # --enable-cache-report
    code, body, _ = http("POST", s.url + "/v1/completions", {"model": "M", "prompt": "hi", "max_tokens": 50})
    assert code == 200 and json.loads(body)["choices"][0]["text"] == expected
    code, body, _ = http("POST", s.url + "/generate", {"text": "hi there", "sampling_params": {}, "rid": "r1"})
    gen = json.loads(body)
    assert code == 200 and gen["text"] == expected and gen["meta_info"]["id"] == "r1"
    assert gen["meta_info"]["cached_tokens"] > 0          # same prompt as the chat above: prefix cache hit
    code, text, headers = http("POST", s.url + "/v1/chat/completions",
                               {"messages": [{"role": "user", "content": "x"}], "stream": True,
                                "stream_options": {"include_usage": True}})
    assert code == 200 and headers["Content-Type"] == "text/event-stream"
    events = [json.loads(ln[6:]) for ln in text.splitlines() if ln.startswith("data: {")]
    assert "".join((e["choices"][0]["delta"].get("content") or "") for e in events if e["choices"]) == expected
    assert events[-1]["usage"]["completion_tokens"] == len(expected.split())
    assert text.rstrip().endswith("data: [DONE]")
    code, text, _ = http("POST", s.url + "/generate", {"text": "y", "stream": True})
    last = [json.loads(ln[6:]) for ln in text.splitlines() if ln.startswith("data: {")][-1]
    assert last["text"] == expected and last["meta_info"]["finish_reason"]["type"] == "stop"
    assert http("POST", s.url + "/generate", body=None)[0] == 200  # empty body is {} -> fine
    metrics = http("GET", s.url + "/metrics")[1]
    assert "TEST DOUBLE" in metrics
    for name in ("sglang:num_running_reqs", "sglang:cache_hit_rate", "sglang:prompt_tokens_total",
                 "sglang:generation_tokens_total", "sglang:e2e_request_latency_seconds_bucket"):
        assert name + "{" in metrics, name
    hit = [ln for ln in metrics.splitlines() if ln.startswith("sglang:cache_hit_rate{")][0]
    assert float(hit.rsplit(" ", 1)[1]) > 0
    assert len(json.loads(http("GET", s.url + "/get_load")[1])) == 2      # one entry per dp rank


def test_bad_json_and_api_key(stubs):
    s = stubs(args=["--api-key", "sekrit"])
    assert http("GET", s.url + "/health")[0] == 200                       # health stays open (the warm-up sent the key)
    assert http("POST", s.url + "/generate", {"text": "x"})[0] == 401
    assert http("GET", s.url + "/flush_cache")[0] == 401                  # ADMIN_OPTIONAL: the key when one is set
    auth = {"Authorization": "Bearer sekrit"}
    assert http("POST", s.url + "/generate", {"text": "x"}, headers=auth)[0] == 200
    req = urllib.request.Request(s.url + "/generate", data=b"{not json", method="POST", headers=auth)
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, timeout=5)
    assert exc.value.code == 400


@pytest.mark.parametrize("parser,close", [("glm45", "</think>"), ("kimi_k3", "<|close|>think<|sep|>")])
def test_reasoning_parser_content_empty_until_the_think_block_closes(stubs, parser, close):
    """serving_chat.py: with --reasoning-parser the think block goes to reasoning_content, content stays "" until it
    closes (glm45 / kimi_k3 think by default); /generate returns the raw text; chat_template_kwargs turns it off."""
    s = stubs(args=["--reasoning-parser", parser], env={"SGLANG_STUB_REASONING_TOKENS": "24"})
    expected = "stub M on 127.0.0.1:%d (sglang 0.5.18, null)" % s.port
    msg = [{"role": "user", "content": "hi"}]
    short = json.loads(http("POST", s.url + "/v1/chat/completions", {"messages": msg, "max_tokens": 16})[1])
    m = short["choices"][0]["message"]
    assert m["content"] == "" and m["reasoning_content"] and short["choices"][0]["finish_reason"] == "length"
    full = json.loads(http("POST", s.url + "/v1/chat/completions", {"messages": msg})[1])["choices"][0]["message"]
    assert full["content"] == expected and len(full["reasoning_content"].split()) == 24 and close not in full["content"]
    raw = json.loads(http("POST", s.url + "/v1/chat/completions", {"messages": msg, "separate_reasoning": False})[1])
    assert close in raw["choices"][0]["message"]["content"]
    off = {"glm45": {"enable_thinking": False}, "kimi_k3": {"thinking": False}}[parser]
    plain = json.loads(http("POST", s.url + "/v1/chat/completions",
                            {"messages": msg, "max_tokens": 16, "chat_template_kwargs": off})[1])
    assert plain["choices"][0]["message"]["content"] == expected
    code, text, _ = http("POST", s.url + "/v1/chat/completions", {"messages": msg, "stream": True})
    deltas = [json.loads(ln[6:])["choices"][0]["delta"] for ln in text.splitlines() if ln.startswith("data: {")
              and json.loads(ln[6:])["choices"]]
    assert "".join(d.get("content") or "" for d in deltas) == expected
    assert len("".join(d.get("reasoning_content") or "" for d in deltas).split()) == 24
    gen = json.loads(http("POST", s.url + "/generate", {"text": "hi"})[1])
    assert gen["text"] == expected                                        # /generate: no chat template, no parser


# ------------------------------------------------------------------------------------------------ PD
def test_pd_bootstrap_room_required_inflight_queue_until_pulled_and_bootstrap_routes(stubs):
    bport = free_port()
    p = stubs(args=["--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(bport)])
    d = stubs(args=["--disaggregation-mode", "decode"])
    boot = "http://127.0.0.1:%d" % bport
    assert http("GET", boot + "/health")[1] == "OK"
    assert http("GET", boot + "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1")[0] == 200
    assert http("GET", boot + "/route")[0] == 400
    for s in (p, d):                                                      # scheduler.py: no bootstrap_room -> 400
        code, body, _ = http("POST", s.url + "/generate", {"text": "q"})
        assert code == 400
        assert "Disaggregated request received without bootstrap room id" in json.loads(body)["error"]["message"]
        code, body, _ = http("POST", s.url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "q"}]})
        assert code == 400 and json.loads(body)["object"] == "error"
    p.control("kv_transfer_ms", "1200")
    body = {"text": "q", "bootstrap_room": 1234567890123, "bootstrap_host": "127.0.0.1", "bootstrap_port": bport}
    tp, outp = in_thread(http, "POST", p.url + "/generate", body, timeout=30)
    time.sleep(0.4)
    assert tp.is_alive(), "the prefill answers only after the decode pulled the KV"
    assert p.state()["prefill_inflight"] == 1 and p.state()["running"] == 0
    loads = json.loads(http("GET", p.url + "/v1/loads?include=disagg")[1])["loads"][0]
    assert loads["disaggregation"]["prefill_inflight_queue_reqs"] == 1
    assert json.loads(http("GET", p.url + "/get_load")[1])[0]["num_reqs"] == 0   # /get_load does not see it
    assert http("POST", p.url + "/flush_cache")[0] == 400                        # ... flush does
    td, outd = in_thread(http, "POST", d.url + "/generate", body, timeout=30)
    time.sleep(0.5)
    assert 'sglang:num_prefill_inflight_queue_reqs{engine_type="prefill",model_name="M",moe_ep_rank="0",' \
           'pp_rank="0",tp_rank="0"} 1.0' in http("GET", p.url + "/metrics")[1]
    assert d.state()["decode_transfer"] == 1
    tp.join(15)
    td.join(15)
    assert outp["r"][0] == 200 and json.loads(outp["r"][1])["text"] == ""
    assert json.loads(outd["r"][1])["text"].endswith("(sglang 0.5.18, decode)")
    assert p.state()["prefill_inflight"] == 0
    for s in (p, d):
        last = json.loads(http("GET", s.url + "/stub/last_requests")[1])
        assert last["last_bootstrap"] == {"bootstrap_room": 1234567890123, "bootstrap_host": "127.0.0.1",
                                          "bootstrap_port": bport}
    info = json.loads(http("GET", p.url + "/server_info")[1])
    assert info["disaggregation_mode"] == "prefill" and info["disaggregation_bootstrap_port"] == bport
    assert "sglang:kv_transfer_total_mb_count" in http("GET", p.url + "/metrics")[1]


def test_prefill_fails_a_request_the_decode_never_pulls(stubs):
    p = stubs(args=["--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(free_port())],
              env={"SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "30"})     # 30 s x 0.02 = 0.6 s
    body = {"text": "q", "bootstrap_room": 7, "bootstrap_host": "127.0.0.1", "bootstrap_port": 1}
    code, _, _ = http("POST", p.url + "/generate", body, timeout=20)
    assert code == 500
    assert "sglang:num_transfer_failed_reqs_total{" in http("GET", p.url + "/metrics")[1]


# ------------------------------------------------------------------------------------------------ faults
def test_fault_knobs_via_control_dir(stubs):
    s = stubs()
    s.control("fault", "error500")
    code, body, _ = http("POST", s.url + "/v1/chat/completions", {"messages": []})
    assert code == 500 and json.loads(body) == {"error": "stub forced 500"}
    s.control("fault", "unhealthy")
    assert http("GET", s.url + "/health")[0] == 503
    s.control("fault", "hang")
    t, out = in_thread(http, "POST", s.url + "/generate", {"text": "x"}, timeout=20)
    time.sleep(1.0)
    assert t.is_alive(), "a hung request must not return while the fault is set"
    s.control("fault", None)
    t.join(10)
    assert not t.is_alive() and out["r"][0] == 200
    assert http("GET", s.url + "/health")[0] == 200
    state = s.state()
    assert state["faults"] == [] and state["healthy"] is True


def test_unhealthy_after_restart_spares_the_running_process(stubs):
    """`unhealthy_after_restart`: the process that runs when the fault is armed stays healthy (a rollout's
    pre-checks see a healthy fleet); a process started afterwards on the same control dir never answers /health."""
    s = stubs()
    time.sleep(1.1)                  # file mtimes have 1 s resolution on some filesystems
    s.control("fault", "unhealthy_after_restart")
    assert http("GET", s.url + "/health")[0] == 200
    later = stubs(env={"SGLANG_STUB_CONTROL_DIR": str(s.ctl)}, wait_healthy=False)
    time.sleep(0.5)
    assert http("GET", later.url + "/health")[0] == 503
    assert "unhealthy" in later.state()["faults"]
    assert http("GET", s.url + "/health")[0] == 200


def test_env_faults_never_healthy_and_die_after_load(tmp_path, stubs):
    s = stubs(env={"SGLANG_STUB_FAULT": "unhealthy"}, wait_healthy=False)
    time.sleep(0.5)
    assert http("GET", s.url + "/health")[0] == 503
    port = free_port()
    proc = subprocess.run([sys.executable, str(BIN / "sglang-0.5.17"), "serve", "--model-path", "/m", "--host",
                           "127.0.0.1", "--port", str(port)], capture_output=True, text=True, timeout=30,
                          env=dict(os.environ, SGLANG_STUB_FAULT="die_after_load", SGLANG_STUB_LOAD_SECONDS="0.2",
                                   SGLANG_STUB_CONTROL_DIR=str(tmp_path / "die")))
    assert proc.returncode == 1 and "die_after_load" in proc.stderr
    assert "THIS IS A TEST DOUBLE" in proc.stderr


# ------------------------------------------------------------------------------------------------ SIGTERM
def test_sigterm_to_main_only_drains_then_kills_itself(stubs):
    """KillMode=mixed: SIGTERM reaches the main process only. Its handler sets gracefully_exit: /health 503, new
    requests are still served, in-flight ones finish (5 s drain steps, scaled); then ShutdownReq to the scheduler
    and kill_process_tree: the process ends by SIGKILL, never exit 0."""
    s = stubs(env={"SGLANG_STUB_LATENCY_MS": "1500"})
    results = []

    def call(stream):
        t0 = time.monotonic()
        code, body, _ = http("POST", s.url + "/v1/chat/completions",
                             {"messages": [{"role": "user", "content": "slow"}], "stream": stream}, timeout=20)
        results.append((code, time.monotonic() - t0, body))

    threads = [threading.Thread(target=call, args=(st_,)) for st_ in (False, True)]
    for t in threads:
        t.start()
    time.sleep(0.4)
    assert s.state()["running"] == 2
    assert json.loads(http("GET", s.url + "/get_load")[1])[0]["num_reqs"] == 2
    child = s.state()["scheduler_pid"]
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    assert http("GET", s.url + "/health")[0] == 503                          # gracefully_exit
    s.control("latency_ms", "0")
    assert http("POST", s.url + "/generate", {"text": "late"})[0] == 200       # still serving
    for t in threads:
        t.join(15)
    assert s.proc.wait(timeout=15) == -signal.SIGKILL
    assert sorted(r[0] for r in results) == [200, 200], results
    assert all(r[1] >= 1.4 for r in results), [r[1] for r in results]
    assert any("data: [DONE]" in r[2] for r in results)
    text = s.text()
    assert "SIGTERM received" in text and "Gracefully exiting... Remaining number of requests" in text
    with pytest.raises(OSError):
        os.kill(child, 0)                                                    # the scheduler is gone too


def test_sigterm_to_the_whole_group_kills_inflight_requests(stubs):
    """KillMode=control-group: SIGTERM also reaches the scheduler child, which has no handler and dies; the
    subprocess watchdog sees it, SIGQUIT, kill_process_tree: requests in flight fail, nothing drains."""
    s = stubs(env={"SGLANG_STUB_LATENCY_MS": "3000"}, new_session=True)
    t, out = in_thread(http, "POST", s.url + "/generate", {"text": "doomed"}, timeout=20)
    time.sleep(0.3)
    t0 = time.monotonic()
    os.killpg(s.proc.pid, signal.SIGTERM)
    assert s.proc.wait(timeout=10) == -signal.SIGKILL
    t.join(10)
    assert "exc" in out, out                                                 # connection reset / closed, no answer
    assert time.monotonic() - t0 < 2.5
    assert "crashed with exit code -15. Triggering SIGQUIT" in s.text()


def test_scheduler_crash_takes_the_server_down(stubs):
    s = stubs()
    os.kill(s.state()["scheduler_pid"], signal.SIGKILL)
    assert s.proc.wait(timeout=10) == -signal.SIGKILL
    assert "Subprocess scheduler_0" in s.text() and "SIGQUIT received" in s.text()


# ------------------------------------------------------------------------------------------------ keep-alive
def test_idle_keep_alive_connection_closed_after_timeout(stubs):
    s = stubs(env={"SGLANG_TIMEOUT_KEEP_ALIVE": "1"})
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=5)
    conn.request("GET", "/model_info")
    assert conn.getresponse().read()
    conn.request("GET", "/model_info")                                       # reused within the timeout
    assert conn.getresponse().read()
    time.sleep(1.5)
    conn.sock.settimeout(2)
    assert conn.sock.recv(1) == b""                                          # the server closed it
    conn.close()
