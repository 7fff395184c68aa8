# -*- coding: utf-8 -*-
"""The host run lock: one run at a time changes a host (issue 35).

Every stage that changes a host (the weights stage, the firmware update, the SGLang deploy / rolling restart /
rollback, the health-history service, and the NCCL and soak runs that must not overlap an update) takes this lock
first, through roles/host_lock. Mechanism:

- The lock is ``flock(2)`` (LOCK_EX) on a file that is never replaced (``/run/lock/b300-rollout/host.lock``: tmpfs, so
  a reboot clears it). The kernel releases a flock when the last descriptor of its open file description closes, so a
  killed holder frees the host: nothing to clean by hand.
- Ansible tasks are short-lived processes, so the descriptor is kept open by a small holder process that the module
  starts (double fork, setsid, stdio on /dev/null, ``comm`` = ``b300-host-lock``) and hands the locked descriptor to.
  The holder lives until the run releases the lock, another run takes it over, or its lease ends
  (``lease_until``: renewed by every later lock task of the same run).
- Who holds it is in the record beside it (``host.lock.json``, replaced atomically, readable by anyone): the run id,
  the operator and the controller (host, PID and the PID's start time), the playbook and stage, since when, the lease,
  the holder's PID. A refused run names all of it.
- A run whose controller process is gone (Ctrl-C, a crash, a failed play that never reached its release) leaves a
  holder until its lease ends. The next run takes it over when it can prove that run is gone (same controller, its
  PID no longer running with the same start time: ``run_gone``; the controller-side filter ``host_lock_run_gone``
  applies it) or when the operator names that run (``-e host_lock_takeover=<run id>``). A takeover ends the holder
  only: the stages' own locks (the weights directory lock, the firmware update's per-device lock) still guard what a
  stage left running on the host, so nothing is ever raced.
- A reboot clears ``/run/lock`` and ends the holder, so a run that reboots the host (the host-stack stage, the
  firmware update's activation) first writes a reboot record on disk (``reserve_reboot``:
  ``/var/lib/b300-rollout/host-lock.rebooting.json``, the lock record with ``state: rebooting`` and ``reboot_until``).
  Until that run takes its lock again after the boot (which removes the record), or ``reboot_until`` passes, or that
  run is taken over, ``acquire`` treats the host as held by it: another run that was waiting for the lock does not
  take the host in the middle of someone else's reboot (found by two host-stack runs at once, 2026-12-07).

Everything here is plain Python with the paths passed in; unit tests in tests/unit/test_host_lock.py run real
processes against temporary directories.
"""
from __future__ import absolute_import, division, print_function
__metaclass__ = type

import errno
import fcntl
import json
import os
import signal
import socket
import time

DEFAULT_PATH = "/run/lock/b300-rollout/host.lock"
HOLDER_COMM = "b300-host-lock"
RECORD_SUFFIX = ".json"
RUN_KEYS = ("id", "user", "controller", "pid", "start")


DEFAULT_REBOOT_PATH = "/var/lib/b300-rollout/host-lock.rebooting.json"


class LockError(Exception):
    """A lock operation that cannot go on; the message names the host, the holder and the fix. HOLDER: the record of
    the run in the way (the lock's, or the reboot record's), when there is one."""

    def __init__(self, msg, holder=None):
        super(LockError, self).__init__(msg)
        self.holder = holder


def record_path(lock_path):
    return lock_path + RECORD_SUFFIX


def proc_start(pid, proc_root="/proc"):
    """The start time of a process in clock ticks since boot (field 22 of /proc/PID/stat), or None if it is gone
    (or a zombie).
    Together with the PID it names one process: a PID reused later has another start time."""
    try:
        with open(os.path.join(proc_root, str(int(pid)), "stat")) as f:
            data = f.read()
    except (OSError, ValueError):
        return None
    # the command name (field 2) is in parentheses and may hold spaces or ')': split after the last ')'
    rest = data[data.rfind(")") + 2:].split()
    if not rest or rest[0] in ("Z", "X", "x"):
        return None  # a zombie (or dead) process runs no more: it holds no descriptor, so no lock
    try:
        return rest[19]
    except IndexError:
        return None


def process_alive(pid, start, proc_root="/proc"):
    """Whether the process PID still runs and is the one that started at START (ticks, as recorded)."""
    if not pid:
        return False
    now = proc_start(pid, proc_root)
    return now is not None and (start is None or str(now) == str(start))


def read_record(lock_path):
    """The holder record beside the lock, or None (missing or unreadable: a torn record cannot happen, it is replaced
    by rename)."""
    return _read_json(record_path(lock_path))


def _read_json(path):
    try:
        with open(path) as f:
            rec = json.load(f)
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def write_record(lock_path, rec):
    """Replace the record atomically (write + fsync + rename), mode 0644: anyone on the host may read who holds it."""
    _write_json(record_path(lock_path), rec)


