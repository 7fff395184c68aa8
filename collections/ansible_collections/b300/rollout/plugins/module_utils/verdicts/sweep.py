"""Concurrency sweep arithmetic (plain stdlib; used by tools/sweep and tests/unit/test_sweep.py).

Source: the second seed document (../shared/seeds/001_*.txt) section 4.3-4.4: a mixed load (45% multi-turn chat, 30%
single-turn Q&A, 25% long documents), concurrency doubled from 32 to 512, each step held 10 minutes, watching the
P99 TTFT and TPOT curves; "find the point where throughput stops growing linearly, then back off one step" (their
256 -> 512 gave a small throughput gain while TTFT rose more than 2x, so they kept 256).

The knee rule (stated here, applied by find_knee): walking up the doubling steps, the knee is the first step where
  - output throughput grew by less than `min_gain` times the previous step's (linear growth under a doubling is 2.0;
    default 1.3), or
  - P99 TTFT grew by `max_ttft_growth` times or more over the previous step (default 2.0, the seed's "more than 2x"),
  - or more than `max_error_pct` % of the step's requests failed (default 1.0).
The recommendation is the step below the knee. No knee up to the limit: the last step, flagged (raise the limit).
"""
import math

from ansible_collections.b300.rollout.plugins.module_utils.common.md_table import table

DEFAULT_RULE = {"min_gain": 1.3, "max_ttft_growth": 2.0, "max_error_pct": 1.0}


def doubling_steps(start, limit):
    """[start, 2*start, ...] up to and including limit (limit itself when it is not a doubling of start)."""
    if start < 1 or limit < start:
        raise ValueError("concurrency steps need 1 <= start <= limit, got start=%r limit=%r" % (start, limit))
    out = [int(start)]
    while out[-1] * 2 <= limit:
        out.append(out[-1] * 2)
    if out[-1] != limit:
        out.append(int(limit))
    return out


def check_mix(name, mix):
    """Validate one task mix: {"tasks": [{"name", "weight", "input_len", "output_len", ...}]}; returns the tasks with
    weights normalised to fractions. The message names the mix, the task and the fix."""
    tasks = (mix or {}).get("tasks") or []
    if not tasks:
        raise ValueError("task mix %r has no tasks: give it a list \"tasks\" of {name, weight, input_len, "
                         "output_len}" % name)
    out, total = [], 0.0
    for t in tasks:
        for key in ("name", "weight", "input_len", "output_len"):
            if key not in t:
                raise ValueError("task mix %r: task %r has no %r (every task needs name, weight, input_len, "
                                 "output_len)" % (name, t.get("name"), key))
        if t["weight"] <= 0 or t["input_len"] < 1 or t["output_len"] < 1:
            raise ValueError("task mix %r: task %r needs weight > 0, input_len >= 1 and output_len >= 1, found %r"
                             % (name, t["name"], {k: t[k] for k in ("weight", "input_len", "output_len")}))
        total += t["weight"]
    for t in tasks:
        out.append(dict(t, share=t["weight"] / total))
    return out


def pick(tasks, u):
    """The task whose cumulative share covers u in [0, 1)."""
    acc = 0.0
    for t in tasks:
        acc += t["share"]
        if u < acc:
            return t
    return tasks[-1]


def percentile(values, q):
    """Linear interpolation between closest ranks (numpy's default, what bench_serving's np.percentile reports);
    None for no values."""
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return None
    pos = (len(vals) - 1) * q / 100.0
    lo, hi = int(math.floor(pos)), int(math.ceil(pos))
    return vals[lo] + (vals[hi] - vals[lo]) * (pos - lo)


def _ms(x):
    return None if x is None else round(x * 1000.0, 3)


def step_summary(concurrency, records, wall_s):
    """One step's figures from its request records ({ok, ttft_s, tpot_s, output_tokens, task, error}):
    output tokens/s and requests/s over the step's wall time, P50/P99 TTFT and TPOT (ms, ok requests), errors."""
    ok = [r for r in records if r.get("ok")]
    failed = [r for r in records if not r.get("ok")]
    sent = len(records)
    tokens = sum(r.get("output_tokens") or 0 for r in ok)
    errors = {}
    for r in failed:
        key = str(r.get("error") or "failed")[:80]
        errors[key] = errors.get(key, 0) + 1
    per_task = {}
    for r in records:
        per_task[r.get("task")] = per_task.get(r.get("task"), 0) + 1
    ttft = [r.get("ttft_s") for r in ok]
    tpot = [r.get("tpot_s") for r in ok]
    return {"concurrency": concurrency, "sent": sent, "ok": len(ok), "failed": len(failed),
            "error_pct": round(100.0 * len(failed) / sent, 3) if sent else 0.0, "errors": errors,
            "wall_s": round(wall_s, 3), "output_tokens": tokens,
            "output_throughput": round(tokens / wall_s, 3) if wall_s > 0 else 0.0,
            "request_throughput": round(len(ok) / wall_s, 3) if wall_s > 0 else 0.0,
            "p50_ttft_ms": _ms(percentile(ttft, 50)), "p99_ttft_ms": _ms(percentile(ttft, 99)),
            "p50_tpot_ms": _ms(percentile(tpot, 50)), "p99_tpot_ms": _ms(percentile(tpot, 99)),
            "per_task": per_task}


