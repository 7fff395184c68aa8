# -*- coding: utf-8 -*-
"""Health history: the GPU (`nvidia-smi dmon`) and IB/RDMA port-counter history every GPU host keeps, and its reader.

Plain stdlib (no Ansible, no third-party imports). Three users:
- the sampler service `roles/health_history/files/sampler.py` (installed next to this file and to thermal.py on each
  host; also runnable alone: `python3 sampler.py --once --out DIR`);
- the read-only module `b300.rollout.health_history_read` (what the on-call triage calls: "was it hot when it hung?");
- the unit tests.

Files in the history directory (one writer: the sampler):
  current.jsonl                   the file being appended to
  history-<first epoch>.jsonl     rotated files, oldest first by name
Rotation: the current file is renamed when the next record would make it larger than `max_file_bytes`; then the
oldest rotated files are deleted until at most `max_files` files (current included) remain. Disk use is therefore at
most max_files x max_file_bytes (a record is a few kB; a single record larger than the cap is still written whole).

One JSON object per line. Records:
  {"v": 1, "t": <epoch>, "meta": {...}}                      sampler start: host, interval_s, dmon argv, NICs
  {"v": 1, "t": <epoch>, "event": "text"}                    dmon exited / restarted / stalled, unreadable counters
  {"v": 1, "t": <epoch>, "iv": <interval s>, "g": {"<gpu index>": {"temp": C, "mtemp": C, "pwr": W, "sm": MHz,
   "mclk": MHz, "util": %, "pviol": %, "tviol": 0|1}}, "n": {"<nic>": {"<counter>": value}}, "full": true|false}
The "n" map of a sample record holds every counter when "full" is true (the first record of each file and of each
sampler start) and only the counters that changed since the previous record otherwise: a file is self-contained,
and a quiet NIC costs a few bytes per record. A NIC key is the RDMA device name for port 1 (`mlx5_3`) and
`<device>:<port>` for other ports; a counter key is the sysfs file name under ports/<p>/counters/ or
ports/<p>/hw_counters/ (a hw_counters name that also exists under counters/ gets the prefix `hw_counters/`).
"""
from __future__ import annotations

import json
import os
import re
import time

try:
    from ansible_collections.b300.rollout.plugins.module_utils.health import thermal
except ImportError:  # on the host, next to sampler.py (roles/health_history ships this file and thermal.py together)
    import thermal  # type: ignore[no-redef]

FORMAT_VERSION = 1
CURRENT = "current.jsonl"
ROTATED_RE = re.compile(r"^history-(\d+)(?:-(\d+))?\.jsonl$")
# dmon metric groups of the sampler: p power + GPU and memory temperature, u utilisation, c clocks, v violations.
DMON_GROUPS = "pucv"

# Hot judgement (per GPU, over the window read):
# - temperature: above 90 C = the thermal soak's ceiling (module_utils/health/thermal.py DEFAULTS["ceiling_c"]), itself the
#   B300 max operating temperature of the sandbox model (sandbox/hwemu/README.md: slowdown 92 C, shutdown 98 C); the
#   seed's cliff (../shared/seeds/001 section 6.1: 96 C, throughput -40% after 15 min at full load) is above it and its
#   healthy figure (82 C after the airflow fix) is below it;
# - any thermal violation sampled by dmon (-s v `tviol`): DCGM fails a diagnostic on any thermal violation
#   (NVIDIA/DCGM nvvs/src/DcgmRecorder.cpp:503-523, ../shared/reference/oncall-triage-anchors.md R12).
HOT_TEMP_C = thermal.DEFAULTS["ceiling_c"]

_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw]?)", re.I)
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}

# dmon sample keys (module_utils/health/thermal.py parse_dmon) -> short record keys.
GPU_KEYS = (("temp_c", "temp"), ("mem_temp_c", "mtemp"), ("power_w", "pwr"), ("sm_mhz", "sm"), ("mem_mhz", "mclk"),
            ("util_pct", "util"), ("pviol_pct", "pviol"), ("tviol", "tviol"))


