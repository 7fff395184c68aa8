"""roles/sglang's rollout decisions (module_utils/sglang/sglang_rollout.py), one test per case the role's YAML handled in Jinja
before: first deploy, flag change, key add/remove, a failed router, a failed rolling pass, a host unreachable
mid-rollback; plus the readers (systemctl show, env files) and the messages."""
import base64

import pytest

from ansible_collections.b300.rollout.plugins.module_utils.sglang import sglang_rollout as ro

# a kimi_k3-like plan (one regular worker per host, the router on b300a) and a glm52_pd-like one (2P on a, 2D on b)
KIMI = {
    "instances": [
        {"id": "b300a/W0", "host": "b300a", "role": "worker", "url": "http://10.0.0.11:30000",
         "unit_name": "sglang-kimi_k3-w0.service", "env_file": "/etc/sglang/kimi_k3-w0.env", "port": 30000},
        {"id": "b300b/W0", "host": "b300b", "role": "worker", "url": "http://10.0.0.12:30000",
         "unit_name": "sglang-kimi_k3-w0.service", "env_file": "/etc/sglang/kimi_k3-w0.env", "port": 30000},
    ],
    "router": {"host": "b300a", "unit_name": "sglang-router.service", "env_file": "/etc/sglang/router.env",
               "workers": [{"id": "b300a/W0", "url": "http://10.0.0.11:30000", "worker_type": "regular",
                            "bootstrap_port": None},
                           {"id": "b300b/W0", "url": "http://10.0.0.12:30000", "worker_type": "regular",
                            "bootstrap_port": None}]},
}
PD = {"instances": [
    {"id": "b300a/P0", "host": "b300a", "role": "prefill", "url": "http://a:30001"},
    {"id": "b300a/P1", "host": "b300a", "role": "prefill", "url": "http://a:30002"},
    {"id": "b300b/D0", "host": "b300b", "role": "decode", "url": "http://b:33002"},
    {"id": "b300b/D1", "host": "b300b", "role": "decode", "url": "http://b:33003"},
]}


def b64(text):
    return base64.b64encode(text.encode()).decode()


# ---- readers ------------------------------------------------------------------------------------------------------

def test_parse_systemctl_show_blocks_and_unknown_units():
    text = ("Id=sglang-router.service\nActiveState=active\nInvocationID=abc\nExecMainStartTimestamp=@1764720000\n\n"
            "Id=nope.service\nActiveState=inactive\nLoadState=not-found\nInvocationID=\n")
    got = ro.parse_systemctl_show(text)
    assert got["sglang-router.service"]["InvocationID"] == "abc"
    assert got["nope.service"] == {"Id": "nope.service", "ActiveState": "inactive", "LoadState": "not-found",
                                   "InvocationID": ""}
    assert ro.unix_seconds(got["sglang-router.service"]["ExecMainStartTimestamp"]) == 1764720000
    assert ro.unix_seconds("") is None and ro.unix_seconds("n/a") is None


def test_env_api_key_unescapes_what_the_template_escapes():
    # templates/etc/sglang/router.env.j2: SGLANG_API_KEY="{{ key | replace('\\', '\\\\') | replace('"', '\\"') }}"
    key = 'k"e\\y'
    line = 'SGLANG_API_KEY="%s"' % key.replace("\\", "\\\\").replace('"', '\\"')
    assert ro.env_api_key("# managed\nRUST_LOG=info\n%s\n" % line) == key
    assert ro.env_api_key("RUST_LOG=info\n") == ""
    assert ro.env_api_key("") == ""


# ---- the API key: first deploy, add, remove, rotate ----------------------------------------------------------------

@pytest.mark.parametrize("env, new, want", [
    (None, "K", "first"),                                   # first deploy: no router env file yet
    (None, "", "first"),
    ("RUST_LOG=info\n", "", "none"),
    ('SGLANG_API_KEY="K"\n', "K", "none"),
    ("RUST_LOG=info\n", "K", "add"),                        # router first, then each worker rolls
    ('SGLANG_API_KEY="K"\n', "", "remove"),                 # workers first, then the router
    ('SGLANG_API_KEY="K1"\n', "K2", "rotate"),              # refused with the rolling strategy
])
def test_key_change(env, new, want):
    assert ro.key_change(env, new) == want


