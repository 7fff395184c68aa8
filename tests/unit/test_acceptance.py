"""roles/acceptance arithmetic: shapes, bench argv, counters, online P95, RDMA bytes, one test per verdict."""
import json

import pytest

from ansible_collections.b300.rollout.plugins.module_utils.verdicts import acceptance as acc

GLM = {"input_len": 65536, "output_len": 1024, "hit_rate": 0.77, "groups": 25, "prompts_per_group": 20,
       "request_rate": 9, "max_concurrency": 64, "output_throughput": 4740.90}
KIMI = {"input_len": 128000, "output_len": 1024, "hit_rate": 0.8198, "groups": 25, "prompts_per_group": 20,
        "request_rate": 9, "max_concurrency": 80, "output_throughput": 1210.81}


def test_seed_shapes_match_the_facts_table():
    g = acc.scaled_shape(GLM)
    assert (g["system_prompt_len"], g["question_len"], g["num_requests"]) == (53120, 12416, 500)
    k = acc.scaled_shape(KIMI)
    assert (k["system_prompt_len"], k["question_len"]) == (110464, 17536)
    assert abs(k["predicted_hit"] - 0.8198) < 0.0005


def test_scaled_shape_keeps_hit_rate_and_rate():
    s = acc.scaled_shape(GLM, 0.05)
    assert s["input_len"] == 3276 and s["groups"] == 3 and s["num_requests"] == 60
    assert abs(s["predicted_hit"] - 0.77) < 0.005
    assert s["request_rate"] == 9 and s["max_concurrency"] == 64
    with pytest.raises(ValueError):
        acc.scaled_shape(GLM, 0)
    with pytest.raises(ValueError):
        acc.gsp_shape(1000, 10, 0.97, 3, 20)


def test_bench_argv_native_backend_gsp_no_fast_prepare():
    argv = acc.bench_argv("py", acc.scaled_shape(GLM), "http://r:30080", "m", "/tok", "o.jsonl", "t")
    assert argv[argv.index("--backend") + 1] == "sglang"
    assert argv[argv.index("--dataset-name") + 1] == "generated-shared-prefix"
    assert "--cache-report" in argv and argv[argv.index("--warmup-requests") + 1] == "0"
    # bench_serving's own flush is one unretried POST through the router: the client flushes each worker instead
    assert "--flush-cache" not in argv
    with pytest.raises(ValueError):
        acc.bench_argv("py", acc.scaled_shape(GLM), "u", "m", "t", "o", "t", extra=["--gsp-fast-prepare"])
    with pytest.raises(ValueError, match="busy worker"):
        acc.bench_argv("py", acc.scaled_shape(GLM), "u", "m", "t", "o", "t", extra=["--flush-cache"])


def test_parse_bench_output_last_line():
    line = {"completed": 60, "duration": 7.0, "output_throughput": 100.0, "p95_ttft_ms": 12.0, "errors": ["", "x"],
            "cache_report": {"total_prompt_tokens": 1000, "total_cached_tokens": 770, "cache_hit_rate_pct": 77.0}}
    out = acc.parse_bench_output(json.dumps({"completed": 1}) + "\n" + json.dumps(line) + "\n")
    assert out["completed"] == 60 and out["failed_details"] == 1 and out["p95_ttft_ms"] == 12.0
    assert out["cache_report"]["cache_hit_rate_pct"] == 77.0


def test_server_cache_hit_one_engine_type_every_cache_source():
    """What the real TokenizerMetricsCollector writes on 0.5.17/0.5.18 (metrics_collector.py
    observe_one_finished_request; the scheduler always sends cached_tokens_details on a hit): cached tokens per
    cache_source device and host, labels model_name + engine_type (+ is_streaming on prompt tokens); a PD decode
    counts the prefill's hit too (F3), so one engine type is read. Series appear at their first observation: none
    before the run."""
    before = {"u": '# HELP sglang:prompt_tokens_total Number of prefill tokens processed.\n'
                   '# TYPE sglang:prompt_tokens_total counter\n'
                   'sglang:prompt_tokens_total{engine_type="prefill",is_streaming="true",model_name="G"} 100.0\n'}
    after = {"u": 'sglang:prompt_tokens_total{engine_type="prefill",is_streaming="true",model_name="G"} 1100.0\n'
                  'sglang:prompt_tokens_total{engine_type="decode",is_streaming="true",model_name="G"} 1000.0\n'
                  'sglang:cached_tokens_total{cache_source="device",engine_type="prefill",model_name="G"} 550.0\n'
                  'sglang:cached_tokens_total{cache_source="host",engine_type="prefill",model_name="G"} 220.0\n'
                  'sglang:cached_tokens_total{cache_source="device",engine_type="decode",model_name="G"} 770.0\n'}
    h = acc.server_cache_hit(before, after, "prefill")
    assert (h["prompt_tokens"], h["cached_tokens"], h["hit"]) == (1000, 770, 0.77)
    # the old reader kept cache_source="total" only: 0 of 770 on this text, verdict cache_miss on every real server
    assert acc.counter_sum(acc.parse_prometheus(after["u"]), "sglang:cached_tokens_total", "prefill",
                           cache_source="total") == 0


