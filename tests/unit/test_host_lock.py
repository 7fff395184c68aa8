"""The host run lock (module_utils/common/host_lock.py, lookup run_identity, filter host_lock_run_gone): real processes,
real flock(2), temporary directories. Issue 35: two runs never both change one host; a killed holder frees it; a
refused run is told who holds it and how to go on."""
import multiprocessing
import os
import signal
import socket
import time

import pytest

from ansible_collections.b300.rollout.plugins.filter.host_lock import host_lock_run_gone
from ansible_collections.b300.rollout.plugins.lookup import run_identity
from ansible_collections.b300.rollout.plugins.module_utils.common import host_lock as hl


def run(n, controller="ctl1", user="alice"):
    return {"id": "%s-%d-1000" % (controller, n), "user": user, "controller": controller, "pid": n, "start": "1000"}


@pytest.fixture
def lock(tmp_path):
    path = str(tmp_path / "lockdir" / "host.lock")  # the directory does not exist yet: acquire makes it
    yield path
    rec = hl.read_record(path)
    if rec and rec.get("holder_pid"):
        hl.stop_holder(rec, 2)


def wait_until(cond, timeout=5.0):
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def test_a_second_run_is_refused_and_told_who_holds_the_host(lock):
    got = hl.acquire(lock, run(1), "firmware-update", 600, playbook="Firmware update | one host at a time")
    assert got["action"] == "acquired" and hl.is_locked(lock)
    rec = hl.read_record(lock)
    assert rec["run_id"] == "ctl1-1-1000" and rec["stage"] == "firmware-update" and rec["state"] == "held"
    assert hl.process_alive(rec["holder_pid"], rec["holder_start"])
    with open("/proc/%d/comm" % rec["holder_pid"]) as f:
        assert f.read().strip() == hl.HOLDER_COMM
    t0 = time.time()
    with pytest.raises(hl.LockError) as err:
        hl.acquire(lock, run(2, user="bob"), "weights", 600, wait_s=1, poll_s=0.2, host="b300b")
    assert time.time() - t0 >= 1.0  # it waited its bound
    msg = str(err.value)
    for part in ("b300b is held by another run", "run ctl1-1-1000", "alice", "controller ctl1",
                 "Firmware update | one host at a time", "stage firmware-update", "holder pid %d" % rec["holder_pid"],
                 "Nothing was changed on b300b", "-e host_lock_takeover=ctl1-1-1000", lock + ".json"):
        assert part in msg, part
    assert hl.read_record(lock)["run_id"] == "ctl1-1-1000"  # the refused run wrote nothing


def test_the_same_run_renews_its_lock_without_a_second_holder(lock):
    first = hl.acquire(lock, run(1), "nccl-validation", 600)["record"]
    time.sleep(0.05)
    again = hl.acquire(lock, run(1), "weights", 1200)
    assert again["action"] == "renewed"
    rec = again["record"]
    assert rec["stage"] == "weights" and rec["since"] == first["since"] and rec["holder_pid"] == first["holder_pid"]
    assert rec["lease_until"] > first["lease_until"]


def test_a_killed_holder_frees_the_host(lock):
    rec = hl.acquire(lock, run(1), "weights", 600)["record"]
    os.kill(rec["holder_pid"], signal.SIGKILL)
    assert wait_until(lambda: not hl.is_locked(lock))
    got = hl.acquire(lock, run(2), "weights", 600)
    assert got["action"] == "acquired" and got["previous"]["run_id"] == "ctl1-1-1000"


def test_the_lease_ends_a_lock_its_run_never_released(lock):
    rec = hl.acquire(lock, run(1), "weights", 1, holder_poll_s=0.05)["record"]
    assert hl.is_locked(lock)
    assert wait_until(lambda: not hl.process_alive(rec["holder_pid"], rec["holder_start"]), 5)
    assert not hl.is_locked(lock)