# ---- what changed, what restarts when -----------------------------------------------------------------------------

def test_first_deploy_restarts_everything_now():
    ids = ro.restart_ids(["b300a/W0"], {"b300a/W0": True}, {"b300a/W0": True})
    assert ids == ["b300a/W0"]
    # no router yet (GET /workers did not answer): restart now, nothing left to a rolling pass
    split = ro.split_restarts("rolling", KIMI["instances"][:1], ids, [])
    assert split == {"now": ["b300a/W0"], "rolling": []}


def test_flag_change_on_a_serving_fleet_rolls():
    # only the env file changed (a flag lives there or in the unit); the router serves the worker
    ids = ro.restart_ids(["b300a/W0"], {"b300a/W0": False}, {"b300a/W0": True})
    assert ids == ["b300a/W0"]
    assert ro.split_restarts("rolling", KIMI["instances"][:1], ids, ["http://10.0.0.11:30000"]) == \
        {"now": [], "rolling": ["b300a/W0"]}
    assert ro.split_restarts("parallel", KIMI["instances"][:1], ids, ["http://10.0.0.11:30000"]) == \
        {"now": ["b300a/W0"], "rolling": []}
    assert ro.split_restarts("none", KIMI["instances"][:1], ids, ["http://10.0.0.11:30000"]) == \
        {"now": [], "rolling": []}
    with pytest.raises(ValueError, match="unknown restart strategy"):
        ro.split_restarts("eventually", KIMI["instances"][:1], ids, [])


def test_no_change_restarts_nothing_and_venv_change_restarts_all():
    iids = ["b300a/W0", "b300a/W1"]
    assert ro.restart_ids(iids, {}, {}) == []
    assert ro.restart_ids(iids, {}, {}, venv_changed=True) == iids
    assert ro.restart_ids(iids, {}, {}, pending=["b300a/W1"]) == ["b300a/W1"]


def test_pending_restart_is_a_file_newer_than_the_running_process():
    insts = [{"id": "W0", "unit_name": "u0.service", "env_file": "/e/0.env"},
             {"id": "W1", "unit_name": "u1.service", "env_file": "/e/1.env"},
             {"id": "W2", "unit_name": "u2.service", "env_file": "/e/2.env"},
             {"id": "W3", "unit_name": "u3.service", "env_file": "/e/3.env"}]
    units = {"u0.service": {"ActiveState": "active", "ExecMainStartTimestamp": "@100"},
             "u1.service": {"ActiveState": "active", "ExecMainStartTimestamp": "@100"},
             "u2.service": {"ActiveState": "inactive", "ExecMainStartTimestamp": ""},
             "u3.service": {"ActiveState": "active", "ExecMainStartTimestamp": ""}}
    mtimes = {"/etc/systemd/system/u0.service": 90, "/e/0.env": 101,      # env written after the start: pending
              "/etc/systemd/system/u1.service": 90, "/e/1.env": 100,      # same second: not newer
              "/e/2.env": 500, "/e/3.env": 500}
    assert ro.pending_restart(insts, units, mtimes) == ["W0"]


def test_rolling_order_is_decode_prefill_worker_in_plan_order():
    order = ro.rolling_order(PD["instances"], ["b300a/P1", "b300b/D1", "b300a/P0", "b300b/D0"])
    assert [i["id"] for i in order] == ["b300b/D0", "b300b/D1", "b300a/P0", "b300a/P1"]
    assert ro.rolling_order(PD["instances"], []) == []
    with pytest.raises(ValueError, match="not planned instances: b300c/D9"):
        ro.rolling_order(PD["instances"], ["b300c/D9"])


# ---- router membership ---------------------------------------------------------------------------------------------

LISTING = {"workers": [{"id": "u1", "url": "http://10.0.0.11:30000", "is_healthy": True, "worker_type": "regular",
                        "api_key": "never-returned", "load": 3},
                       {"id": "u2", "url": "http://10.0.0.12:30000", "is_healthy": False, "worker_type": "regular"}],
           "total": 2}


