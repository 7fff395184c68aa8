"""A change that fails part-way leaves the fleet serving (issue 23), on the sandbox (stub workers, REAL router 0.3.2).

kimi_k3 serves (the fleet the other integration tests deploy; deployed here first only when it does not serve). Per
rollback kind, one real `playbooks/sglang_deploy.yml --tags deploy` run with a change the fleet cannot take, under a
bounded chat-completion load through the router (tools/loadgen.py's request code, in a thread):
  - flag:  sglang_server_extra_args {"--log-requests": true} while both stubs refuse that flag at start (stub fault
           `refuse_flag:--log-requests`): the first re-rolled worker never comes up;
  - key:   an API key added while both stubs refuse a key at start (stub fault `refuse_api_key`): the router restarts
           with the key first, then the first re-rolled worker never comes up.
(Legal values that need care - a model root with a space, % and $ - are proven end to end in test_secrets.py, on
the deploys it makes anyway.) Each run must fail with "ROLLED BACK" and the reason, leave every unit and env file as it was (sha256 before ==
after), every planned worker healthy in the router, no key in the output, and the router answering through the run:
the flag run (router never restarted) with 0 failed requests; the key run (the router restarts twice: with the key,
then back without it) with failures only inside those restarts, the longest gap without an answer bounded.
Figures go to artifacts/rollback/last.json.
"""
import json
import os
import pathlib
import secrets
import threading
import time
import urllib.request

import pytest
import yaml

import loadgen

ROOT = pathlib.Path(__file__).resolve().parents[2]

ROUTER = "http://10.89.30.11:30080"
HOSTS = ("b300a", "b300b")
FILES = {"b300a": ["/etc/systemd/system/sglang-kimi_k3-w0.service", "/etc/sglang/kimi_k3-w0.env",
                   "/etc/systemd/system/sglang-router.service", "/etc/sglang/router.env"],
         "b300b": ["/etc/systemd/system/sglang-kimi_k3-w0.service", "/etc/sglang/kimi_k3-w0.env"]}
FAULT = "/run/sglang-stub/30000/fault"
# a failing re-rolled worker is given up on after this long (the default is an hour for a cold start of real weights)
FAST = {"sglang_health_timeout_s": 15, "sglang_reachability_check": False, "sglang_gather_hw_facts": False,
        "sglang_router_smoke_requests": 1}
FIGURES = {}

pytestmark = [pytest.mark.integration, pytest.mark.sandbox]


def deploy(sandbox, *extra, tags=("deploy",)):
    argv = ["ansible-playbook", "-i", sandbox.inventory, "playbooks/sglang_deploy.yml", "-l", "b300a,b300b",
            "-e", "sglang_profile=kimi_k3"] + (["--tags", ",".join(tags)] if tags else [])
    argv += list(extra)
    t = time.monotonic()
    r = sandbox.run(argv, check=False, timeout=1500)
    return r.returncode, r.stdout + r.stderr, round(time.monotonic() - t, 1)


def workers(key=None):
    req = urllib.request.Request(ROUTER + "/workers", headers={"Authorization": "Bearer %s" % key} if key else {})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())["workers"]


def serving():
    try:
        ws = workers()
    except OSError:
        return False
    return sorted(w["url"] for w in ws if w["is_healthy"]) == ["http://10.89.30.11:30000", "http://10.89.30.12:30000"]


def save(name, out):
    d = ROOT / "artifacts" / "rollback"
    d.mkdir(parents=True, exist_ok=True)
    (d / ("%s.log" % name)).write_text(out)


def router_invocation(sandbox):
    return sandbox.exec("b300a", "systemctl show -p InvocationID --value sglang-router.service").stdout.strip()


def file_digests(sandbox):
    out = {}
    for host, files in FILES.items():
        for line in sandbox.exec(host, "sha256sum %s" % " ".join(files)).stdout.splitlines():
            digest, path = line.split()
            out["%s:%s" % (host, path)] = digest
    return out


