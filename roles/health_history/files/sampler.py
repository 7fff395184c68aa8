#!/usr/bin/env python3
"""b300 health history sampler: `nvidia-smi dmon` + IB/RDMA port counters -> bounded rotating files + a textfile.

Installed by roles/health_history as a hardened systemd service (b300-health-history.service), next to
health_history.py and thermal.py (the collection's module_utils, shipped as they are). Runs alone too, e.g. on a GPU
box without Ansible (python3 stdlib only):

    python3 sampler.py --once --out DIR            # one sample: DIR/current.jsonl (+ the record on stdout)
    python3 sampler.py --out DIR --interval 10     # sample until SIGTERM/SIGINT
    python3 sampler.py --config /etc/b300-health-history/config.json          # what the service runs

From a checkout it finds the module_utils under collections/ by itself. Every `--interval` seconds it writes one
record: the last dmon round (temperatures incl. HBM, clocks, power, utilisation, power/thermal violation) and the
counters/ and hw_counters/ of every configured RDMA device (see module_utils/health/health_history.py for the format,
rotation and size bounds). When dmon stalls or exits the NIC counters are still sampled, an event is recorded and dmon
is restarted with a backoff (5 s doubling to 300 s). Exit codes: 0 stopped by a signal or --rounds reached, 2 bad
configuration, 3 --once could not sample anything.
"""
import argparse
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if not os.path.exists(os.path.join(HERE, "health_history.py")):  # run from a checkout: roles/health_history/files
    sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "collections", "ansible_collections", "b300", "rollout",
                                    "plugins", "module_utils", "health"))
import health_history as hh  # noqa: E402  its directory is only known after the check above

DEFAULTS = {
    "dir": "/var/lib/b300-health-history",
    "interval_s": 10,
    "nvidia_smi": "nvidia-smi",
    "dmon_groups": hh.DMON_GROUPS,
    "sysfs_root": "/sys",
    "nics": None,                     # None = every device under <sysfs_root>/class/infiniband; a list = exactly those
    "max_file_bytes": 16 * 1024 * 1024,
    "max_files": 16,
    "textfile_dir": "",               # "" = no node_exporter textfile
    "textfile_name": "b300_health_history.prom",
    "textfile_port_counters": list(hh.DEFAULT_TEXTFILE_PORT_COUNTERS),
    "host": None,
    "expected_gpus": None,            # GPU count (closes the first dmon round at once instead of one interval later)
}
BACKOFF_MIN_S, BACKOFF_MAX_S = 5.0, 300.0


def log(msg):
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def load_config(args):
    cfg = dict(DEFAULTS)
    if args.config:
        with open(args.config, encoding="utf-8") as f:
            cfg.update(json.load(f))
    for key, val in (("dir", args.out), ("interval_s", args.interval), ("nvidia_smi", args.nvidia_smi),
                     ("sysfs_root", args.sysfs_root), ("dmon_groups", args.dmon_groups),
                     ("textfile_dir", args.textfile_dir), ("max_files", args.max_files)):
        if val is not None:
            cfg[key] = val
    if args.nics is not None:
        cfg["nics"] = [n for n in args.nics.split(",") if n]
    if args.max_file_mb is not None:
        cfg["max_file_bytes"] = int(float(args.max_file_mb) * 1024 * 1024)
    cfg["host"] = cfg.get("host") or socket.gethostname()
    problems = []
    try:
        cfg["interval_s"] = int(cfg["interval_s"])
        if not 1 <= cfg["interval_s"] <= 3600:
            problems.append("interval_s %s: expected 1..3600 (dmon takes whole seconds)" % cfg["interval_s"])
    except (TypeError, ValueError):
        problems.append("interval_s %r is not a whole number of seconds" % (cfg["interval_s"],))
    if not set(str(cfg["dmon_groups"])) <= set("pucvmet") or not {"p", "c"} <= set(str(cfg["dmon_groups"])):
        problems.append("dmon_groups %r: letters of pucvmet including p (temperatures) and c (clocks)"
                        % (cfg["dmon_groups"],))
    if not os.path.isabs(str(cfg["dir"])):
        problems.append("dir %r must be an absolute path" % (cfg["dir"],))
    if int(cfg["max_files"]) < 2 or int(cfg["max_file_bytes"]) < 4096:
        problems.append("max_files %s (>= 2) / max_file_bytes %s (>= 4096) out of range"
                        % (cfg["max_files"], cfg["max_file_bytes"]))
    return cfg, problems


