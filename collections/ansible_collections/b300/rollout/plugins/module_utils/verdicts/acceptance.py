"""Go-live acceptance arithmetic (plain stdlib; used by roles/acceptance and tests/unit/test_acceptance.py).

Sources: ../shared/reference/benchmark-and-rdma-facts.md (section numbers below refer to it).
- shape: generated-shared-prefix (GSP) with G groups x P prompts, system prompt S, question Q, L = S + Q;
  predicted hit = ((P-1)/P) * S/L (section 1.5). S is rounded to the page (64) like the table there.
- cache hit (servers): delta cached_tokens_total / delta prompt_tokens_total over the run, ONE engine_type
  (prefill for PD, unified for regular), summed over every cache_source (device, host, storage_*; "total" only
  holds requests that came without a breakdown): module_utils/sglang/sglang_metrics.py reads the counters, for this module
  and for roles/acceptance/files/acceptance_client.py alike.
- cache hit (responses): bench_serving --cache-report: total_cached_tokens / total_prompt_tokens (section 1.4).
- online P95 throughput (pinned here, the seed does not define it, section 1.4): the 95th percentile (nearest rank)
  of the output tokens/s of consecutive 10 s windows, from the servers' decode token counter sampled during the run.
- RDMA: port_xmit_data / port_rcv_data are octets / 4 (section 4.3): bytes = delta * 4.
"""
import json
import math

from ansible_collections.b300.rollout.plugins.module_utils.sglang import sglang_metrics
from ansible_collections.b300.rollout.plugins.module_utils.common.md_table import table

VERDICTS = ("accepted", "below_seed", "regressed", "cache_miss", "errors", "tcp_fallback")

RULES = {
    "errors": "failed requests > {max_failed_pct}% of sent, or the client did not complete",
    "tcp_fallback": "PD: an instance's --disaggregation-ib-device counters moved less than {min_rdma_share:.0%} of the "
                    "KV bytes expected for it (Mooncake fell back to TCP or used other devices)",
    "cache_miss": "server-side hit rate more than {cache_miss_points} points below the target",
    "below_seed": "output throughput below {min_seed_ratio:.0%} of the seed's figure",
    "regressed": "output throughput more than {max_regression_pct}% below the previous accepted run of this pair",
    "accepted": "none of the rules fired",
}

# the threshold that switches a rule off when set to 0 (the sandbox turns the seed ratio off: stubs are not GPUs)
RULE_SWITCH = {"below_seed": "min_seed_ratio", "tcp_fallback": "min_rdma_share"}

DEFAULT_THRESHOLDS = {"max_failed_pct": 1.0, "min_rdma_share": 0.5, "cache_miss_points": 3.0,
                      "min_seed_ratio": 0.9, "max_regression_pct": 10.0, "hit_agreement_points": 3.0}


def cache_domains(policy, instances):
    """How many prefix caches one group's prompts land on: 1 under a prefix-sticky policy (cache_aware, or manual /
    consistent_hashing with --gsp-send-routing-key), else every instance (round_robin, random, power_of_two)."""
    return 1 if policy in ("cache_aware", "manual", "consistent_hashing", "prefix_hash") else max(1, instances)


def gsp_shape(input_len, output_len, target_hit, groups, prompts_per_group, page=64, domains=1):
    """System-prompt and question lengths for a target hit rate (fraction). Each of the `domains` caches a group
    reaches misses once (facts 1.5: (P-1)/P*S/L sticky, (P-2)/P*S/L round_robin over 2): S = target*L*P/(P-domains)."""
    if prompts_per_group <= domains:
        raise ValueError("prompts_per_group must be > %d (each cache a group reaches misses once)" % domains)
    top = (prompts_per_group - domains) / prompts_per_group
    if not 0 < target_hit < top:
        raise ValueError("target hit %.4f is not reachable with %d prompts per group over %d cache(s) (max %.4f)"
                         % (target_hit, prompts_per_group, domains, top))
    ideal = target_hit * input_len / top
    system = int(round(ideal / page)) * page if page > 1 else int(round(ideal))
    system = min(system, input_len - 1)
    question = input_len - system
    predicted = top * system / input_len
    return {"input_len": input_len, "output_len": output_len, "system_prompt_len": system, "question_len": question,
            "groups": groups, "prompts_per_group": prompts_per_group, "num_requests": groups * prompts_per_group,
            "target_hit": target_hit, "predicted_hit": round(predicted, 6), "page": page, "cache_domains": domains}


