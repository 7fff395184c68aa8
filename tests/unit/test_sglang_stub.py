"""sglang-stub (sandbox/sglang_stub): catalog-based argv parsing and the HTTP API, on 127.0.0.1 only.

The stub is a TEST DOUBLE; its accept/refuse parity with the real parser is proven in tests/parser. Here: its own
behaviour (parsing, endpoints, PD bootstrap recording, fault knobs, latency, graceful SIGTERM).
"""
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
STUB_DIR = ROOT / "sandbox" / "sglang_stub"
BIN = STUB_DIR / "bin"
sys.path.insert(0, str(STUB_DIR))
sys.path.insert(0, str(ROOT / "tools" / "sglang_argcheck"))
import sglang_stub as st  # noqa: E402
import seed_commands  # noqa: E402


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
        with pytest.raises(Exception):
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


class Stub:
    def __init__(self, tmp_path, args=(), env=None, version="0.5.18", wait_healthy=True):
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.ctl = tmp_path / ("ctl-%d" % self.port)
        self.log = open(tmp_path / ("stub-%d.log" % self.port), "wb")
        e = dict(os.environ, SGLANG_STUB_LOAD_SECONDS="0.3", SGLANG_STUB_CONTROL_DIR=str(self.ctl))
        e.update(env or {})
        argv = [str(BIN / ("sglang-%s" % version)), "serve", "--model-path", "/models/M", "--served-model-name",
                "M", "--host", "127.0.0.1", "--port", str(self.port), "--enable-metrics"] + list(args)
        self.proc = subprocess.Popen([sys.executable] + argv, stdout=self.log, stderr=subprocess.STDOUT, env=e)
        self.wait_listening()
        if wait_healthy:
            self.wait(lambda: http("GET", self.url + "/health", timeout=2)[0] == 200, 20)

    def wait_listening(self, timeout=20):
        def up():
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        self.wait(up, timeout)

    def wait(self, pred, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None or pred is None, "stub exited rc=%s" % self.proc.returncode
            try:
                if pred():
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError("timeout")

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


def test_health_during_load_then_ready_and_info_endpoints(stubs):
    s = stubs(env={"SGLANG_STUB_LOAD_SECONDS": "1.5"}, wait_healthy=False)
    assert http("GET", s.url + "/health")[0] == 503
    code, body, _ = http("POST", s.url + "/v1/chat/completions", {"messages": []})
    assert code == 503
    s.wait(lambda: http("GET", s.url + "/health")[0] == 200, 20)
    code, body, _ = http("GET", s.url + "/health")
    assert (code, body) == (200, "")
    for path in ("/server_info", "/get_server_info"):
        code, body, _ = http("GET", s.url + path)
        info = json.loads(body)
        assert code == 200 and info["served_model_name"] == "M" and info["version"] == "0.5.18"
        assert info["tp_size"] == 1 and info["dp_size"] == 1 and info["disaggregation_mode"] == "null"
        assert "model_path" not in info and "tokenizer_path" not in info
    for path in ("/model_info", "/get_model_info"):
        info = json.loads(http("GET", s.url + path)[1])
        assert "model_path" not in info and info["architectures"]
    models = json.loads(http("GET", s.url + "/v1/models")[1])
    assert [m["id"] for m in models["data"]] == ["M"]
    load = json.loads(http("GET", s.url + "/get_load")[1])
    assert load == [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}]
    assert http("POST", s.url + "/flush_cache")[0] == 200
    assert http("GET", s.url + "/no/such/path")[0] == 404
    assert http("GET", s.url + "/health_generate")[0] == 200


def test_inference_endpoints_answer_names_instance(stubs):
    s = stubs(args=["--tp-size", "4", "--dp-size", "2"])
    expected = "stub M on 127.0.0.1:%d (sglang 0.5.18, null)" % s.port
    code, body, _ = http("POST", s.url + "/v1/chat/completions",
                         {"model": "unknown", "messages": [{"role": "user", "content": "hi there"}],
                          "max_completion_tokens": 5, "separate_reasoning": True, "whatever_new_field": [1]})
    chat = json.loads(body)
    assert code == 200 and chat["object"] == "chat.completion"
    assert chat["choices"][0]["message"]["content"] == expected
    assert chat["usage"]["completion_tokens"] == len(expected.split())
    code, body, _ = http("POST", s.url + "/v1/completions", {"model": "M", "prompt": "hi"})
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
    code, body, _ = http("POST", s.url + "/generate", headers={"Content-Type": "application/json"},
                         body=None)
    assert code == 200
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
    assert http("GET", s.url + "/health")[0] == 200                       # health stays open
    assert http("POST", s.url + "/generate", {"text": "x"})[0] == 401
    auth = {"Authorization": "Bearer sekrit"}
    assert http("POST", s.url + "/generate", {"text": "x"}, headers=auth)[0] == 200
    req = urllib.request.Request(s.url + "/generate", data=b"{not json", method="POST", headers=auth)
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, timeout=5)
    assert exc.value.code == 400