class HistoryError(Exception):
    pass


def parse_duration(text):
    """'6h' -> 21600, '90m' -> 5400, '1h30m' -> 5400, '45' / '45s' -> 45, '2d' -> 172800. ValueError otherwise."""
    s = str(text).strip().lower().replace(" ", "")
    if not s:
        raise ValueError("empty duration")
    pos, total = 0, 0.0
    for m in _DURATION_RE.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT_S[m.group(2)]
        pos = m.end()
    if pos != len(s):
        raise ValueError("duration %r: expected e.g. 6h, 90m, 1h30m, 45s, 2d" % (text,))
    if total <= 0:
        raise ValueError("duration %r must be positive" % (text,))
    return total


# --------------------------------------------------------------------------------------------- sampling: GPUs
def dmon_argv(nvidia_smi, interval_s, groups=DMON_GROUPS, count=None):
    """`nvidia-smi dmon -s <groups> -d <s> [-c N]` (dmon's delay is whole seconds, >= 1)."""
    argv = [nvidia_smi, "dmon", "-s", groups, "-d", str(max(1, int(round(float(interval_s)))))]
    if count is not None:
        argv += ["-c", str(int(count))]
    return argv


def gpu_record(sample):
    """One thermal.parse_dmon sample -> the record's per-GPU dict (None values left out)."""
    out = {}
    for src, dst in GPU_KEYS:
        v = sample.get(src)
        if v is not None:
            out[dst] = int(v) if float(v).is_integer() else round(float(v), 2)
    return out


def gpu_round(dmon_text):
    """dmon text (header + one or more rounds) -> {"<index>": record dict} of the LAST sample of each GPU."""
    parsed = thermal.parse_dmon(dmon_text)
    rnd = {}
    for s in parsed["samples"]:
        rnd[str(s["index"])] = gpu_record(s)
    return rnd, parsed


class DmonRounds:
    """Feed dmon output line by line; complete rounds (all GPUs of one sampling instant) come out.

    A round ends when a GPU index repeats (the next round started) or, once the GPU count is known (given, or from a
    previous round), when that many GPUs are in. Header lines (`# gpu ...`, `# Idx ...`) are remembered and repeat every screenful.
    Each line is parsed by thermal.parse_dmon (the thermal soak's parser), so both read dmon the same way.
    """

    def __init__(self, clock=time.time, expected=None):
        self.header = None
        self.units = None
        self.current = {}
        self.started = None
        self.expected = int(expected) if expected else None  # GPU count, when known before the first round
        self.malformed = 0
        self.clock = clock

    def feed(self, line):
        """Returns the rounds this line completed: [] or [(t, {"<idx>": record}), ...] (at most two)."""
        s = line.strip()
        if not s:
            return []
        if s.startswith("#"):
            toks = s.lstrip("#").split()
            if "gpu" in [t.lower() for t in toks[:3]]:
                self.header = s
            else:
                self.units = s
            return []
        if self.header is None:
            self.malformed += 1
            return []
        parsed = thermal.parse_dmon(self.header + "\n" + s + "\n")
        if not parsed["samples"]:
            self.malformed += 1
            return []
        sample = parsed["samples"][0]
        idx = str(sample["index"])
        done = []
        if idx in self.current:
            done.append(self._close())
        if not self.current:
            self.started = self.clock()
        self.current[idx] = gpu_record(sample)
        if self.expected and len(self.current) >= self.expected:
            done.append(self._close())
        return done

    def _close(self):
        if not self.current:
            return None
        rnd, t = self.current, self.started
        self.expected = max(self.expected or 0, len(rnd))
        self.current, self.started = {}, None
        return t, rnd

    def flush(self):
        """The round in progress (dmon exited mid-round), or None."""
        return self._close()


# --------------------------------------------------------------------------------------------- sampling: NICs
def ib_devices(sysfs_root="/sys"):
    """RDMA device names under <sysfs_root>/class/infiniband (sorted), [] when there is none."""
    d = os.path.join(sysfs_root, "class", "infiniband")
    try:
        return sorted(os.listdir(d))
    except OSError:
        return []