def scaled_shape(seed, scale=1.0, page=64, domains=1):
    """The seed's shape, scaled: lengths x scale (input >= 256, output >= 16), groups x scale (>= 3), the same
    prompts per group, rate, concurrency and target hit. scale=1 is the seed shape itself."""
    if not 0 < scale <= 1:
        raise ValueError("scale must be in (0, 1], got %r" % scale)
    full = scale == 1
    input_len = seed["input_len"] if full else max(256, int(seed["input_len"] * scale))
    output_len = seed["output_len"] if full else max(16, int(seed["output_len"] * scale))
    groups = seed["groups"] if full else max(3, int(math.ceil(seed["groups"] * scale)))
    pg = page if full else (16 if input_len < 16 * 64 * 4 else page)
    shape = gsp_shape(input_len, output_len, seed["hit_rate"], groups, seed["prompts_per_group"], page=pg,
                      domains=domains)
    shape.update(request_rate=seed["request_rate"], max_concurrency=seed["max_concurrency"], scale=scale)
    return shape


def bench_argv(python, shape, base_url, model, tokenizer, output_file, tag, seed=42, extra=()):
    """The bench_serving command line (facts section 6): native sglang backend, GSP, --cache-report,
    --warmup-requests 0, and NO --flush-cache. Never --gsp-fast-prepare (section 1.3).

    Why bench_serving does not flush (decided for issue 20, E1 of sglang-real-contract.md): its --flush-cache is one
    POST /flush_cache through the router right after its own warm-up request, and it raise_for_status()es
    (sglang/benchmark/serving.py flush_server_cache, 0.5.17 line 975-981 / 0.5.18 line 977-995; 0.5.18 adds
    ?timeout=60, still one attempt, and whether router 0.3.2's fan-out passes it on is not known). A real worker
    answers 400 whenever its scheduler is not fully idle (srt/managers/scheduler.py flush_cache), and on glm52_pd the
    router's /health checks are one-token generations every few seconds, so that single unretried flush aborts the
    whole run (verdict `errors`, nothing measured) at random; how router 0.3.2 merges a partial 400 is not even
    known. roles/acceptance/files/acceptance_client.py flushes every worker itself instead, with ?timeout= (the
    server waits for idle) and bounded retries, naming the worker when it gives up. bench_serving's warm-up request
    would then refill one group's prefix after that flush (the measured run would hit above the shape's prediction),
    so it is switched off (--warmup-requests 0); the client sends its own warm-up before it flushes."""
    argv = [python, "-m", "sglang.bench_serving", "--backend", "sglang", "--base-url", base_url,
            "--model", model, "--tokenizer", tokenizer,
            "--dataset-name", "generated-shared-prefix",
            "--gsp-num-groups", str(shape["groups"]), "--gsp-prompts-per-group", str(shape["prompts_per_group"]),
            "--gsp-system-prompt-len", str(shape["system_prompt_len"]),
            "--gsp-question-len", str(shape["question_len"]), "--gsp-output-len", str(shape["output_len"]),
            "--request-rate", str(shape["request_rate"]), "--max-concurrency", str(shape["max_concurrency"]),
            "--seed", str(seed), "--warmup-requests", "0", "--cache-report",
            "--output-file", output_file, "--output-details", "--tag", tag]
    argv.extend(extra)
    if "--gsp-fast-prepare" in argv:
        raise ValueError("--gsp-fast-prepare sets every prompt_len=1: the hit rate and input figures would be wrong")
    if "--flush-cache" in argv:
        raise ValueError("--flush-cache: bench_serving flushes once through the router and aborts the run on the 400 "
                         "a busy worker answers; the acceptance client already flushes every worker with retries")
    return argv


