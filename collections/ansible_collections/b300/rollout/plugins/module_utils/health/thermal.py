# -*- coding: utf-8 -*-
"""Thermal soak / burn-in: parse `nvidia-smi --query-gpu ... -lms N` or `nvidia-smi dmon` samples and judge them.

Plain stdlib functions (no Ansible, no third-party imports): the modules `thermal_soak_probe` and
`thermal_soak_report` and the controller tool `tools/plot_thermal.py` all use them.

Verdicts per GPU and per host, worst first: error > hot > throttled > ok.
- error:     no samples, the loader is missing or failed, or a GPU never reached load.
- hot:       max temperature.gpu above the ceiling.
- throttled: counted clock-event reasons (thermal/power slowdown) active in more than `throttle_max_fraction`
             of the loaded samples, or a sustained SM clock drop under load: the median SM clock of the last
             third of the loaded period below (100 - clock_drop_max_pct)% of the median of the first minute
             (at most the first third) while the median utilisation of that last third stays loaded.
"""
from __future__ import annotations

import datetime
import re
import statistics

# Field names valid on driver >= 550 (the real 580.159.04 capture uses clocks.current.sm and
# clocks_event_reasons.active). Drivers before the rename know only clocks_throttle_reasons.*.
QUERY_FIELDS = [
    "timestamp",
    "index",
    "temperature.gpu",
    "clocks.current.sm",
    "clocks.current.memory",
    "power.draw",
    "utilization.gpu",
    "clocks_event_reasons.active",
    "clocks_event_reasons.hw_thermal_slowdown",
    "clocks_event_reasons.sw_thermal_slowdown",
    "clocks_event_reasons.sw_power_cap",
    "clocks_event_reasons.hw_slowdown",
]
LEGACY_PREFIX = "clocks_throttle_reasons."
EVENT_PREFIX = "clocks_event_reasons."

# NVML nvmlClocksEventReasons bit values.
REASON_BITS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}
# Reasons that mean "cooling or power delivery is not keeping up". sw_power_cap is sampled and reported, but not
# counted by default: a matmul burner on an air/liquid-cooled HGX sits at its power cap by design.
DEFAULT_THROTTLE_REASONS = ["hw_thermal_slowdown", "sw_thermal_slowdown", "hw_slowdown", "hw_power_brake_slowdown"]

DEFAULTS = {
    "ceiling_c": 90.0,
    "loaded_util_pct": 50.0,
    "throttle_reasons": DEFAULT_THROTTLE_REASONS,
    "throttle_max_fraction": 0.10,
    "clock_drop_max_pct": 15.0,
    "baseline_s": 60.0,
    "sample_ms": 2000,
}

DMON_DEFAULT_GROUPS = "puc"  # nvidia-smi dmon -s groups of the dmon sampler

VERDICT_RANK = {"ok": 0, "throttled": 1, "hot": 2, "error": 3}

_ALIASES = {
    "timestamp": "timestamp",
    "index": "index",
    "temperature.gpu": "temp_c",
    "clocks.sm": "sm_mhz",
    "clocks.current.sm": "sm_mhz",
    "clocks.mem": "mem_mhz",
    "clocks.current.memory": "mem_mhz",
    "power.draw": "power_w",
    "power.draw.instant": "power_w",
    "power.draw.average": "power_w",
    "utilization.gpu": "util_pct",
}
_NA = {"", "n/a", "[n/a]", "[not supported]", "not supported", "[unknown error]", "unknown error", "[gpu is lost]"}
_NUM_RE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)")
_TS_FORMATS = ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S.%f", "%Y-%m-%dT%H:%M:%S",
               "%Y-%m-%d %H:%M:%S.%f", "%Y-%m-%d %H:%M:%S")


def legacy_fields(fields):
    """The same query with clocks_event_reasons.* renamed to clocks_throttle_reasons.* (drivers < 535)."""
    return [LEGACY_PREFIX + f[len(EVENT_PREFIX):] if f.startswith(EVENT_PREFIX) else f for f in fields]


def invalid_field(stderr_or_stdout):
    """Return the field nvidia-smi rejected ('Field "x" is not a valid field to query.'), or None."""
    m = re.search(r'Field "([^"]+)" is not a valid field to query', stderr_or_stdout or "")
    return m.group(1) if m else None


