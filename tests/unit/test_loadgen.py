"""tools/loadgen.py: target guard, bounds, summary maths, and a bounded run against a loopback stub server."""
import json
import pathlib
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import loadgen

ROOT = pathlib.Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------------ guard
@pytest.mark.parametrize("url", [
    "http://127.0.0.1:30000", "http://127.5.6.7:1", "http://localhost:30080", "http://[::1]:30000",
    "http://10.89.30.11:30080", "http://10.89.30.254:8000/", "https://10.89.30.12:443",
])
def test_allowed_targets(url):
    loadgen.check_target(url)


@pytest.mark.parametrize("url", [
    "http://10.89.31.11:30080", "http://10.0.0.1:30000", "http://192.168.1.10:30000", "http://172.16.0.1:1",
    "http://8.8.8.8:80", "http://[2001:db8::1]:80", "ftp://127.0.0.1/", "http:///nohost", "http://0.0.0.0:30000",
])
def test_refused_targets(url):
    with pytest.raises(loadgen.TargetRefused):
        loadgen.check_target(url)


def test_hostname_must_resolve_only_to_allowed_addresses():
    def resolver(addrs):
        return lambda host, port, *a: [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (x, port)) for x in addrs]

    loadgen.check_target("http://b300a:30000", resolver=resolver(["10.89.30.11"]))
    with pytest.raises(loadgen.TargetRefused):
        loadgen.check_target("http://b300a:30000", resolver=resolver(["10.89.30.11", "93.184.216.34"]))
    with pytest.raises(loadgen.TargetRefused):
        loadgen.check_target("http://gpu-prod:30000", resolver=resolver(["10.1.2.3"]))

    def failing(*_a):
        raise OSError("no such host")

    with pytest.raises(loadgen.TargetRefused):
        loadgen.check_target("http://nowhere:1", resolver=failing)


def test_refused_target_sends_nothing_and_exits_2(capsys):
    assert loadgen.main(["--url", "http://192.0.2.1:30000", "--requests", "5", "--duration", "5"]) == 2
    assert "refused" in capsys.readouterr().err
    with pytest.raises(loadgen.TargetRefused):
        loadgen.run("http://192.0.2.1:30000", 5, 5, 1)


# ------------------------------------------------------------------------------------------------ bounds
@pytest.mark.parametrize("args", [
    (0, 10, 1, 5), (loadgen.MAX_REQUESTS + 1, 10, 1, 5), (10, 0, 1, 5), (10, float("inf"), 1, 5),
    (10, loadgen.MAX_DURATION_S + 1, 1, 5), (10, 10, 0, 5), (10, 10, loadgen.MAX_CONCURRENCY + 1, 5),
    (10, 10, 1, 0), (10, 10, 1, float("nan")),
])
def test_bounds_refused(args):
    with pytest.raises(ValueError):
        loadgen.check_bounds(*args)


def test_main_rejects_unbounded_arguments(capsys):
    assert loadgen.main(["--url", "http://127.0.0.1:1", "--requests", "10", "--duration", "inf"]) == 2
    assert loadgen.main(["--url", "http://127.0.0.1:1", "--requests", "0", "--duration", "5"]) == 2
    with pytest.raises(SystemExit):   # both bounds are required
        loadgen.main(["--url", "http://127.0.0.1:1", "--requests", "10"])
    capsys.readouterr()


# ------------------------------------------------------------------------------------------------ maths
def test_percentile_nearest_rank():
    vals = list(range(1, 101))
    assert loadgen.percentile(vals, 50) == 50
    assert loadgen.percentile(vals, 95) == 95
    assert loadgen.percentile(vals, 99) == 99
    assert loadgen.percentile([3.0], 99) == 3.0
    assert loadgen.percentile([], 50) is None


def test_summarize_counts_windows_and_workers():
    recs = [
        {"seq": 0, "t_start": 0.1, "latency_s": 0.2, "ok": True, "status": 200, "error": None, "worker": "a:1"},
        {"seq": 1, "t_start": 0.5, "latency_s": 0.4, "ok": True, "status": 200, "error": None, "worker": "b:1"},
        {"seq": 2, "t_start": 1.2, "latency_s": 0.1, "ok": False, "status": 503, "error": "HTTP 503", "worker": None},
        {"seq": 3, "t_start": 2.7, "latency_s": 3.0, "ok": False, "status": None,
         "error": "ConnectionRefusedError: [Errno 111]", "worker": None},
        {"seq": 4, "t_start": 2.9, "latency_s": 0.3, "ok": True, "status": 200, "error": None, "worker": "a:1"},
    ]
    s = loadgen.summarize(recs, window_s=1.0)
    assert (s["sent"], s["ok"], s["failed"]) == (5, 3, 2)
    assert s["errors"] == {"http_503": 1, "ConnectionRefusedError": 1}
    assert s["workers"] == {"a:1": 2, "b:1": 1}
    assert s["latency_s"]["p50"] == 0.3 and s["latency_s"]["max"] == 0.4
    assert [(w["sent"], w["ok"], w["failed"]) for w in s["windows"]] == [(2, 2, 0), (1, 0, 1), (2, 1, 1)]
    assert s["windows"][0]["workers"] == {"a:1": 1, "b:1": 1}


def test_parse_answer_and_stream_text():
    assert loadgen.parse_answer("stub Kimi-K3 on b300a:30000 (sglang 0.5.18, null)") == {
        "worker": "b300a:30000", "worker_mode": "null", "worker_version": "0.5.18"}
    assert loadgen.parse_answer("a real model's answer")["worker"] is None
    sse = ('data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
           'data: {"choices":[{"delta":{"content":"stub M"}}]}\n\n'
           'data: {"choices":[{"delta":{"content":" on h:1 (sglang 0.5.17, decode)"}}]}\n\n'
           'data: {"choices":[],"usage":{}}\n\ndata: [DONE]\n\n')
    assert loadgen.extract_text(sse, True) == "stub M on h:1 (sglang 0.5.17, decode)"