BENCH_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def parse_bench_output(text):
    """The last JSON line bench_serving appended to --output-file (it opens the file in mode 'a')."""
    lines = [ln for ln in text.splitlines() if ln.strip().startswith("{")]
    if not lines:
        raise ValueError("no JSON line in the bench_serving output file")
    res = json.loads(lines[-1])
    out = {k: res.get(k) for k in ("completed", "duration", "output_throughput", "total_output_tokens",
                                   "total_input_tokens", "request_throughput", "max_output_tokens_per_s")}
    for metric in ("ttft", "tpot", "itl", "e2e_latency"):
        for stat in ("median", "p95", "p99", "mean"):
            key = "%s_%s_ms" % (stat, metric)
            out[key] = res.get(key)
    errors = [e for e in (res.get("errors") or []) if e]
    out["failed_details"] = len(errors)
    cache = res.get("cache_report") or {}
    out["cache_report"] = {"total_prompt_tokens": cache.get("total_prompt_tokens"),
                           "total_cached_tokens": cache.get("total_cached_tokens"),
                           "cache_hit_rate_pct": cache.get("cache_hit_rate_pct")}
    out["ttfts"] = res.get("ttfts") or []
    out["itls"] = res.get("itls") or []
    out["output_lens"] = res.get("output_lens") or []
    return out


def parse_prometheus(text):
    """[(name, {labels}, value)] from a /metrics text (module_utils/sglang/sglang_metrics.py, the one reader)."""
    return sglang_metrics.parse(text)


def counter_sum(samples, name, engine_type=None, **match):
    """Sum of a counter over label sets (sglang_metrics.counter_sum: cached_tokens_total over every cache_source)."""
    return sglang_metrics.counter_sum(samples, name, engine_type, **match)


def server_cache_hit(before, after, engine_type):
    """{prompt, cached, hit} from per-server /metrics texts before/after ({url: text}); one engine type only."""
    prompt = cached = 0.0
    for url, text_after in after.items():
        b = parse_prometheus(before.get(url, ""))
        a = parse_prometheus(text_after)
        prompt += counter_sum(a, "sglang:prompt_tokens_total", engine_type) - \
            counter_sum(b, "sglang:prompt_tokens_total", engine_type)
        cached += counter_sum(a, "sglang:cached_tokens_total", engine_type) - \
            counter_sum(b, "sglang:cached_tokens_total", engine_type)
    return {"prompt_tokens": int(prompt), "cached_tokens": int(cached),
            "hit": round(cached / prompt, 6) if prompt > 0 else None, "engine_type": engine_type}


def percentile(values, q):
    """Nearest-rank percentile (q in [0, 100]); None for no values."""
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return None
    rank = max(1, int(math.ceil(q / 100.0 * len(vals))))
    return vals[rank - 1]


def window_rates(samples, window_s=10.0):
    """[(t_end, tokens/s)] of consecutive windows from [(t, counter)] samples (linear interpolation)."""
    pts = sorted(samples)
    if len(pts) < 2:
        return []

    def at(t):
        for (t0, c0), (t1, c1) in zip(pts, pts[1:]):
            if t0 <= t <= t1:
                return c0 if t1 == t0 else c0 + (c1 - c0) * (t - t0) / (t1 - t0)
        return pts[-1][1]

    start, end = pts[0][0], pts[-1][0]
    if end - start < window_s:
        return [(end, (pts[-1][1] - pts[0][1]) / (end - start))] if end > start else []
    out = []
    t = start
    while t + window_s <= end + 1e-9:
        out.append((t + window_s, (at(t + window_s) - at(t)) / window_s))
        t += window_s
    return out


