"""module_utils/sglang/sglang_metrics.py (the ONE /metrics reader) and roles/acceptance/files/acceptance_client.py (API key
handling, flush retries, warm-up), without a server.

The exposition texts below follow what prometheus_client 0.26 writes for SGLang's TokenizerMetricsCollector
(tests/parser/test_real_contract.py runs the REAL collector of 0.5.17/0.5.18 and reads its real text with the same
reader; these are the fast, dependency-free cases).
"""
import io
import json
import math
import pathlib

import pytest

from ansible_collections.b300.rollout.plugins.module_utils.sglang import sglang_metrics as sm

import acceptance_client as client

ROOT = pathlib.Path(__file__).resolve().parents[2]

MODEL = 'Kimi "K3" {a,b}=c\\d\ne'
# single-process exposition of prometheus_client: HELP/TYPE, _total and _created, escaped label values, exponents
TEXT = """# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{engine_type="unified",is_streaming="false",model_name="Kimi \\"K3\\" {a,b}=c\\\\d\\ne"} 1.5e+06
sglang:prompt_tokens_total{engine_type="unified",is_streaming="true",model_name="Kimi \\"K3\\" {a,b}=c\\\\d\\ne"} 4096.0
# HELP sglang:prompt_tokens_created Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_created gauge
sglang:prompt_tokens_created{engine_type="unified",is_streaming="false",model_name="Kimi \\"K3\\" {a,b}=c\\\\d\\ne"} 1.7961764220495524e+09
# HELP sglang:cached_tokens_total Number of cached prompt tokens by source (device/host/storage).
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{cache_source="device",engine_type="unified",model_name="Kimi \\"K3\\" {a,b}=c\\\\d\\ne"} 1.234567e+06
sglang:cached_tokens_total{cache_source="host",engine_type="unified",model_name="Kimi \\"K3\\" {a,b}=c\\\\d\\ne"} 3008.0
sglang:cached_tokens_total{cache_source="storage_HiCacheFile",engine_type="unified",model_name="Kimi \\"K3\\" {a,b}=c\\\\d\\ne"} 3072.0
sglang:cached_tokens_created{cache_source="device",engine_type="unified",model_name="Kimi \\"K3\\" {a,b}=c\\\\d\\ne"} 1.796176422050012e+09
# HELP sglang:realtime_tokens_total Total number of tokens processed (updated on each log interval).
# TYPE sglang:realtime_tokens_total counter
sglang:realtime_tokens_total{engine_type="unified",mode="prefill_compute",model_name="K",pp_rank="0",tp_rank="0"} 100.0
sglang:realtime_tokens_total{engine_type="unified",mode="decode",model_name="K",pp_rank="0",tp_rank="0"} 2.5e+03
sglang:num_requests_total{engine_type="unified",is_streaming="true",model_name="K"} 7.0 1712345678000
sglang:gen_throughput{engine_type="unified"} NaN
sglang:max_total_num_tokens{engine_type="unified"} +Inf
"""


def test_parse_unescapes_labels_and_reads_exponents_timestamps_inf_nan():
    s = sm.parse(TEXT)
    cached = [(lab, v) for n, lab, v in s if n == sm.CACHED_TOKENS]
    assert cached[0][0] == {"cache_source": "device", "engine_type": "unified", "model_name": MODEL}
    assert cached[0][1] == 1234567.0
    assert [v for n, _, v in s if n == sm.NUM_REQUESTS] == [7.0]            # the timestamp is not the value
    assert [v for n, _, v in s if n == "sglang:max_total_num_tokens"] == [math.inf]
    assert math.isnan([v for n, _, v in s if n == "sglang:gen_throughput"][0])
    assert not any(n.startswith("#") for n, _, _ in s)


def test_cached_tokens_sum_every_source_never_created():
    s = sm.parse(TEXT)
    assert sm.cached_tokens(s, "unified") == 1234567 + 3008 + 3072
    assert sm.cached_tokens_by_source(s) == {"device": 1234567.0, "host": 3008.0, "storage_HiCacheFile": 3072.0}
    assert sm.counter_sum(s, sm.PROMPT_TOKENS, "unified") == 1504096       # _created is a timestamp, not counted
    assert sm.cached_tokens(s, "prefill") == 0                               # another engine type


def test_label_order_trailing_comma_and_no_label_series():
    text = ('sglang:cached_tokens_total{model_name="m",cache_source="host",engine_type="prefill",} 5\n'
            'sglang:cached_tokens_total 7\n'                                  # an old server without labels
            'sglang:cached_tokens_total{engine_type="prefill", cache_source="device"} 11\n')
    assert sm.cached_tokens(sm.parse(text), "prefill") == 23


def test_series_absent_until_first_observation_reads_zero():
    text = "# HELP sglang:cached_tokens_total Number of cached prompt tokens.\n# TYPE sglang:cached_tokens_total counter\n"
    assert sm.cached_tokens(sm.parse(text)) == 0
    assert sm.summarize(text) == {}
    assert sm.parse("# scrape failed: [Errno 111] Connection refused\n") == []


