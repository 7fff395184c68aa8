"""Quality gate arithmetic per task type (plain stdlib; used by tools/quality-gate and tests/unit/test_quality_gate.py).

Source: the second seed document (../shared/seeds/001_*.txt) section 3.3: the quantized model's answers compared with
a baseline's by ROUGE-L similarity and by accuracy on tasks with known answers, "split by task type, do not look only
at the mean": one table-understanding type fell more than 5% while the mean fell 1%.

- ROUGE-L: the F-measure of each candidate answer against the BASELINE's answer to the same item (the baseline
  deployment scores 1.0 against itself), averaged per task type. The scorer is passed in (tools/quality-gate uses the
  rouge-score package's RougeScorer(["rougeL"])), so this module stays stdlib only.
- Accuracy: items with a checkable answer (`check_answer`): kind "number" = the last stand-alone number of the answer
  (a number glued to letters, like b305, is not one) equals it; kind "label" = the label's words appear in the answer
  as whole words, case-insensitive.
- Drops in points (x100): ROUGE-L drop = 100 * (1 - mean F); accuracy drop = 100 * (baseline - candidate accuracy).
- Verdict: fail when ANY task type drops more than its threshold (the question set's thresholds.types[type], else
  thresholds.default), naming the type, even when the mean holds; and when the mean over all items drops more than
  thresholds.mean.
"""
import hashlib
import json
import re

from ansible_collections.b300.rollout.plugins.module_utils.common.md_table import table

NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w])")
DEFAULT_THRESHOLDS = {"default": {"max_rouge_drop_points": 3.0, "max_accuracy_drop_points": 3.0}, "types": {},
                      "mean": {"max_rouge_drop_points": 2.0, "max_accuracy_drop_points": 2.0}}


def words(text):
    return re.findall(r"[a-z0-9]+(?:-[a-z0-9]+)*", str(text or "").lower())


def check_answer(check, answer):
    """True/False for a checkable item, None when the item has no check."""
    if not check:
        return None
    if check["kind"] == "number":
        nums = NUMBER.findall(str(answer or "").replace(",", ""))
        return bool(nums) and float(nums[-1]) == float(check["answer"])
    if check["kind"] == "label":
        want, have = words(check["answer"]), words(answer)
        return any(have[i:i + len(want)] == want for i in range(len(have) - len(want) + 1)) if want else False
    raise ValueError("unknown check kind %r (number or label)" % check["kind"])


def questions_digest(questions):
    """sha256 of the items (id, prompt, reference, check): a baseline recorded on other questions is refused."""
    keep = [[it["id"], it["prompt"], it["reference"], it.get("check")] for it in questions["items"]]
    return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()


def scores(items, baseline, candidate, rouge_f):
    """Per task type: {n, rouge_l (mean F vs the baseline's answers), checkable, accuracy_baseline,
    accuracy_candidate}, plus "_all" over every item. baseline/candidate: {item id: answer}."""
    acc = {}
    for it in items:
        for key in (it["task_type"], "_all"):
            t = acc.setdefault(key, {"n": 0, "rouge_sum": 0.0, "checkable": 0, "ok_b": 0, "ok_c": 0})
            t["n"] += 1
            t["rouge_sum"] += rouge_f(baseline.get(it["id"], ""), candidate.get(it["id"], ""))
            if it.get("check"):
                t["checkable"] += 1
                t["ok_b"] += bool(check_answer(it["check"], baseline.get(it["id"])))
                t["ok_c"] += bool(check_answer(it["check"], candidate.get(it["id"])))
    out = {}
    for key, t in acc.items():
        out[key] = {"n": t["n"], "rouge_l": round(t["rouge_sum"] / t["n"], 6), "checkable": t["checkable"],
                    "accuracy_baseline": round(t["ok_b"] / t["checkable"], 6) if t["checkable"] else None,
                    "accuracy_candidate": round(t["ok_c"] / t["checkable"], 6) if t["checkable"] else None}
    return out


def _limits(thresholds, ttype):
    th = thresholds or DEFAULT_THRESHOLDS
    if ttype == "_all":
        return dict(DEFAULT_THRESHOLDS["mean"], **th.get("mean", {}))
    base = dict(DEFAULT_THRESHOLDS["default"], **th.get("default", {}))
    return dict(base, **(th.get("types") or {}).get(ttype, {}))