def active_span(samples):
    """The samples from the last one before the counter first moves to the first one after it stops moving (the
    client's prompt generation before and the drain after are not serving time)."""
    pts = sorted(samples)
    moved = [i for i in range(1, len(pts)) if pts[i][1] != pts[i - 1][1]]
    if not moved:
        return pts
    return pts[moved[0] - 1:moved[-1] + 1]


def online_p95(samples, window_s=10.0):
    """Pinned definition of the seed's 'online P95 throughput': p95 (nearest rank) of per-10 s output tok/s."""
    return percentile([rate for t, rate in window_rates(samples, window_s)], 95)


def rdma_bytes(before, after):
    """{device: {xmit_bytes, rcv_bytes}} from {device: {port_xmit_data, port_rcv_data}} (4-byte units)."""
    out = {}
    for dev, a in after.items():
        b = before.get(dev, {})
        out[dev] = {"xmit_bytes": 4 * (int(a.get("port_xmit_data", 0)) - int(b.get("port_xmit_data", 0))),
                    "rcv_bytes": 4 * (int(a.get("port_rcv_data", 0)) - int(b.get("port_rcv_data", 0)))}
    return out


def rdma_verdicts(instances, expected_bytes, min_share=0.5):
    """Per PD instance: did the KV bytes appear on its own devices? instances: [{id, role, devices: {dev: {xmit_bytes,
    rcv_bytes}}}]; expected_bytes: total KV bytes the decode side pulled (both directions must carry their share)."""
    out = {}
    roles = {}
    for inst in instances:
        roles.setdefault(inst["role"], []).append(inst)
    for inst in instances:
        peers = len(roles.get(inst["role"], [])) or 1
        share = expected_bytes / peers if expected_bytes else 0
        key = "xmit_bytes" if inst["role"] == "prefill" else "rcv_bytes"
        moved = sum(d.get(key, 0) for d in inst["devices"].values())
        if not inst["devices"]:
            verdict, why = "tcp_fallback", "no --disaggregation-ib-device: Mooncake auto-discovery or TCP"
        elif moved <= 0 or (share and moved < min_share * share):
            verdict, why = "tcp_fallback", "%d bytes on %s, expected about %d" % (moved, ",".join(inst["devices"]), share)
        else:
            verdict, why = "rdma", "%d bytes on %s" % (moved, ",".join(inst["devices"]))
        out[inst["id"]] = {"role": inst["role"], "devices": sorted(inst["devices"]), "bytes": moved,
                           "expected_bytes": int(share), "verdict": verdict, "why": why}
    return out


def verdict(measured, seed, target_hit, previous=None, rdma=None, thresholds=None):
    """(verdict, rule text, [all fired rules]) in precedence order errors > tcp_fallback > cache_miss > below_seed
    > regressed > accepted. measured: {sent, failed, output_throughput, hit_servers, hit_responses}."""
    th = dict(DEFAULT_THRESHOLDS)
    th.update(thresholds or {})
    fired = []
    sent = measured.get("sent") or 0
    failed = measured.get("failed") or 0
    if sent == 0 or failed * 100.0 / sent > th["max_failed_pct"]:
        fired.append(("errors", "%d of %d requests failed" % (failed, sent)))
    bad = sorted(i for i, r in (rdma or {}).items() if r["verdict"] == "tcp_fallback")
    if bad:
        fired.append(("tcp_fallback", "instances %s: %s" % (", ".join(bad), "; ".join(
            "%s %s" % (i, rdma[i]["why"]) for i in bad))))
    hit = measured.get("hit_servers")
    if hit is None or (target_hit - hit) * 100 > th["cache_miss_points"]:
        cause = ("no server-side counters moved (metrics off?)" if hit is None else
                 "routing scattered the groups (router policy not cache_aware / balance thresholds), the radix cache "
                 "is off or too small (evictions), or caches were not flushed evenly" if hit < target_hit else "")
        fired.append(("cache_miss", "server hit %s vs target %.2f%%: %s" % (
            "n/a" if hit is None else "%.2f%%" % (hit * 100), target_hit * 100, cause)))
    tput = measured.get("output_throughput") or 0.0
    ratio = tput / seed["output_throughput"] if seed.get("output_throughput") else None
    if ratio is not None and th["min_seed_ratio"] and ratio < th["min_seed_ratio"]:
        fired.append(("below_seed", "%.2f tok/s is %.1f%% of the seed's %.2f" % (
            tput, ratio * 100, seed["output_throughput"])))
    if previous and previous.get("output_throughput"):
        drop = (1 - tput / previous["output_throughput"]) * 100
        if drop > th["max_regression_pct"]:
            fired.append(("regressed", "%.2f tok/s is %.1f%% below the previous accepted run (%s: %.2f)" % (
                tput, drop, previous.get("run", "?"), previous["output_throughput"])))
    if not fired:
        return "accepted", RULES["accepted"], []
    name, detail = fired[0]
    return name, RULES[name].format(**th) + " -- " + detail, [{"verdict": n, "detail": d} for n, d in fired]


