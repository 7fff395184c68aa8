#!/usr/bin/env python3
"""Plot a thermal soak: temperature and SM clock over time, one line per GPU (controller side, matplotlib Agg).

  tools/plot_thermal.py --samples artifacts/thermal/b300a/samples.csv \
      --summary artifacts/thermal/b300a/summary.json --out artifacts/thermal/b300a/plot.png

The summary (written by playbooks/thermal_soak.yml) gives the host, verdict, ceiling and throttled intervals; without
it the figures are recomputed from the samples with the default thresholds. Exit codes: 0 written, 2 bad input,
3 matplotlib missing.
"""
import argparse
import json
import os
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "collections", "ansible_collections", "b300", "rollout", "plugins", "module_utils"))

import thermal  # noqa: E402  (the collection's module_utils/thermal.py, stdlib only)

VERDICT_COLOURS = {"ok": "#2e7d32", "throttled": "#ef6c00", "hot": "#c62828", "error": "#6a1b9a"}


def plot(samples, summary, out_path):
    """Write the PNG. samples: thermal.parse_samples()["samples"]; summary: thermal.analyse_host() result."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit(3)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = summary.get("t0")
    if t0 is None:
        stamps = [s["t"] for s in samples if s["t"] is not None]
        t0 = min(stamps) if stamps else 0.0
    ceiling = (summary.get("params") or {}).get("ceiling_c", thermal.DEFAULTS["ceiling_c"])
    by_gpu = {}
    for s in samples:
        if s["t"] is not None:
            by_gpu.setdefault(s["index"], []).append(s)
    fig, (ax_t, ax_c) = plt.subplots(2, 1, sharex=True, figsize=(12, 7), dpi=110)
    cmap = plt.get_cmap("tab10")
    for n, (idx, ss) in enumerate(sorted(by_gpu.items())):
        ss.sort(key=lambda s: s["t"])
        ts = [s["t"] - t0 for s in ss]
        colour = cmap(n % 10)
        verdict = (summary.get("gpus", {}).get(str(idx)) or {}).get("verdict", "?")
        ax_t.plot(ts, [s["temp_c"] for s in ss], color=colour, lw=1.3, label="GPU %s (%s)" % (idx, verdict))
        ax_c.plot(ts, [s["sm_mhz"] for s in ss], color=colour, lw=1.3)
    ax_t.axhline(ceiling, color="#c62828", ls="--", lw=1.2, label="ceiling %g °C" % ceiling)
    spans = sorted(tuple(iv) for g in (summary.get("gpus") or {}).values() for iv in g.get("throttled_intervals", []))
    merged = []
    for a, b in spans:  # union over GPUs, so overlapping shades do not stack into an opaque block
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    for n, (a, b) in enumerate(merged):
        for ax in (ax_t, ax_c):
            ax.axvspan(a, b, color="#ffb74d", alpha=0.3, lw=0,
                       label="throttled (any GPU)" if (ax is ax_t and n == 0) else None)
    ax_t.set_ylabel("temperature.gpu (°C)")
    ax_c.set_ylabel("SM clock (MHz)")
    ax_c.set_xlabel("time since soak start (s)")
    for ax in (ax_t, ax_c):
        ax.grid(True, alpha=0.3)
    ax_c.set_ylim(bottom=0)  # clock drops read in proportion
    ax_t.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, borderaxespad=0)
    verdict = summary.get("verdict", "?")
    dur = summary.get("duration_s")
    sampled = summary.get("sampled_s")
    fig.suptitle("%s — thermal soak — verdict: %s — %s s load (%s s sampled), %d GPUs"
                 % (summary.get("host") or "?", verdict.upper(), dur if dur is not None else "?", sampled,
                    len(by_gpu)), color=VERDICT_COLOURS.get(verdict, "black"), fontsize=12)
    reasons = summary.get("reasons") or []
    lines = textwrap.wrap("; ".join(reasons), 190)[:3]
    if lines:
        fig.text(0.01, 0.005, "\n".join(lines), fontsize=7, color="#444444", va="bottom")
    fig.tight_layout(rect=(0, 0.012 * (len(lines) + 1), 1, 0.96))
    fig.savefig(out_path)
    plt.close(fig)
    return out_path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", required=True, help="samples.csv (header line + nvidia-smi CSV rows)")
    ap.add_argument("--summary", help="summary.json of this host")
    ap.add_argument("--host", help="host name (when there is no summary)")
    ap.add_argument("--out", required=True, help="PNG to write")
    a = ap.parse_args(argv)
    try:
        with open(a.samples, encoding="utf-8") as f:
            parsed = thermal.parse_samples(f.read())
    except OSError as e:
        print("cannot read samples %s: %s" % (a.samples, e), file=sys.stderr)
        return 2
    if a.summary:
        with open(a.summary, encoding="utf-8") as f:
            summary = json.load(f)
    else:
        summary = thermal.analyse_host(parsed["samples"], host=a.host)
    if not parsed["samples"]:
        print("no samples in %s: plotting an empty figure" % a.samples, file=sys.stderr)
    plot(parsed["samples"], summary, a.out)
    print(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