def _write_json(path, rec):
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, 0o755, exist_ok=True)
    tmp = "%s.%d.tmp" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    try:
        os.write(fd, (json.dumps(rec, sort_keys=True) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)
    if d:  # the rename itself survives a power cut (the reboot record must)
        dfd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def read_reboot(reboot_path):
    """The reboot record (a run that rebooted the host and has not taken its lock again), or None."""
    return _read_json(reboot_path) if reboot_path else None


def clear_reboot(reboot_path):
    try:
        os.unlink(reboot_path)
    except OSError as e:
        if e.errno != errno.ENOENT:
            raise


def _clear_reboot_of(reboot_path, run_id):
    """Remove the reboot record if RUN_ID wrote it (another run's is left as it is)."""
    rec = read_reboot(reboot_path)
    if rec and rec.get("run_id") == str(run_id):
        clear_reboot(reboot_path)


def reboot_pending(rec, now=None):
    """Whether a reboot record still reserves the host (its reboot_until has not passed)."""
    now = time.time() if now is None else now
    return bool(rec) and rec.get("state") == "rebooting" and now <= float(rec.get("reboot_until") or 0)


def reserve_reboot(lock_path, reboot_path, run_id, reboot_s, host="this host", now=None):
    """Before RUN_ID reboots the host: write the reboot record on disk (the lock record, state rebooting, reboot_since,
    reboot_until = now + REBOOT_S). Only the run that holds the lock may; returns the record."""
    rec = read_record(lock_path)
    if not rec or rec.get("run_id") != str(run_id) or rec.get("state") != "held" or not is_locked(lock_path):
        raise LockError("host lock on %s: run %s is about to reboot the host but does not hold its lock (found: %s); "
                        "fix: take the lock first (roles/host_lock) - a reboot record is written by the holder only"
                        % (host, run_id, describe(rec)), holder=rec)
    now = time.time() if now is None else now
    res = dict(rec, state="rebooting", reboot_since=now, reboot_until=now + int(reboot_s))
    _write_json(reboot_path, res)
    return res


def check_run(run):
    """Errors in the run identity the controller passes (roles/host_lock builds it with the lookup
    b300.rollout.run_identity)."""
    errors = []
    if not isinstance(run, dict):
        return ["run must be a mapping with %s" % ", ".join(RUN_KEYS)]
    for key in RUN_KEYS:
        if run.get(key) in (None, ""):
            errors.append("run.%s is missing" % key)
    rid = str(run.get("id") or "")
    if rid and not all(c.isalnum() or c in "._:@-" for c in rid):
        errors.append("run.id %r may hold letters, digits and ._:@- only" % rid)
    return errors


def describe(rec, now=None):
    """One line naming a holder: run, operator, controller, playbook/stage, since, lease, holder PID."""
    if not rec:
        return "an unknown holder (no record beside the lock)"
    now = time.time() if now is None else now
    since = rec.get("since") or 0
    lease = rec.get("lease_until") or 0
    who = ("run %s of %s on controller %s (pid %s), play '%s', stage %s, since %s (%s ago)"
           % (rec.get("run_id"), rec.get("user"), rec.get("controller"), rec.get("controller_pid"),
              rec.get("playbook") or "?", rec.get("stage"), _utc(since), _ago(now - since)))
    if rec.get("state") == "rebooting":
        rebooted = rec.get("reboot_since") or now
        return ("%s, REBOOTING the host since %s (%s ago): the host is that run's until it takes its lock again after "
                "the boot, or until %s" % (who, _utc(rebooted), _ago(now - rebooted), _utc(rec.get("reboot_until"))))
    return "%s, lease until %s, holder pid %s" % (who, _utc(lease), rec.get("holder_pid"))


def _utc(ts):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts)) if ts else "?"


def _ago(seconds):
    seconds = max(0, int(seconds))
    if seconds < 120:
        return "%d s" % seconds
    if seconds < 7200:
        return "%d min" % (seconds // 60)
    return "%.1f h" % (seconds / 3600.0)


def run_gone(rec, this_controller=None, proc_root="/proc"):
    """Whether the run that holds the lock is provably gone: it was started on THIS controller and its controller
    process (PID + start time) no longer runs. A run from another controller is never judged gone here: only its
    operator knows (the refusal names host_lock_takeover)."""
    if not rec or rec.get("state") == "released":
        return False
    this_controller = this_controller or socket.gethostname()
    if rec.get("controller") != this_controller:
        return False
    return not process_alive(rec.get("controller_pid"), rec.get("controller_start"), proc_root)


def _open_lock(lock_path):
    d = os.path.dirname(lock_path)
    if d:
        os.makedirs(d, 0o755, exist_ok=True)  # two runs at once may both make it
    return os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o644)


