#!/usr/bin/env python3
"""Plot a thermal soak or a health-history window: temperature and SM clock over time, one line per GPU (matplotlib Agg).

  tools/plot_thermal.py --samples artifacts/thermal/b300a/samples.csv \
      --summary artifacts/thermal/b300a/summary.json --out artifacts/thermal/b300a/plot.png
  tools/plot_thermal.py --history artifacts/health-history/b300a/window.json --host b300a --out .../plot.png

Both draw with plot_series() (one plotting function). A history window (b300.rollout.health_history_read's result)
is marked with vertical lines; its thermal-violation stretches are shaded like the soak's throttled intervals.

The summary (written by playbooks/thermal_soak.yml) gives the host, verdict, ceiling and throttled intervals; without
it the figures are recomputed from the samples with the default thresholds. Exit codes: 0 written, 2 bad input,
3 matplotlib missing.
"""
import argparse
import json
import sys
import textwrap
import time

import repo_path  # noqa: F401  tools/repo_path.py, the one bootstrap: puts collections/ on sys.path
from ansible_collections.b300.rollout.plugins.module_utils.health import thermal  # stdlib only

VERDICT_COLOURS = {"ok": "#2e7d32", "throttled": "#ef6c00", "hot": "#c62828", "error": "#6a1b9a"}


def _matplotlib():
    try:
        import matplotlib
    except ImportError:
        raise SystemExit(3) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _union(spans):
    """Union of [a, b] intervals, so overlapping shades do not stack into an opaque block."""
    merged = []
    for a, b in sorted(tuple(iv) for iv in spans):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return merged


def plot_series(series, out_path, title, title_colour="black", ceiling=None, intervals=(), footer=(),
                xlabel="time (s)", window=None, interval_label="throttled (any GPU)"):
    """THE temperature / SM clock / throttle plot (thermal soak and health history both draw with it).

    series: [(label, {"t": [s], "temp_c": [...], "sm_mhz": [...], "mem_temp_c": [...] (optional)})], one per GPU;
    ceiling: dashed temperature line; intervals: [[a, b]] shaded on both panels (throttled / thermal violation);
    window: [a, b] marked with vertical lines and a light band (the window a reader asked about); footer: text lines.
    """
    plt = _matplotlib()
    fig, (ax_t, ax_c) = plt.subplots(2, 1, sharex=True, figsize=(12, 7), dpi=110)
    cmap = plt.get_cmap("tab10")
    for n, (label, ss) in enumerate(series):
        colour = cmap(n % 10)
        ax_t.plot(ss["t"], ss["temp_c"], color=colour, lw=1.3, label=label)
        if any(v is not None for v in ss.get("mem_temp_c") or []):
            ax_t.plot(ss["t"], ss["mem_temp_c"], color=colour, lw=0.8, ls=":")
        ax_c.plot(ss["t"], ss["sm_mhz"], color=colour, lw=1.3)
    if ceiling is not None:
        ax_t.axhline(ceiling, color="#c62828", ls="--", lw=1.2, label="ceiling %g °C" % ceiling)
    for n, (a, b) in enumerate(_union(intervals)):
        for ax in (ax_t, ax_c):
            ax.axvspan(a, b, color="#ffb74d", alpha=0.3, lw=0, label=interval_label if (ax is ax_t and n == 0) else None)
    if window is not None:
        for ax in (ax_t, ax_c):
            ax.axvspan(window[0], window[1], color="#90caf9", alpha=0.12, lw=0,
                       label="window read" if ax is ax_t else None)
            for x in window:
                ax.axvline(x, color="#1565c0", lw=1.0, ls="-.")
    if any(any(v is not None for v in ss.get("mem_temp_c") or []) for _l, ss in series):
        ax_t.plot([], [], color="#555555", lw=0.8, ls=":", label="HBM (dotted)")
    ax_t.set_ylabel("temperature (°C)")
    ax_c.set_ylabel("SM clock (MHz)")
    ax_c.set_xlabel(xlabel)
    for ax in (ax_t, ax_c):
        ax.grid(True, alpha=0.3)
    ax_c.set_ylim(bottom=0)  # clock drops read in proportion
    ax_t.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, borderaxespad=0)
    fig.suptitle(title, color=title_colour, fontsize=12)
    lines = textwrap.wrap("; ".join(footer), 190)[:3]
    if lines:
        fig.text(0.01, 0.005, "\n".join(lines), fontsize=7, color="#444444", va="bottom")
    fig.tight_layout(rect=(0, 0.012 * (len(lines) + 1), 1, 0.96))
    fig.savefig(out_path)
    plt.close(fig)
    return out_path


