"""tools/sweep and module_utils/verdicts/sweep.py (issue 37): the knee rule on figures whose knee is known, and the whole tool
against one stub worker on loopback whose step-time model puts the knee at a known batch (about 15 s)."""
import json
import re
import signal
import subprocess
import sys
import time

import pytest

from ansible_collections.b300.rollout.plugins.module_utils.verdicts import sweep
from test_sglang_stub import Stub

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "sweep"


def step(c, thr, ttft=100.0, err=0.0):
    return {"concurrency": c, "output_throughput": thr, "p99_ttft_ms": ttft, "error_pct": err}


def test_doubling_steps():
    assert sweep.doubling_steps(32, 512) == [32, 64, 128, 256, 512]      # the seed's steps
    assert sweep.doubling_steps(3, 20) == [3, 6, 12, 20]
    with pytest.raises(ValueError):
        sweep.doubling_steps(64, 32)


def test_percentile_is_numpys_linear():
    # numpy.percentile([1, 2, 3, 4], 50) = 2.5 and (.., 99) = 3.97 (linear between closest ranks)
    assert sweep.percentile([4, 1, 3, 2], 50) == 2.5
    assert abs(sweep.percentile([1, 2, 3, 4], 99) - 3.97) < 1e-9
    assert sweep.percentile([None], 50) is None


def test_the_seeds_curve_backs_off_one_step():
    """The seed (4.3-4.4): 128 -> 256 clearly up, 256 -> 512 a small gain while TTFT more than doubled: keep 256."""
    steps = [step(32, 1000, 300), step(64, 1950, 310), step(128, 3800, 330), step(256, 7000, 400),
             step(512, 7600, 900)]
    k = sweep.find_knee(steps)
    assert k["knee_concurrency"] == 512 and k["recommended_concurrency"] == 256
    assert "throughput x1.09" in k["knee_reason"] and "P99 TTFT x2.25" in k["knee_reason"]


def test_each_rule_fires_alone_and_no_knee_is_flagged():
    linear = [step(8, 100), step(16, 200), step(32, 400)]
    assert sweep.find_knee(linear)["no_knee"] and sweep.find_knee(linear)["recommended_concurrency"] == 32
    ttft = [step(8, 100, 100), step(16, 200, 100), step(32, 400, 210)]
    assert sweep.find_knee(ttft)["knee_concurrency"] == 32 and "TTFT" in sweep.find_knee(ttft)["knee_reason"]
    errors = [step(8, 100), step(16, 200, err=5.0)]
    assert sweep.find_knee(errors)["recommended_concurrency"] == 8
    first = sweep.find_knee([step(8, 100, err=50.0), step(16, 200)])
    assert first["knee_concurrency"] == 8 and first["recommended_concurrency"] is None
    assert "start the sweep lower" in first["knee_reason"]
    assert sweep.plan(None, 2)["lines"][0].startswith("no recommendation")


def test_plan_spreads_over_workers():
    p = sweep.plan(256, 3, "kimi_k3")
    assert p["router_max_concurrent_requests"] == 256 and p["worker_max_running_requests"] == 86
    assert "roles/sglang/files/profiles/kimi_k3.yml: router.args --max-concurrent-requests: 256" in p["lines"]


def test_bad_mix_names_the_task():
    with pytest.raises(ValueError, match="task 'chat' has no 'output_len'"):
        sweep.check_mix("m", {"tasks": [{"name": "chat", "weight": 1, "input_len": 5}]})