def _try_flock(fd):
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise


def is_locked(lock_path):
    """Whether some process holds the flock now (a probe: takes and drops it when free)."""
    if not os.path.exists(lock_path):
        return False
    fd = _open_lock(lock_path)
    try:
        if _try_flock(fd):
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        return True
    finally:
        os.close(fd)


def _hold_loop(fd, lock_path, run_id, poll_s):
    """The holder: keep FD (locked) open while the record says this run holds the lock and its lease lasts."""
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        rec = read_record(lock_path)
        if (rec is None or rec.get("run_id") != run_id or rec.get("state") != "held"
                or time.time() > float(rec.get("lease_until") or 0)):
            os._exit(0)
        time.sleep(poll_s)


def spawn_holder(fd, lock_path, run_id, poll_s=1.0):
    """Start the holder process (double fork, own session, stdio on /dev/null, every other descriptor closed) and hand
    it FD, which holds the flock. Returns (pid, start ticks). The caller closes its own copy of FD afterwards."""
    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        try:
            os.setsid()
            if os.fork() > 0:
                os._exit(0)
            null = os.open(os.devnull, os.O_RDWR)
            for target in (0, 1, 2):
                os.dup2(null, target)
            keep = {0, 1, 2, fd, w}
            for name in os.listdir("/proc/self/fd"):
                n = int(name)
                if n not in keep:
                    try:
                        os.close(n)
                    except OSError:
                        pass
            try:
                with open("/proc/self/comm", "w") as comm:
                    comm.write(HOLDER_COMM)
            except OSError:
                pass
            os.chdir("/")
            os.write(w, str(os.getpid()).encode())
            os.close(w)
            _hold_loop(fd, lock_path, run_id, poll_s)
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(child, 0)
    data = b""
    while True:
        chunk = os.read(r, 64)
        if not chunk:
            break
        data += chunk
    os.close(r)
    if not data:
        raise LockError("the lock holder process did not start")
    pid = int(data)
    return pid, proc_start(pid)


def stop_holder(rec, wait_s=10.0):
    """End the holder named in REC (only that process: PID and start time must match). True when it is gone."""
    pid, start = rec.get("holder_pid"), rec.get("holder_start")
    if not process_alive(pid, start):
        return True
    for sig, until in ((signal.SIGTERM, wait_s / 2.0), (signal.SIGKILL, wait_s / 2.0)):
        try:
            os.kill(int(pid), sig)
        except OSError:
            return True
        deadline = time.time() + until
        while time.time() < deadline:
            if not process_alive(pid, start):
                return True
            time.sleep(0.05)
    return not process_alive(pid, start)


def _new_record(run, stage, playbook, lease_s, now):
    return {
        "state": "held",
        "run_id": str(run["id"]),
        "user": run.get("user"),
        "controller": run.get("controller"),
        "controller_pid": run.get("pid"),
        "controller_start": run.get("start"),
        "playbook": playbook or run.get("playbook") or "",
        "stage": stage,
        "since": now,
        "renewed": now,
        "lease_until": now + lease_s,
    }


