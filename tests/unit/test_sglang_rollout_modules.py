"""The rollout modules run the way Ansible runs them (ad-hoc `ansible localhost -m`):

- b300.rollout.sglang_router_members against a fake sglang-router on loopback whose /workers API copies what the real
  0.3.2 router does (../shared/reference/sglang-router-contract.md §5, measured against the real router: GET /workers
  lists {id, url, worker_type, is_healthy, ...}; DELETE /workers/<id> answers 202 and the worker is gone shortly
  after; POST /workers answers 202 and the worker turns healthy after its first health check; with --api-key the
  /workers API needs `Authorization: Bearer <key>`, 401 otherwise). The real router runs under these modules in the
  sandbox integration tests (rolling restarts, rollbacks, reliability).
- b300.rollout.sglang_units_state with a stand-in `systemctl` that prints what `systemctl show --timestamp=unix -p ...`
  prints (blocks of KEY=VALUE, a blank line between units, `@<unix seconds>` timestamps)."""
import base64
import json
import os
import pathlib
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from test_facts_modules import run_module


class FakeRouter(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, key="", healthy_after=0.3, removal_after=0.2):
        super().__init__(("127.0.0.1", 0), Handler)
        self.key, self.healthy_after, self.removal_after = key, healthy_after, removal_after
        self.workers, self.calls, self.lock, self.n = [], [], threading.Lock(), 0

    def add(self, url, healthy=True, **kw):
        self.n += 1
        self.workers.append(dict({"id": "uuid-%d" % self.n, "url": url, "worker_type": "regular", "is_healthy": healthy,
                                  "load": 0, "priority": 50, "cost": 1.0, "connection_mode": "HTTP",
                                  "metadata": {}, "disable_health_check": False}, **kw))

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.server_address[1]


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _send(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _auth(self):
        r = self.server
        r.calls.append((self.command, self.path, self.headers.get("Authorization")))
        if r.key and self.headers.get("Authorization") != "Bearer " + r.key:
            self._send(401, {"error": "unauthorized"})
            return False
        return True

    def do_GET(self):
        if not self._auth():
            return
        if self.path != "/workers":
            return self._send(404, {"error": "not found"})
        with self.server.lock:
            ws = list(self.server.workers)
        self._send(200, {"workers": ws, "total": len(ws), "stats": {}})

    def do_DELETE(self):
        if not self._auth():
            return
        wid = self.path.rsplit("/", 1)[-1]
        r = self.server
        if not any(w["id"] == wid for w in r.workers):
            return self._send(404, {"error": "Worker %s not found" % wid, "code": "WORKER_NOT_FOUND"})

        def later():
            time.sleep(r.removal_after)
            with r.lock:
                r.workers = [w for w in r.workers if w["id"] != wid]
        threading.Thread(target=later, daemon=True).start()
        self._send(202, {"status": "accepted", "worker_id": wid,
                         "message": "Worker removal queued for background processing"})

    def do_POST(self):
        if not self._auth():
            return
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        r = self.server
        r.calls.append(("BODY", self.path, body))
        if "url" not in body:
            return self._send(422, {"error": "missing url"})
        with r.lock:
            r.add(body["url"], healthy=False, worker_type=body.get("worker_type", "regular"))
            wid = r.workers[-1]["id"]

        def later():
            time.sleep(r.healthy_after)
            with r.lock:
                for w in r.workers:
                    if w["id"] == wid:
                        w["is_healthy"] = True
        threading.Thread(target=later, daemon=True).start()
        self._send(202, {"status": "accepted", "worker_id": wid})


@pytest.fixture
def router():
    servers = []

    def make(**kw):
        r = FakeRouter(**kw)
        threading.Thread(target=r.serve_forever, daemon=True).start()
        servers.append(r)
        return r
    yield make
    for r in servers:
        r.shutdown()
        r.server_close()


def env_file(tmp_path, key):
    p = tmp_path / "router.env"
    p.write_text("RUST_LOG=info\n" + ('SGLANG_API_KEY="%s"\n' % key.replace("\\", "\\\\").replace('"', '\\"')
                                      if key else ""))
    return str(p)


A = {"id": "b300a/W0", "url": "http://10.0.0.11:30000", "worker_type": "regular", "bootstrap_port": None}
B = {"id": "b300b/W0", "url": "http://10.0.0.12:30000", "worker_type": "regular", "bootstrap_port": None}
P0 = {"id": "b300a/P0", "url": "http://10.0.0.11:30001", "worker_type": "prefill", "bootstrap_port": 8998}


def members(r, tmp_path, key="", check=False, **args):
    return run_module("sglang_router_members", dict({"url": r.url, "env_file": env_file(tmp_path, key),
                                                     "poll": 0.1, "timeout": 5}, **args), tmp_path, check=check)


def test_out_of_the_router_and_back_with_the_routers_key(router, tmp_path):
    key = 'sk-"rel\\x'                                        # escaped in the env file as the template does
    r = router(key=key)
    r.add(A["url"])
    r.add(B["url"])
    rc, res = members(r, tmp_path, key=key, state="absent", workers=[B], others=[A])
    assert rc == 0 and res["changed"] and res["removed"] == ["b300b/W0"], res
    assert res["listed_urls"] == [A["url"]]
    assert ("DELETE", "/workers/uuid-2", "Bearer " + key) in r.calls
    rc, res = members(r, tmp_path, key=key, state="present", workers=[A, B])
    assert rc == 0 and res["added"] == ["b300b/W0"] and res["changed"], res
    body = [c[2] for c in r.calls if c[0] == "BODY"]
    assert body == [{"url": B["url"], "api_key": key}]          # the workers hold the router's key
    assert sorted(res["listed_urls"]) == sorted([A["url"], B["url"]])
    assert all(w["is_healthy"] for w in res["workers"])
    assert key not in json.dumps(res) and key not in res["_stderr"]
    # idempotent: nothing missing, nothing added
    rc, res = members(r, tmp_path, key=key, state="present", workers=[A, B])
    assert rc == 0 and not res["changed"] and res["added"] == []


def test_refuses_to_take_a_worker_out_while_another_is_unhealthy(router, tmp_path):
    r = router()
    r.add(A["url"], healthy=False)
    r.add(B["url"])
    rc, res = members(r, tmp_path, state="absent", workers=[B], others=[A])
    assert rc != 0 and res["failed"]
    assert "does not list b300a/W0 as healthy" in res["msg"] and "other than b300b/W0" in res["msg"]
    assert not [c for c in r.calls if c[0] == "DELETE"], "nothing may be removed when the pre-check fails"
    assert len(r.workers) == 2


def test_check_mode_says_what_would_change_and_changes_nothing(router, tmp_path):
    r = router()
    r.add(A["url"])
    rc, res = members(r, tmp_path, check=True, state="present", workers=[A, P0])
    assert rc == 0 and res["changed"] and res["added"] == ["b300a/P0"]
    rc, res = members(r, tmp_path, check=True, state="absent", workers=[A])
    assert rc == 0 and res["removed"] == ["b300a/W0"]
    assert [c[0] for c in r.calls] == ["GET", "GET"] and len(r.workers) == 1


def test_prefill_body_and_healthy_wait(router, tmp_path):
    r = router(healthy_after=0.5)
    rc, res = members(r, tmp_path, state="present", workers=[P0])
    assert rc == 0, res
    assert [c[2] for c in r.calls if c[0] == "BODY"] == [{"url": P0["url"], "worker_type": "prefill",
                                                          "bootstrap_port": 8998}]
    assert res["elapsed"] >= 0.4
    # state=healthy waits, never adds
    r2 = router()
    rc, res = members(r2, tmp_path, state="healthy", workers=[A], timeout=1)
    assert rc != 0 and "every planned worker (b300a/W0) healthy not reached within 1 s" in res["msg"]
    assert not [c for c in r2.calls if c[0] == "BODY"]


def test_a_wrong_key_and_a_router_that_is_down(router, tmp_path):
    r = router(key="right")
    rc, res = members(r, tmp_path, key="wrong", state="query")
    assert rc != 0 and "GET %s/workers -> 401" % r.url in res["msg"] and "wrong" not in res["msg"]
    rc, res = run_module("sglang_router_members", {"url": "http://127.0.0.1:9", "state": "query", "missing_ok": True},
                         tmp_path)
    assert rc == 0 and res["reachable"] is False and res["workers"] == []
    rc, res = run_module("sglang_router_members", {"url": "http://127.0.0.1:9", "state": "absent", "workers": [A]},
                         tmp_path)
    assert rc != 0 and "the router does not answer" in res["msg"]


# ---- sglang_units_state --------------------------------------------------------------------------------------------

def fake_systemctl(tmp_path, out):
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    (d / "out.txt").write_text(out)
    exe = d / "systemctl"
    exe.write_text('#!/bin/sh\necho "$*" >> %s/calls.log\ncat %s/out.txt\n' % (d, d))
    exe.chmod(0o755)
    return d


def test_units_state_snapshot_and_pending_restart(tmp_path, monkeypatch):
    unit_dir = pathlib.Path("/etc/systemd/system")
    env = tmp_path / "w0.env"
    env.write_text('SGLANG_API_KEY="k"\n')
    started = int(time.time()) - 100
    os.utime(env, (started + 50, started + 50))                  # written after the process started: pending
    out = ("Id=sglang-x-w0.service\nActiveState=active\nSubState=running\nInvocationID=abc\n"
           "ExecMainStartTimestamp=@%d\nLoadState=loaded\n\n"
           "Id=gone.service\nActiveState=inactive\nSubState=dead\nInvocationID=\nExecMainStartTimestamp=\n"
           "LoadState=not-found\n" % started)
    bindir = fake_systemctl(tmp_path, out)
    monkeypatch.setenv("PATH", "%s:%s" % (bindir, os.environ["PATH"]))
    inst = {"id": "W0", "unit_name": "sglang-x-w0.service", "env_file": str(env)}
    rc, res = run_module("sglang_units_state", {"units": ["gone.service"], "instances": [inst],
                                                "files": [str(tmp_path / "absent.env")], "content": True}, tmp_path)
    assert rc == 0, res
    assert res["pending_restart"] == ["W0"] and not res["changed"]
    assert res["units"]["sglang-x-w0.service"]["InvocationID"] == "abc"
    assert res["snapshot"]["units"] == {"sglang-x-w0.service": {"invocation": "abc", "active": "active"},
                                        "gone.service": {"invocation": "", "active": "inactive"}}
    assert base64.b64decode(res["snapshot"]["files"][str(env)]) == b'SGLANG_API_KEY="k"\n'
    assert res["snapshot"]["files"][str(tmp_path / "absent.env")] == ""
    assert res["files"][str(tmp_path / "absent.env")] == {"exists": False, "mtime": None}
    calls = (bindir / "calls.log").read_text()
    assert "show --timestamp=unix -p Id,ActiveState,SubState,InvocationID,ExecMainStartTimestamp,LoadState" in calls
    assert str(unit_dir / "sglang-x-w0.service") in res["files"]