def test_workers_view_keeps_only_what_the_role_needs():
    view = ro.workers_view(LISTING)
    assert view == [{"id": "u1", "url": "http://10.0.0.11:30000", "worker_type": "regular", "is_healthy": True},
                    {"id": "u2", "url": "http://10.0.0.12:30000", "worker_type": "regular", "is_healthy": False}]
    assert "never-returned" not in repr(view)
    assert ro.workers_view({}) == [] and ro.workers_view(None) == []


def test_a_worker_leaves_the_router_only_when_the_others_are_healthy():
    view = ro.workers_view(LISTING)
    a, b = KIMI["router"]["workers"]
    assert ro.membership_check(b, [a], view, "http://127.0.0.1:30080") == ""      # a healthy: b may leave
    msg = ro.membership_check(a, [b], view, "http://127.0.0.1:30080")
    assert "does not list b300b/W0 as healthy" in msg and "other than b300a/W0" in msg
    assert "http://10.0.0.12:30000 healthy=False" in msg and "parallel" not in msg
    nobody = [dict(w, is_healthy=False) for w in view]
    assert "rerun with -e sglang_restart_strategy=parallel" in ro.membership_check(a, [b], nobody, "u")


def test_worker_body_for_regular_prefill_decode_and_a_keyed_router():
    assert ro.worker_body({"url": "http://a:1", "worker_type": "regular", "bootstrap_port": None}) == {"url": "http://a:1"}
    assert ro.worker_body({"url": "http://a:1", "worker_type": "prefill", "bootstrap_port": 8998}, "K") == \
        {"url": "http://a:1", "worker_type": "prefill", "bootstrap_port": 8998, "api_key": "K"}
    assert ro.worker_body({"url": "http://b:2", "worker_type": "decode", "bootstrap_port": None}) == \
        {"url": "http://b:2", "worker_type": "decode"}


def test_missing_and_unhealthy_workers():
    view = ro.workers_view(LISTING)
    planned = KIMI["router"]["workers"] + [{"id": "c", "url": "http://c:1"}]
    assert [w["id"] for w in ro.missing_workers(planned, view)] == ["c"]
    assert [w["id"] for w in ro.unhealthy_workers(planned, view)] == ["b300b/W0", "c"]


# ---- one step of a rolling pass ------------------------------------------------------------------------------------

INST = KIMI["instances"][1]


@pytest.mark.parametrize("rc, on_timeout, ok, fixed", [(0, "fail", True, False), (5, "fail", True, True),
                                                       (4, "fail", False, False), (4, "restart", True, False),
                                                       (6, "fail", False, False), (1, "fail", False, False)])
def test_drain_verdict(rc, on_timeout, ok, fixed):
    res = {"rc": rc, "stdout": '{"detail": "d", "loads": {"running": 2}}'}
    v = ro.drain_verdict(res, INST, 600, 120, on_timeout, "/etc/sglang/router.env")
    assert (v["ok"], v["fixed_wait"]) == (ok, fixed)
    if rc == 4 and not ok:
        assert 'Found still on it after 600 s' in v["msg"] and '{"running": 2}' in v["msg"]
        assert "sglang_stop_timeout_s = 120 s" in v["msg"]
    if rc == 4 and ok:
        assert v["msg"].startswith("b300b/W0 NOT drained, restarted anyway")
    if rc == 6:
        assert "accept the running router's key (/etc/sglang/router.env)" in v["msg"]
    if not ok:
        assert v["msg"].startswith("b300b: b300b/W0 (sglang-kimi_k3-w0.service, http://10.0.0.12:30000) did not drain: d.")


def test_a_failed_rolling_pass_names_where_it_stopped_and_how_to_resume():
    msg = ro.rolling_stop_message(INST, "Rolling | wait until healthy | b300b/W0", "not ready", True,
                                  ["b300a/W0", "b300b/W0"], ["b300a/W0"], "kimi_k3")
    assert "Rolling restart stopped at b300b/W0" in msg and "The instance is NOT in the router" in msg
    assert "-e '{\"sglang_rolling_instances\": [\"b300b/W0\"]}'" in msg
    still = ro.rolling_stop_message(INST, "pre-check", "x", False, ["b300b/W0"], [], "kimi_k3")
    assert "STILL in the router (nothing was removed or restarted)" in still