class Sampler:
    def __init__(self, cfg, clock=time.time):
        self.cfg = cfg
        self.clock = clock
        self.iv = int(cfg["interval_s"])
        self.writer = hh.HistoryWriter(cfg["dir"], cfg["max_file_bytes"], cfg["max_files"], clock=clock)
        self.recorder = hh.Recorder(self.writer, self.iv)
        self.nics = hh.ib_devices(cfg["sysfs_root"]) if cfg["nics"] is None else list(cfg["nics"])
        self.stop = threading.Event()
        self.proc = None
        self.q = queue.Queue()
        self.samples = 0
        self.last_problems = None

    # ------------------------------------------------------------------ dmon child
    def dmon_argv(self, count=None):
        return hh.dmon_argv(self.cfg["nvidia_smi"], self.iv, self.cfg["dmon_groups"], count)

    def _reader(self, proc):
        rounds = hh.DmonRounds(clock=self.clock, expected=self.cfg.get("expected_gpus"))
        for line in proc.stdout:
            for r in rounds.feed(line):
                self.q.put(("round", r))
        r = rounds.flush()
        if r:
            self.q.put(("round", r))
        rc = proc.wait()
        err = (proc.stderr.read() or "").strip() if proc.stderr else ""
        self.q.put(("exit", rc, err[-300:]))

    def start_dmon(self):
        argv = self.dmon_argv()
        try:
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
                                         start_new_session=True)
        except OSError as e:
            self.proc = None
            self.q.put(("exit", None, "cannot run %s: %s" % (argv[0], e.strerror or e)))
            return
        threading.Thread(target=self._reader, args=(self.proc,), daemon=True).start()

    def stop_dmon(self):
        p = self.proc
        if p and p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except OSError:
                pass
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)

    # ------------------------------------------------------------------ one record
    def record(self, t, gpus, dmon_up):
        counters, problems, hw_names = hh.read_nic_counters(self.cfg["sysfs_root"], self.nics)
        if problems != self.last_problems and problems:
            self.recorder.event(t, "counters: " + "; ".join(problems))
            log("counters: " + "; ".join(problems))
        self.last_problems = problems
        rec = self.recorder.sample(t, gpus, counters)
        self.samples += 1
        if self.cfg.get("textfile_dir"):
            nbytes, nfiles = hh.disk_usage(self.cfg["dir"])
            text = hh.render_textfile(t, gpus, counters, hw_names, set(self.cfg["textfile_port_counters"]),
                                      {"dmon_up": dmon_up, "bytes": nbytes, "files": nfiles,
                                       "problems": len(problems)})
            try:
                hh.write_textfile(self.cfg["textfile_dir"], self.cfg["textfile_name"], text)
            except OSError as e:
                log("textfile %s: %s" % (self.cfg["textfile_dir"], e))
        return rec

    def meta(self):
        self.recorder.meta(self.clock(), {"host": self.cfg["host"], "interval_s": self.iv, "dmon": self.dmon_argv(),
                                          "nics": self.nics, "sysfs_root": self.cfg["sysfs_root"],
                                          "max_file_bytes": self.cfg["max_file_bytes"],
                                          "max_files": self.cfg["max_files"], "pid": os.getpid()})

    # ------------------------------------------------------------------ modes
    def once(self):
        """One dmon sample (-c 1) and one counter read -> one record. Returns (record, problem or None)."""
        self.meta()
        argv = self.dmon_argv(count=1)
        gpus, problem = None, None
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
            if r.returncode != 0:
                problem = "%s exited rc %d: %s" % (" ".join(argv), r.returncode, (r.stderr or r.stdout).strip()[-300:])
            gpus, parsed = hh.gpu_round(r.stdout)
            if not gpus and problem is None:
                problem = "no GPU line in the output of %s (%d malformed)" % (" ".join(argv), parsed["malformed"])
        except (OSError, subprocess.TimeoutExpired) as e:
            problem = "cannot run %s: %s" % (" ".join(argv), e)
        t = self.clock()
        if problem:
            self.recorder.event(t, problem)
        rec = self.record(t, gpus or None, dmon_up=bool(gpus))
        return rec, (problem if not gpus and not rec.get("n") else None), problem

    def run(self, rounds=None):
        """Sample until stop is set (signal) or `rounds` sample records were written."""
        self.meta()
        log("sampling every %d s: %s; NICs %s; into %s (<= %d files x %d bytes)"
            % (self.iv, " ".join(self.dmon_argv()), ",".join(self.nics) or "none", self.cfg["dir"],
               self.cfg["max_files"], self.cfg["max_file_bytes"]))
        self.start_dmon()
        backoff, restart_at, stalled = BACKOFF_MIN_S, None, False
        last_nic_only = self.clock()
        while not self.stop.is_set() and (rounds is None or self.samples < rounds):
            if restart_at is not None and time.monotonic() >= restart_at:
                restart_at = None
                self.start_dmon()
            wait = self.iv if restart_at is not None else 2 * self.iv + 5
            try:
                item = self.q.get(timeout=wait)
            except queue.Empty:
                item = None
            if self.stop.is_set():
                break
            now = self.clock()
            if item is None:
                if restart_at is None and not stalled:
                    stalled = True
                    self.recorder.event(now, "no output from nvidia-smi dmon for %d s" % wait)
                    log("no output from nvidia-smi dmon for %d s" % wait)
                if now - last_nic_only >= self.iv - 0.5:
                    self.record(now, None, dmon_up=False)
                    last_nic_only = now
                continue
            if item[0] == "round":
                t, gpus = item[1]
                stalled, backoff = False, BACKOFF_MIN_S
                self.record(t, gpus, dmon_up=True)
                last_nic_only = now
            elif item[0] == "exit":
                text = "nvidia-smi dmon exited rc %s%s; restart in %d s" % (item[1], (": " + item[2]) if item[2] else "",
                                                                            backoff)
                self.recorder.event(now, text)
                log(text)
                restart_at = time.monotonic() + backoff
                backoff = min(BACKOFF_MAX_S, backoff * 2)
                self.proc = None
        self.stop_dmon()
        return self.samples


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", help="JSON config (what the service uses); options below override it")
    ap.add_argument("--out", help="history directory (default %s)" % DEFAULTS["dir"])
    ap.add_argument("--interval", type=int, help="seconds between samples (default %d)" % DEFAULTS["interval_s"])
    ap.add_argument("--nvidia-smi", dest="nvidia_smi", help="nvidia-smi executable (default: from PATH)")
    ap.add_argument("--sysfs-root", dest="sysfs_root", help="sysfs root (default /sys)")
    ap.add_argument("--nics", help="comma-separated RDMA devices, '' for none (default: every one under class/infiniband)")
    ap.add_argument("--dmon-groups", dest="dmon_groups", help="dmon -s groups (default %s)" % DEFAULTS["dmon_groups"])
    ap.add_argument("--max-file-mb", dest="max_file_mb", type=float, help="size cap per file, MiB (default 16)")
    ap.add_argument("--max-files", dest="max_files", type=int, help="file count cap, current included (default 16)")
    ap.add_argument("--textfile-dir", dest="textfile_dir", help="node_exporter textfile collector directory")
    ap.add_argument("--once", action="store_true", help="one sample, print the record, exit")
    ap.add_argument("--rounds", type=int, help="stop after this many samples (tests)")
    a = ap.parse_args(argv)
    try:
        cfg, problems = load_config(a)
    except (OSError, ValueError) as e:
        log("config: %s" % e)
        return 2
    if problems:
        log("config: " + "; ".join(problems))
        return 2
    try:
        sampler = Sampler(cfg)
    except (OSError, hh.HistoryError) as e:
        log("cannot use %s: %s" % (cfg["dir"], e))
        return 2
    if a.once:
        rec, fatal, problem = sampler.once()
        print(json.dumps(rec, sort_keys=True))
        if problem:
            log(problem)
        return 3 if fatal else 0

    def _stop(signum, _frame):
        log("signal %d: stopping" % signum)
        sampler.stop.set()
        sampler.q.put(("stop",))

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    n = sampler.run(rounds=a.rounds)
    log("stopped after %d samples" % n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