def exec_starts(sandbox):
    """The argv systemd starts each worker with (ExecStart= without its run-time fields: pid, start time)."""
    return {h: sandbox.exec(h, "systemctl show -p ExecStart --value sglang-kimi_k3-w0.service").stdout.split(" ; ")[1]
            for h in HOSTS}


def main_pids(sandbox):
    return {h: sandbox.exec(h, "systemctl show -p MainPID --value sglang-kimi_k3-w0.service").stdout.strip()
            for h in HOSTS}


class Load:
    """Chat completions through the router until stopped (bounded: at most 20 minutes, 3 in flight, 4 per second)."""

    def __init__(self, key=None):
        self.headers = {"Authorization": "Bearer %s" % key} if key else {}
        self.records, self.stop, self.lock = [], threading.Event(), threading.Lock()
        loadgen.check_target(ROUTER)
        self.t0 = time.monotonic()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(3)]

    def _run(self):
        seq = 0
        while not self.stop.is_set() and time.monotonic() - self.t0 < 1200:
            rec = loadgen.one_request(ROUTER, seq, self.t0, 15, False, "Kimi-K3", "rollback", self.headers)
            with self.lock:
                self.records.append(rec)
            seq += 1
            time.sleep(0.75)

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        time.sleep(3)
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def figures(self):
        recs = sorted(self.records, key=lambda r: r["t_start"])
        ok = [r["t_end"] for r in recs if r["ok"]]
        gaps = [b - a for a, b in zip(ok, ok[1:])]
        failed = [r for r in recs if not r["ok"]]
        return {"sent": len(recs), "ok": len(ok), "failed": len(failed),
                "errors": sorted({(r["error"] or "")[:60] for r in failed}),
                "longest_gap_without_answer_s": round(max(gaps), 2) if gaps else None,
                "first_ok_s": ok[0] if ok else None, "last_ok_s": ok[-1] if ok else None,
                "span_s": round(recs[-1]["t_end"], 1) if recs else 0}


@pytest.fixture(scope="module")
def fleet(sandbox):
    """kimi_k3 serving without a key, no stub fault armed; faults removed and the fleet left serving afterwards."""
    for h in HOSTS:
        sandbox.exec(h, "rm -f %s" % FAULT)
    if not serving():
        rc, out, _ = deploy(sandbox, tags=())
        assert rc == 0 and serving(), out[-4000:]
    yield sandbox
    for h in HOSTS:
        sandbox.exec(h, "rm -f %s" % FAULT)
    if not serving():
        rc, out, _ = deploy(sandbox, tags=())
        assert rc == 0, "the fleet could not be put back:\n" + out[-4000:]
    out = ROOT / "artifacts" / "rollback"
    out.mkdir(parents=True, exist_ok=True)
    (out / "last.json").write_text(json.dumps(FIGURES, indent=1) + "\n")


def arm(sandbox, fault):
    for h in HOSTS:
        sandbox.exec(h, "mkdir -p %s && echo %s > %s && chmod 0644 %s" % (os.path.dirname(FAULT), fault, FAULT, FAULT))


def check_rolled_back(sandbox, out, before_files, before_exec):
    text = " ".join(out.split())
    assert "ROLLED BACK: task '" in text, out[-5000:]
    reason = text[text.index("ROLLED BACK: task '"):]
    assert "b300a/W0" in reason.split(" -- ")[0], "the reason (the first re-rolled worker) is not named: " + reason[:800]
    assert "the router lists all 2 planned workers healthy" in text, out[-3000:]
    assert file_digests(sandbox) == before_files, "a unit or env file differs from the one that served before"
    assert exec_starts(sandbox) == before_exec
    deadline = time.monotonic() + 30
    while not serving() and time.monotonic() < deadline:
        time.sleep(1)
    assert serving(), workers()