# ---- rollback ------------------------------------------------------------------------------------------------------

UNIT = "/etc/systemd/system/sglang-kimi_k3-w0.service"
RUNIT = "/etc/systemd/system/sglang-router.service"


def snapshots(router_active="active"):
    files_a = {UNIT: b64("[Service]\nExecStart=old\n"), "/etc/sglang/kimi_k3-w0.env": b64("X=1\n"),
               RUNIT: b64("[Service]\n"), "/etc/sglang/router.env": b64('SGLANG_API_KEY="old"\n')}
    files_b = {UNIT: b64("[Service]\nExecStart=old\n"), "/etc/sglang/kimi_k3-w0.env": b64("X=1\n")}
    return {"b300a": {"files": files_a, "units": {"sglang-kimi_k3-w0.service": {"invocation": "a1", "active": "active"},
                                                  "sglang-router.service": {"invocation": "r1", "active": router_active}}},
            "b300b": {"files": files_b, "units": {"sglang-kimi_k3-w0.service": {"invocation": "b1", "active": "active"}}}}


def now(**inv):
    out = {}
    for host, units in inv.items():
        out[host] = {u: {"Id": u, "ActiveState": a, "InvocationID": i} for u, (a, i) in units.items()}
    return out


def test_rollback_after_a_failed_router_restarts_the_router_and_what_it_moved():
    # a key add: the router restarted (new InvocationID) and b300a/W0 rolled; b300b/W0 not reached yet
    cur = now(b300a={"sglang-kimi_k3-w0.service": ("active", "a2"), "sglang-router.service": ("active", "r2")},
              b300b={"sglang-kimi_k3-w0.service": ("active", "b1")})
    rb = ro.rollback_plan(KIMI, snapshots(), cur)
    assert rb["served"] and rb["why_not"] == ""
    assert rb["restart"] == ["b300a/W0"] and rb["router_restart"]
    kinds = sorted((r["host"], r["kind"]) for r in rb["restore"])
    assert kinds == [("b300a", "env"), ("b300a", "router_env"), ("b300a", "router_unit"), ("b300a", "unit"),
                     ("b300b", "env"), ("b300b", "unit")]
    assert [w["id"] for w in rb["workers"]] == ["b300a/W0", "b300b/W0"] and rb["unreachable"] == []
    summary = ro.rollback_summary(rb, ["b300a/W0 env", "router env"], "task 'x' failed: y", True)
    assert summary.startswith("ROLLED BACK: task 'x' failed: y -- Restored b300a/W0 env, router env;")
    assert "restarted on the restored files: b300a/W0, router" in summary
    assert "the router lists all 2 planned workers healthy" in summary and "API key set" in summary


def test_rollback_after_a_failed_rolling_pass_restarts_the_failed_worker_only():
    # a flag change: the router did not move; b300b/W0 restarted and failed (not active now)
    cur = now(b300a={"sglang-kimi_k3-w0.service": ("active", "a1"), "sglang-router.service": ("active", "r1")},
              b300b={"sglang-kimi_k3-w0.service": ("failed", "b2")})
    rb = ro.rollback_plan(KIMI, snapshots(), cur)
    assert rb["restart"] == ["b300b/W0"] and not rb["router_restart"]
    assert ro.restored_files([{"id": "b300b/W0", "kind": "env"}, {"id": "router", "kind": "router_env"}],
                             [{"changed": True}, {"changed": False}]) == ["b300b/W0 env"]


def test_no_rollback_on_a_first_deploy_or_without_a_snapshot():
    cur = now(b300a={}, b300b={})
    first = ro.rollback_plan(KIMI, snapshots(router_active="inactive"), cur)
    assert not first["served"] and "first deploy" in first["why_not"]
    snaps = snapshots()
    del snaps["b300b"]
    assert "no snapshot of b300b" in ro.rollback_plan(KIMI, snaps, cur)["why_not"]
    assert ro.rollback_plan({"instances": []}, {}, {})["why_not"] == "the plan has no router"