def test_takeover_only_of_the_run_named(lock):
    rec = hl.acquire(lock, run(1), "weights", 600)["record"]
    with pytest.raises(hl.LockError):
        hl.acquire(lock, run(2), "weights", 600, takeover="ctl1-99-1000")  # another run's id: refused, untouched
    assert hl.process_alive(rec["holder_pid"], rec["holder_start"])
    got = hl.acquire(lock, run(2), "weights", 600, takeover="ctl1-1-1000")
    assert got["action"] == "took_over" and got["record"]["took_over"] == "ctl1-1-1000"
    assert not hl.process_alive(rec["holder_pid"], rec["holder_start"])
    assert hl.is_locked(lock) and hl.read_record(lock)["run_id"] == "ctl1-2-1000"


def test_only_the_holder_releases(lock):
    hl.acquire(lock, run(1), "weights", 600)
    assert hl.release(lock, "ctl1-2-1000") == "not_held"
    assert hl.is_locked(lock)
    assert hl.release(lock, "ctl1-1-1000") == "released"
    assert wait_until(lambda: not hl.is_locked(lock))
    rec = hl.read_record(lock)
    assert rec["state"] == "released" and rec["released_at"] >= rec["since"]
    assert hl.release(lock, "ctl1-1-1000") == "not_held"  # twice: nothing to do


def _race(lock, n, barrier, out):
    barrier.wait()
    try:
        hl.acquire(lock, run(n), "firmware-update", 600)
        out.put(n)
    except hl.LockError:
        out.put(-n)


def test_of_many_runs_started_at_once_exactly_one_takes_the_host(lock):
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(6), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(lock, n, barrier, out)) for n in range(1, 7)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(20)
    results = [out.get(timeout=5) for _ in procs]
    winners = [n for n in results if n > 0]
    assert len(winners) == 1, results
    assert hl.read_record(lock)["run_id"] == "ctl1-%d-1000" % winners[0]


def test_a_bad_run_identity_is_refused_before_the_lock_is_touched(lock):
    with pytest.raises(hl.LockError, match="run.controller is missing"):
        hl.acquire(lock, {"id": "x-1-1", "user": "a", "pid": 1, "start": "1"}, "weights", 600)
    with pytest.raises(hl.LockError, match="letters, digits"):
        hl.acquire(lock, dict(run(1), id="x; rm -rf /"), "weights", 600)
    assert not os.path.exists(lock)


def test_a_run_of_this_controller_whose_process_is_gone_is_gone():
    me = socket.gethostname()
    alive = {"controller": me, "controller_pid": os.getpid(), "controller_start": hl.proc_start(os.getpid()),
             "state": "held"}
    assert not host_lock_run_gone(alive)
    # the same PID with another start time is another process: the run that held the lock is gone
    assert host_lock_run_gone(dict(alive, controller_start="1"))
    child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(0,))
    child.start()
    child.join()
    assert host_lock_run_gone(dict(alive, controller_pid=child.pid, controller_start="1"))
    # another controller's run is never judged from here, nor a released lock, nor no record
    assert not host_lock_run_gone(dict(alive, controller="elsewhere", controller_pid=child.pid))
    assert not host_lock_run_gone(dict(alive, controller_start="1", state="released"))
    assert not host_lock_run_gone(None)


def _identity(out):
    out.put(run_identity.identity())


def test_the_run_identity_names_the_main_process_from_a_forked_worker():
    """Ansible's task workers are forks of ansible-playbook: the identity is the same from each of them."""
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    p = ctx.Process(target=_identity, args=(out,))
    p.start()
    ident = out.get(timeout=10)
    p.join()
    assert ident == run_identity.identity()
    assert ident["pid"] == run_identity.main_pid() and ident["pid"] != p.pid
    assert ident["id"] == "%s-%d-%s" % (socket.gethostname(), ident["pid"], ident["start"])
    assert not hl.check_run(ident)


