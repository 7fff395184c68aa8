#!/usr/bin/env python3
"""Run the GPU loader(s) and the nvidia-smi sampler together until a deadline, then stop everything.

Usage: thermal_soak_runner.py PLAN.json   (stdlib only; shipped by roles/thermal_soak)

PLAN = {"duration_s": int, "out_dir": str, "grace_s": int,
        "sampler": {"argv": [...], "header": "timestamp,index,..."},
        "loads": [{"name": "gpu0", "argv": [...], "env": {...}, "loop": false}, ...]}

Writes into out_dir: samples.csv (header line, empty for the dmon sampler, + the sampler's stdout), sampler.err, load-<name>.log, status.json.
Every child runs in its own session under `timeout --kill-after=5 <seconds>` (a bound even if this runner dies).
At the deadline each session gets SIGTERM, then SIGKILL after grace_s; afterwards /proc is scanned for any process
still in one of those sessions (leftovers), which are killed and listed in status.json.
"""
import json
import os
import signal
import sys
import time


def _spawn(argv, env_extra, out, err, seconds):
    import subprocess

    env = dict(os.environ)
    env.update({k: str(v) for k, v in (env_extra or {}).items()})
    wrapped = ["timeout", "--kill-after=5", "%d" % max(1, int(seconds))] + list(argv)
    return subprocess.Popen(wrapped, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env,
                            start_new_session=True, close_fds=True)


def _session_of(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            data = f.read()
    except OSError:
        return None
    # fields after the ')' of comm: state ppid pgrp session ...; zombies hold no GPU and cannot be killed
    rest = data.rsplit(")", 1)[1].split()
    return None if rest[0] in ("Z", "X") else int(rest[3])


def _procs_in_sessions(sids):
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        if pid == os.getpid():
            continue
        if _session_of(pid) in sids:
            try:
                with open("/proc/%d/cmdline" % pid, "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
            except OSError:
                cmd = "?"
            out.append({"pid": pid, "cmdline": cmd})
    return out


def _signal_session(proc, sig):
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(path, n=1500):
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - n))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def run(plan):
    duration = float(plan["duration_s"])
    grace = float(plan.get("grace_s", 10))
    out_dir = plan["out_dir"]
    os.makedirs(out_dir, exist_ok=True)
    samples_path = os.path.join(out_dir, "samples.csv")
    with open(samples_path, "w") as f:
        f.write(plan["sampler"]["header"].rstrip("\n") + "\n")
    start = time.time()
    deadline = start + duration
    sids = set()
    sampler_out = open(samples_path, "a")
    sampler_err = open(os.path.join(out_dir, "sampler.err"), "w")
    sampler = _spawn(plan["sampler"]["argv"], {}, sampler_out, sampler_err, duration + grace)
    sids.add(sampler.pid)
    loads = []
    for spec in plan.get("loads", []):
        log = open(os.path.join(out_dir, "load-%s.log" % spec["name"]), "w")
        proc = _spawn(spec["argv"], spec.get("env"), log, log, duration + grace)
        sids.add(proc.pid)
        loads.append({"spec": spec, "proc": proc, "log": log, "rcs": [], "runs": 1, "failed": False,
                      "ended_early_s": None})
    with open(os.path.join(out_dir, "pids.json"), "w") as f:
        json.dump({"sessions": sorted(sids), "runner": os.getpid()}, f)

    sampler_rc, sampler_early = None, None
    while time.time() < deadline:
        now = time.time()
        for ld in loads:
            proc = ld["proc"]
            if proc is None or proc.poll() is None:
                continue
            rc = proc.returncode
            ld["rcs"].append(rc)
            remaining = deadline - now
            if ld["spec"].get("loop") and rc == 0 and remaining > 2:
                ld["proc"] = _spawn(ld["spec"]["argv"], ld["spec"].get("env"), ld["log"], ld["log"], remaining + grace)
                sids.add(ld["proc"].pid)
                ld["runs"] += 1
                continue
            ld["proc"] = None
            if remaining > 2:
                ld["failed"] = True
                ld["ended_early_s"] = round(now - start, 1)
        if sampler_rc is None and sampler.poll() is not None:
            sampler_rc = sampler.returncode
            if deadline - now > 2:
                sampler_early = round(now - start, 1)
        time.sleep(min(0.5, max(0.0, deadline - time.time())))

    live = [ld["proc"] for ld in loads if ld["proc"] is not None] + ([sampler] if sampler_rc is None else [])
    for proc in live:
        _signal_session(proc, signal.SIGTERM)
    stop_by = time.time() + grace
    while time.time() < stop_by and any(p.poll() is None for p in live):
        time.sleep(0.2)
    for proc in live:
        if proc.poll() is None:
            _signal_session(proc, signal.SIGKILL)
            proc.wait()
    for ld in loads:
        if ld["proc"] is not None:
            ld["rcs"].append(ld["proc"].returncode)
        ld["log"].close()
    if sampler_rc is None:
        sampler_rc = sampler.returncode
    sampler_out.close()
    sampler_err.close()

    leftovers = _procs_in_sessions(sids)
    for p in leftovers:
        try:
            os.kill(p["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass
    time.sleep(0.2 if leftovers else 0)
    still = _procs_in_sessions(sids)

    status = {
        "started": start,
        "ended": time.time(),
        "duration_s": duration,
        "sampler": {"argv": plan["sampler"]["argv"], "rc": sampler_rc, "ended_early_s": sampler_early,
                    "stderr_tail": _tail(os.path.join(out_dir, "sampler.err"))},
        "loads": [{"name": ld["spec"]["name"], "argv": ld["spec"]["argv"], "runs": ld["runs"], "rcs": ld["rcs"],
                   "failed": ld["failed"], "ended_early_s": ld["ended_early_s"],
                   "log_tail": _tail(os.path.join(out_dir, "load-%s.log" % ld["spec"]["name"]))} for ld in loads],
        "leftovers_killed": leftovers,
        "still_running": still,
    }
    with open(os.path.join(out_dir, "status.json"), "w") as f:
        json.dump(status, f, indent=1)
    return status


def main(argv):
    if len(argv) != 2:
        sys.stderr.write(__doc__)
        return 2
    with open(argv[1]) as f:
        plan = json.load(f)
    status = run(plan)
    print(json.dumps({"loads_failed": [ld["name"] for ld in status["loads"] if ld["failed"]],
                      "sampler_rc": status["sampler"]["rc"], "leftovers_killed": len(status["leftovers_killed"]),
                      "still_running": len(status["still_running"])}))
    return 1 if status["still_running"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