def test_total_fallback_adds_to_the_breakdown():
    """A request without cached_tokens_details goes to cache_source="total" INSTEAD of the breakdown (the two
    branches are exclusive per request), so a family holding both sums them; tests/parser/test_real_contract.py
    feeds the real collector such a mix and checks the same."""
    text = ('sglang:cached_tokens_total{cache_source="device",engine_type="unified",model_name="K"} 3968.0\n'
            'sglang:cached_tokens_total{cache_source="total",engine_type="unified",model_name="K"} 2048.0\n'
            'sglang:prompt_tokens_total{engine_type="unified",is_streaming="false",model_name="K"} 8192.0\n')
    h = acc.server_cache_hit({}, {"u": text}, "unified")
    assert (h["cached_tokens"], h["prompt_tokens"]) == (6016, 8192)


def test_online_p95_from_10s_windows():
    samples = [(t, sum(100 if s < 50 else 1000 for s in range(t))) for t in range(0, 61)]
    rates = acc.window_rates(samples, 10)
    assert [round(r) for _, r in rates] == [100, 100, 100, 100, 100, 1000]
    assert acc.online_p95(samples) == 1000
    assert acc.online_p95([(0, 0), (5, 50)]) == 10


def test_rdma_bytes_times_four_and_tcp_fallback_per_instance():
    d = acc.rdma_bytes({"mlx5_0": {"port_xmit_data": 10, "port_rcv_data": 0}},
                       {"mlx5_0": {"port_xmit_data": 260, "port_rcv_data": 5}})
    assert d == {"mlx5_0": {"xmit_bytes": 1000, "rcv_bytes": 20}}
    inst = [{"id": "P0", "role": "prefill", "devices": {"mlx5_0": {"xmit_bytes": 1000, "rcv_bytes": 0}}},
            {"id": "D0", "role": "decode", "devices": {}}]
    r = acc.rdma_verdicts(inst, 1000)
    assert r["P0"]["verdict"] == "rdma" and r["D0"]["verdict"] == "tcp_fallback"


BASE = {"sent": 500, "failed": 0, "output_throughput": 4800.0, "hit_servers": 0.77, "hit_responses": 0.77}


def test_verdict_accepted():
    v, rule, fired = acc.verdict(BASE, GLM, 0.77)
    assert v == "accepted" and fired == [] and "none of the rules" in rule


def test_verdict_errors():
    v, rule, _ = acc.verdict(dict(BASE, failed=50), GLM, 0.77)
    assert v == "errors" and "50 of 500" in rule


def test_verdict_cache_miss_names_cause():
    v, rule, _ = acc.verdict(dict(BASE, hit_servers=0.5), GLM, 0.77)
    assert v == "cache_miss" and "routing" in rule and "3.0 points" in rule


def test_verdict_below_seed_shows_ratio():
    v, rule, _ = acc.verdict(dict(BASE, output_throughput=2370.45), GLM, 0.77)
    assert v == "below_seed" and "50.0%" in rule


def test_verdict_regressed():
    v, rule, _ = acc.verdict(BASE, GLM, 0.77, previous={"output_throughput": 6000.0, "run": "X"})
    assert v == "regressed" and "20.0%" in rule


def test_verdict_tcp_fallback_beats_cache_and_seed():
    rdma = {"D0": {"verdict": "tcp_fallback", "why": "0 bytes"}}
    v, rule, fired = acc.verdict(dict(BASE, output_throughput=1.0), GLM, 0.77, rdma=rdma)
    assert v == "tcp_fallback" and "D0" in rule and len(fired) == 2


def test_prometheus_textfile_and_agreement():
    rep = {"profile": "kimi_k3", "verdict": "accepted", "output_throughput_tok_s": 1.5,
           "cache_hit_rate": {"counters": 0.8}}
    text = acc.prometheus_textfile(rep)
    assert 'verdict="accepted"} 1' in text and 'verdict="errors"} 0' in text
    assert acc.hits_agree(0.77, 0.76) and not acc.hits_agree(0.77, 0.5)


def test_round_robin_over_two_caches_needs_a_longer_system_prompt():
    assert acc.cache_domains("round_robin", 2) == 2 and acc.cache_domains("cache_aware", 2) == 1
    s = acc.gsp_shape(65536, 1024, 0.77, 25, 20, domains=2)
    assert s["system_prompt_len"] == 56064 and abs(s["predicted_hit"] - 0.77) < 0.001   # 0.77 * 65536 / 0.9


