"""tools/reliability.py waits for other runs on the shared sandbox fleet before each scenario (wait_fleet_idle). A
pytest of the controller lane (`-m controller`, `make integration-controller`) never touches the fleet and must not
count: in CI it ran beside the fleet lane and made each reliability scenario wait its --wait-idle-s for nothing.
Real processes whose command lines look like the two lanes' pytest runs (a sleeping python with those arguments)."""
import os
import shlex
import signal
import subprocess
import sys
import time

import reliability


def _spawn(*args):
    """The python runs as a GRANDchild (fleet_busy leaves out this process's own children), in its own group."""
    return _spawn_code("import time; time.sleep(30)", *args)


def _spawn_code(code, *args):
    cmd = " ".join(shlex.quote(a) for a in [sys.executable, "-c", code, *args])
    sh = subprocess.Popen(["sh", "-c", "%s & echo $!; wait" % cmd], stdout=subprocess.PIPE, text=True,
                          start_new_session=True)
    sh.child = int(sh.stdout.readline())
    return sh


def test_the_controller_lane_does_not_make_the_fleet_busy_the_fleet_lane_does():
    ctrl = _spawn("pytest", "-q", "-m", "controller", "tests/integration")
    fleet = _spawn("pytest", "-q", "-m", "not controller", "tests/integration")
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            busy = " | ".join(reliability.fleet_busy())
            if str(fleet.child) in busy:
                break
            time.sleep(0.1)
        assert "%d " % fleet.child in busy + " ", busy        # the fleet lane's pytest uses the fleet: waited for
        assert "%d " % ctrl.child not in busy + " ", busy     # the controller lane's never does
    finally:
        for p in (ctrl, fleet):
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def test_what_the_controller_lane_runs_does_not_make_the_fleet_busy():
    """Its bad-input suite runs ansible-playbook with the sandbox inventory (and -c local): a child of that pytest."""
    child = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)', "
             "'ansible-playbook', '-i', 'inventory/sandbox', 'site.yml', '-c', 'local']); time.sleep(30)")
    ctrl = _spawn_code(child, "pytest", "-q", "-m", "controller", "tests/integration")
    alone = _spawn("ansible-playbook", "-i", "inventory/sandbox", "site.yml")     # the same run, by an operator
    try:
        deadline = time.monotonic() + 20
        kid = None      # the lane's ansible-playbook, once exec'd (so the check below cannot pass before it exists)
        while kid is None and time.monotonic() < deadline:
            for k in subprocess.run(["pgrep", "-P", str(ctrl.child)], capture_output=True, text=True).stdout.split():
                with open("/proc/%s/cmdline" % k, "rb") as f:
                    if b"ansible-playbook" in f.read():
                        kid = k
            time.sleep(0.1)
        assert kid, "the controller lane's child did not start"
        while time.monotonic() < deadline:
            busy = " | ".join(reliability.fleet_busy())
            if str(alone.child) in busy:
                break
            time.sleep(0.1)
        assert "%d " % alone.child in busy + " ", busy                    # an operator's run: waited for
        assert "%s " % kid not in busy + " ", busy                         # the lane's: never
    finally:
        for p in (ctrl, alone):
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def test_controller_lane_is_told_by_the_marker_argument_alone():
    assert reliability._controller_lane("python pytest -q -m controller tests/integration")
    assert not reliability._controller_lane("python pytest -q -m not controller tests/integration")
    assert not reliability._controller_lane("python pytest -q tests/integration")
    assert not reliability._controller_lane("python ansible-playbook -m controller")