def parse_number(value):
    """'405 MHz' -> 405.0, '116.40' -> 116.4, 'N/A' / '[Not Supported]' -> None."""
    if value is None:
        return None
    v = value.strip()
    if v.lower() in _NA:
        return None
    m = _NUM_RE.match(v)
    return float(m.group(1)) if m else None


def parse_timestamp(value):
    """nvidia-smi timestamp ('2026/11/29 16:43:41.123') -> POSIX seconds (naive, local), or None."""
    v = (value or "").strip()
    for fmt in _TS_FORMATS:
        try:
            dt = datetime.datetime.strptime(v, fmt)
        except ValueError:
            continue
        return (dt - datetime.datetime(1970, 1, 1)).total_seconds()
    return None


def parse_active(value):
    """Decode clocks_event_reasons.active ('0x0000000000000041') into a set of reason names."""
    v = (value or "").strip()
    try:
        bits = int(v, 16) if v.lower().startswith("0x") else int(v)
    except ValueError:
        return None
    return {name for name, bit in REASON_BITS.items() if bits & bit}


def _field_key(name):
    name = re.sub(r"\s*\[[^\]]*\]\s*$", "", name.strip())  # header units: 'clocks.current.sm [MHz]'
    if name in _ALIASES:
        return _ALIASES[name]
    for prefix in (EVENT_PREFIX, LEGACY_PREFIX):
        if name.startswith(prefix):
            rest = name[len(prefix):]
            return "active" if rest == "active" else "reason:" + rest
    return "other:" + name


def _split(line):
    return [c.strip() for c in line.split(",")]


