#!/usr/bin/env python3
"""Reliability figures of the SGLang rollout on the sandbox (issue 7): rolling restart and a version change under
load, and three faults (worker killed, worker never healthy during a rollout, host unreachable during a rollout).

    .venv/bin/python tools/reliability.py                       # both profiles, every scenario (~25 min)
    .venv/bin/python tools/reliability.py --profiles kimi_k3 --scenarios rolling,unhealthy

Needs the running sandbox (`sandbox/fleet.sh up 2`). For each profile it deploys with playbooks/sglang_deploy.yml
(the sandbox settings of inventory/sandbox/group_vars/all.yml), sets a stub latency so requests
are in flight, then per scenario: starts a bounded chat-completion load through the REAL router (tools/loadgen.py's
request/summary code, same target guard: loopback or 10.89.30.0/24 only), measures a baseline window, runs the
action while the load continues, keeps loading a few seconds after, and records requests sent / failed and p99
before / during / after. The sandbox workers are TEST DOUBLES (sandbox/sglang_stub), the router is the real
sglang-router 0.3.2: latencies are the stub's configured latency plus router and network overhead, not SGLang's.

Scenarios (per profile):
  rolling      playbooks/rolling_restart.yml (every instance, one at a time, behind the router)
  version      SGLang version change without downtime: sglang_deploy.yml --tags install,units -e sglang_version=NEW
               (new venv + units, nothing restarted), then rolling_restart.yml; then the same back to the pinned
               version (scenario "version_back"). Answers name the version that served them (stub answer text).
  kill         fault (a): `die_after_load` armed, then kill -9 of one worker's MainPID (systemd restarts it, it
               dies again: a crash-looping worker). Router health checks / circuit breaker must move traffic; then
               a read-only health report (sglang_deploy.yml --check --tags deploy, short health timeout) must name
               the dead instance.
  unhealthy    fault (b): `unhealthy` armed on the LAST instance of the rolling order, so its restarted process
               never answers /health: the rollout must stop naming it, the others keep serving. Recovery (fault
               cleared, rerun for that instance only, as the stop message says) is measured too.
  unreachable  fault (c): SSH to one worker host blocked for this controller (an extra inventory points its
               ansible_port at a closed port; the host and its services keep running, nothing else on the shared
               fleet is affected) during a rollout: the rollout must stop naming the host; recovery as above.
  rerun        sglang_deploy.yml (the site.yml SGLang part) with a changed flag (sglang_server_extra_args
               {"--log-level": "warning"}) under load, then back: sglang_restart_strategy=rolling must restart every
               instance one at a time behind the router with 0 failed requests.
  key          API key added to the serving fleet (sglang_deploy.yml with sglang_api_key from a temporary 0600 vars
               file, default rolling strategy: the router restarts first with the key, then each worker rolls), then
               removed (workers first, then the router). The load sends the key from the start (a key-less router
               and key-less workers ignore it). The router's own restart is the one step that is not rolled.

Everything is bounded (load: --max-requests / --max-load-s per scenario, playbooks: --playbook-timeout-s). Output:
artifacts/reliability/<timestamp>.json (+ playbook logs and per-request JSON lines in artifacts/reliability/<timestamp>/)
and a table on stdout. The sandbox is restored afterwards (faults and latency files removed, every planned instance
running and listed healthy by the router). Exit 0 when every scenario met its expectation, 1 otherwise, 2 on bad use.
"""

import argparse
import datetime
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import yaml

import loadgen  # tools/loadgen.py, beside this file (sys.path[0])
import repo_path  # noqa: F401  tools/repo_path.py, the one bootstrap: puts collections/ on sys.path
from ansible_collections.b300.rollout.plugins.module_utils.sglang import sglang_rollout

ROOT = pathlib.Path(__file__).resolve().parents[1]
INVENTORY = ROOT / "inventory" / "sandbox"
PROFILES_DIR = ROOT / "roles" / "sglang" / "files" / "profiles"   # which profiles exist (their names only)
VENV_BIN = ROOT / ".venv" / "bin"
# version to switch to per profile (both pairs are in roles/sglang/vars/compat.yml with router 0.3.2)
OTHER_VERSION = {"kimi_k3": "0.5.17", "glm52_pd": "0.5.18"}
ALL_SCENARIOS = ("rolling", "version", "kill", "unhealthy", "unreachable", "rerun", "key")


def env():
    e = dict(os.environ)
    e.update(ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1", NO_COLOR="1",
             CONTAINERS_CONF=os.environ.get("CONTAINERS_CONF", str(ROOT / "sandbox" / "containers.conf")))
    e["PATH"] = "%s:%s" % (VENV_BIN, e.get("PATH", ""))
    return e


# ------------------------------------------------------------------------------------------------------------------
# what is deployed where: the project's own planner (tools/plan -> playbooks/plan.yml -> b300.rollout.sglang_plan, on
# the controller, nothing reached) and its rolling order (module_utils/sglang/sglang_rollout.py rolling_order)
# ------------------------------------------------------------------------------------------------------------------