def test_active_span_drops_idle_head_and_tail():
    pts = [(0, 0), (1, 0), (2, 0), (3, 10), (4, 20), (5, 20), (6, 20)]
    assert acc.active_span(pts) == [(2, 0), (3, 10), (4, 20)]


def _pd_result(kv_mb):
    def m(prompt, cached, kv):
        return ('sglang:prompt_tokens_total{engine_type="prefill",is_streaming="true"} %d\n'
                'sglang:cached_tokens_total{cache_source="device",engine_type="prefill"} %d\n'
                'sglang:kv_transfer_total_mb_sum{engine_type="prefill",tp_rank="0"} %f\n' % (prompt, cached, kv))
    return {"rc": 0, "metrics_before": {"http://p:1": m(0, 0, 0)}, "metrics_after": {"http://p:1": m(1000, 770, kv_mb)},
            "argv": ["x"]}


def _pd_plan():
    plan = {"mode": "pd", "served_model_name": "G", "router": {"url": "http://r:1", "args": []},
            "instances": [{"id": "P0", "url": "http://p:1", "role": "prefill", "host": "a", "ib_devices": ["mlx5_0"]},
                          {"id": "D0", "url": "http://d:1", "role": "decode", "host": "b", "ib_devices": ["mlx5_1"]}]}
    return acc.plan_run(plan, GLM, 0.05, "py", "/tok", "/runs/x", "t")


def test_build_report_pd_rdma_then_tcp_fallback_from_flat_counters():
    bench = {"completed": 60, "output_throughput": 5000.0, "cache_report": {"total_prompt_tokens": 1000,
                                                                             "total_cached_tokens": 770}}
    rp = _pd_plan()
    assert rp["env"]["HOME"] == "/runs/.client-home" and rp["engine_type"] == "prefill"
    moved_b = {"P0": {"mlx5_0": {"port_xmit_data": 0}}, "D0": {"mlx5_1": {"port_rcv_data": 0}}}
    moved_a = {"P0": {"mlx5_0": {"port_xmit_data": 262144}}, "D0": {"mlx5_1": {"port_rcv_data": 262144}}}
    ok = acc.build_report("glm52_pd", rp, GLM, _pd_result(1.0), bench, [], moved_b, moved_a)
    assert ok["verdict"] == "accepted" and ok["rdma"]["D0"]["bytes"] == 1048576
    flat = acc.build_report("glm52_pd", rp, GLM, _pd_result(1.0), bench, [], moved_b, moved_b,
                            startup_lines={"D0": ["Using TCP transport (no HCA detected)"]})
    assert flat["verdict"] == "tcp_fallback" and "P0" in flat["rule"] and "D0" in flat["rule"]
    assert "Using TCP transport" in flat["rdma"]["D0"]["why"]
    assert "KV over RDMA" in acc.report_markdown(flat)


def test_report_lists_every_rule_with_its_state():
    """An `accepted` at 40% of the seed must say why below_seed did not fire (switched off), not leave it unsaid."""
    bench = {"completed": 60, "output_throughput": 5000.0, "cache_report": {"total_prompt_tokens": 1000,
                                                                             "total_cached_tokens": 770}}
    rp = _pd_plan()
    moved_b = {"P0": {"mlx5_0": {"port_xmit_data": 0}}, "D0": {"mlx5_1": {"port_rcv_data": 0}}}
    moved_a = {"P0": {"mlx5_0": {"port_xmit_data": 262144}}, "D0": {"mlx5_1": {"port_rcv_data": 262144}}}
    off = acc.build_report("glm52_pd", rp, GLM, _pd_result(1.0), dict(bench, output_throughput=1900.0), [],
                           moved_b, moved_a, thresholds={"min_seed_ratio": 0})
    states = {x["rule"]: x["state"] for x in off["rules"]}
    assert off["verdict"] == "accepted"
    assert states["below_seed"] == "off (min_seed_ratio = 0)"
    assert states["tcp_fallback"] == "passed" and states["errors"] == "passed"
    assert states["regressed"].startswith("n/a (no previous")
    on = acc.build_report("glm52_pd", rp, GLM, _pd_result(1.0), dict(bench, output_throughput=1900.0), [],
                          moved_b, moved_a, previous={"run": "r0", "output_throughput": 2000.0})
    states = {x["rule"]: x["state"] for x in on["rules"]}
    assert on["verdict"] == "below_seed" and states["below_seed"].startswith("fired: 1900.00 tok/s is 40.1%")
    assert states["regressed"] == "passed"   # 5% below r0, within the 10% allowed
    md = acc.report_markdown(on)
    assert "| below_seed | output throughput below 90% of the seed's figure | fired: 1900.00" in md
    assert [x["rule"] for x in on["rules"]] == ["errors", "tcp_fallback", "cache_miss", "below_seed", "regressed"]