def acquire(lock_path, run, stage, lease_s, wait_s=0, poll_s=1.0, takeover=None, playbook=None, host="this host",
            sleep=time.sleep, holder_poll_s=1.0, reboot_path=None, changed_before=False):
    """Take the lock for RUN (or renew it when RUN holds it already). Returns a dict:
    action (acquired | renewed | took_over), record (the new holder record), previous (the record before, if any).
    Waits at most WAIT_S for another run; then raises LockError naming it and the fix.
    REBOOT_PATH: the reboot record (reserve_reboot). A free lock is not taken while another run's reboot record is
    pending; RUN's own record is removed when RUN takes its lock again after the boot. CHANGED_BEFORE: RUN changed
    the host before this step (a re-take after its reboot): the refusal says so instead of "nothing was changed"."""
    errors = check_run(run)
    if errors:
        raise LockError("host lock on %s: %s" % (host, "; ".join(errors)))
    run_id = str(run["id"])
    deadline = time.time() + max(0, wait_s)
    fd = _open_lock(lock_path)
    try:
        while True:
            previous = read_record(lock_path)
            if _try_flock(fd):
                now = time.time()
                rebooting = read_reboot(reboot_path)
                if rebooting and rebooting.get("run_id") != run_id and reboot_pending(rebooting, now) \
                        and not (takeover and rebooting.get("run_id") == str(takeover)):
                    # another run rebooted the host and has not taken it back yet: the free lock is not ours
                    fcntl.flock(fd, fcntl.LOCK_UN)
                    if time.time() >= deadline:
                        raise LockError(refusal(host, rebooting, lock_path, wait_s, reboot_path, changed_before),
                                        holder=rebooting)
                    sleep(min(poll_s, max(0.05, deadline - time.time())))
                    continue
                rec = _new_record(run, stage, playbook, lease_s, now)
                action = "acquired"
                if previous and previous.get("run_id") == run_id and previous.get("state") == "held":
                    rec["since"] = previous.get("since") or now  # this run's holder died (lease): same run goes on
                if rebooting:
                    if rebooting.get("run_id") == run_id:
                        rec["since"] = rebooting.get("since") or now  # back after its own reboot: the same run
                    elif takeover and rebooting.get("run_id") == str(takeover):
                        action = "took_over"
                        rec["took_over"] = rebooting.get("run_id")
                    previous = rebooting
                write_record(lock_path, rec)
                if rebooting:
                    clear_reboot(reboot_path)  # after the new record: no moment where neither names the host's run
                pid, start = spawn_holder(fd, lock_path, run_id, holder_poll_s)
                rec.update(holder_pid=pid, holder_start=start)
                write_record(lock_path, rec)
                return {"action": action, "record": rec, "previous": previous}
            if previous and previous.get("run_id") == run_id and previous.get("state") == "held":
                now = time.time()
                rec = dict(previous, stage=stage, renewed=now, lease_until=now + lease_s)
                if playbook:
                    rec["playbook"] = playbook
                if not process_alive(rec.get("holder_pid"), rec.get("holder_start")):
                    raise LockError("host lock on %s: the record says this run (%s) holds the lock, but its holder "
                                    "pid %s is gone and another process holds %s; fix: find it with "
                                    "`fuser -v %s` before anything else runs here"
                                    % (host, run_id, rec.get("holder_pid"), lock_path, lock_path))
                write_record(lock_path, rec)
                _clear_reboot_of(reboot_path, run_id)  # its reboot record, when the reboot did not end the holder
                return {"action": "renewed", "record": rec, "previous": previous}
            if takeover and previous and previous.get("run_id") == str(takeover):
                if not stop_holder(previous):
                    raise LockError("host lock on %s: could not end the holder of %s" % (host, describe(previous)))
                got = False
                end = time.time() + 10
                while time.time() < end:
                    if _try_flock(fd):
                        got = True
                        break
                    sleep(0.05)
                if not got:
                    raise LockError("host lock on %s: took over %s, but the lock is still held by another process "
                                    "(fix: `fuser -v %s` names it)" % (host, describe(previous), lock_path))
                now = time.time()
                rec = _new_record(run, stage, playbook, lease_s, now)
                rec["took_over"] = previous.get("run_id")
                write_record(lock_path, rec)
                # the run taken over had meant to reboot: its reservation goes with it
                _clear_reboot_of(reboot_path, previous.get("run_id"))
                pid, start = spawn_holder(fd, lock_path, run_id, holder_poll_s)
                rec.update(holder_pid=pid, holder_start=start)
                write_record(lock_path, rec)
                return {"action": "took_over", "record": rec, "previous": previous}
            if time.time() >= deadline:
                raise LockError(refusal(host, previous, lock_path, wait_s, changed_before=changed_before),
                                holder=previous)
            sleep(min(poll_s, max(0.05, deadline - time.time())))
    finally:
        os.close(fd)


def refusal(host, rec, lock_path, wait_s, reboot_path=None, changed_before=False):
    """The refusal text: host, holder, what was waited, what this run changed, and the two ways on."""
    rid = (rec or {}).get("run_id") or "<run id>"
    waited = "waited %d s" % wait_s if wait_s else "tried for as long as host_lock_wait_s allows"
    where = reboot_path if (rec or {}).get("state") == "rebooting" and reboot_path else record_path(lock_path)
    changed = ("This run changed %s before this step (its earlier tasks say what) and stops here: run it again once "
               "the host is free." % host) if changed_before else "Nothing was changed on %s by this run." % host
    return ("%s is held by another run: %s; %s. %s "
            "Fix: wait for that run to finish (its record: %s), or, if it is gone (Ctrl-C, a lost controller), take "
            "the host over with -e host_lock_takeover=%s (ends only its lock holder; what it left running on the host "
            "is still guarded by the stages' own locks)."
            % (host, describe(rec), waited, changed, where, rid))


def release(lock_path, run_id, wait_s=10.0, reboot_path=None):
    """Release the lock RUN_ID holds (and its own reboot record, if one is left). Returns 'released', or 'not_held'
    when this run does not hold it (nothing done: another run's lock is never released here)."""
    rec = read_record(lock_path)
    _clear_reboot_of(reboot_path, run_id)  # a run that ends without taking its lock back after its reboot
    if not rec or rec.get("run_id") != str(run_id) or rec.get("state") != "held":
        return "not_held"
    now = time.time()
    write_record(lock_path, dict(rec, state="released", released_at=now, lease_until=now))
    stop_holder(rec, wait_s)
    return "released"