def profile_layout(name, extra=()):
    with tempfile.TemporaryDirectory(prefix="reliability-plan-") as out:
        r = subprocess.run([str(ROOT / "tools" / "plan"), "-i", str(INVENTORY), name, *extra], cwd=ROOT, env=dict(
            env(), B300_PLAN_DIR=out), capture_output=True, text=True, timeout=300, check=False)
        if r.returncode != 0:
            raise RuntimeError("tools/plan %s failed (rc %d): %s" % (name, r.returncode, (r.stdout + r.stderr)[-2000:]))
        plan = json.loads((pathlib.Path(out) / ("%s.json" % name)).read_text())
    instances = [{"id": u["id"], "host": u["host"], "role": u["role"], "port": u["port"], "url": u["url"],
                  "unit": u["unit_name"]} for u in plan["units"] if u["kind"] == "instance"]
    router = next(u for u in plan["units"] if u["kind"] == "router")
    rolling = sglang_rollout.rolling_order(instances, [i["id"] for i in instances])
    return {"profile": name, "version": plan["version"], "instances": instances, "rolling_order": rolling,
            "router_host": router["host"], "router_url": router["url"]}


# ------------------------------------------------------------------------------------------------------------------
# sandbox access
# ------------------------------------------------------------------------------------------------------------------

def sh(host, cmd, timeout=60, check=True):
    """Run a shell command inside sandbox host `host` (podman exec)."""
    r = subprocess.run(["podman", "exec", "b300-%s" % host, "sh", "-c", cmd], capture_output=True, text=True,
                       env=env(), timeout=timeout, check=False)
    if check and r.returncode != 0:
        raise RuntimeError("%s: %s failed (rc %d): %s" % (host, cmd, r.returncode, r.stderr.strip()[-500:]))
    return r.stdout


def control_file(inst, name, value):
    """Write (value str) or remove (value None) /run/sglang-stub/<port>/<name> on the instance's host."""
    d = "/run/sglang-stub/%d" % inst["port"]
    if value is None:
        sh(inst["host"], "rm -f %s/%s" % (d, name))
    else:
        sh(inst["host"], "mkdir -p %s && chmod 755 /run/sglang-stub %s && printf '%%s\\n' '%s' > %s/%s && chmod 644 %s/%s"
           % (d, d, value, d, name, d, name))


def main_pid(inst):
    out = sh(inst["host"], "systemctl show -p MainPID --value %s" % inst["unit"]).strip()
    return int(out or 0)


def http_json(url, timeout=5.0):
    loadgen.check_target(url)
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read().decode())


def router_workers(layout):
    try:
        return http_json(layout["router_url"] + "/workers").get("workers", [])
    except (OSError, ValueError) as exc:
        return [{"error": str(exc)}]


def all_serving(layout):
    """Every planned instance listed healthy by the router."""
    ws = {w.get("url"): w for w in router_workers(layout)}
    return all(ws.get(i["url"], {}).get("is_healthy") for i in layout["instances"])


def _ppid(pid):
    try:
        return int(pathlib.Path("/proc/%d/stat" % pid).read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def fleet_busy(me=None):
    """Other runs on the shared fleet: ansible-playbook against the sandbox inventory, or an integration pytest
    (other helpers, CI), not counting this process, its ancestors (a pytest that runs this code) or its children."""
    me = me or os.getpid()
    mine, pid = {me}, me
    while pid > 1:
        pid = _ppid(pid)
        mine.add(pid)
    busy = []
    for p in pathlib.Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) in mine or _ppid(int(p.name)) == me:
            continue
        cmd = _cmdline(int(p.name))
        if cmd is None:
            continue
        if cmd.split(" ", 1)[0].endswith("flock"):
            continue   # a job WAITING for the sandbox lock (flock ... bash -c '... pytest ...') is not using the fleet
        if _controller_lane(cmd):
            continue   # `make integration-controller` (pytest -m controller): its tests never touch the fleet
        if "python" in cmd and (("ansible-playbook" in cmd and "inventory/sandbox" in cmd)
                                or ("pytest" in cmd and "tests/integration" in cmd)):
            if not _under_controller_lane(int(p.name)):     # nor what that lane runs (only a match pays the walk)
                busy.append("%s %s" % (p.name, cmd[:150]))
    return busy


def _controller_lane(cmd):
    """A pytest run of only the controller-lane tests (`-m controller`, what `make integration-controller` runs beside
    the fleet lane in `make test`): tests/integration/conftest.py refuses a controller-marked test that uses the
    sandbox fleet, so such a run never competes for it. In CI it ran beside this code and made every scenario wait
    its --wait-idle-s for nothing (about 12 of the 16 minutes the reliability tests took)."""
    argv = cmd.split()
    return "pytest" in cmd and any(a == "-m" and b == "controller" for a, b in zip(argv, argv[1:]))


def _under_controller_lane(pid):
    """Whether a controller-lane pytest started pid (its ancestors): the bad-input suite's ansible-playbook runs name
    the sandbox inventory but run with -c local. Counted as busy, they made each reliability scenario of a CI run
    (2026-12-07, the lanes' timing shifted by the Mitogen strategy) wait its --wait-idle-s beside that lane."""
    while pid > 1:
        pid = _ppid(pid)
        cmd = _cmdline(pid)
        if cmd is None:
            return False
        if _controller_lane(cmd):
            return True
    return False