def find_knee(steps, rule=None):
    """The knee of a sweep (the module docstring states the rule) and the recommendation one step below it.
    Returns {knee_concurrency, knee_reason, recommended_concurrency, no_knee, rule}."""
    rule = dict(DEFAULT_RULE, **(rule or {}))
    out = {"rule": rule, "knee_concurrency": None, "knee_reason": None, "recommended_concurrency": None,
           "no_knee": False}
    if not steps:
        out["knee_reason"] = "no step completed"
        return out
    for i, s in enumerate(steps):
        reasons = []
        if s["error_pct"] > rule["max_error_pct"]:
            reasons.append("%.2f%% of its requests failed (limit %.2f%%)" % (s["error_pct"], rule["max_error_pct"]))
        if i > 0:
            prev = steps[i - 1]
            if prev["output_throughput"] > 0:
                gain = s["output_throughput"] / prev["output_throughput"]
                growth = s["concurrency"] / prev["concurrency"]
                # for a last step that is not a full doubling the linear gain is the concurrency ratio
                need = 1 + (rule["min_gain"] - 1) * (growth - 1)
                if gain < need:
                    reasons.append("throughput x%.2f for concurrency x%.2g (rule: below x%.2f is not linear "
                                   "growth)" % (gain, growth, need))
            if prev.get("p99_ttft_ms") and s.get("p99_ttft_ms") is not None:
                t = s["p99_ttft_ms"] / prev["p99_ttft_ms"]
                if t >= rule["max_ttft_growth"]:
                    reasons.append("P99 TTFT x%.2f (%.0f -> %.0f ms; rule: x%.2f or more)" % (
                        t, prev["p99_ttft_ms"], s["p99_ttft_ms"], rule["max_ttft_growth"]))
        if reasons:
            out["knee_concurrency"] = s["concurrency"]
            out["knee_reason"] = "; ".join(reasons)
            out["recommended_concurrency"] = steps[i - 1]["concurrency"] if i > 0 else None
            if i == 0:
                out["knee_reason"] += " (already at the first step: start the sweep lower)"
            return out
    out["no_knee"] = True
    out["recommended_concurrency"] = steps[-1]["concurrency"]
    out["knee_reason"] = ("no knee up to %d: throughput still grew linearly and P99 TTFT held; raise the limit"
                          % steps[-1]["concurrency"])
    return out


def plan(recommended, workers, profile=None):
    """What to set for a recommended total concurrency (printed, never applied): the router's
    --max-concurrent-requests = recommended, each of `workers` serving instances' --max-running-requests =
    ceil(recommended / workers) (the router spreads the load; for PD, count the decode instances)."""
    if not recommended:
        return {"lines": ["no recommendation: the first step was already past the knee; sweep from a lower start"]}
    per = int(math.ceil(recommended / max(1, workers)))
    where = "roles/sglang/files/profiles/%s.yml" % (profile or "<profile>")
    return {"router_max_concurrent_requests": recommended, "worker_max_running_requests": per, "workers": workers,
            "lines": ["%s: router.args --max-concurrent-requests: %d" % (where, recommended),
                      "%s: every serving (decode) worker's args --max-running-requests: %d (= %d / %d workers, "
                      "rounded up)" % (where, per, recommended, max(1, workers)),
                      "not applied: change the profile, deploy it the usual way (site.yml) and sweep again"]}