def hits_agree(hit_servers, hit_responses, points=3.0):
    if hit_servers is None or hit_responses is None:
        return None
    return abs(hit_servers - hit_responses) * 100 <= points


def prometheus_textfile(report):
    """node_exporter textfile collector lines with the verdict."""
    lines = ["# HELP b300_acceptance_verdict Go-live acceptance verdict (1 for the current verdict).",
             "# TYPE b300_acceptance_verdict gauge"]
    for v in VERDICTS:
        lines.append('b300_acceptance_verdict{profile="%s",verdict="%s"} %d' % (
            report["profile"], v, int(report["verdict"] == v)))
    lines += ["# HELP b300_acceptance_output_throughput_tok_s Output token throughput of the last acceptance run.",
              "# TYPE b300_acceptance_output_throughput_tok_s gauge",
              'b300_acceptance_output_throughput_tok_s{profile="%s"} %s' % (
                  report["profile"], report["output_throughput_tok_s"] or 0),
              "# HELP b300_acceptance_cache_hit_ratio Server-side prefix cache hit of the last acceptance run.",
              "# TYPE b300_acceptance_cache_hit_ratio gauge",
              'b300_acceptance_cache_hit_ratio{profile="%s"} %s' % (
                  report["profile"], report["cache_hit_rate"]["counters"] or 0),
              "# HELP b300_acceptance_timestamp_seconds End of the last acceptance run.",
              "# TYPE b300_acceptance_timestamp_seconds gauge",
              'b300_acceptance_timestamp_seconds{profile="%s"} %s' % (report["profile"], report.get("end_epoch", 0))]
    return "\n".join(lines) + "\n"


def router_policy(router_args, mode):
    """The policy deciding where a group's prompts are prefilled (PD: --prefill-policy, else --policy)."""
    args = list(router_args or [])
    for flag in (("--prefill-policy", "--policy") if mode == "pd" else ("--policy",)):
        if flag in args and args.index(flag) + 1 < len(args):
            return args[args.index(flag) + 1]
    return "cache_aware"   # the router's default (facts 1.5)


# environment names that hold secrets: never in the client's spec (OPENAI_API_KEY / API_KEY are bench_serving's)
SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
FLUSH_DEFAULTS = {"timeout_s": 10.0, "attempts": 6, "pause_s": 5.0}