def _cmdline(pid):
    """/proc/PID/cmdline as one space-separated string; None when the process is gone or unreadable."""
    try:
        return pathlib.Path("/proc/%d/cmdline" % pid).read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None


def wait_fleet_idle(max_wait_s, log):
    deadline = time.monotonic() + max_wait_s
    while True:
        busy = fleet_busy()
        if not busy:
            return True
        if time.monotonic() > deadline:
            log("fleet still busy after %d s, going ahead: %s" % (max_wait_s, busy[0]))
            return False
        log("fleet busy (another run: %s), waiting" % busy[0])
        time.sleep(15)


# ------------------------------------------------------------------------------------------------------------------
# load (tools/loadgen.py's request and summary code; stop event added so a phase can end it early)
# ------------------------------------------------------------------------------------------------------------------

class Load:
    def __init__(self, url, concurrency, max_requests, max_duration_s, timeout_s=30.0, api_key=None, jsonl=None):
        loadgen.check_target(url)
        loadgen.check_bounds(max_requests, max_duration_s, concurrency, timeout_s)
        self.url, self.concurrency, self.max_requests = url, concurrency, max_requests
        self.max_duration_s, self.timeout_s = max_duration_s, timeout_s
        self.headers = {"Authorization": "Bearer %s" % api_key} if api_key else {}
        self.records, self.lock, self.stop_ev = [], threading.Lock(), threading.Event()
        self.next, self.t0, self.threads, self.jsonl = 0, None, [], jsonl

    def now(self):
        return time.monotonic() - self.t0

    def _worker(self):
        while not self.stop_ev.is_set():
            with self.lock:
                seq = self.next
                if seq >= self.max_requests or self.now() >= self.max_duration_s:
                    return
                self.next += 1
            # every other request asks the model not to think: a reasoning model's 16-token answer is all
            # reasoning_content (an answer, counted as one), and only the answer part of the stub names the worker
            # and version that served it (the version scenarios check that)
            rec = loadgen.one_request(self.url, seq, self.t0, self.timeout_s, False, "default", "reliability",
                                      self.headers, loadgen.NO_THINKING if seq % 2 else None)
            with self.lock:
                self.records.append(rec)

    def start(self):
        self.t0 = time.monotonic()
        self.threads = [threading.Thread(target=self._worker, daemon=True) for _ in range(self.concurrency)]
        for t in self.threads:
            t.start()
        return self

    def stop(self):
        self.stop_ev.set()
        for t in self.threads:
            t.join(self.timeout_s + 5)
        recs = sorted(self.records, key=lambda r: r["seq"])
        if self.jsonl:
            with open(self.jsonl, "w", encoding="utf-8") as fh:
                for r in recs:
                    fh.write(json.dumps(r) + "\n")
        return recs


def window(records, t_from, t_to):
    rs = [r for r in records if t_from <= r["t_start"] < t_to]
    lat = [r["latency_s"] for r in rs if r["ok"]]
    errors, workers = {}, {}
    for r in rs:
        k = loadgen.error_kind(r)
        if k:
            errors[k] = errors.get(k, 0) + 1
        if r.get("worker"):
            key = "%s (%s)" % (r["worker"], r.get("worker_version"))
            workers[key] = workers.get(key, 0) + 1
    return {"sent": len(rs), "failed": sum(1 for r in rs if not r["ok"]), "errors": errors,
            # answered with reasoning_content only (a reasoning model still thinking): answers, counted by loadgen
            "answers_in_reasoning_content": sum(1 for r in rs if r.get("answer_in") == "reasoning_content"),
            "p50_s": loadgen._r(loadgen.percentile(lat, 50)), "p99_s": loadgen._r(loadgen.percentile(lat, 99)),
            "max_s": loadgen._r(max(lat) if lat else None), "workers": workers}


# ------------------------------------------------------------------------------------------------------------------
# playbooks
# ------------------------------------------------------------------------------------------------------------------