def plot(samples, summary, out_path):
    """The soak's PNG. samples: thermal.parse_samples()["samples"]; summary: thermal.analyse_host() result."""
    t0 = summary.get("t0")
    if t0 is None:
        stamps = [s["t"] for s in samples if s["t"] is not None]
        t0 = min(stamps) if stamps else 0.0
    ceiling = (summary.get("params") or {}).get("ceiling_c", thermal.DEFAULTS["ceiling_c"])
    by_gpu = {}
    for s in samples:
        if s["t"] is not None:
            by_gpu.setdefault(s["index"], []).append(s)
    series = []
    for idx, ss in sorted(by_gpu.items()):
        ss.sort(key=lambda s: s["t"])
        verdict = (summary.get("gpus", {}).get(str(idx)) or {}).get("verdict", "?")
        series.append(("GPU %s (%s)" % (idx, verdict), {"t": [s["t"] - t0 for s in ss],
                                                         "temp_c": [s["temp_c"] for s in ss],
                                                         "sm_mhz": [s["sm_mhz"] for s in ss]}))
    intervals = [iv for g in (summary.get("gpus") or {}).values() for iv in g.get("throttled_intervals", [])]
    verdict = summary.get("verdict", "?")
    dur = summary.get("duration_s")
    title = ("%s — thermal soak — verdict: %s — %s s load (%s s sampled), %d GPUs"
             % (summary.get("host") or "?", verdict.upper(), dur if dur is not None else "?", summary.get("sampled_s"),
                len(by_gpu)))
    return plot_series(series, out_path, title, VERDICT_COLOURS.get(verdict, "black"), ceiling, intervals,
                       summary.get("reasons") or [], xlabel="time since soak start (s)")


def plot_history(history, out_path, host=None):
    """A health-history window (b300.rollout.health_history_read's result, or its plot_data alone) as the same plot,
    with the window marked and thermal-violation stretches shaded."""
    pdata = history.get("plot_data", history)
    gpus_read = history.get("gpus") or {}
    t0 = pdata.get("t0") or 0.0
    window = pdata.get("window")
    span = (window or [0, 0])[1]
    unit, div = ("minutes", 60.0) if span > 7200 else ("seconds", 1.0)  # hours of history read in minutes
    series = []
    for idx, g in (pdata.get("gpus") or {}).items():
        hot = (gpus_read.get(idx) or {}).get("hot", g.get("hot"))
        series.append(("GPU %s%s" % (idx, " (hot)" if hot else ""), dict(g, t=[x / div for x in g.get("t", [])])))
    intervals = [[a / div, b / div] for g in (pdata.get("gpus") or {}).values()
                 for a, b in g.get("throttled_intervals", [])]
    hot_gpus = [i for i, g in gpus_read.items() if g.get("hot")] or [i for i, g in (pdata.get("gpus") or {}).items()
                                                                     if g.get("hot")]
    we = pdata.get("window_epoch") or [None, None]
    fmt = "%Y-%m-%d %H:%M:%SZ"
    when = " to ".join(time.strftime(fmt, time.gmtime(e)) for e in we if e is not None)
    title = ("%s — health history %s — %s" % (host or "?", when or "(no window)",
                                              ("HOT: GPU " + ", ".join(hot_gpus)) if hot_gpus else "not hot"))
    footer = ["%s: %s" % ("GPU " + i, "; ".join(g.get("hot_reasons") or [])) for i, g in gpus_read.items()
              if g.get("hot_reasons")]
    if not series:
        footer.insert(0, history.get("reason") or "no samples")
    return plot_series(series, out_path, title, VERDICT_COLOURS["hot" if hot_gpus else "ok"],
                       pdata.get("hot_temp_c", thermal.DEFAULTS["ceiling_c"]), intervals, footer,
                       xlabel="%s since %s" % (unit, time.strftime(fmt, time.gmtime(t0)) if t0 else "start"),
                       window=[x / div for x in window] if window else None,
                       interval_label="thermal violation (any GPU)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", help="samples.csv (nvidia-smi query CSV or dmon text)")
    ap.add_argument("--summary", help="summary.json of this host")
    ap.add_argument("--history", help="JSON of a health_history_read result (or its plot_data) instead of a soak")
    ap.add_argument("--host", help="host name (when there is no summary)")
    ap.add_argument("--out", required=True, help="PNG to write")
    a = ap.parse_args(argv)
    if bool(a.samples) == bool(a.history):
        ap.error("give either --samples (a thermal soak) or --history (a health history window)")
    if a.history:
        try:
            with open(a.history, encoding="utf-8") as f:
                history = json.load(f)
        except (OSError, ValueError) as e:
            print("cannot read history %s: %s" % (a.history, e), file=sys.stderr)
            return 2
        plot_history(history, a.out, a.host)
        print(a.out)
        return 0
    try:
        with open(a.samples, encoding="utf-8") as f:
            parsed = thermal.parse_any(f.read())
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