def test_flag_change_refused_at_start_is_rolled_back_under_load(fleet):
    sandbox = fleet
    before_files, before_exec = file_digests(sandbox), exec_starts(sandbox)
    router_before, pids_before = router_invocation(sandbox), main_pids(sandbox)
    arm(sandbox, "refuse_flag:--log-requests")
    try:
        with Load() as load:
            time.sleep(3)
            rc, out, took = deploy(sandbox, "-e", json.dumps(dict(FAST, sglang_server_extra_args={
                "--log-requests": True})))
    finally:
        for h in HOSTS:
            sandbox.exec(h, "rm -f %s" % FAULT)
    fig = load.figures()
    save("flag", out)
    save("flag-router-journal", sandbox.exec("b300a", "journalctl -u sglang-router --no-pager -o short-precise "
                                             "--since '-%d s'" % (int(took) + 30), timeout=120).stdout)
    save("flag-load", "\n".join(json.dumps(r) for r in sorted(load.records, key=lambda r: r["t_start"])))
    FIGURES["flag"] = dict(fig, playbook_s=took, rc=rc, router_restarted=router_invocation(sandbox) != router_before)
    assert not FIGURES["flag"]["router_restarted"], "a flag change of the workers restarted the router"
    # only the worker the rolling pass reached was restarted (twice: with the flag, then on the restored files)
    assert main_pids(sandbox)["b300b"] == pids_before["b300b"], "the rollback restarted b300b/W0, which never moved"
    assert rc != 0, out[-4000:]
    assert "refuses --log-requests at start" in out or "is not ready" in out, out[-4000:]
    check_rolled_back(sandbox, out, before_files, before_exec)
    assert "--log-requests" not in " ".join(exec_starts(sandbox).values())
    # the router was never restarted: every request through the run was answered
    assert fig["failed"] == 0 and fig["ok"] >= 20, fig
    assert fig["longest_gap_without_answer_s"] < 5, fig


def test_key_added_but_refused_by_the_workers_is_rolled_back_under_load(fleet, tmp_path):
    sandbox = fleet
    key = "sk-b300-" + secrets.token_hex(16)
    varsfile = tmp_path / "key.yml"
    varsfile.write_text(yaml.safe_dump(dict(FAST, sglang_api_key=key)))
    before_files, before_exec = file_digests(sandbox), exec_starts(sandbox)
    arm(sandbox, "refuse_api_key")
    try:
        # the load sends the key all along: the router without a key ignores it, with the key requires it
        with Load(key) as load:
            time.sleep(3)
            rc, out, took = deploy(sandbox, "-e", "@%s" % varsfile)
    finally:
        for h in HOSTS:
            sandbox.exec(h, "rm -f %s" % FAULT)
    fig = load.figures()
    save("key_add", out)
    save("key_add-load", "\n".join(json.dumps(r) for r in sorted(load.records, key=lambda r: r["t_start"])))
    FIGURES["key_add"] = dict(fig, playbook_s=took, rc=rc)
    assert rc != 0, out[-4000:]
    assert key not in out, "the API key is in the output of the rolled-back run"
    assert "API key on the serving fleet: add (strategy rolling)" in out
    check_rolled_back(sandbox, out, before_files, before_exec)
    for host in HOSTS:
        assert "SGLANG_API_KEY" not in sandbox.exec(host, "cat /etc/sglang/kimi_k3-w0.env").stdout
    with urllib.request.urlopen(urllib.request.Request(
            ROUTER + "/v1/chat/completions", data=json.dumps({"model": "Kimi-K3", "max_tokens": 4, "messages": [
                {"role": "user", "content": "hi"}]}).encode(), headers={"Content-Type": "application/json"}),
            timeout=30) as resp:
        assert resp.status == 200, "the router wants a key after the rollback"
    # answered before, between and after the two router restarts; failures only while the router restarted
    assert fig["ok"] >= 20 and fig["first_ok_s"] < 5 and fig["span_s"] - fig["last_ok_s"] < 5, fig
    assert fig["longest_gap_without_answer_s"] < 15, fig
    assert all("Connection refused" in e or "Remote end closed" in e or "reset" in e.lower() or "503" in e
               or "timed out" in e for e in fig["errors"]), fig