class Runner:
    def __init__(self, outdir, timeout_s, verbose, router_flags="resilient"):
        self.outdir, self.timeout_s, self.verbose, self.n = outdir, timeout_s, verbose, 0
        self.router_flags = router_flags

    def log(self, msg):
        if self.verbose:
            print("[%s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)

    def playbook(self, label, playbook, profile, *extra, inventories=(), timeout_s=None):
        self.n += 1
        logf = self.outdir / ("%02d-%s.log" % (self.n, re.sub(r"[^A-Za-z0-9_.-]+", "_", label)))
        argv = [str(VENV_BIN / "ansible-playbook"), "-i", str(INVENTORY)]
        for inv in inventories:
            argv += ["-i", str(inv)]
        argv += [playbook, "-l", "b300a,b300b", "-e", "sglang_profile=%s" % profile]
        argv += ["-e", "sglang_router_flags=%s" % self.router_flags]
        argv += list(extra)
        self.log("%s: %s" % (label, " ".join(argv[1:])))
        t = time.monotonic()
        try:
            r = subprocess.run(argv, cwd=ROOT, env=env(), capture_output=True, text=True,
                               timeout=timeout_s or self.timeout_s, check=False)
            rc, out = r.returncode, r.stdout + r.stderr
        except subprocess.TimeoutExpired as exc:
            rc, out = 124, (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            out += "\n[reliability.py] TIMEOUT after %s s" % (timeout_s or self.timeout_s)
        logf.write_text("$ %s\n%s" % (" ".join(argv), out))
        res = {"label": label, "command": " ".join(["ansible-playbook"] + argv[1:]).replace(str(ROOT) + "/", ""),
               "rc": rc, "duration_s": round(time.monotonic() - t, 1), "log": os.path.relpath(logf, ROOT),
               "recap": recap(out), "messages": messages(out)}
        self.log("%s: rc=%d in %.0f s" % (label, rc, res["duration_s"]))
        return res, out


def recap(out):
    res = {}
    for m in re.finditer(r"^(\S+)\s+:\s+(ok=.*)$", out.split("PLAY RECAP")[-1], re.M):
        res[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
    return res


def messages(out):
    """The lines an operator reads: fatal/unreachable results and their msg."""
    lines = []
    for m in re.finditer(r"^(fatal|failed): \[([^\]]+)\].*?(?=^\S|\Z)", out, re.M | re.S):
        block = m.group(0)
        msg = re.search(r"msg: (?:[>|]-?\n)?(.*?)(?=\n\S|\n    [a-z_]+:|\Z)", block, re.S)
        text = re.sub(r"\s+", " ", msg.group(1) if msg else block.splitlines()[0]).strip().strip("'\"").replace("''", "'")
        lines.append("%s [%s]: %s" % (m.group(1), m.group(2), text[:600]))
    for m in re.finditer(r"^(fatal: \[[^\]]+\]: UNREACHABLE!.*)$", out, re.M):
        lines.append(m.group(1)[:400])
    return lines[:8]


# ------------------------------------------------------------------------------------------------------------------
# scenarios
# ------------------------------------------------------------------------------------------------------------------

class Bench:
    def __init__(self, opts, outdir):
        self.o, self.outdir = opts, outdir
        self.run = Runner(outdir, opts.playbook_timeout_s, not opts.quiet, opts.router_flags)
        self.log = self.run.log

    def loaded(self, layout, name, action, api_key=None):
        """Baseline window, action under load, tail; returns the scenario record (action returns a dict)."""
        wait_fleet_idle(self.o.wait_idle_s, self.log)
        if self.o.reset_start_limit:
            # The units have StartLimitBurst=3 per StartLimitIntervalSec=7200 and systemd counts EVERY start, planned
            # restarts included: the 4th restart within 2 h fails ("start of the service was attempted too often")
            # and stops the rollout. Until the role resets the counter itself, reset it here before each scenario
            # (--no-reset-start-limit reproduces the failure).
            for inst in layout["instances"]:
                sh(inst["host"], "systemctl reset-failed %s" % inst["unit"], check=False)
        load = Load(layout["router_url"], self.o.concurrency, self.o.max_requests, self.o.max_load_s, api_key=api_key,
                    jsonl=self.outdir / ("%s-%s.jsonl" % (layout["profile"], name))).start()
        time.sleep(self.o.baseline_s)
        t1 = load.now()
        try:
            detail = action(load)
        finally:
            t2 = load.now()
            time.sleep(self.o.tail_s)
            records = load.stop()
        t3 = max([r["t_start"] for r in records] + [t2]) + 1
        rec = {"profile": layout["profile"], "scenario": name, "router": layout["router_url"],
               "load": {"concurrency": self.o.concurrency, "stub_latency_ms": self.o.latency_ms,
                        "max_requests": self.o.max_requests, "max_load_s": self.o.max_load_s},
               "sent": len(records), "failed": sum(1 for r in records if not r["ok"]),
               "before": window(records, 0, t1), "during": window(records, t1, t2), "after": window(records, t2, t3),
               "phase_s": {"baseline": round(t1, 1), "action": round(t2 - t1, 1), "tail": round(t3 - t2, 1)}}
        rec.update(detail)
        rec["first_failure_s"] = next((round(r["t_start"] - t1, 2) for r in records if not r["ok"]), None)
        rec["last_failure_s"] = max((round(r["t_start"] - t1, 2) for r in records if not r["ok"]), default=None)
        # what each failed request got, in seconds after the action began: an HAProxy 502 and a router 502 read
        # differently (HTML "502 Bad Gateway" page vs the router's own text), so a rare one names its source
        rec["failures"] = [{"t_s": round(r["t_start"] - t1, 2), "latency_s": r.get("latency_s"), "error": r["error"]}
                           for r in records if not r["ok"]][:10]
        return rec

    # -- setup / restore -------------------------------------------------------------------------------------------
    def deploy(self, layout, *extra):
        wait_fleet_idle(self.o.wait_idle_s, self.log)
        # Profile switch workaround: the OTHER profile's router keeps its port until the router play restarts it at
        # the end, and glm52_pd's router port 30000 is kimi_k3's W0 port: W0 cannot bind and crash-loops. Stop a
        # router that serves another profile first (and clear the start-rate counters of our units).
        rh = layout["router_host"]
        desc = sh(rh, "systemctl show -p Description --value sglang-router.service", check=False)
        if "sglang-router" in desc and " for %s " % layout["profile"] not in desc + " ":
            self.log("router on %s serves another profile (%s): stopping it before the deploy" % (rh, desc.strip()))
            sh(rh, "systemctl stop sglang-router.service", check=False)
        for inst in layout["instances"]:
            sh(inst["host"], "systemctl reset-failed %s" % inst["unit"], check=False)
        res, _ = self.run.playbook("deploy-%s" % layout["profile"], "playbooks/sglang_deploy.yml", layout["profile"],
                                   *extra)
        if res["rc"] != 0:
            raise RuntimeError("deploy of %s failed (rc %d), see %s: %s" % (layout["profile"], res["rc"], res["log"],
                                                                         res["messages"]))
        return res

    def set_latency(self, layout, ms):
        for inst in layout["instances"]:
            control_file(inst, "latency_ms", None if ms is None else str(ms))

    def clear_faults(self, layout):
        for inst in layout["instances"]:
            control_file(inst, "fault", None)

    def wait_serving(self, layout, timeout_s):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all_serving(layout):
                return True
            time.sleep(2)
        return False

    def restore(self, layout):
        """Faults cleared, every instance running and in the router (rerun the rollout for the missing ones)."""
        self.clear_faults(layout)
        for inst in layout["instances"]:
            # --no-block: a crash-looping unit's start job waits for RestartSec and its ExecStartPre (more than the
            # exec timeout on the loaded 2-core machine); wait_serving below does the waiting, bounded
            sh(inst["host"], "systemctl reset-failed %s >/dev/null 2>&1; systemctl is-active -q %s || "
               "systemctl start --no-block %s" % (inst["unit"], inst["unit"], inst["unit"]), check=False)
        listed = {w.get("url"): w for w in router_workers(layout)}
        missing = [i["id"] for i in layout["instances"] if i["url"] not in listed]
        if missing:
            self.log("restore: %s not in the router, rolling restart of those" % missing)
            self.run.playbook("restore-%s" % layout["profile"], "playbooks/rolling_restart.yml", layout["profile"],
                              "-e", json.dumps({"sglang_rolling_instances": missing}), *self.fast_health())
        ok = self.wait_serving(layout, 150)
        self.log("restore %s: every instance listed healthy: %s" % (layout["profile"], ok))
        return ok

    def fast_health(self):
        return ["-e", "sglang_health_timeout_s=%d" % self.o.health_timeout_s, "-e", "sglang_health_poll_s=2"]

    # -- scenarios -------------------------------------------------------------------------------------------------
    def s_rolling(self, layout):
        before = {i["id"]: main_pid(i) for i in layout["instances"]}

        def action(_load):
            res, _ = self.run.playbook("rolling-%s" % layout["profile"], "playbooks/rolling_restart.yml",
                                       layout["profile"], *self.fast_health())
            return {"playbooks": [res]}
        rec = self.loaded(layout, "rolling_restart", action)
        after = {i["id"]: main_pid(i) for i in layout["instances"]}
        rec["restarted"] = sorted(k for k in before if before[k] != after[k] and after[k])
        rec["expect"] = "rollout rc 0, every instance restarted, 0 failed requests"
        rec["pass"] = rec["playbooks"][0]["rc"] == 0 and rec["failed"] == 0 and len(rec["restarted"]) == len(before)
        return [rec]

    def s_rerun(self, layout):
        """site-style re-run (sglang_deploy.yml) with a changed server flag under load, then back: with
        sglang_restart_strategy=rolling (default) every changed instance restarts one at a time behind the router."""
        out = []
        for name, extra in (("rerun_flag_changed", ["-e", json.dumps({"sglang_server_extra_args": {"--log-level": "warning"}})]),
                            ("rerun_flag_back", [])):
            before = {i["id"]: main_pid(i) for i in layout["instances"]}

            def action(_load, extra=extra, name=name):
                res, _ = self.run.playbook("%s-%s" % (name, layout["profile"]), "playbooks/sglang_deploy.yml",
                                           layout["profile"], *extra, *self.fast_health())
                return {"playbooks": [res], "extra": extra}
            rec = self.loaded(layout, name, action)
            after = {i["id"]: main_pid(i) for i in layout["instances"]}
            rec["restarted"] = sorted(k for k in before if before[k] != after[k] and after[k])
            rec["expect"] = "deploy rc 0, every instance restarted (rolling strategy), 0 failed requests"
            rec["pass"] = (rec["playbooks"][0]["rc"] == 0 and rec["failed"] == 0
                           and len(rec["restarted"]) == len(before))
            out.append(rec)
            if not rec["pass"]:
                break
        return out

    def s_key(self, layout):
        """API key added to the serving fleet, then removed, under load (tasks/router_key.yml orders: add = router first,
        remove = workers first; every worker restart rolls behind the router)."""
        out = []
        key = "rel-%s" % os.urandom(12).hex()           # a throw-away sandbox key, never printed or written to artifacts
        tmp = pathlib.Path(tempfile.mkdtemp(prefix="reliability-key-"))
        try:
            kv = tmp / "key.yml"
            kv.touch(mode=0o600)
            kv.write_text(yaml.safe_dump({"sglang_api_key": key}))
            for name, extra in (("key_add", ["-e", "@%s" % kv]), ("key_remove", [])):
                before = {i["id"]: main_pid(i) for i in layout["instances"]}

                def action(_load, extra=extra, name=name):
                    res, out_text = self.run.playbook("%s-%s" % (name, layout["profile"]), "playbooks/sglang_deploy.yml",
                                                      layout["profile"], *extra, *self.fast_health())
                    change = re.search(r"API key on the serving fleet: (\w+)", out_text)
                    return {"playbooks": [res], "key_change": change.group(1) if change else None,
                            "key_in_log": key in out_text}
                rec = self.loaded(layout, name, action, api_key=key)
                after = {i["id"]: main_pid(i) for i in layout["instances"]}
                rec["restarted"] = sorted(k for k in before if before[k] != after[k] and after[k])
                rec["expect"] = ("deploy rc 0, key change '%s', every worker restarted one at a time, the key in no "
                                 "log, 0 failed requests" % ("add" if name == "key_add" else "remove"))
                rec["pass"] = (rec["playbooks"][0]["rc"] == 0 and not rec["key_in_log"] and rec["failed"] == 0
                               and rec["key_change"] == ("add" if name == "key_add" else "remove")
                               and len(rec["restarted"]) == len(before))
                out.append(rec)        # no break: the removal runs even after a failed add (fleet back to no key)
        finally:
            for f in tmp.iterdir():
                f.unlink()
            tmp.rmdir()
        return out

    def s_version(self, layout):
        out = []
        pinned, other = layout["version"], OTHER_VERSION[layout["profile"]]
        for name, ver in (("version_change", other), ("version_back", pinned)):
            def action(_load, ver=ver):
                units, _ = self.run.playbook("units-%s-%s" % (layout["profile"], ver), "playbooks/sglang_deploy.yml",
                                             layout["profile"], "--tags", "install,units", "-e", "sglang_version=%s" % ver)
                res = [units]
                if units["rc"] == 0:
                    roll, _ = self.run.playbook("rolling-%s-%s" % (layout["profile"], ver),
                                                "playbooks/rolling_restart.yml", layout["profile"],
                                                "-e", "sglang_version=%s" % ver, *self.fast_health())
                    res.append(roll)
                return {"playbooks": res, "from_version": pinned if ver == other else other, "to_version": ver}
            rec = self.loaded(layout, name, action)
            served = {}
            for k in rec["after"]["workers"]:
                v = k.rsplit("(", 1)[1].rstrip(")")
                served[v] = served.get(v, 0) + rec["after"]["workers"][k]
            rec["versions_serving_after"] = served
            rec["expect"] = "units rewritten without restart, rollout rc 0, 0 failed, afterwards only %s answers" % ver
            rec["pass"] = (all(p["rc"] == 0 for p in rec["playbooks"]) and len(rec["playbooks"]) == 2
                           and rec["failed"] == 0 and set(served) == {ver})
            out.append(rec)
            if not rec["pass"]:
                break
        return out

    def victim(self, layout, role_pref=("decode", "worker")):
        """Kill target: a decode (PD) or the regular worker on the host that is not the router host."""
        cands = [i for i in layout["instances"] if i["role"] in role_pref and i["host"] != layout["router_host"]]
        return (cands or [i for i in layout["instances"] if i["role"] in role_pref] or layout["instances"])[-1]

    def s_kill(self, layout):
        """One worker killed (kill -9, crash-looping) per record: the regular worker, or for PD a decode, then a prefill."""
        out = []
        prefs = [("decode",), ("prefill",)] if any(i["role"] == "prefill" for i in layout["instances"]) else [("worker",)]
        for pref in prefs:
            out += self._kill_one(layout, self.victim(layout, pref))
        return out

    def _kill_one(self, layout, v):

        def action(load):
            control_file(v, "fault", "die_after_load")   # the process systemd restarts dies again (crash loop)
            pid = main_pid(v)
            t_kill = load.now()
            sh(v["host"], "kill -9 %d" % pid)
            self.log("kill -9 %s MainPID %d" % (v["id"], pid))
            time.sleep(self.o.observe_s)
            w = {x.get("url"): x for x in router_workers(layout)}.get(v["url"], {})
            report, out = self.run.playbook("health-report-%s" % layout["profile"], "playbooks/sglang_deploy.yml",
                                            layout["profile"], "--check", "--tags", "deploy", *self.fast_health())
            return {"victim": v["id"], "killed_pid": pid, "t_kill_s": round(t_kill, 2), "playbooks": [report],
                    "router_view_of_victim": {k: w.get(k) for k in ("url", "is_healthy", "worker_type")},
                    "unit_state_after": sh(v["host"], "systemctl show -p ActiveState,SubState,NRestarts --value %s"
                                           % v["unit"], check=False).split(),
                    "report_names_victim": v["id"] in "\n".join(report["messages"]) or v["id"] in out.split(
                        "PLAY RECAP")[-1]}
        rec = self.loaded(layout, "worker_killed_%s" % v["role"], action)
        rec["router_flags"] = self.run.router_flags
        rec["expect"] = ("traffic moves to the other worker(s) (%s), the health report fails and names %s"
                         % ("0 failed requests" if self.run.router_flags == "resilient"
                            else "seed flags: failures bounded, none in the last window", v["id"]))
        rec["restored"] = self.restore(layout)
        rec["pass"] = (rec["playbooks"][0]["rc"] != 0 and rec["report_names_victim"] and rec["after"]["failed"] == 0
                       and rec["restored"] and (rec["failed"] == 0 or self.run.router_flags != "resilient"))
        return [rec]

    def s_unhealthy(self, layout):
        v = layout["rolling_order"][-1]

        def action(_load):
            # the running process stays healthy (the pre-checks would stop the rollout before it starts otherwise):
            # only the process the rollout starts never answers /health
            control_file(v, "fault", "unhealthy_after_restart")
            res, out = self.run.playbook("rolling-unhealthy-%s" % layout["profile"], "playbooks/rolling_restart.yml",
                                         layout["profile"], *self.fast_health())
            listed = [x.get("url") for x in router_workers(layout)]
            stop = re.search(r"Rolling restart stopped at (\S+) \(", out)
            return {"victim": v["id"], "playbooks": [res], "stopped_at": stop.group(1) if stop else None,
                    "victim_in_router_after_stop": v["url"] in listed,
                    "others_in_router_after_stop": sorted(i["id"] for i in layout["instances"] if i["url"] in listed)}
        rec = self.loaded(layout, "never_healthy", action)

        def recover(_load):
            control_file(v, "fault", None)
            res, _ = self.run.playbook("recover-%s" % layout["profile"], "playbooks/rolling_restart.yml",
                                       layout["profile"], "-e", json.dumps({"sglang_rolling_instances": [v["id"]]}),
                                       *self.fast_health())
            return {"playbooks": [res], "all_serving_after": all_serving(layout)}
        rec2 = self.loaded(layout, "never_healthy_recovery", recover)
        rec["expect"] = "rollout rc != 0 and stops at %s, it stays out of the router, 0 failed requests" % v["id"]
        rec["pass"] = (rec["playbooks"][0]["rc"] != 0 and rec["stopped_at"] == v["id"]
                       and not rec["victim_in_router_after_stop"] and rec["failed"] == 0)
        rec2["expect"] = "rerun for %s only: rc 0, every instance serving, 0 failed" % v["id"]
        rec2["pass"] = rec2["playbooks"][0]["rc"] == 0 and rec2["all_serving_after"] and rec2["failed"] == 0
        return [rec, rec2]

    def s_unreachable(self, layout):
        host = next(i["host"] for i in layout["instances"] if i["host"] != layout["router_host"])
        tmp = pathlib.Path(tempfile.mkdtemp(prefix="reliability-inv-"))
        blocked = tmp / "blocked.yml"
        # a port nothing listens on: ssh gets "connection refused" -> UNREACHABLE; only this controller's runs see it
        blocked.write_text(yaml.safe_dump({"all": {"hosts": {host: {"ansible_port": 1}}}}))

        def action(_load):
            res, out = self.run.playbook("rolling-unreachable-%s" % layout["profile"], "playbooks/rolling_restart.yml",
                                         layout["profile"], *self.fast_health(), inventories=[blocked])
            listed = [x.get("url") for x in router_workers(layout)]
            return {"unreachable_host": host, "how": "ansible_port=1 for %s in an extra inventory (SSH refused); the "
                    "host and its services keep running" % host, "playbooks": [res],
                    "names_host": bool(re.search(r"\b%s\b.*UNREACHABLE|UNREACHABLE.*\b%s\b|unreachable=1|%s \(host of \S+\) is "
                                                 r"unreachable" % (host, host, host),
                                                 out)),
                    "out_of_router_after_stop": sorted(i["id"] for i in layout["instances"] if i["url"] not in listed)}
        rec = self.loaded(layout, "host_unreachable", action)
        rec["expect"] = "rollout rc != 0 naming %s, the router keeps answering, 0 failed requests" % host
        rec["restored"] = self.restore(layout)
        rec["expect"] += ", and (pre-check) no instance of %s removed from the router" % host
        rec["pass"] = (rec["playbooks"][0]["rc"] != 0 and rec["names_host"] and rec["failed"] == 0 and rec["restored"]
                       and not rec["out_of_router_after_stop"])
        return [rec]

    def profile(self, name):
        layout = profile_layout(name)
        results = []
        self.log("=== %s: deploy" % name)
        deploy = self.deploy(layout)
        try:
            self.clear_faults(layout)
            self.set_latency(layout, self.o.latency_ms)
            if not self.wait_serving(layout, 120):
                raise RuntimeError("%s: not every instance is healthy in the router after the deploy" % name)
            for s in self.o.scenarios:
                self.log("=== %s: %s" % (name, s))
                try:
                    results += getattr(self, "s_" + s)(layout)
                except Exception as exc:  # one broken scenario must not leave the fleet faulted
                    results.append({"profile": name, "scenario": s, "pass": False, "error": repr(exc)})
                    self.restore(layout)
                if not all_serving(layout):
                    self.restore(layout)
        finally:
            self.clear_faults(layout)
            self.set_latency(layout, None)
            restored = self.restore(layout)
        return {"profile": name, "layout": layout, "deploy": deploy, "restored": restored, "scenarios": results}


def table(report):
    rows = [("profile", "scenario", "sent", "failed", "p99 before", "p99 during", "p99 after", "result", "note")]
    for p in report["profiles"]:
        for s in p["scenarios"]:
            note = s.get("error") or ""
            if not note:
                msgs = [m for pb in s.get("playbooks", []) for m in pb.get("messages", [])]
                note = (s.get("stopped_at") and "stopped at %s" % s["stopped_at"]) or ""
                if s.get("victim") and s["scenario"] == "worker_killed":
                    note = "killed %s; health report names it: %s" % (s["victim"], s.get("report_names_victim"))
                if s.get("unreachable_host"):
                    note = "%s unreachable; out of router after stop: %s" % (s["unreachable_host"],
                                                                           s.get("out_of_router_after_stop"))
                if s.get("versions_serving_after"):
                    note = "%s -> %s, serving after: %s" % (s["from_version"], s["to_version"],
                                                            s["versions_serving_after"])
                if not note and msgs:
                    note = msgs[0][:80]

            def f(w, s=s):
                v = (s.get(w) or {}).get("p99_s")
                return "-" if v is None else "%.3f s" % v
            rows.append((p["profile"], s["scenario"], str(s.get("sent", "-")), str(s.get("failed", "-")), f("before"),
                         f("during"), f("after"), "PASS" if s.get("pass") else "FAIL", note[:110]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [" | ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def options(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profiles", default="kimi_k3,glm52_pd")
    ap.add_argument("--router-flags", default="resilient", choices=("resilient", "seed"),
                    help="sglang_router_flags for every deploy (seed: the seed's --disable-retries flags)")
    ap.add_argument("--scenarios", default=",".join(ALL_SCENARIOS), help="subset of %s" % ",".join(ALL_SCENARIOS))
    ap.add_argument("--latency-ms", type=int, default=200, help="stub time per request (requests stay in flight)")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--baseline-s", type=float, default=15.0)
    ap.add_argument("--tail-s", type=float, default=5.0)
    ap.add_argument("--observe-s", type=float, default=40.0, help="load after the kill before the health report")
    ap.add_argument("--max-requests", type=int, default=20000, help="bound per scenario")
    ap.add_argument("--max-load-s", type=float, default=900.0, help="bound per scenario (load stops by then)")
    ap.add_argument("--playbook-timeout-s", type=int, default=600)
    ap.add_argument("--health-timeout-s", type=int, default=30, help="sglang_health_timeout_s for the rollouts")
    ap.add_argument("--wait-idle-s", type=int, default=300, help="wait this long for other runs on the fleet")
    ap.add_argument("--out-dir", default=str(ROOT / "artifacts" / "reliability"))
    ap.add_argument("--no-reset-start-limit", dest="reset_start_limit", action="store_false",
                    help="do not reset the units' systemd start-rate counters before each scenario")
    ap.add_argument("--quiet", action="store_true")
    o = ap.parse_args(argv)
    o.scenarios = [s for s in o.scenarios.split(",") if s]
    return o


def main(argv=None):
    o = options(argv)
    bad = [s for s in o.scenarios if s not in ALL_SCENARIOS]
    profiles = [p for p in o.profiles.split(",") if p]
    missing = [p for p in profiles if not (PROFILES_DIR / ("%s.yml" % p)).is_file()]
    if bad or missing:
        print("reliability: unknown scenario(s) %s / profile(s) %s" % (bad, missing), file=sys.stderr)
        return 2
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    outdir = pathlib.Path(o.out_dir) / stamp
    outdir.mkdir(parents=True, exist_ok=True)
    bench = Bench(o, outdir)
    report = {"started": stamp, "tool": "tools/reliability.py", "argv": sys.argv[1:], "settings": vars(o),
              "note": "workers are the sandbox TEST DOUBLE (sandbox/sglang_stub); router: real sglang-router 0.3.2",
              "profiles": []}
    t = time.monotonic()
    try:
        for p in profiles:
            try:
                report["profiles"].append(bench.profile(p))
            except Exception as exc:  # record and go on with the next profile
                report["profiles"].append({"profile": p, "error": repr(exc), "scenarios": []})
    finally:
        report["duration_s"] = round(time.monotonic() - t, 1)
        report["pass"] = all(s.get("pass") for p in report["profiles"] for s in p["scenarios"]) and all(
            not p.get("error") for p in report["profiles"])
        path = pathlib.Path(o.out_dir) / ("%s.json" % stamp)
        path.write_text(json.dumps(report, indent=1, default=str) + "\n")
        print(table(report))
        print("\nresults: %s (details in %s/)" % (path, outdir))
    return 0 if report["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