def plan_run(plan, seed, scale, client_python, tokenizer, outdir, tag, base_url=None, extra_args=(), sample_s=2.0,
             client_env=None, flush=None):
    """Everything the client host needs: shape, bench argv, env, workers to flush/scrape, cache engine type.
    The spec (spec.json on the client host) holds no secret: the API key goes to the client on its stdin."""
    mode = plan.get("mode") or "regular"
    cache_role = "prefill" if mode == "pd" else "worker"
    instances = plan.get("instances") or []
    cache_instances = [i for i in instances if i["role"] == cache_role]
    policy = router_policy((plan.get("router") or {}).get("args"), mode)
    domains = cache_domains(policy, len(cache_instances))
    shape = scaled_shape(seed, scale, domains=domains)
    extra = list(extra_args)
    if policy in ("manual", "consistent_hashing") and "--gsp-send-routing-key" not in extra:
        extra.append("--gsp-send-routing-key")
    router_url = base_url or plan["router"]["url"]
    argv = bench_argv(client_python, shape, router_url, plan["served_model_name"], tokenizer,
                      outdir + "/bench.jsonl", tag, extra=extra)
    fl = dict(FLUSH_DEFAULTS)
    fl.update({k: v for k, v in (flush or {}).items() if v is not None})
    if set(fl) - set(FLUSH_DEFAULTS):
        raise ValueError("flush: unknown key(s) %s (known: %s)" % (
            ", ".join(sorted(set(fl) - set(FLUSH_DEFAULTS))), ", ".join(sorted(FLUSH_DEFAULTS))))
    if int(fl["attempts"]) < 1 or float(fl["timeout_s"]) < 0 or float(fl["pause_s"]) < 0:
        raise ValueError("flush: attempts must be >= 1, timeout_s and pause_s >= 0 (got %r)" % (fl,))
    workers = [{"id": i["id"], "url": i["url"], "role": i["role"], "host": i["host"],
                "ib_devices": list(i.get("ib_devices") or [])} for i in instances]
    secret = sorted(k for k in (client_env or {}) if any(w in k.upper() for w in SECRET_WORDS))
    if secret:
        raise ValueError("client_env %s: a secret would be written to spec.json on the client host; the API key "
                         "reaches the client on its stdin (sglang_api_key), nothing else secret is needed"
                         % ", ".join(secret))
    env = dict(BENCH_ENV)
    env.update(client_env or {})
    # GSP caches its generated prompts under ~/.cache/sglang/benchmark (the key ignores the tokenizer path): one home
    # for the client next to the runs, so a re-run of the same shape skips the generation
    env["HOME"] = outdir.rstrip("/").rsplit("/", 1)[0] + "/.client-home"
    return {"shape": shape, "argv": argv, "env": env, "workers": workers, "policy": policy, "mode": mode,
            "engine_type": "prefill" if mode == "pd" else "unified",
            "spec": {"outdir": outdir, "argv": argv, "env": env, "workers": workers, "router_url": router_url,
                     "total": shape["num_requests"], "sample_s": sample_s, "flush": fl}}


def _counter_series(samples, key, urls):
    return [(s["t"], sum((s["workers"].get(u) or {}).get(key, 0.0) for u in urls)) for s in samples]