def test_describe_names_every_part_of_a_holder():
    rec = {"run_id": "c-1-2", "user": "alice", "controller": "c", "controller_pid": 1, "playbook": "Weights",
           "stage": "weights", "since": 1000.0, "lease_until": 4600.0, "holder_pid": 42}
    text = hl.describe(rec, now=1000.0 + 300)
    assert text == ("run c-1-2 of alice on controller c (pid 1), play 'Weights', stage weights, since "
                    "1970-01-01T00:16:40Z (5 min ago), lease until 1970-01-01T01:16:40Z, holder pid 42")
    assert hl.describe(None).startswith("an unknown holder")


# --- a run that reboots the host keeps it through the reboot (found 2026-12-07: two host-stack runs at once; see
# docs/evidence/sandbox/host_stack_concurrency_20261207/). A reboot ends the holder and clears /run/lock: "reboot"
# below is exactly that - the holder killed, the lock directory removed - and the reboot record is what is left.

def reboot(lock):
    rec = hl.read_record(lock)
    hl.stop_holder(rec, 2)
    for p in (lock, lock + ".json"):
        os.unlink(p)
    os.rmdir(os.path.dirname(lock))


@pytest.fixture
def reboot_path(tmp_path):
    return str(tmp_path / "varlib" / "host-lock.rebooting.json")  # its directory is made by reserve_reboot


def test_a_waiting_run_does_not_take_the_host_in_the_middle_of_anothers_reboot(lock, reboot_path):
    hl.acquire(lock, run(1), "host-stack", 600, reboot_path=reboot_path)
    res = hl.reserve_reboot(lock, reboot_path, "ctl1-1-1000", 900, host="b300c")
    assert res["state"] == "rebooting" and res["reboot_until"] - res["reboot_since"] == 900
    reboot(lock)
    assert not hl.is_locked(lock) and hl.read_record(lock) is None  # the lock alone would let anyone in
    with pytest.raises(hl.LockError) as err:
        hl.acquire(lock, run(2, user="bob"), "host-stack", 600, wait_s=1, poll_s=0.2, host="b300c",
                   reboot_path=reboot_path)
    msg = str(err.value)
    for part in ("b300c is held by another run: run ctl1-1-1000", "REBOOTING the host since",
                 "Nothing was changed on b300c by this run", reboot_path, "-e host_lock_takeover=ctl1-1-1000"):
        assert part in msg, part
    assert err.value.holder["run_id"] == "ctl1-1-1000" and err.value.holder["state"] == "rebooting"
    assert not hl.is_locked(lock) and hl.read_record(lock) is None  # the waiter left nothing behind
    # the rebooting run comes back: takes its lock again, the same run (since kept), the record gone
    back = hl.acquire(lock, run(1), "host-stack", 600, reboot_path=reboot_path)
    assert back["action"] == "acquired" and back["previous"]["state"] == "rebooting"
    assert back["record"]["since"] == res["since"] and not os.path.exists(reboot_path)
    # and the waiter is now told about a held lock, as before
    with pytest.raises(hl.LockError, match="b300c is held by another run: run ctl1-1-1000"):
        hl.acquire(lock, run(2), "host-stack", 600, host="b300c", reboot_path=reboot_path)


def test_a_run_that_waits_longer_than_the_reboot_gets_the_host_after_it(lock, reboot_path):
    hl.acquire(lock, run(1), "firmware-update", 600, reboot_path=reboot_path)
    hl.reserve_reboot(lock, reboot_path, "ctl1-1-1000", 900)
    reboot(lock)

    def comes_back(_s):
        if os.path.exists(reboot_path):  # run 1 back from its boot during run 2's wait: takes, works, releases
            hl.acquire(lock, run(1), "firmware-update", 600, reboot_path=reboot_path)
            hl.release(lock, "ctl1-1-1000", reboot_path=reboot_path)
        time.sleep(0.05)

    got = hl.acquire(lock, run(2), "host-stack", 600, wait_s=5, poll_s=0.1, sleep=comes_back, reboot_path=reboot_path)
    assert got["action"] == "acquired" and got["previous"]["run_id"] == "ctl1-1-1000"
    assert got["previous"]["state"] == "released" and not os.path.exists(reboot_path)