def test_pd_prefill_bootstrap_listener_and_recording(stubs):
    bport = free_port()
    p = stubs(args=["--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(bport)])
    d = stubs(args=["--disaggregation-mode", "decode"])
    with socket.create_connection(("127.0.0.1", bport), timeout=2):
        pass
    assert http("GET", "http://127.0.0.1:%d/health" % bport)[0] == 200
    body = {"text": "q", "bootstrap_room": 1234567890123, "bootstrap_host": "127.0.0.1", "bootstrap_port": bport}
    code, pbody, _ = http("POST", p.url + "/generate", body)
    assert code == 200 and json.loads(pbody)["text"] == ""                  # prefill: 2xx, no answer
    code, dbody, _ = http("POST", d.url + "/generate", body)
    assert json.loads(dbody)["text"].endswith("(sglang 0.5.18, decode)")
    for s in (p, d):
        last = json.loads(http("GET", s.url + "/stub/last_requests")[1])
        assert last["last_bootstrap"] == {"bootstrap_room": 1234567890123, "bootstrap_host": "127.0.0.1",
                                          "bootstrap_port": bport}
    info = json.loads(http("GET", p.url + "/server_info")[1])
    assert info["disaggregation_mode"] == "prefill" and info["disaggregation_bootstrap_port"] == bport


def test_fault_knobs_via_control_dir(stubs):
    s = stubs()
    s.control("fault", "error500")
    code, body, _ = http("POST", s.url + "/v1/chat/completions", {"messages": []})
    assert code == 500 and json.loads(body) == {"error": "stub forced 500"}
    assert http("GET", s.url + "/health_generate")[0] == 503
    s.control("fault", "unhealthy")
    assert http("GET", s.url + "/health")[0] == 503
    s.control("fault", "hang")
    result = {}

    def call():
        result["r"] = http("POST", s.url + "/generate", {"text": "x"}, timeout=20)

    t = threading.Thread(target=call)
    t.start()
    time.sleep(1.0)
    assert t.is_alive(), "a hung request must not return while the fault is set"
    s.control("fault", None)
    t.join(10)
    assert not t.is_alive() and result["r"][0] == 200
    assert http("GET", s.url + "/health")[0] == 200
    state = json.loads(http("GET", s.url + "/stub/state")[1])
    assert state["faults"] == [] and state["healthy"] is True


def test_unhealthy_after_restart_spares_the_running_process(stubs):
    """`unhealthy_after_restart`: the process that runs when the fault is armed stays healthy (a rollout's
    pre-checks see a healthy fleet); a process started afterwards on the same control dir never answers /health."""
    s = stubs()
    time.sleep(1.1)                  # file mtimes have 1 s resolution on some filesystems
    s.control("fault", "unhealthy_after_restart")
    assert http("GET", s.url + "/health")[0] == 200
    later = stubs(env={"SGLANG_STUB_CONTROL_DIR": str(s.ctl)}, wait_healthy=False)
    time.sleep(0.8)                  # past its 0.3 s load
    assert http("GET", later.url + "/health")[0] == 503
    assert "unhealthy" in json.loads(http("GET", later.url + "/stub/state")[1])["faults"]
    assert http("GET", s.url + "/health")[0] == 200


def test_env_faults_never_healthy_and_die_after_load(tmp_path, stubs):
    s = stubs(env={"SGLANG_STUB_FAULT": "unhealthy"}, wait_healthy=False)
    time.sleep(0.8)
    assert http("GET", s.url + "/health")[0] == 503
    port = free_port()
    proc = subprocess.run([sys.executable, str(BIN / "sglang-0.5.17"), "serve", "--model-path", "/m", "--host",
                           "127.0.0.1", "--port", str(port)], capture_output=True, text=True, timeout=30,
                          env=dict(os.environ, SGLANG_STUB_FAULT="die_after_load", SGLANG_STUB_LOAD_SECONDS="0.2",
                                   SGLANG_STUB_CONTROL_DIR=str(tmp_path / "die")))
    assert proc.returncode == 1 and "die_after_load" in proc.stderr
    assert "THIS IS A TEST DOUBLE" in proc.stderr


def test_latency_and_graceful_sigterm_finishes_inflight(stubs):
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
    time.sleep(0.5)
    state = json.loads(http("GET", s.url + "/stub/state")[1])
    assert state["inflight"] == 2
    load = json.loads(http("GET", s.url + "/get_load")[1])
    assert load[0]["num_reqs"] == 2 and load[0]["num_tokens"] > 0
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    with pytest.raises(OSError):                                    # no new connections while draining
        socket.create_connection(("127.0.0.1", s.port), timeout=1).close()
    for t in threads:
        t.join(15)
    assert s.proc.wait(timeout=15) == 0
    assert sorted(r[0] for r in results) == [200, 200], results
    assert all(r[1] >= 1.4 for r in results), [r[1] for r in results]
    assert any("data: [DONE]" in r[2] for r in results)