def verdict(per_type, thresholds=None):
    """{passed, failed_types, rows: [{task_type, rouge_drop_points, accuracy_drop_points, limits, failed, why}],
    message}. The message names every failing type, its figures and its limit."""
    rows, failed = [], []
    for ttype in sorted(per_type, key=lambda k: (k == "_all", k)):
        s = per_type[ttype]
        lim = _limits(thresholds, ttype)
        rd = round(100.0 * (1.0 - s["rouge_l"]), 3)
        ad = None
        if s["accuracy_baseline"] is not None:
            ad = round(100.0 * (s["accuracy_baseline"] - s["accuracy_candidate"]), 3)
        why = []
        if rd > lim["max_rouge_drop_points"]:
            why.append("ROUGE-L vs the baseline's answers %.3f, a drop of %.1f points (limit %.1f)" % (
                s["rouge_l"], rd, lim["max_rouge_drop_points"]))
        if ad is not None and ad > lim["max_accuracy_drop_points"]:
            why.append("accuracy %.1f%% -> %.1f%%, a drop of %.1f points (limit %.1f)" % (
                100 * s["accuracy_baseline"], 100 * s["accuracy_candidate"], ad, lim["max_accuracy_drop_points"]))
        name = "mean (all items)" if ttype == "_all" else ttype
        rows.append({"task_type": name, "rouge_l": s["rouge_l"], "rouge_drop_points": rd,
                     "accuracy_baseline": s["accuracy_baseline"], "accuracy_candidate": s["accuracy_candidate"],
                     "accuracy_drop_points": ad, "limits": lim, "failed": bool(why), "why": "; ".join(why)})
        if why:
            failed.append(name)
    mean = next(r for r in rows if r["task_type"] == "mean (all items)")
    if failed:
        parts = ["%s: %s" % (r["task_type"], r["why"]) for r in rows if r["failed"]]
        msg = "quality gate FAILED for %s. %s. (mean over all items: ROUGE-L drop %.1f points%s)" % (
            ", ".join(failed), ". ".join(parts), mean["rouge_drop_points"],
            "" if mean["failed"] else ", within its limit: the mean alone would have passed")
    else:
        msg = "quality gate passed: every task type within its limits (mean ROUGE-L drop %.1f points)" % (
            mean["rouge_drop_points"])
    return {"passed": not failed, "failed_types": failed, "rows": rows, "message": msg}


def identity_changes(baseline, candidate):
    """{key: [baseline value, candidate value]} for every identity key whose value differs."""
    keys = sorted(set(baseline) | set(candidate))
    return {k: [baseline.get(k), candidate.get(k)] for k in keys if baseline.get(k) != candidate.get(k)}


def report_markdown(r):
    def f(x, fmt="%.3f"):
        return "-" if x is None else fmt % x
    lines = ["# Quality gate: %s" % ("PASSED" if r["verdict"]["passed"] else "FAILED"), "", r["verdict"]["message"], "",
             "Baseline recorded %s; candidate asked %s; %d items, temperature %s, seed %s." % (
                 r["baseline"].get("recorded"), r.get("asked"), r["items"], r["settings"].get("temperature"),
                 r["settings"].get("seed")), ""]
    if r.get("note"):
        lines += ["> " + r["note"], ""]
    lines += table(("identity", "baseline", "candidate"), [
        (k, r["baseline"]["identity"].get(k), r["identity"].get(k))
        for k in sorted(set(r["baseline"]["identity"]) | set(r["identity"]))])
    lines += [""] + table(("task type", "ROUGE-L vs baseline", "drop (points)", "accuracy baseline",
                           "accuracy candidate", "drop (points)", "verdict"), [
        (row["task_type"], f(row["rouge_l"]), f(row["rouge_drop_points"], "%.1f"), f(row["accuracy_baseline"]),
         f(row["accuracy_candidate"]), f(row["accuracy_drop_points"], "%.1f"),
         "FAIL: " + row["why"] if row["failed"] else "ok") for row in r["verdict"]["rows"]])
    return "\n".join(lines) + "\n"