def parse_samples(text, fields=None):
    """Parse query-gpu CSV output into sample dicts.

    `fields`: the --query-gpu list when the text has no header (csv,noheader); when None, the first non-empty line
    is the header (plain `--format=csv`, units in brackets are stripped). Values may carry units ('405 MHz').
    Returns {"samples": [...], "malformed": n, "fields": [...]}; each sample has index, t (POSIX seconds or None),
    temp_c, sm_mhz, mem_mhz, power_w, util_pct (floats or None) and reasons (set of active reason names, or None
    when no reason column was readable).
    """
    lines = [ln for ln in (text or "").splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if fields is None:
        if not lines:
            return {"samples": [], "malformed": 0, "fields": []}
        fields = _split(lines[0])
        lines = lines[1:]
    keys = [_field_key(f) for f in fields]
    samples, malformed = [], 0
    for line in lines:
        cols = _split(line)
        if len(cols) != len(keys):
            malformed += 1
            continue
        s = {"index": None, "t": None, "temp_c": None, "sm_mhz": None, "mem_mhz": None, "power_w": None,
             "util_pct": None, "reasons": None}
        reasons, reason_seen = set(), False
        for key, val in zip(keys, cols):
            if key == "timestamp":
                s["t"] = parse_timestamp(val)
            elif key == "index":
                num = parse_number(val)
                s["index"] = int(num) if num is not None else None
            elif key == "active":
                act = parse_active(val)
                if act is not None:
                    reasons |= act
                    reason_seen = True
            elif key.startswith("reason:"):
                v = val.strip().lower()
                if v in ("active", "not active"):
                    reason_seen = True
                    if v == "active":
                        reasons.add(key[len("reason:"):])
            elif not key.startswith("other:"):
                s[key] = parse_number(val)
        if s["index"] is None:
            malformed += 1
            continue
        s["reasons"] = reasons if reason_seen else None
        samples.append(s)
    return {"samples": samples, "malformed": malformed, "fields": list(fields)}


def _median(values):
    """Median of the values that are not None; None when there are none."""
    vals = [v for v in values if v is not None]
    return float(statistics.median(vals)) if vals else None


def _round(v, nd=1):
    return None if v is None else round(v, nd)


def _intervals(times, flags, dts):
    """Contiguous runs of flagged samples -> [[start_s, end_s], ...]."""
    out, start = [], None
    for t, f, dt in zip(times, flags, dts):
        if f and start is None:
            start = t
        if f:
            end = t + dt
        if not f and start is not None:
            out.append([round(start, 1), round(end, 1)])
            start = None
    if start is not None:
        out.append([round(start, 1), round(end, 1)])
    return out


def _params(params):
    p = dict(DEFAULTS)
    p.update({k: v for k, v in (params or {}).items() if v is not None})
    return p


def analyse_gpu(samples, t0, params=None):
    """Judge one GPU's samples (already filtered to that GPU). t0: soak start (POSIX s) for relative times."""
    p = _params(params)
    counted = set(p["throttle_reasons"])
    interval = float(p["sample_ms"]) / 1000.0
    ss = sorted((s for s in samples if s.get("t") is not None), key=lambda s: s["t"])
    res = {"verdict": "error", "reasons": [], "samples": len(ss), "loaded_samples": 0,
           "temp_max_c": None, "temp_median_c": None, "sm_min_mhz": None, "sm_median_mhz": None,
           "sm_baseline_mhz": None, "sm_tail_mhz": None, "sm_tail_ratio": None,
           "mem_median_mhz": None, "power_max_w": None, "power_median_w": None, "util_median_pct": None,
           "time_above_ceiling_s": 0.0, "first_above_ceiling_s": None, "first_throttled_s": None,
           "throttle_fraction": None, "reason_counts": {}, "throttled_intervals": []}
    if not ss:
        res["reasons"].append("no samples")
        return res
    times = [s["t"] - t0 for s in ss]
    gaps = [b - a for a, b in zip(times, times[1:])]
    typical = _median(gaps) or interval
    dts = [min(g, 3 * typical) for g in gaps] + [typical]
    # dmon sampled without -s u has no utilisation: then every sample counts as loaded (the soak keeps the load on)
    # (only when the sampler had no utilisation column at all: a query CSV or dmon -s u with empty values stays "never loaded")
    util_known = not ss or not all(s.get("util_column") is False for s in ss)
    res["util_sampled"] = util_known
    loaded = [(s["util_pct"] is not None and s["util_pct"] >= p["loaded_util_pct"]) if util_known else True
              for s in ss]
    ls = [s for s, ld in zip(ss, loaded) if ld]
    res["loaded_samples"] = len(ls)
    temps = [s["temp_c"] for s in ss if s["temp_c"] is not None]
    res["temp_max_c"] = _round(max(temps)) if temps else None
    res["temp_median_c"] = _round(_median(s["temp_c"] for s in (ls or ss)))
    sms = [s["sm_mhz"] for s in (ls or ss) if s["sm_mhz"] is not None]
    res["sm_min_mhz"] = _round(min(sms)) if sms else None
    res["sm_median_mhz"] = _round(_median(sms))
    res["mem_median_mhz"] = _round(_median(s["mem_mhz"] for s in (ls or ss)))
    powers = [s["power_w"] for s in ss if s["power_w"] is not None]
    res["power_max_w"] = _round(max(powers)) if powers else None
    res["power_median_w"] = _round(_median(s["power_w"] for s in (ls or ss)))
    res["util_median_pct"] = _round(_median(s["util_pct"] for s in ss))
    # temperature above the ceiling
    above = [s["temp_c"] is not None and s["temp_c"] > p["ceiling_c"] for s in ss]
    res["time_above_ceiling_s"] = round(sum(dt for a, dt in zip(above, dts) if a), 1)
    res["first_above_ceiling_s"] = next((round(t, 1) for t, a in zip(times, above) if a), None)
    # clock-event reasons
    counts = {}
    for s in ss:
        for r in sorted(s["reasons"] or ()):
            counts[r] = counts.get(r, 0) + 1
    res["reason_counts"] = counts
    reason_flag = [bool(s["reasons"] and (s["reasons"] & counted)) for s in ss]
    if ls:
        res["throttle_fraction"] = round(sum(1 for f, ld in zip(reason_flag, loaded) if f and ld) / len(ls), 3)
    # sustained SM clock drop under load
    drop_flag = [False] * len(ss)
    clock_dropped = False
    if ls:
        lt = [(s["t"] - t0) for s in ls]
        span = lt[-1] - lt[0]
        base_end = lt[0] + min(float(p["baseline_s"]), span / 3.0)
        tail_start = lt[-1] - span / 3.0
        base = _median(s["sm_mhz"] for s, t in zip(ls, lt) if t <= base_end)
        tail = [s for s, t in zip(ls, lt) if t >= tail_start]
        tail_sm = _median(s["sm_mhz"] for s in tail)
        tail_util = _median(s["util_pct"] for s in tail)
        res["sm_baseline_mhz"] = _round(base)
        res["sm_tail_mhz"] = _round(tail_sm)
        if base and tail_sm is not None:
            res["sm_tail_ratio"] = round(tail_sm / base, 3)
            limit = base * (1.0 - float(p["clock_drop_max_pct"]) / 100.0)
            if span > 0 and tail_sm < limit and (not util_known or (tail_util is not None
                                                                    and tail_util >= p["loaded_util_pct"])):
                clock_dropped = True
            drop_flag = [ld and (s["t"] - t0) > base_end and s["sm_mhz"] is not None and s["sm_mhz"] < limit
                         for s, ld in zip(ss, loaded)]
    throttled_flag = [a or (clock_dropped and b) for a, b in zip(reason_flag, drop_flag)]
    res["throttled_intervals"] = _intervals(times, throttled_flag, dts)
    res["first_throttled_s"] = next((round(t, 1) for t, f in zip(times, throttled_flag) if f), None)
    # verdict
    if not ls:
        mx = max((s["util_pct"] for s in ss if s["util_pct"] is not None), default=None)
        res["reasons"].append("never loaded: max utilization.gpu %s%% < %s%%" % (mx, p["loaded_util_pct"]))
        return res
    reasons, verdict = [], "ok"
    if res["temp_max_c"] is not None and res["temp_max_c"] > p["ceiling_c"]:
        verdict = "hot"
        reasons.append("max temperature %s C above the ceiling %s C (%.0f s above, first at %s s)"
                       % (res["temp_max_c"], p["ceiling_c"], res["time_above_ceiling_s"], res["first_above_ceiling_s"]))
    if res["throttle_fraction"] is not None and res["throttle_fraction"] > p["throttle_max_fraction"]:
        verdict = "hot" if verdict == "hot" else "throttled"
        active = sorted(r for r in counts if r in counted)
        reasons.append("%s active in %.0f%% of loaded samples (limit %.0f%%)"
                       % ("/".join(active), 100 * res["throttle_fraction"], 100 * p["throttle_max_fraction"]))
    if clock_dropped:
        verdict = "hot" if verdict == "hot" else "throttled"
        reasons.append("SM clock fell to %s MHz in the last third vs %s MHz at the start (%.0f%%, limit -%s%%) under load"
                       % (res["sm_tail_mhz"], res["sm_baseline_mhz"], 100 * res["sm_tail_ratio"], p["clock_drop_max_pct"]))
    res["verdict"] = verdict
    res["reasons"] = reasons
    return res


def worst(verdicts):
    vs = list(verdicts)
    return max(vs, key=lambda v: VERDICT_RANK.get(v, 3)) if vs else "error"


def analyse_host(samples, params=None, expected_gpus=None, load_errors=None, host=None, duration_s=None):
    """Judge a host: per-GPU results plus the host verdict (the worst GPU, or error for load/sampling problems).

    samples: parse_samples()["samples"]; expected_gpus: GPU indices that must appear (list of int) or None;
    load_errors: human-readable problems from the loader/sampler run (each makes the host 'error').
    """
    p = _params(params)
    by_gpu = {}
    for s in samples:
        by_gpu.setdefault(s["index"], []).append(s)
    stamps = [s["t"] for s in samples if s.get("t") is not None]
    t0 = min(stamps) if stamps else 0.0
    indices = sorted(set(by_gpu) | set(expected_gpus or []))
    gpus = {}
    for i in indices:
        gpus[str(i)] = analyse_gpu(by_gpu.get(i, []), t0, p)
    errors = list(load_errors or [])
    if not samples:
        errors.append("no samples from nvidia-smi")
    verdict = "error" if errors else worst(g["verdict"] for g in gpus.values()) if gpus else "error"
    reasons = list(errors)
    for i, g in gpus.items():
        reasons += ["GPU %s %s: %s" % (i, g["verdict"], r) for r in g["reasons"]]
    temps = [g["temp_max_c"] for g in gpus.values() if g["temp_max_c"] is not None]
    sms = [g["sm_min_mhz"] for g in gpus.values() if g["sm_min_mhz"] is not None]
    firsts = [g["first_throttled_s"] for g in gpus.values() if g["first_throttled_s"] is not None]
    span = (max(stamps) - t0) if stamps else 0.0
    return {
        "host": host,
        "verdict": verdict,
        "reasons": reasons,
        "duration_s": duration_s,
        "sampled_s": round(span, 1),
        "gpu_count": len(gpus),
        "samples": len(samples),
        "t0": t0,
        "temp_max_c": max(temps) if temps else None,
        "sm_min_mhz": min(sms) if sms else None,
        "first_throttled_s": min(firsts) if firsts else None,
        "params": {k: p[k] for k in ("ceiling_c", "loaded_util_pct", "throttle_reasons", "throttle_max_fraction",
                                     "clock_drop_max_pct", "baseline_s", "sample_ms")},
        "gpus": gpus,
    }


def fleet_summary(host_summaries):
    """All hosts: {verdict, failed_hosts, hosts: {name: summary}}."""
    hosts = {h["host"]: h for h in host_summaries}
    failed = sorted(n for n, h in hosts.items() if h["verdict"] != "ok")
    return {"verdict": worst(h["verdict"] for h in hosts.values()) if hosts else "error",
            "failed_hosts": failed, "hosts": hosts}


def choose_loader(preference, torch_python, nccl_bin, burn_bin):
    """Pick the load generator: 'torch' (PyTorch bf16 matmul), 'nccl' (looped all_reduce_perf) or 'burn'.

    preference: auto|torch|nccl|burn. torch_python: interpreter path where `torch.cuda.is_available()` is True or
    None; nccl_bin / burn_bin: found executables or None. Returns (kind, problem) with kind None when nothing fits.
    """
    avail = {"torch": torch_python, "nccl": nccl_bin, "burn": burn_bin}
    if preference != "auto":
        if preference not in avail:
            return None, "unknown loader %r (expected auto, torch, nccl or burn)" % preference
        if avail[preference]:
            return preference, None
        return None, "loader %r requested but not available on this host" % preference
    for kind in ("torch", "nccl", "burn"):
        if avail[kind]:
            return kind, None
    return None, ("no loader: python3 with torch.cuda.is_available() not found, no all_reduce_perf, "
                  "no gpu_burn/gpu-burn")


def parse_load_log(text):
    """TFLOPS lines printed by the torch burner ('TFLOPS gpu=<i> t=<s> tflops=<x>') -> {gpu: [(t, x), ...]}."""
    out = {}
    for m in re.finditer(r"^TFLOPS gpu=(\d+) t=([\d.]+) tflops=([\d.]+)", text or "", re.M):
        out.setdefault(m.group(1), []).append((float(m.group(2)), float(m.group(3))))
    return out


def sampler_argv(nvidia_smi, fields, sample_ms):
    """argv of the sampler: one CSV line per GPU every sample_ms until stopped."""
    return [nvidia_smi, "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits", "-lms", str(int(sample_ms))]


def sampler_spec(sampler, nvidia_smi, fields, sample_ms, dmon_groups=DMON_DEFAULT_GROUPS):
    """The runner's sampler entry: query CSV (header line = the fields) or dmon (no header line: dmon prints its own)."""
    if sampler == "dmon":
        return {"kind": "dmon", "argv": dmon_argv(nvidia_smi, sample_ms, dmon_groups), "header": ""}
    if sampler != "query":
        raise ValueError("unknown sampler %r (expected query or dmon)" % (sampler,))
    return {"kind": "query", "argv": sampler_argv(nvidia_smi, fields, sample_ms), "header": ",".join(fields)}


def build_plan(kind, duration_s, sample_ms, nvidia_smi, fields, gpu_indices, out_dir, loader_path,
               burner_script=None, burn_size=8192, nccl_args=None, burn_args=None, load_env=None, grace_s=10,
               sampler="query", dmon_groups=DMON_DEFAULT_GROUPS):
    """The runner's plan (see roles/thermal_soak/files/thermal_soak_runner.py) for the chosen loader.

    torch: one burner per GPU (CUDA_VISIBLE_DEVICES=<i>), running slightly past the deadline so it is still loaded
    when the sampler stops; nccl: one looped all_reduce_perf over all GPUs; burn: one gpu-burn-like tool over all
    GPUs, given the duration in seconds as its last argument.
    """
    env = {"NCCL_NVLS_ENABLE": "0"}
    env.update({str(k): str(v) for k, v in (load_env or {}).items()})
    duration_s = int(duration_s)
    over = duration_s + int(grace_s) + 30
    loads = []
    if kind == "torch":
        for i in gpu_indices:
            e = dict(env, CUDA_VISIBLE_DEVICES=str(i))
            loads.append({"name": "gpu%s" % i, "loop": False, "env": e,
                          "argv": [loader_path, burner_script, "--seconds", str(over), "--device", "0",
                                   "--gpu-label", str(i), "--size", str(int(burn_size))]})
    elif kind == "nccl":
        args = list(nccl_args) if nccl_args else ["-b", "256M", "-e", "2G", "-f", "2", "-n", "50", "-w", "5", "-c", "0"]
        loads.append({"name": "nccl", "loop": True, "env": env,
                      "argv": [loader_path] + args + ["-g", str(len(gpu_indices))]})
    elif kind == "burn":
        loads.append({"name": "burn", "loop": False, "env": env,
                      "argv": [loader_path] + list(burn_args or []) + [str(over)]})
    else:
        raise ValueError("unknown loader kind %r" % kind)
    return {"duration_s": duration_s, "grace_s": int(grace_s), "out_dir": out_dir,
            "sampler": sampler_spec(sampler, nvidia_smi, fields, sample_ms, dmon_groups),
            "loads": loads, "loader": kind}


def load_problems(status):
    """Problems in the runner's status.json (dict) that make a host 'error'."""
    if not status:
        return ["runner status missing (the soak did not run or was killed)"]
    out = []
    for ld in status.get("loads", []):
        if ld.get("failed"):
            tail = (ld.get("log_tail") or "").strip().splitlines()[-3:]
            out.append("loader %s (%s) stopped after %s s of %s s, rc %s: %s"
                       % (ld.get("name"), " ".join(ld.get("argv", [])[:1]), ld.get("ended_early_s"),
                          status.get("duration_s"), (ld.get("rcs") or [None])[-1], " | ".join(tail)))
    if not status.get("loads"):
        out.append("no loader ran")
    smp = status.get("sampler", {})
    if smp.get("ended_early_s") is not None and smp.get("rc") not in (0, None):
        out.append("sampler nvidia-smi exited rc %s after %s s: %s"
                   % (smp.get("rc"), smp.get("ended_early_s"), (smp.get("stderr_tail") or "").strip()[-300:]))
    if status.get("still_running"):
        out.append("processes still running after the soak: %s"
                   % ", ".join("%s %s" % (p["pid"], p["cmdline"][:60]) for p in status["still_running"]))
    return out


# --------------------------------------------------------------------------- nvidia-smi dmon
# dmon column names (`# gpu pwr gtemp ...` header, any -s selection of p,u,c,v,m,e,t and -o D/T/DT) -> sample keys.
DMON_COLUMNS = {
    "gpu": "index",
    "pwr": "power_w",
    "gtemp": "temp_c",
    "temp": "temp_c",  # drivers before ~R384 print `# gpu   pwr  temp    sm ...` (no mtemp)
    "mtemp": "mem_temp_c",
    "sm": "util_pct",
    "mem": "mem_util_pct",
    "mclk": "mem_mhz",
    "pclk": "sm_mhz",
    "gclk": "sm_mhz",
    "pviol": "pviol_pct",
    "tviol": "tviol",
}
# dmon's violation columns (-s v) as clock-event reason names, so that analyse_gpu can count them when listed in
# throttle_reasons: tviol (thermal violation, bool) -> thermal_violation, pviol (% of time power-capped) ->
# power_violation. Neither is counted by default.
DMON_REASONS = {"tviol": "thermal_violation", "pviol": "power_violation"}


def dmon_argv(nvidia_smi, sample_ms, groups=DMON_DEFAULT_GROUPS):
    """argv of the dmon sampler: `nvidia-smi dmon -s <groups> -o DT -d <seconds>` (dmon's delay is whole seconds, >= 1).

    groups: -s letters; p (power/temperature) and c (clocks) are what the analysis needs, u (SM utilisation) tells loaded
    samples apart; without u every sample counts as loaded.
    """
    secs = max(1, int(round(int(sample_ms) / 1000.0)))
    return [nvidia_smi, "dmon", "-s", groups, "-o", "DT", "-d", str(secs)]


def _dmon_time(date, clock):
    """dmon -o D/T/DT stamps ('20261201', '01:59:54'; '2026/01/31' also accepted) -> POSIX seconds or None."""
    d = (date or "19700101").replace("/", "").replace("-", "")
    try:
        dt = datetime.datetime.strptime(d + " " + (clock or "00:00:00"), "%Y%m%d %H:%M:%S")
    except ValueError:
        return None
    return (dt - datetime.datetime(1970, 1, 1)).total_seconds()


def is_dmon(text):
    """True when the text looks like `nvidia-smi dmon` output (a `# gpu ...` / `#Date Time gpu ...` header)."""
    for ln in (text or "").splitlines()[:50]:
        s = ln.strip()
        if s.startswith("#"):
            toks = s.lstrip("#").replace(",", " ").split()
            if "gpu" in toks[:3]:
                return True
    return False


def parse_dmon(text, interval_s=1.0):
    """Parse `nvidia-smi dmon` text output into the same sample dicts as :func:`parse_samples`.

    Handles: the header (`# gpu pwr gtemp ...`, `#Date Time gpu ...`, `#Time gpu ...`) and units line (`# Idx W C ...`,
    `#YYYYMMDD HH:MM:SS Idx ...`) repeated every screenful, any -s selection (unknown columns are kept under `extra`),
    `-` for unavailable values, blank lines, a last line cut short when the sampler was killed (counted as malformed).
    Time: from the Date/Time columns (-o DT; -o T alone is anchored at 1970-01-01 and wraps over midnight); without
    them, synthetic: one round of GPUs = interval_s seconds (`t_synthetic` is then True).

    Returns {"samples": [...], "malformed": n, "fields": [columns], "headers": n, "t_synthetic": bool}. Each sample has
    index, t, temp_c, sm_mhz, mem_mhz, power_w, util_pct, reasons (set of thermal_violation/power_violation when -s v
    was sampled, else None), mem_temp_c, mem_util_pct, util_column (False when dmon ran without -s u: analyse_gpu then
    counts every sample as loaded), pviol_pct / tviol (the raw violation values, when -s v was sampled) and extra
    (other columns, by dmon name).
    """
    columns, samples, malformed, headers = None, [], 0, 0
    synthetic = None
    round_no, seen_in_round = 0, set()
    last_t, day_offset = None, 0.0
    for raw in (text or "").splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            toks = line.lstrip("#").replace(",", " ").split()
            if "gpu" in toks[:3]:
                columns = [t.lower() for t in toks]
                headers += 1
            continue
        if columns is None:
            malformed += 1
            continue
        vals = line.replace(",", " ").split()
        if len(vals) != len(columns):
            malformed += 1
            continue
        row = dict(zip(columns, vals))
        s = {"index": None, "t": None, "temp_c": None, "sm_mhz": None, "mem_mhz": None, "power_w": None,
             "util_pct": None, "reasons": None, "mem_temp_c": None, "mem_util_pct": None}
        idx = parse_number(row.get("gpu"))
        if idx is None:
            malformed += 1
            continue
        s["index"] = int(idx)
        s["util_column"] = "sm" in row
        extra = {}
        for col, val in row.items():
            key = DMON_COLUMNS.get(col)
            if col in ("date", "time", "gpu"):
                continue
            num = None if val.strip() == "-" else parse_number(val)
            if key in ("pviol_pct", "tviol"):
                s[key] = num  # the raw value too (health_history sums violation time from it)
                if num is not None:
                    if s["reasons"] is None:
                        s["reasons"] = set()
                    if num > 0:
                        s["reasons"].add(DMON_REASONS[col])
            elif key:
                s[key] = num
            else:
                extra[col] = num
        if extra:
            s["extra"] = extra
        if "time" in row or "date" in row:
            t = _dmon_time(row.get("date"), row.get("time"))
            if t is not None and "date" not in row:
                t += day_offset
                if last_t is not None and t < last_t - 43200:
                    day_offset += 86400.0
                    t += 86400.0
            s["t"] = t
            if t is not None:
                last_t = t
            synthetic = False if synthetic is None else synthetic
        else:
            if s["index"] in seen_in_round:
                round_no += 1
                seen_in_round = set()
            seen_in_round.add(s["index"])
            s["t"] = round_no * float(interval_s)
            synthetic = True
        samples.append(s)
    return {"samples": samples, "malformed": malformed, "fields": list(columns or []), "headers": headers,
            "t_synthetic": bool(synthetic)}


def parse_any(text, fields=None, interval_s=1.0):
    """dmon text or query CSV, whichever the text is (samples.csv holds the output of the chosen sampler)."""
    if is_dmon(text):
        out = parse_dmon(text, interval_s)
        out["sampler"] = "dmon"
        return out
    out = parse_samples(text, fields)
    out["sampler"] = "query"
    return out