def _read_int(path):
    try:
        with open(path, "rb") as f:
            return int(f.read().strip() or b"x", 0)
    except (OSError, ValueError):
        return None


def read_nic_counters(sysfs_root, nics):
    """Read the port counters of the named RDMA devices.

    Returns (values, problems, hw_names): values {"mlx5_0": {"link_downed": 0, "local_ack_timeout_err": 3, ...},
    "mlx5_0:2": {...}} from every file of ports/<p>/counters/ and ports/<p>/hw_counters/ (sysfs, mode 0444: no
    privilege needed); problems: a device that is missing or has no readable counter, by name; hw_names: the counter
    keys that came from hw_counters/ (the textfile exports those under their own metric).
    """
    out, problems, hw_names = {}, [], set()
    base = os.path.join(sysfs_root, "class", "infiniband")
    for dev in nics:
        pdir = os.path.join(base, dev, "ports")
        try:
            ports = sorted(os.listdir(pdir), key=lambda p: int(p) if p.isdigit() else 0)
        except OSError as e:
            problems.append("%s: no ports directory %s (%s)" % (dev, pdir, e.strerror or e))
            continue
        for port in ports:
            key = dev if port == "1" else "%s:%s" % (dev, port)
            vals = {}
            for sub in ("counters", "hw_counters"):
                cdir = os.path.join(pdir, port, sub)
                try:
                    names = sorted(os.listdir(cdir))
                except OSError:
                    continue
                for name in names:
                    v = _read_int(os.path.join(cdir, name))
                    if v is None:
                        continue
                    k = name if (sub == "counters" or name not in vals) else "hw_counters/" + name
                    vals[k] = v
                    if sub == "hw_counters":
                        hw_names.add(k)
            if vals:
                out[key] = vals
            else:
                problems.append("%s port %s: no readable counters under %s/{counters,hw_counters}"
                                % (dev, port, os.path.join(pdir, port)))
    return out, problems, hw_names


def counter_changes(prev, cur):
    """The counters of cur that differ from prev (new NICs and counters included)."""
    ch = {}
    for nic, vals in cur.items():
        old = prev.get(nic, {})
        d = {k: v for k, v in vals.items() if old.get(k) != v}
        if d:
            ch[nic] = d
    return ch


# --------------------------------------------------------------------------------------------- writing, rotation
def rotated_files(directory):
    """[(first_epoch, path)] of the rotated files, oldest first."""
    out = []
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    for n in names:
        m = ROTATED_RE.match(n)
        if m:
            out.append((int(m.group(1)), int(m.group(2) or 0), os.path.join(directory, n)))
    return [(e, p) for e, _s, p in sorted(out)]


def history_files(directory):
    """Every history file, oldest first (the current file last)."""
    files = [p for _e, p in rotated_files(directory)]
    cur = os.path.join(directory, CURRENT)
    if os.path.exists(cur):
        files.append(cur)
    return files


def disk_usage(directory):
    """(bytes, files) of the history files."""
    total, n = 0, 0
    for p in history_files(directory):
        try:
            total += os.path.getsize(p)
            n += 1
        except OSError:
            pass
    return total, n