def test_malformed_lines_are_skipped_not_fatal():
    text = ('sglang:cached_tokens_total{cache_source="device" 5\n'              # unterminated label set
            'sglang:cached_tokens_total{cache_source="device"}\n'              # no value
            'sglang:cached_tokens_total{cache_source="device"} 3\n')
    assert sm.cached_tokens(sm.parse(text)) == 3
    with pytest.raises(ValueError):
        sm.parse_line('x{a="b} 1')


def test_summarize_filters_realtime_to_decode():
    out = sm.summarize(TEXT)
    assert out[sm.REALTIME_TOKENS] == 2500
    assert out[sm.CACHED_TOKENS] == 1234567 + 3008 + 3072
    assert out[sm.NUM_REQUESTS] == 7
    assert client.summarize({"u": TEXT}) == {"u": out}


def test_the_client_imports_the_collection_reader_and_the_role_ships_it():
    """One reader: the client imports sglang_metrics (no copy under roles/), and roles/acceptance copies the
    collection's module_utils file next to it."""
    assert pathlib.Path(client.sglang_metrics.__file__).resolve() == pathlib.Path(sm.__file__).resolve()
    assert not (ROOT / "roles" / "acceptance" / "files" / "sglang_metrics.py").exists()
    tasks = (ROOT / "roles" / "acceptance" / "tasks" / "main.yml").read_text()
    assert "collections/ansible_collections/b300/rollout/plugins/module_utils/sglang/sglang_metrics.py" in tasks
    assert "dest: sglang_metrics.py" in tasks


# ------------------------------------------------------------------------------------------------ client: key
def test_key_from_stdin_never_in_spec_and_handed_to_bench_as_openai_api_key(monkeypatch):
    monkeypatch.setenv("API_KEY", "stale")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    spec = {"api_key_stdin": True, "env": {"HF_HUB_OFFLINE": "1"}}
    key = client.read_key(spec, io.StringIO("sk-secret\n"))
    assert key == "sk-secret"
    env = client.child_env(spec, key)
    assert env["OPENAI_API_KEY"] == "sk-secret" and "API_KEY" not in env and env["HF_HUB_OFFLINE"] == "1"
    assert "OPENAI_API_KEY" not in client.child_env(spec, None)
    monkeypatch.setenv("OPENAI_API_KEY", "from-env")
    assert client.read_key({}) == "from-env"


def test_plan_spec_holds_no_key_and_refuses_secret_env():
    from ansible_collections.b300.rollout.plugins.module_utils.verdicts import acceptance as acc
    plan = {"mode": "regular", "served_model_name": "K", "router": {"url": "http://r:1", "args": []},
            "instances": [{"id": "w0", "url": "http://w:1", "role": "worker", "host": "a"}]}
    seed = {"input_len": 4096, "output_len": 64, "hit_rate": 0.8, "groups": 3, "prompts_per_group": 20,
            "request_rate": 9, "max_concurrency": 8, "output_throughput": 1.0}
    rp = acc.plan_run(plan, seed, 1.0, "py", "/t", "/runs/x", "t", flush={"attempts": 2})
    assert rp["spec"]["flush"] == {"timeout_s": 10.0, "attempts": 2, "pause_s": 5.0}
    assert rp["spec"]["router_url"] == "http://r:1"
    assert not any("key" in k.lower() for k in json.dumps(rp["spec"]["env"]).split('"'))
    for bad in ({"OPENAI_API_KEY": "x"}, {"HF_TOKEN": "x"}, {"api_key": "x"}):
        with pytest.raises(ValueError, match="secret"):
            acc.plan_run(plan, seed, 1.0, "py", "/t", "/runs/x", "t", client_env=bad)
    with pytest.raises(ValueError, match="unknown"):
        acc.plan_run(plan, seed, 1.0, "py", "/t", "/runs/x", "t", flush={"retries": 3})


def test_role_gives_the_key_on_stdin_not_environment_nor_spec():
    tasks = (ROOT / "roles" / "acceptance" / "tasks" / "main.yml").read_text()
    start = tasks[tasks.index("- name: Acceptance | start the client"):]
    start = start[:start.index("\n- name:")]
    assert "stdin:" in start and "sglang_api_key" in start and "no_log:" in start
    assert "environment:" not in start
    spec_task = tasks[tasks.index("- name: Acceptance | spec"):]
    spec_task = spec_task[:spec_task.index("\n- name:")]
    assert "sglang_api_key" not in spec_task and "api_key_stdin" in spec_task


# ------------------------------------------------------------------------------------------------ client: flush
class FakeHTTP:
    def __init__(self, answers):
        self.answers = list(answers)
        self.calls = []

    def __call__(self, method, url, key=None, timeout=30, body=None):
        self.calls.append((method, url, key, timeout))
        a = self.answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a


BUSY = (400, "Cache not flushed because there are pending requests.")