def test_a_reboot_record_past_its_time_keeps_nothing(lock, reboot_path):
    hl.acquire(lock, run(1), "host-stack", 600, reboot_path=reboot_path)
    hl.reserve_reboot(lock, reboot_path, "ctl1-1-1000", 900, now=time.time() - 1000)  # written 1000 s ago
    reboot(lock)
    got = hl.acquire(lock, run(2), "host-stack", 600, reboot_path=reboot_path)
    assert got["action"] == "acquired" and got["previous"]["run_id"] == "ctl1-1-1000"
    assert not os.path.exists(reboot_path)


def test_a_rebooting_run_is_taken_over_only_by_name_and_then_is_refused(lock, reboot_path):
    hl.acquire(lock, run(1), "host-stack", 600, reboot_path=reboot_path)
    hl.reserve_reboot(lock, reboot_path, "ctl1-1-1000", 900)
    reboot(lock)
    with pytest.raises(hl.LockError):
        hl.acquire(lock, run(2), "host-stack", 600, takeover="ctl1-99-1000", reboot_path=reboot_path)
    got = hl.acquire(lock, run(2), "host-stack", 600, takeover="ctl1-1-1000", reboot_path=reboot_path)
    assert got["action"] == "took_over" and got["record"]["took_over"] == "ctl1-1-1000"
    assert not os.path.exists(reboot_path)
    # the run taken over comes back: refused, and told it changed the host before (not "nothing was changed")
    with pytest.raises(hl.LockError) as err:
        hl.acquire(lock, run(1), "host-stack", 600, host="b300c", reboot_path=reboot_path, changed_before=True)
    assert "This run changed b300c before this step" in str(err.value)
    assert "Nothing was changed" not in str(err.value)


def test_only_the_holder_writes_a_reboot_record_and_a_release_removes_its_own(lock, reboot_path):
    with pytest.raises(hl.LockError, match="does not hold its lock"):
        hl.reserve_reboot(lock, reboot_path, "ctl1-1-1000", 900, host="b300c")
    hl.acquire(lock, run(1), "host-stack", 600, reboot_path=reboot_path)
    with pytest.raises(hl.LockError, match="run ctl1-2-1000 is about to reboot the host but does not hold its lock"):
        hl.reserve_reboot(lock, reboot_path, "ctl1-2-1000", 900, host="b300c")
    assert not os.path.exists(reboot_path)
    hl.reserve_reboot(lock, reboot_path, "ctl1-1-1000", 900)
    # the reboot did not happen (its command failed): the run renews its lock - and its own record goes
    assert hl.acquire(lock, run(1), "host-stack", 600, reboot_path=reboot_path)["action"] == "renewed"
    assert not os.path.exists(reboot_path)
    hl.reserve_reboot(lock, reboot_path, "ctl1-1-1000", 900)
    assert hl.release(lock, "ctl1-2-1000", reboot_path=reboot_path) == "not_held" and os.path.exists(reboot_path)
    assert hl.release(lock, "ctl1-1-1000", reboot_path=reboot_path) == "released"
    assert not os.path.exists(reboot_path)


def test_a_rebooting_run_of_this_controller_that_is_gone_is_gone(lock, reboot_path):
    """The controller-side filter judges the reboot record the module returns as the holder, as it judges a lock's."""
    me = socket.gethostname()
    dead = {"run_id": "%s-1-1" % me, "controller": me, "controller_pid": 2 ** 22 + 7, "controller_start": "1",
            "state": "rebooting", "reboot_until": time.time() + 900}
    assert host_lock_run_gone(dead)
    alive = dict(dead, controller_pid=os.getpid(), controller_start=hl.proc_start(os.getpid()))
    assert not host_lock_run_gone(alive)