def build_report(profile, run_plan, seed, result, bench, samples, nic_before, nic_after, previous=None,
                 thresholds=None, label="", run_id="", startup_lines=None):
    """The report dict (report.json). nic_*: {instance_id: {device: {port_xmit_data, port_rcv_data}}}."""
    th = dict(DEFAULT_THRESHOLDS)
    th.update(thresholds or {})
    shape = run_plan["shape"]
    engine = run_plan["engine_type"]
    workers = run_plan["workers"]
    cache_urls = [w["url"] for w in workers if w["role"] in ("prefill", "worker")]
    out_urls = [w["url"] for w in workers if w["role"] in ("decode", "worker")]
    before = {u: t for u, t in result["metrics_before"].items() if u in cache_urls}
    after = {u: t for u, t in result["metrics_after"].items() if u in cache_urls}
    hit = server_cache_hit(before, after, engine)
    cr = (bench or {}).get("cache_report") or {}
    hit_resp = (cr["total_cached_tokens"] / cr["total_prompt_tokens"]) if cr.get("total_prompt_tokens") else None
    sent = shape["num_requests"]
    completed = (bench or {}).get("completed") or 0
    failed = sent - completed if result.get("rc") == 0 and bench else sent
    decode_series = _counter_series(samples, "sglang:realtime_tokens_total", out_urls)
    cached_series = _counter_series(samples, "sglang:cached_tokens_total", cache_urls)
    prompt_series = _counter_series(samples, "sglang:prompt_tokens_total", cache_urls)
    rdma = None
    expected = 0
    if run_plan["mode"] == "pd":
        for u in [w["url"] for w in workers if w["role"] == "prefill"]:
            expected += 1048576 * (counter_sum(parse_prometheus(result["metrics_after"].get(u, "")),
                                               "sglang:kv_transfer_total_mb_sum") -
                                   counter_sum(parse_prometheus(result["metrics_before"].get(u, "")),
                                               "sglang:kv_transfer_total_mb_sum"))
        insts = [{"id": w["id"], "role": w["role"],
                  "devices": rdma_bytes((nic_before or {}).get(w["id"], {}), (nic_after or {}).get(w["id"], {}))}
                 for w in workers]
        rdma = rdma_verdicts(insts, expected, th["min_rdma_share"])
        for iid, lines in (startup_lines or {}).items():
            if iid in rdma:
                rdma[iid]["startup"] = list(lines or [])
                if any("Using TCP transport" in ln for ln in lines or []):
                    rdma[iid].update(verdict="tcp_fallback", why=rdma[iid]["why"] + "; the transfer engine logged "
                                     "'Using TCP transport (no HCA detected)'")
    measured = {"sent": sent, "failed": failed, "output_throughput": (bench or {}).get("output_throughput"),
                "hit_servers": hit["hit"], "hit_responses": hit_resp}
    v, rule, fired = verdict(measured, seed, shape["target_hit"], previous, rdma, th)
    tput = measured["output_throughput"]
    report = {
        "profile": profile, "run": run_id, "label": label, "verdict": v, "rule": rule, "rules_fired": fired,
        "requests": {"sent": sent, "completed": completed, "failed": failed},
        "output_throughput_tok_s": tput,
        "output_throughput_vs_seed": round(tput / seed["output_throughput"], 4) if tput else None,
        "online_p95_output_tok_s": online_p95(active_span(decode_series)),
        "online_p95_definition": "p95 (nearest rank) of output tok/s per 10 s window, from the decode-side "
                                 "sglang:realtime_tokens_total{mode=decode} sampled every %.0f s while it moves"
                                 % run_plan["spec"]["sample_s"],
        "latency_ms": {m: {s: (bench or {}).get("%s_%s_ms" % (s, m)) for s in ("median", "p95", "p99")}
                       for m in ("ttft", "tpot", "itl", "e2e_latency")},
        "cache_hit_rate": {"counters": hit["hit"], "responses": round(hit_resp, 6) if hit_resp is not None else None,
                           "target": shape["target_hit"], "predicted": shape["predicted_hit"],
                           "agree": hits_agree(hit["hit"], hit_resp, th["hit_agreement_points"]),
                           "engine_type": engine, "prompt_tokens": hit["prompt_tokens"],
                           "cached_tokens": hit["cached_tokens"]},
        "seed": {"output_throughput_tok_s": seed["output_throughput"], "hit_rate": seed["hit_rate"],
                 "online_p95_tok_s": seed.get("online_p95"), "source": seed.get("source")},
        "previous": previous,
        "shape": shape, "router_policy": run_plan["policy"], "argv": result.get("argv"),
        "duration_s": (bench or {}).get("duration"), "client_rc": result.get("rc"),
        "start_epoch": result.get("start_epoch"), "end_epoch": result.get("end_epoch"),
        "series": {"decode_tokens": decode_series, "cached_tokens": cached_series, "prompt_tokens": prompt_series},
        "thresholds": th,
    }
    if rdma is not None:
        report["rdma"] = rdma
        report["rdma_expected_kv_bytes"] = int(expected)
    report["rules"] = [{"rule": n, "fires_when": w, "state": st} for n, w, st in rule_states(report)]
    return report


