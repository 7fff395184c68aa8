"""Issue 35 on the sandbox fleet (over SSH, as production): the host run lock of another controller's run refuses a
rolling restart of the serving kimi_k3 fleet before any unit restarts, and names that run; the lock's holder outlives
the SSH session that started it. Runs right after test_sglang_deploy's kimi_k3 converge (FLEET_ORDER), ~30 s."""
import json

import pytest

pytestmark = pytest.mark.integration

OTHER = {"id": "ops-laptop-4242-777", "user": "bob", "controller": "ops-laptop", "pid": 4242, "start": "777"}
UNIT = "sglang-kimi_k3-w0.service"


def lock_module(sandbox, host, state, takeover=""):
    args = json.dumps({"state": state, "run": OTHER, "stage": "firmware-update", "host": host, "takeover": takeover,
                       "playbook": "Firmware update | one host at a time"})
    return sandbox.ansible_json(host, "b300.rollout.host_lock", args, "-b")[host]


def hold_as_other(sandbox, host):
    """OTHER takes HOST. A run of an earlier test that failed on purpose keeps its lock (by design: only the next run
    of the same controller, or a named takeover, ends it); OTHER is another controller, so it names that run, as an
    operator would after reading the refusal."""
    now = sandbox.ansible_json(host, "b300.rollout.host_lock", json.dumps({"state": "query", "host": host}), "-b")[host]
    stale = (now.get("holder") or {}).get("run_id", "") if now["held_by_other"] else ""
    return lock_module(sandbox, host, "held", takeover=stale)


def main_pids(sandbox):
    return {h: sandbox.ssh(h, "systemctl show -p MainPID --value %s" % UNIT).stdout.strip() for h in ("b300a", "b300b")}


def test_another_controllers_run_holds_b300b_and_a_rolling_restart_changes_nothing(sandbox):
    before = main_pids(sandbox)
    assert all(p not in ("", "0") for p in before.values()), before  # the kimi_k3 fleet serves (test_sglang_deploy)
    held = hold_as_other(sandbox, "b300b")
    try:
        assert held["outcome"] in ("acquired", "took_over"), held
        holder = held["holder"]
        # the holder process outlived the SSH session and the module that started it
        comm = sandbox.ssh("b300b", "cat /proc/%d/comm" % holder["holder_pid"]).stdout.strip()
        assert comm == "b300-host-lock"
        r = sandbox.ansible_playbook("playbooks/rolling_restart.yml", "-e", "sglang_profile=kimi_k3",
                                     "-e", "host_lock_wait_s=0", limit="b300a,b300b", check=False)
        out = " ".join((r.stdout + r.stderr).split())
        assert r.returncode != 0
        assert "b300b is held by another run: run ops-laptop-4242-777 of bob on controller ops-laptop" in out, out[-4000:]
        assert "stage firmware-update" in out and "-e host_lock_takeover=ops-laptop-4242-777" in out
        assert main_pids(sandbox) == before  # any_errors_fatal: no instance left the router or restarted
        # the other run still holds b300b: the refused run neither released nor took it
        rec = json.loads(sandbox.ssh("b300b", "cat /run/lock/b300-rollout/host.lock.json").stdout)
        assert rec["run_id"] == OTHER["id"] and rec["state"] == "held"
    finally:
        assert lock_module(sandbox, "b300b", "released")["outcome"] in ("released", "not_held")