def test_flush_retries_while_busy_then_succeeds(monkeypatch):
    fake = FakeHTTP([BUSY, OSError("connection reset"), (200, "Cache flushed.\n")])
    monkeypatch.setattr(client, "http", fake)
    slept = []
    out = client.flush_one({"id": "P0", "url": "http://h:30001"}, "k", timeout_s=10, attempts=5, pause_s=2,
                           sleep=slept.append)
    assert out["status"] == 200 and out["attempts"] == 3 and slept == [2, 2]
    assert fake.calls[0][:3] == ("POST", "http://h:30001/flush_cache?timeout=10", "k")
    assert fake.calls[0][3] > 10                                    # the HTTP timeout outlives the server's wait


def test_flush_gives_up_naming_the_worker(monkeypatch):
    monkeypatch.setattr(client, "http", FakeHTTP([BUSY] * 3))
    with pytest.raises(client.FlushError) as exc:
        client.flush_one({"id": "P1", "url": "http://h:30002"}, None, timeout_s=1, attempts=3, pause_s=0,
                         sleep=lambda s: None)
    msg = str(exc.value)
    for part in ("P1", "http://h:30002", "3 attempt(s)", "400", "pending requests", "never became idle", "Fix:"):
        assert part in msg, (part, msg)


def test_flush_does_not_retry_a_refused_key(monkeypatch):
    fake = FakeHTTP([(401, "Unauthorized")])
    monkeypatch.setattr(client, "http", fake)
    with pytest.raises(client.FlushError, match="refused the API key"):
        client.flush_one({"id": "w0", "url": "http://h:1"}, "bad", attempts=6, sleep=lambda s: None)
    assert len(fake.calls) == 1


def test_run_stops_before_bench_when_a_flush_gives_up(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(client, "http", FakeHTTP([(200, "{}")] + [BUSY] * 2))
    monkeypatch.setattr(client.time, "sleep", lambda s: None)
    started = []
    monkeypatch.setattr(client.subprocess, "Popen", lambda *a, **k: started.append(a))
    spec = {"outdir": str(tmp_path), "argv": ["bench"], "workers": [{"id": "D0", "url": "http://h:2", "role": "decode"}],
            "router_url": "http://r:1", "total": 60, "flush": {"timeout_s": 1, "attempts": 2, "pause_s": 0}}
    assert client.run(spec, "sk-secret") == client.EXIT_FLUSH
    assert not started
    result = json.loads((tmp_path / "result.json").read_text())
    assert "D0" in result["error"] and "http://h:2" in result["error"]
    assert json.loads((tmp_path / "progress.json").read_text())["finished"]
    err = capsys.readouterr().err
    assert "D0" in err and "sk-secret" not in err
    assert not any("sk-secret" in p.read_text() for p in tmp_path.iterdir())


def test_warmup_401_stops_with_the_fix(monkeypatch):
    monkeypatch.setattr(client, "http", FakeHTTP([(401, "")]))
    with pytest.raises(client.WarmupError, match="no API key was given"):
        client.warm_up({"router_url": "http://r:1"}, None, sleep=lambda s: None)
    monkeypatch.setattr(client, "http", FakeHTTP([(500, "x"), (200, "{}")]))
    assert client.warm_up({"router_url": "http://r:1"}, "k", sleep=lambda s: None)["attempts"] == 2


STUB_CONTRACT = ROOT / "sandbox" / "sglang_stub" / "contract"


@pytest.mark.parametrize("name", sorted(p.name for p in STUB_CONTRACT.glob("metrics-*.txt")))
def test_real_collector_files_of_the_stub_contract(name):
    """sandbox/sglang_stub/contract/metrics-<ver>-<mode>.txt: multiprocess exposition written by the REAL
    metrics_collector.py of each version (real_metrics.py there: requests fed with cached 100 as device 60 + host
    40, cached 3 without details, and a miss). Our reader counts 103 cached of 122 prompt tokens, and the
    decode-mode realtime tokens (7); the kv transfer sum only on a prefill."""
    text = (STUB_CONTRACT / name).read_text()
    s = sm.parse(text)
    assert sm.cached_tokens_by_source(s) == {"device": 60.0, "host": 40.0, "total": 3.0}
    assert sm.cached_tokens(s) == 103
    assert sm.counter_sum(s, sm.PROMPT_TOKENS) == 122 and sm.counter_sum(s, sm.NUM_REQUESTS) == 3
    assert sm.summarize(text)[sm.REALTIME_TOKENS] == 7
    kv = sm.counter_sum(s, sm.KV_TRANSFER_MB_SUM)
    assert (kv == pytest.approx(0.4)) if "prefill" in name else kv == 0


def test_stub_contract_files_exist_for_both_versions():
    names = {p.name for p in STUB_CONTRACT.glob("metrics-*.txt")}
    assert {"metrics-%s-%s.txt" % (v, m) for v in ("0.5.17", "0.5.18") for m in ("null", "prefill", "decode")} <= names