def test_reasoning_only_answers_count_as_answers():
    """SGLang with a reasoning parser answers a short chat with content "" and the text in reasoning_content
    (serving_chat.py 17:1836-1843); tests/parser/test_roles_contract.py builds these with the real classes."""
    full = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": "",
                                                             "reasoning_content": "The user wants", "tool_calls": None},
                                    "finish_reason": "length"}]})
    assert loadgen.extract_answer(full, False) == ("", "The user wants")
    assert loadgen.extract_text(full, False) == "The user wants"
    both = json.dumps({"choices": [{"message": {"content": "Hello!", "reasoning_content": "think"}}]})
    assert loadgen.extract_text(both, False) == "Hello!"
    sse = ('data: {"choices":[{"delta":{"role":"assistant","content":null,"reasoning_content":"The user"}}]}\n\n'
           'data: {"choices":[{"delta":{"content":null,"reasoning_content":" wants"}}]}\n\ndata: [DONE]\n\n')
    assert loadgen.extract_answer(sse, True) == ("", "The user wants")
    empty = json.dumps({"choices": [{"message": {"content": "", "reasoning_content": None}}]})
    assert loadgen.extract_text(empty, False) == ""


def test_one_request_records_where_the_answer_was(monkeypatch):
    bodies = [json.dumps({"choices": [{"message": {"content": "", "reasoning_content": "hmm"}}]}),
              json.dumps({"choices": [{"message": {"content": "", "reasoning_content": None}}]})]

    class Resp:
        status = 200

        def __init__(self, b):
            self.b = b

        def read(self):
            return self.b.encode()

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False
    sent = []

    def urlopen(req, timeout):
        sent.append(json.loads(req.data))
        return Resp(bodies.pop(0))
    monkeypatch.setattr(loadgen.urllib.request, "urlopen", urlopen)
    rec = loadgen.one_request("http://127.0.0.1:1", 0, time.monotonic(), 5, False, "m", "p", {})
    assert rec["ok"] and rec["answer_in"] == "reasoning_content" and rec["error"] is None
    rec = loadgen.one_request("http://127.0.0.1:1", 1, time.monotonic(), 5, False, "m", "p", {}, loadgen.NO_THINKING)
    assert "chat_template_kwargs" not in sent[0]
    assert sent[1]["chat_template_kwargs"] == {"thinking": False, "enable_thinking": False}
    assert not rec["ok"] and rec["answer_in"] is None and rec["error"].startswith("empty answer")
    assert loadgen.summarize([dict(rec, ok=True, answer_in="reasoning_content", latency_s=0.1)])[
        "answers_in_reasoning_content"] == 1


# ------------------------------------------------------------------------------------------------ runs
class _Fake(BaseHTTPRequestHandler):
    delay = 0.0
    calls = 0
    lock = threading.Lock()

    def log_message(self, *a):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with _Fake.lock:
            _Fake.calls += 1
            n = _Fake.calls
        time.sleep(_Fake.delay)
        if n % 5 == 0:
            body, code = b'{"error": "stub forced 500"}', 500
        else:
            text = "stub M on 127.0.0.1:%d (sglang 0.5.18, null)" % (1000 + n % 2)
            body, code = json.dumps({"choices": [{"message": {"content": text}}]}).encode(), 200
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture()
def fake_server():
    _Fake.calls, _Fake.delay = 0, 0.0
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Fake)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield "http://127.0.0.1:%d" % srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def test_count_bound(fake_server, tmp_path):
    out, summ = tmp_path / "r.jsonl", tmp_path / "s.json"
    rc = loadgen.main(["--url", fake_server, "--requests", "20", "--duration", "30", "--concurrency", "4",
                       "--out", str(out), "--summary", str(summ)])
    assert rc == 0
    lines = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert len(lines) == 20 == _Fake.calls
    s = json.loads(summ.read_text())
    assert (s["sent"], s["ok"], s["failed"]) == (20, 16, 4)
    assert s["errors"] == {"http_500": 4}
    assert set(s["workers"]) == {"127.0.0.1:1000", "127.0.0.1:1001"}
    assert all(r["latency_s"] >= 0 for r in lines)
    assert loadgen.main(["--url", fake_server, "--requests", "5", "--duration", "30", "--fail-on-error"]) == 1


def test_time_bound(fake_server):
    _Fake.delay = 0.2
    t0 = time.monotonic()
    recs = loadgen.run(fake_server, requests=10000, duration=1.0, concurrency=2, timeout=5)
    elapsed = time.monotonic() - t0
    assert elapsed < 1.0 + 0.2 + 1.0, elapsed           # duration + one request + slack
    assert 2 <= len(recs) <= 14, len(recs)              # ~ 2 workers x 1 s / 0.2 s
    assert max(r["t_start"] for r in recs) < 1.0


def test_rate_pacing(fake_server):
    recs = loadgen.run(fake_server, requests=6, duration=10, concurrency=6, timeout=5, rps=5)
    starts = sorted(r["t_start"] for r in recs)
    assert len(recs) == 6 and starts[-1] >= 0.9, starts    # 6 starts at 5/s: the last at about 1.0 s


def test_connection_errors_recorded():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    recs = loadgen.run("http://127.0.0.1:%d" % port, requests=3, duration=5, concurrency=1, timeout=2)
    assert len(recs) == 3 and all(not r["ok"] and r["status"] is None for r in recs)
    assert all("Connection" in r["error"] or "refused" in r["error"] for r in recs), recs