def test_a_host_unreachable_mid_rollback():
    # b300b stopped answering: its instance cannot be restored or restarted, the rest is rolled back
    cur = now(b300a={"sglang-kimi_k3-w0.service": ("active", "a2"), "sglang-router.service": ("active", "r1")})
    rb = ro.rollback_plan(KIMI, snapshots(), cur, unreachable=["b300b"])
    assert rb["served"] and rb["lost"] == ["b300b/W0"] and rb["restart"] == ["b300a/W0"]
    assert all(r["host"] == "b300a" for r in rb["restore"])
    assert [w["id"] for w in rb["workers"]] == ["b300a/W0"]       # the router waits for what can serve
    msg = ro.rollback_summary(rb, [], "task 'x' failed: y", True)
    assert msg.startswith("ROLLBACK INCOMPLETE: task 'x' failed: y -- b300b is unreachable: b300b/W0 not restored")
    # a host whose state could not be read is restarted on its restored files (the safe side)
    rb2 = ro.rollback_plan(KIMI, snapshots(), {"b300a": cur["b300a"]})
    assert rb2["restart"] == ["b300a/W0", "b300b/W0"]
    # the router host itself unreachable: nothing can be rolled back through it
    rb3 = ro.rollback_plan(KIMI, snapshots(), {}, unreachable=["b300a"])
    assert not rb3["served"] and "router host b300a is unreachable" in rb3["why_not"]


def test_rollback_restores_only_files_that_existed():
    snaps = snapshots()
    snaps["b300b"]["files"]["/etc/sglang/kimi_k3-w0.env"] = ""        # the run created it: nothing to restore
    cur = now(b300a={"sglang-kimi_k3-w0.service": ("active", "a1"), "sglang-router.service": ("active", "r1")},
              b300b={"sglang-kimi_k3-w0.service": ("active", "b1")})
    rb = ro.rollback_plan(KIMI, snaps, cur)
    assert ("b300b", "env") not in [(r["host"], r["kind"]) for r in rb["restore"]]
    assert rb["restart"] == [] and not rb["router_restart"]


def test_snapshot_units_shape():
    assert ro.snapshot_units(ro.parse_systemctl_show("Id=u\nActiveState=active\nInvocationID=x\n")) == \
        {"u": {"invocation": "x", "active": "active"}}


def test_rollback_restores_the_front_and_restarts_it_only_when_its_process_moved():
    plan = dict(KIMI, router=dict(KIMI["router"], front={"unit_name": "sglang-router-front.service",
                                                         "config": "/etc/haproxy/sglang-router-front.cfg"}))
    snaps = snapshots()
    snaps["b300a"]["files"]["/etc/systemd/system/sglang-router-front.service"] = b64("[Service]\n")
    snaps["b300a"]["files"]["/etc/haproxy/sglang-router-front.cfg"] = b64("global\n")
    snaps["b300a"]["units"]["sglang-router-front.service"] = {"invocation": "f1", "active": "active"}
    same = now(b300a={"sglang-kimi_k3-w0.service": ("active", "a1"), "sglang-router.service": ("active", "r2"),
                      "sglang-router-front.service": ("active", "f1")},
               b300b={"sglang-kimi_k3-w0.service": ("active", "b1")})
    rb = ro.rollback_plan(plan, snaps, same)
    assert {"front_unit", "front_cfg"} <= {r["kind"] for r in rb["restore"]}
    assert rb["router_restart"] and not rb["front_restart"]        # the front kept its process: a reload at most
    moved = dict(same, b300a=dict(same["b300a"], **{"sglang-router-front.service": {
        "Id": "sglang-router-front.service", "ActiveState": "active", "InvocationID": "f2"}}))
    assert ro.rollback_plan(plan, snaps, moved)["front_restart"]
    assert ro.restored_files([{"id": "router", "kind": "front_cfg"}], [{"changed": True}]) == ["router front cfg"]
    # a front that did not exist before (first run with the front): nothing to restore, nothing to restart
    assert not ro.rollback_plan(KIMI, snapshots(), moved)["front_restart"]