def report_markdown(r):
    def f(x, fmt="%.1f"):
        return "-" if x is None else fmt % x
    k = r["knee"]
    lines = ["# Concurrency sweep: %s" % r.get("mix"), "",
             "Target %s, model %s, client %s; steps %s held %g s each%s." % (
                 r.get("url"), r.get("model"), r.get("client"), ", ".join(str(c) for c in r.get("concurrency", [])),
                 r.get("hold_s", 0), " (INTERRUPTED: partial)" if r.get("interrupted") else ""),
             ""]
    if r.get("note"):
        lines += ["> " + r["note"], ""]
    rows = []
    for s in r["steps"]:
        mark = " (knee)" if s["concurrency"] == k.get("knee_concurrency") else (
            " (recommended)" if s["concurrency"] == k.get("recommended_concurrency") else "")
        rows.append(("%d%s" % (s["concurrency"], mark), "%d" % s["sent"], "%d" % s["failed"],
                     f(s["output_throughput"]), f(s["request_throughput"], "%.2f"), f(s["p50_ttft_ms"]),
                     f(s["p99_ttft_ms"]), f(s["p50_tpot_ms"]), f(s["p99_tpot_ms"])))
    lines += table(("concurrency", "sent", "failed", "output tok/s", "req/s", "P50 TTFT ms", "P99 TTFT ms",
                    "P50 TPOT ms", "P99 TPOT ms"), rows)
    rule = k["rule"]
    lines += ["", "Knee rule: the first step whose output throughput grew less than x%.2f over the previous (doubled) "
              "step, or whose P99 TTFT grew x%.2f or more, or with more than %.2f%% failed requests; recommended: "
              "the step below." % (rule["min_gain"], rule["max_ttft_growth"], rule["max_error_pct"]), "",
              "Knee: %s (%s)." % (k.get("knee_concurrency") or "none", k.get("knee_reason")),
              "Recommended concurrency: %s." % (k.get("recommended_concurrency") or "none"), "", "Plan (not applied):", ""]
    lines += ["- " + ln for ln in r["plan"]["lines"]]
    return "\n".join(lines) + "\n"


# --- the real benchmark client (tools/sweep --client bench_serving) ---------------------------------------------------
# One `python -m sglang.bench_serving` child per step: the step's mix is one custom dataset (JSONL of {"conversations":
# [{"content": prompt}, {"content": completion}]}: sglang/benchmark/datasets/custom.py takes the prompt as is and the
# output length from the completion's token count; ignore_eos is on by default, so exactly that many tokens come),
# --max-concurrency C (its closed loop) and C x rounds requests. bench_serving holds no time, so the rounds are sized
# to last about the hold from the previous step's mean end-to-end latency (`bench_rounds`).

def bench_argv(python, url, model, tokenizer, dataset, num, concurrency, output_file, seed, tag):
    """The bench_serving command line of one step (native sglang backend: /generate, like the acceptance run)."""
    argv = [python, "-m", "sglang.bench_serving", "--backend", "sglang", "--base-url", url,
            "--tokenizer", tokenizer, "--dataset-name", "custom", "--dataset-path", dataset,
            "--num-prompts", str(num), "--request-rate", "inf", "--max-concurrency", str(concurrency),
            "--seed", str(seed), "--warmup-requests", "0", "--output-file", output_file, "--output-details",
            "--disable-tqdm", "--tag", tag]
    if model:
        argv[argv.index("--tokenizer"):argv.index("--tokenizer")] = ["--model", model]
    return argv


def bench_rounds(hold_s, mean_e2e_s, first_rounds=4, cap=10000):
    """Requests per client for a step to last about hold_s: hold / the previous step's mean latency (first step:
    first_rounds), at least 2."""
    if not mean_e2e_s or mean_e2e_s <= 0:
        return first_rounds
    return int(max(2, min(cap, round(hold_s / mean_e2e_s))))


def bench_records(result, tasks):
    """Request records (as the built-in client's) from bench_serving's --output-details JSON line: ok = an empty
    error, TTFT = ttfts[i], TPOT = the mean of itls[i] (bench_serving's own TPOT: (latency - ttft) / (tokens - 1)),
    the task = the one whose input_len is nearest input_lens[i] (the mixes keep them apart)."""
    ttfts, itls = result.get("ttfts") or [], result.get("itls") or []
    outs, errs, ins = result.get("output_lens") or [], result.get("errors") or [], result.get("input_lens") or []
    recs = []
    for i, ttft in enumerate(ttfts):
        err = errs[i] if i < len(errs) else ""
        il = itls[i] if i < len(itls) else []
        n_in = ins[i] if i < len(ins) else None
        task = min(tasks, key=lambda t: abs(t["input_len"] - n_in))["name"] if n_in is not None and tasks else None
        recs.append({"task": task, "ok": not err, "error": (err.strip().splitlines() or ["failed"])[-1] if err else None,
                     "ttft_s": ttft if not err else None, "tpot_s": (sum(il) / len(il)) if il and not err else None,
                     "output_tokens": outs[i] if i < len(outs) and not err else 0})
    return recs
