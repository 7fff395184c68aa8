"""Issue 35 without the fleet: the host run lock around a real changing stage, the whole
playbooks/nic_firmware_update.yml on the controller (connection local) against a PRIVATE copy of the emulated hardware
(the fixture of test_nic_firmware_update_local.py). Two operators ten seconds apart: the second run is refused before it
reads or changes anything, told who holds the host, and the NIC is burned once. Ctrl-C and a re-run: the re-run takes
the gone run's lock over by itself and finishes the update. The lock file lives under the test's tmp dir."""
import json
import os
import signal
import subprocess
import time

import pytest
from test_nic_firmware_update_local import ROOT, fresh, fw, local  # noqa: F401 - local is the shared fixture

pytestmark = [pytest.mark.integration, pytest.mark.controller]


def counting_flint(lc):
    """Every flint call of the run is logged (argv) to emu/flint.calls, then the emulator's flint runs."""
    bin_dir = lc["emu"] / "bin"
    real = bin_dir / "flint.real"
    if not real.exists():
        (bin_dir / "flint").rename(real)
        (bin_dir / "flint").write_text('#!/bin/sh\necho "$*" >> %s\nexec %s "$@"\n' % (lc["emu"] / "flint.calls", real))
        (bin_dir / "flint").chmod(0o755)
    calls = lc["emu"] / "flint.calls"
    if calls.exists():
        calls.unlink()
    return calls


def burns(calls):
    return [ln for ln in calls.read_text().splitlines() if ln.split()[-1:] == ["burn"]] if calls.exists() else []


def start(lc, name, lock, burn_s, *extra):
    argv = ["ansible-playbook", "-i", str(lc["inv"]), "playbooks/nic_firmware_update.yml", "-e",
            "@%s" % lc["imgs"]["good"], "-e", "nic_firmware_update_maintenance=true",
            "-e", "nic_firmware_update_report_dir=%s" % (lc["t"] / "rep"),
            "-e", "nic_firmware_update_report_name=%s" % name, "-e", "host_lock_path=%s" % lock] + list(extra)
    log = open(lc["t"] / ("%s.log" % name), "w")
    env = dict(lc["env"], HWEMU_BURN_S=str(burn_s))
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True), log


def finish(proc, log, timeout=600):
    rc = proc.wait(timeout)
    log.close()
    return rc, " ".join(open(log.name).read().split())


def wait_for(cond, timeout=120):
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return True
        time.sleep(0.2)
    return False


def record(lock):
    try:
        return json.loads(open(str(lock) + ".json").read())
    except (OSError, ValueError):
        return None


def test_two_updates_of_one_host_never_both_burn(local):  # noqa: F811 - the fixture
    fresh(local)
    calls = counting_flint(local)
    lock = local["t"] / "hostlock" / "host.lock"
    a, alog = start(local, "lock-a", lock, 12)
    # the second operator starts while the first one burns
    assert wait_for(lambda: burns(calls)), open(alog.name).read()[-3000:]
    held = record(lock)
    assert held and held["state"] == "held" and held["stage"] == "firmware-update"
    b, blog = start(local, "lock-b", lock, 1, "-e", "host_lock_wait_s=0")
    rc_b, out_b = finish(b, blog)
    assert rc_b != 0 and "b300b is held by another run: run %s" % held["run_id"] in out_b, out_b[-3000:]
    assert "Nothing was changed on b300b by this run" in out_b and "host_lock_takeover=%s" % held["run_id"] in out_b
    assert len(burns(calls)) == 1  # B read nothing and burned nothing while A burned
    rc_a, out_a = finish(a, alog)
    assert rc_a == 0, out_a[-3000:]
    assert len(burns(calls)) == 1 and fw(local) == "40.47.1026"
    # A gave the host back at its end
    assert record(lock)["state"] == "released" and record(lock)["run_id"] == held["run_id"]


def test_ctrl_c_then_a_rerun_takes_the_gone_runs_lock_over(local):  # noqa: F811 - the fixture
    fresh(local)
    calls = counting_flint(local)
    lock = local["t"] / "hostlock2" / "host.lock"
    a, alog = start(local, "ctrlc-a", lock, 30)
    assert wait_for(lambda: burns(calls)), open(alog.name).read()[-3000:]
    gone = record(lock)
    os.killpg(a.pid, signal.SIGINT)  # the operator's Ctrl-C: the whole foreground process group
    finish(a, alog, 60)
    # the lock outlives the run (its holder is not in the run's process group); the re-run finds that run gone
    assert record(lock)["run_id"] == gone["run_id"] and record(lock)["state"] == "held"
    b, blog = start(local, "ctrlc-b", lock, 1, "-e", "host_lock_wait_s=0")
    rc_b, out_b = finish(b, blog)
    assert rc_b == 0, out_b[-3000:]
    assert "took the host run lock over from %s" % gone["run_id"] in out_b
    assert fw(local) == "40.47.1026"
    rec = record(lock)
    assert rec["state"] == "released" and rec["took_over"] == gone["run_id"]