def _first_epoch(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    return float(json.loads(line)["t"])
                except (ValueError, KeyError, TypeError):
                    continue
    except OSError:
        pass
    return None


class HistoryWriter:
    """Append records to <dir>/current.jsonl with the size and count caps (see the module docstring).

    `rotated` is True right after a rotation: the caller then writes a full counter snapshot (the new file must be
    self-contained).
    """

    def __init__(self, directory, max_file_bytes, max_files, clock=time.time):
        if int(max_files) < 2:
            raise HistoryError("max_files must be >= 2 (the current file and at least one rotated file)")
        if int(max_file_bytes) < 4096:
            raise HistoryError("max_file_bytes must be >= 4096")
        self.dir = directory
        self.max_file_bytes = int(max_file_bytes)
        self.max_files = int(max_files)
        self.clock = clock
        self.path = os.path.join(directory, CURRENT)
        os.makedirs(directory, exist_ok=True)
        self.rotated = False

    def needs_rotation(self, nbytes):
        try:
            size = os.path.getsize(self.path)
        except OSError:
            return False
        return size > 0 and size + nbytes > self.max_file_bytes

    def rotate(self):
        first = _first_epoch(self.path)
        if first is None:
            first = self.clock()
        base = "history-%010d" % int(first)
        dest = os.path.join(self.dir, base + ".jsonl")
        n = 1
        while os.path.exists(dest):
            dest = os.path.join(self.dir, "%s-%d.jsonl" % (base, n))
            n += 1
        os.replace(self.path, dest)
        self.prune()
        self.rotated = True
        return dest

    def prune(self):
        """Delete the oldest rotated files until at most max_files files (current included) remain."""
        rot = rotated_files(self.dir)
        keep = self.max_files - 1  # the current file exists, or will after the write that follows a rotation
        removed = []
        while len(rot) > max(keep, 0):
            _e, p = rot.pop(0)
            try:
                os.remove(p)
                removed.append(p)
            except OSError:
                pass
        return removed

    def write(self, record):
        """Append one record; rotates first when the cap would be exceeded. Returns the line's length in bytes."""
        line = (json.dumps(record, separators=(",", ":"), sort_keys=True) + "\n").encode("utf-8")
        if self.needs_rotation(len(line)):
            self.rotate()
        with open(self.path, "ab") as f:
            f.write(line)
        return len(line)


def sample_record(t, interval_s, gpus, nic_counters, full):
    rec = {"v": FORMAT_VERSION, "t": round(float(t), 3), "iv": float(interval_s), "full": bool(full)}
    if gpus is not None:
        rec["g"] = gpus
    rec["n"] = nic_counters
    return rec


class Recorder:
    """Sample records with sparse NIC counters over a HistoryWriter: full snapshot at every file start."""

    def __init__(self, writer, interval_s):
        self.writer = writer
        self.interval_s = float(interval_s)
        self.prev = None

    def meta(self, t, meta):
        self.writer.write({"v": FORMAT_VERSION, "t": round(float(t), 3), "meta": meta})
        self.prev = None  # a sampler start: the next sample record is a full snapshot

    def event(self, t, text):
        self.writer.write({"v": FORMAT_VERSION, "t": round(float(t), 3), "event": str(text)[:500]})

    def sample(self, t, gpus, nic_counters):
        full = self.prev is None
        rec = sample_record(t, self.interval_s, gpus, nic_counters if full else counter_changes(self.prev, nic_counters),
                            full)
        line = (json.dumps(rec, separators=(",", ":"), sort_keys=True) + "\n").encode("utf-8")
        if not full and self.writer.needs_rotation(len(line)):
            self.writer.rotate()
            rec = sample_record(t, self.interval_s, gpus, nic_counters, True)
        self.writer.write(rec)
        self.writer.rotated = False
        self.prev = {k: dict(v) for k, v in nic_counters.items()}
        return rec


# --------------------------------------------------------------------------------------------- node_exporter textfile
PROM_GPU = (("temp", "b300_gpu_temperature_celsius", "GPU temperature (nvidia-smi dmon gtemp)"),
            ("mtemp", "b300_gpu_memory_temperature_celsius", "HBM temperature (nvidia-smi dmon mtemp)"),
            ("pwr", "b300_gpu_power_watts", "Power draw (nvidia-smi dmon pwr)"),
            ("sm", "b300_gpu_sm_clock_mhz", "SM clock (nvidia-smi dmon pclk)"),
            ("mclk", "b300_gpu_memory_clock_mhz", "Memory clock (nvidia-smi dmon mclk)"),
            ("util", "b300_gpu_utilization_percent", "SM utilisation (nvidia-smi dmon sm)"),
            ("pviol", "b300_gpu_power_violation_percent", "Share of the last sample period power-capped (dmon pviol)"),
            ("tviol", "b300_gpu_thermal_violation", "Thermal violation in the last sample period, 0/1 (dmon tviol)"))


def _esc(v):
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _split_nic(key):
    dev, _sep, port = key.partition(":")
    return dev, port or "1"


def render_textfile(t, gpus, nic_counters, hw_names, port_counters, status):
    """node_exporter textfile (Prometheus text format 0.0.4).

    GPUs: the last dmon sample. NICs: every hw_counters/ value (keys in hw_names) as b300_rdma_hw_counter, and of
    counters/ only the names in `port_counters` as b300_ib_port_counter: node_exporter's infiniband collector already
    exports the others (e.g. node_infiniband_link_downed_total) but not symbol_error
    (../shared/reference/oncall-triage-anchors.md R4 and section 3: "don't re-export what node_exporter exports").
    status: {"dmon_up": bool, "bytes": n, "files": n, "problems": n}.
    """
    lines = []
    for key, name, help_ in PROM_GPU:
        rows = [(i, g[key]) for i, g in sorted((gpus or {}).items(), key=lambda kv: int(kv[0])) if key in g]
        if not rows:
            continue
        lines += ["# HELP %s %s" % (name, help_), "# TYPE %s gauge" % name]
        lines += ['%s{gpu="%s"} %s' % (name, _esc(i), v) for i, v in rows]
    hw, port = [], []
    for nic in sorted(nic_counters or {}):
        dev, p = _split_nic(nic)
        for c, v in sorted(nic_counters[nic].items()):
            if c in hw_names:
                hw.append('b300_rdma_hw_counter{device="%s",port="%s",counter="%s"} %d'
                          % (_esc(dev), p, _esc(c.replace("hw_counters/", "")), v))
            elif c in port_counters:
                port.append('b300_ib_port_counter{device="%s",port="%s",counter="%s"} %d' % (_esc(dev), p, _esc(c), v))
    if port:
        lines += ["# HELP b300_ib_port_counter IB port counters node_exporter does not export (sysfs ports/<p>/counters/)",
                  "# TYPE b300_ib_port_counter counter"] + port
    if hw:
        lines += ["# HELP b300_rdma_hw_counter RDMA transport counters (sysfs ports/<p>/hw_counters/)",
                  "# TYPE b300_rdma_hw_counter counter"] + hw
    st = status or {}
    lines += ["# HELP b300_health_history_last_sample_timestamp_seconds When the sampler last wrote a sample",
              "# TYPE b300_health_history_last_sample_timestamp_seconds gauge",
              "b300_health_history_last_sample_timestamp_seconds %.3f" % float(t),
              "# HELP b300_health_history_dmon_up 1 when nvidia-smi dmon delivered the last sample",
              "# TYPE b300_health_history_dmon_up gauge",
              "b300_health_history_dmon_up %d" % (1 if st.get("dmon_up") else 0),
              "# HELP b300_health_history_bytes Bytes of history files on disk (bounded by max_files x max_file_bytes)",
              "# TYPE b300_health_history_bytes gauge",
              "b300_health_history_bytes %d" % int(st.get("bytes", 0)),
              "# HELP b300_health_history_files History files on disk",
              "# TYPE b300_health_history_files gauge",
              "b300_health_history_files %d" % int(st.get("files", 0)),
              "# HELP b300_health_history_problems NICs or counter directories the last sample could not read",
              "# TYPE b300_health_history_problems gauge",
              "b300_health_history_problems %d" % int(st.get("problems", 0))]
    return "\n".join(lines) + "\n"


# counters/ names exported by default besides hw_counters/: the one node_exporter lacks (see render_textfile).
DEFAULT_TEXTFILE_PORT_COUNTERS = ("symbol_error",)


def write_textfile(directory, name, text):
    """Atomic write (temp file in the same directory, then rename): node_exporter never reads half a file."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    tmp = os.path.join(directory, ".%s.%d.tmp" % (name, os.getpid()))
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return path


# --------------------------------------------------------------------------------------------- reading a window
def iter_records(directory, since_epoch=None):
    """Yield (record, path) in time order from the files that can hold records at or after since_epoch.

    A rotated file is skipped when the NEXT file starts at or before since_epoch (it ended before the window).
    Lines that are not JSON objects (a line cut short while being written) are skipped; the count of skipped lines is
    yielded at the end as ({"_skipped": n}, None).
    """
    rot = rotated_files(directory)
    files = [p for _e, p in rot]
    starts = [e for e, _p in rot]
    cur = os.path.join(directory, CURRENT)
    if os.path.exists(cur):
        files.append(cur)
        starts.append(None)
    skipped = 0
    for i, path in enumerate(files):
        if since_epoch is not None and i + 1 < len(files):
            nxt = starts[i + 1] if starts[i + 1] is not None else _first_epoch(files[i + 1])
            if nxt is not None and nxt <= since_epoch:
                continue
        try:
            f = open(path, encoding="utf-8", errors="replace")
        except OSError:
            continue  # rotated away or pruned between listing and opening
        with f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    skipped += 1
                    continue
                if not isinstance(rec, dict) or "t" not in rec:
                    skipped += 1
                    continue
                yield rec, path
    yield {"_skipped": skipped}, None


def _intervals(flags):
    """[(t, dt, flag)] in time order -> [[start, end], ...] of contiguous flagged stretches."""
    out = []
    for t, dt, f in flags:
        if f:
            if out and t <= out[-1][1] + 1e-6:
                out[-1][1] = max(out[-1][1], t + dt)
            else:
                out.append([t, t + dt])
    return [[round(a, 3), round(b, 3)] for a, b in out]


def _downsample(points, max_points):
    """points: [(t, rec)] sorted. Buckets of equal time span; per bucket: the mean time, max temperatures, min clock,
    max power (extremes survive the reduction)."""
    if len(points) <= max_points:
        return list(points)
    t0, t1 = points[0][0], points[-1][0]
    width = (t1 - t0) / float(max_points) or 1.0
    buckets = {}
    for t, r in points:
        buckets.setdefault(min(int((t - t0) / width), max_points - 1), []).append((t, r))
    out = []
    for k in sorted(buckets):
        b = buckets[k]
        merged = {}
        for key, fn in (("temp", max), ("mtemp", max), ("sm", min), ("pwr", max), ("tviol", max), ("pviol", max)):
            vals = [r[key] for _t, r in b if r.get(key) is not None]
            if vals:
                merged[key] = fn(vals)
        out.append((sum(t for t, _r in b) / len(b), merged))
    return out


def read_window(directory, since_s, now=None, hot_temp_c=HOT_TEMP_C, plot_points=600, plot_context_s=1800.0):
    """Summarise the history of the last since_s seconds (window [now - since_s, now]).

    Returns {"available", "window": {"start_epoch", "end_epoch", "first_sample_epoch", "last_sample_epoch",
    "samples"}, "gpus": {"<i>": {...}}, "nics": {"<nic>": {"<counter>": delta}}, "plot_data": {...}, "reason",
    "events", "files_read", "skipped_lines", "hot_temp_c"}; see the module health_history_read for every key.

    NIC deltas: sum of the increases between consecutive values inside the window, starting from the last value known
    before the window (or the first one inside it when the history starts later); a value lower than the one before
    it is a counter reset (driver reload, reboot) and counts as its own value.
    GPU violation time: a sample stands for min(its interval, the gap to the next sample) seconds, cut at the window
    end; thermal_violation_s sums the samples with tviol > 0, power_violation_s sums pviol% x that time.
    """
    now = time.time() if now is None else float(now)
    since_s = float(since_s)
    start, end = now - since_s, now
    plot_start = start - max(0.0, float(plot_context_s))
    res = {"available": False, "reason": None, "hot_temp_c": float(hot_temp_c),
           "window": {"start_epoch": round(start, 3), "end_epoch": round(end, 3), "first_sample_epoch": None,
                      "last_sample_epoch": None, "samples": 0},
           "gpus": {}, "nics": {}, "plot_data": {}, "events": [], "files_read": [], "skipped_lines": 0}
    if not os.path.isdir(directory):
        res["reason"] = "no history directory %s (is the health_history role installed on this host?)" % directory
        return res
    samples, files, deltas = _scan(directory, start, end, plot_start, res)
    res["files_read"] = [os.path.basename(p) for p in files]
    res["nics"] = {nic: dict(sorted(d.items())) for nic, d in sorted(deltas.items())}
    win = [s for s in samples if s[0] >= start]
    if not win:
        res["reason"] = ("no sample between %s and %s in %s (%d files)"
                         % (_iso(start), _iso(end), directory, len(history_files(directory))))
        res["plot_data"] = _plot_data(samples, plot_start, start, end, {}, hot_temp_c, plot_points)
        return res
    res["available"] = True
    res["window"].update(first_sample_epoch=win[0][0], last_sample_epoch=win[-1][0], samples=len(win))
    durations = _sample_durations(samples, end)
    gpus = _gpu_summaries(samples, durations, start, hot_temp_c)
    res["gpus"] = {i: gpus[i] for i in sorted(gpus, key=lambda x: int(x) if x.isdigit() else 1 << 30)}
    res["plot_data"] = _plot_data(samples, plot_start, start, end, dict(zip([s[0] for s in samples], durations)),
                                  hot_temp_c, plot_points, hot={i: a["hot"] for i, a in gpus.items()})
    return res


def _scan(directory, start, end, plot_start, res):
    """One pass over the history from plot_start to end: the GPU samples [(t, interval, {"<i>": record})], the files
    read, the NIC counter deltas inside [start, end] (nic -> counter -> delta); events and skipped lines into res."""
    state = {}          # nic -> counter -> last value seen (before or in the window)
    deltas = {}         # nic -> counter -> delta inside the window
    samples = []        # (t, iv, {"<i>": gpu record}) inside [plot_start, end]
    files = []
    for rec, path in iter_records(directory, since_epoch=plot_start):
        if path is None:
            res["skipped_lines"] = rec.get("_skipped", 0)
            continue
        if path not in files:
            files.append(path)
        t = float(rec["t"])
        if t > end:
            break
        if "event" in rec:
            if t >= start:
                res["events"].append({"epoch": t, "event": rec["event"]})
            continue
        if "meta" in rec:
            continue
        nmap = rec.get("n") or {}
        if rec.get("full"):
            # a full snapshot: counters absent from it are gone (NIC removed): forget them
            for nic in list(state):
                if nic not in nmap:
                    del state[nic]
        in_window = t >= start
        for nic, vals in nmap.items():
            st = state.setdefault(nic, {})
            for c, v in vals.items():
                if not isinstance(v, int):
                    continue
                old = st.get(c)
                if in_window:
                    d = deltas.setdefault(nic, {})
                    d.setdefault(c, 0)
                    if old is not None and v != old:
                        d[c] += (v - old) if v >= old else v
                st[c] = v
        if in_window:
            for nic, vals in state.items():  # counters known but unchanged: delta 0, still reported
                d = deltas.setdefault(nic, {})
                for c in vals:
                    d.setdefault(c, 0)
        if "g" in rec and t >= plot_start:
            samples.append((t, float(rec.get("iv") or 0) or None, rec["g"]))
    return samples, files, deltas


def _sample_durations(samples, end):
    """Per-sample duration: min(interval, gap to next), cut at the window end."""
    durations = []
    for k, (t, iv, _g) in enumerate(samples):
        nxt = samples[k + 1][0] if k + 1 < len(samples) else None
        gap = (nxt - t) if nxt is not None else None
        dt = iv if iv else (gap if gap is not None else 0.0)
        if gap is not None and gap < dt:
            dt = gap
        dt = max(0.0, min(dt, end - t))
        durations.append(dt)
    return durations


def _gpu_summaries(samples, durations, start, hot_temp_c):
    """Per GPU over the window's samples: sample count, max temperatures and power, min SM clock, thermal and power
    violation seconds, and whether (and since when) it ran hot, with the reasons."""
    gpus = {}
    for (t, _iv, g), dt in zip(samples, durations):
        if t < start:
            continue
        for i, r in g.items():
            a = gpus.setdefault(i, {"samples": 0, "max_temp_c": None, "max_mem_temp_c": None, "min_sm_clock_mhz": None,
                                    "max_power_w": None, "thermal_violation_s": 0.0, "power_violation_s": 0.0,
                                    "hot": False, "first_hot_epoch": None, "hot_reasons": []})
            a["samples"] += 1
            for key, field, fn in (("temp", "max_temp_c", max), ("mtemp", "max_mem_temp_c", max),
                                   ("sm", "min_sm_clock_mhz", min), ("pwr", "max_power_w", max)):
                v = r.get(key)
                if v is not None:
                    a[field] = v if a[field] is None else fn(a[field], v)
            tv = r.get("tviol")
            if tv is not None and tv > 0:
                a["thermal_violation_s"] += dt
            pv = r.get("pviol")
            if pv is not None and pv > 0:
                a["power_violation_s"] += dt * min(float(pv), 100.0) / 100.0
            hot_now = (r.get("temp") is not None and r["temp"] > hot_temp_c) or (tv is not None and tv > 0)
            if hot_now and a["first_hot_epoch"] is None:
                a["first_hot_epoch"] = t
    for a in gpus.values():
        a["thermal_violation_s"] = round(a["thermal_violation_s"], 1)
        a["power_violation_s"] = round(a["power_violation_s"], 1)
        if a["max_temp_c"] is not None and a["max_temp_c"] > hot_temp_c:
            a["hot_reasons"].append("max temperature %s C above %s C" % (a["max_temp_c"], _num(hot_temp_c)))
        if a["thermal_violation_s"] > 0 or (a["first_hot_epoch"] is not None and not a["hot_reasons"]):
            a["hot_reasons"].append("thermal violation for %s s (dmon tviol)" % a["thermal_violation_s"])
        a["hot"] = bool(a["hot_reasons"])
    return gpus


def _num(v):
    return int(v) if float(v).is_integer() else v


def _iso(epoch):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def _plot_data(samples, plot_start, start, end, dts, hot_temp_c, max_points, hot=None):
    """Series per GPU for tools/plot_thermal.py (times in seconds since t0 = plot start), downsampled to max_points.

    {"t0", "window": [start, end] (s since t0), "window_epoch": [start, end], "hot_temp_c", "gpus": {"<i>": {"t",
    "temp_c", "mem_temp_c", "sm_mhz", "power_w", "throttled_intervals", "hot"}}}. throttled_intervals: the stretches
    with a dmon thermal violation (tviol), from the full-resolution samples.
    """
    per = {}
    for t, _iv, g in samples:
        for i, r in g.items():
            per.setdefault(i, []).append((t, r))
    gpus = {}
    for i, pts in per.items():
        ds = _downsample(pts, max(10, int(max_points)))
        viol = _intervals([(t - plot_start, dts.get(t, 0.0) or 0.0, (r.get("tviol") or 0) > 0) for t, r in pts])
        gpus[i] = {"t": [round(t - plot_start, 2) for t, _r in ds],
                   "temp_c": [r.get("temp") for _t, r in ds],
                   "mem_temp_c": [r.get("mtemp") for _t, r in ds],
                   "sm_mhz": [r.get("sm") for _t, r in ds],
                   "power_w": [r.get("pwr") for _t, r in ds],
                   "throttled_intervals": viol,
                   "hot": bool((hot or {}).get(i))}
    return {"t0": round(plot_start, 3), "window": [round(start - plot_start, 3), round(end - plot_start, 3)],
            "window_epoch": [round(start, 3), round(end, 3)], "hot_temp_c": float(hot_temp_c),
            "gpus": {i: gpus[i] for i in sorted(gpus, key=lambda x: int(x) if x.isdigit() else 1 << 30)}}