def rule_states(r):
    """[(rule, text with thresholds, state)] for every rule in precedence order; state is fired, passed, off
    (switched off by a 0 threshold), or n/a (tcp_fallback outside PD, regressed without a previous accepted run)."""
    th = r["thresholds"]
    fired = {x["verdict"]: x["detail"] for x in r.get("rules_fired") or []}
    out = []
    for name in ("errors", "tcp_fallback", "cache_miss", "below_seed", "regressed"):
        if name in fired:
            state = "fired: " + fired[name]
        elif name in RULE_SWITCH and not th.get(RULE_SWITCH[name]):
            state = "off (%s = 0)" % RULE_SWITCH[name]
        elif name == "tcp_fallback" and not r.get("rdma"):
            state = "n/a (not a PD profile)"
        elif name == "regressed" and not (r.get("previous") or {}).get("output_throughput"):
            state = "n/a (no previous accepted run of this pair)"
        else:
            state = "passed"
        out.append((name, RULES[name].format(**th), state))
    return out


def report_markdown(r):
    def f(x, fmt="%.2f"):
        return "n/a" if x is None else fmt % x
    ch = r["cache_hit_rate"]
    lines = ["# Acceptance %s: %s" % (r["profile"], r["verdict"].upper()), "",
             "%s" % r["label"], "", "Run %s. Rule: %s" % (r["run"], r["rule"]), "",
             ]
    lines += table(("measure", "this run", "seed", "ratio"), [
        ("output throughput (tok/s, client)", f(r["output_throughput_tok_s"]), f(r["seed"]["output_throughput_tok_s"]),
         f(r["output_throughput_vs_seed"], "%.3f")),
        ("online P95 (tok/s, 10 s windows)", f(r["online_p95_output_tok_s"]), f(r["seed"]["online_p95_tok_s"]), ""),
        ("cache hit, servers (%s)" % ch["engine_type"], f(ch["counters"] and ch["counters"] * 100),
         f(r["seed"]["hit_rate"] * 100), ""),
        ("cache hit, responses", f(ch["responses"] and ch["responses"] * 100), "target %s" % f(ch["target"] * 100),
         "agree: %s" % ch["agree"]),
        ("requests sent / failed", "%d / %d" % (r["requests"]["sent"], r["requests"]["failed"]), "", "")])
    lines += [""] + table(("latency (ms)", "p50", "p95", "p99"), [
        (m, f(v["median"]), f(v["p95"]), f(v["p99"])) for m, v in r["latency_ms"].items()])
    lines += [""] + table(("rule (precedence order)", "fires when", "this run"), rule_states(r))
    if r.get("rdma"):
        lines += ["", "## KV over RDMA (expected %d KV bytes)" % r["rdma_expected_kv_bytes"], ""]
        lines += table(("instance", "role", "devices", "bytes", "verdict"), [
            (i, x["role"], ",".join(x["devices"]) or "-", "%d" % x["bytes"], "%s (%s)" % (x["verdict"], x["why"]))
            for i, x in sorted(r["rdma"].items())])
    s = r["shape"]
    lines += ["", "Shape: GSP %d groups x %d prompts, system %d + question %d tokens -> %d out, %s RPS, concurrency %s,"
              " scale %s, router policy %s (%d cache domain(s))." % (
                  s["groups"], s["prompts_per_group"], s["system_prompt_len"], s["question_len"], s["output_len"],
                  s["request_rate"], s["max_concurrency"], s["scale"], r["router_policy"], s["cache_domains"]),
              "", "Client: `%s`" % " ".join(r.get("argv") or [])]
    return "\n".join(lines) + "\n"