def test_a_sweep_longer_than_its_bound_is_refused_before_any_request(tmp_path):
    r = subprocess.run([sys.executable, str(TOOL), "--url", "http://127.0.0.1:9", "--start", "32", "--limit", "512",
                        "--hold", "600", "--max-total", "3000", "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "= 3300 s is over --max-total 3000" in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()


MIX = {"default": "t", "mixes": {"t": {"tasks": [
    {"name": "chat", "weight": 60, "system_len": 16, "input_len": 40, "output_len": 8},
    {"name": "doc", "weight": 40, "system_len": 4, "input_len": 200, "output_len": 8}]}}}


FIXTURE = ROOT / "tests" / "fixtures" / "sweep" / "bench_serving-0.5.17-custom-c2.jsonl"
STUB_SMALL = sweep.check_mix("stub_small", json.loads((ROOT / "tools" / "golive" / "mixes.json").read_text())
                             ["mixes"]["stub_small"])


def test_bench_serving_output_is_read_as_bench_serving_reads_it():
    """A real bench_serving 0.5.17 result (tests/fixtures/sweep/SOURCES.md); the expected values are copied from the
    raw file: total_output_tokens 60, p99_ttft_ms 55.335410810102985, median_tpot_ms 40.663790111117734,
    input_lens [256, 48, 48, 32, ...] (long_document 256, chat 48, Q&A 32 words in stub_small), no errors."""
    res = json.loads(FIXTURE.read_text().splitlines()[-1])
    recs = sweep.bench_records(res, STUB_SMALL)
    assert len(recs) == 8 and all(r["ok"] for r in recs)
    assert [r["task"] for r in recs[:4]] == ["long_document", "multi_turn_chat", "multi_turn_chat", "single_turn_qa"]
    s = sweep.step_summary(2, recs, res["duration"])
    assert s["output_tokens"] == 60
    assert abs(s["p99_ttft_ms"] - 55.335410810102985) < 1e-3      # the report keeps 3 decimals (microseconds)
    assert abs(s["p50_tpot_ms"] - 40.663790111117734) < 0.5     # mean ITL per request vs (latency - ttft) / (n - 1)
    bad = dict(res, errors=["Traceback ...\nClientConnectorError: refused"] + res["errors"][1:])
    first = sweep.bench_records(bad, STUB_SMALL)[0]
    assert not first["ok"] and first["error"] == "ClientConnectorError: refused" and first["output_tokens"] == 0


def test_bench_argv_and_rounds():
    argv = sweep.bench_argv("/v/python", "http://r:30080", "M", "/tok", "/d.jsonl", 64, 16, "/o.jsonl", 42, "t")
    assert argv[:3] == ["/v/python", "-m", "sglang.bench_serving"] and "--flush-cache" not in argv
    for flag, val in (("--dataset-name", "custom"), ("--max-concurrency", "16"), ("--num-prompts", "64"),
                      ("--request-rate", "inf"), ("--warmup-requests", "0"), ("--model", "M")):
        assert argv[argv.index(flag) + 1] == val
    assert sweep.bench_rounds(600, None) == 4 and sweep.bench_rounds(600, 2.0) == 300
    assert sweep.bench_rounds(1, 5.0) == 2


def stub_with_knee(tmp_path, knee):
    # 100 ms a step up to a running batch of `knee`, longer past it (sglang_stub.py StubState.step_s); a step long
    # enough that a scheduling hiccup on a busy 2-core machine does not double a P99 TTFT (the knee rule's 2x)
    return Stub(tmp_path, env={"SGLANG_STUB_STEP_MS": "100", "SGLANG_STUB_KNEE_BATCH": str(knee)})


def test_the_sweep_finds_the_stubs_knee(tmp_path):
    (tmp_path / "mix.json").write_text(json.dumps(MIX))
    s = stub_with_knee(tmp_path, 4)
    try:
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, str(TOOL), "--url", s.url, "--mixes", str(tmp_path / "mix.json"),
                            "--start", "2", "--limit", "16", "--hold", "2.5", "--drain", "8", "--timeout", "20", "--progress", "1",
                            "--workers", "2", "--out", str(tmp_path / "out")], capture_output=True, text=True,
                           timeout=120)
        took = time.monotonic() - t0
    finally:
        s.stop()
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert [x["concurrency"] for x in rep["steps"]] == [2, 4, 8, 16]
    # the stub's throughput stops growing past a batch of 4: the knee is the next step, the recommendation 4
    assert rep["knee"]["knee_concurrency"] == 8 and rep["knee"]["recommended_concurrency"] == 4, rep["knee"]
    assert rep["plan"]["worker_max_running_requests"] == 2
    by = {x["concurrency"]: x for x in rep["steps"]}
    assert all(x["failed"] == 0 and x["ok"] > 0 for x in rep["steps"])
    assert set(by[16]["per_task"]) == {"chat", "doc"}
    # the step time grows with the batch past the knee: 16 running = 4x the step of 4
    assert by[16]["p50_tpot_ms"] > 3 * by[4]["p50_tpot_ms"]
    assert "| 8 (knee) |" in (tmp_path / "out" / "sweep.md").read_text()
    assert (tmp_path / "out" / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert r.stderr.count("] concurrency") == 8          # a start and an end line per step
    assert re.search(r"sweep:   concurrency 16: \d+/2.5 s, \d+ requests done", r.stderr)   # every --progress s
    assert took < 60


def test_ctrl_c_writes_a_partial_report(tmp_path):
    (tmp_path / "mix.json").write_text(json.dumps(MIX))
    s = stub_with_knee(tmp_path, 4)
    try:
        p = subprocess.Popen([sys.executable, str(TOOL), "--url", s.url, "--mixes", str(tmp_path / "mix.json"),
                              "--start", "2", "--limit", "8", "--hold", "30", "--drain", "5",
                              "--out", str(tmp_path / "out")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        time.sleep(2.5)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    finally:
        s.stop()
    assert p.returncode == 130, err
    rep = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert rep["interrupted"] and rep["steps"] == [] and rep["partial_step"]["concurrency"] == 2
    assert "INTERRUPTED" in (tmp_path / "out" / "sweep.md").read_text()
