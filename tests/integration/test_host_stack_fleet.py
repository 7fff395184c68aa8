"""Issue 36 on the sandbox fleet: the users' main command, `site.yml -l b300a,b300b`, takes a BARE sandbox host
(b300b: none of the stack) to a proven stack and to serving - real apt-get/dpkg/apt-mark against the offline mirror
sandbox/fleet.sh serves (file:/opt/b300-hoststack-repo, stand-in packages), one reboot through the controller's command
(the container's restart), the emulated driver and fabric manager following what dpkg installed
(sandbox/hwemu/hoststack.py), then the gates, NCCL and the deploy on the proven stack - and site.yml again changes
nothing on either host. The runs are timed (printed; a benchmark, not a timed assertion).

Only the fleet shows this: the role's real apt-get, holds and files on a Debian host, the reboot through the controller,
the fabric manager's unit starting at boot and its journal, the proof's fabric wait, and (item 4) the owed reboot of a
host that SERVES kimi_k3 through the firmware update's out-of-service path while requests flow through the router
(tests/integration/test_nic_firmware_update.py's Load: 0 failed) - interrupted by the operator's Ctrl-C once the host is
out of service, then resumed by the next site.yml run from the maintenance lock it left - and glm52_pd refused without
the maintenance flag.
The traps themselves are shown without the fleet (tests/unit/test_hwemu_hoststack.py), except a reboot that does not
come back in time, shown here in the same sequence (the first site.yml run's reboot leaves the host unreachable and
the run stops at the stage; the next site.yml run, the host serving again, owes and does the reboot). The module runs
among the kimi_k3 fleet tests (tests/integration/conftest.py FLEET_ORDER, after test_nic_firmware_update.py, whose
kimi_k3 fleet it reuses: it deploys only when run alone). The host is left bare again (stand-ins purged, the stage's
files removed, power-cycled) and serving, so every other fleet test sees its scenario as before. 393 s alone
(2026-12-06, with the fleet's kimi_k3 deploy): the site.yml run with the serving reboot 113.8 s, 465 requests through
the router, 0 failed; the no-change site.yml 74.7 s; the stage's playbook alone, no change, 5.0 s (1.2 s with the
stage off: the stage's own ~3.8 s are 5% of that site.yml). 381 s alone (2026-12-07, kimi_k3 already deployed; with
the Ctrl-C'd run and its resume: the resumed site.yml 150.5 s, 747 requests over both runs, 0 failed).
"""
import contextlib
import json
import os
import re
import signal
import subprocess
import time

import pytest

from conftest import failed_tasks
from test_nic_firmware_update import ROUTER, WORKERS, Load, healthy_workers

pytestmark = pytest.mark.integration

HOST = "b300b"
DRIVER = "580.173.02"
EMU_RUN = "/run/hwemu"      # the emulator's run dir on the hosts (sandbox/hwemu/hwemu_cli.py run_dir)
STAGE_FILES = ("/etc/apt/apt.conf.d/51b300-host-stack-blacklist", "/etc/apt/preferences.d/b300-host-stack.pref",
               "/etc/modules-load.d/b300-host-stack.conf")
# every stand-in carries /usr/share/doc/<name>/STAND-IN (sandbox/hoststack_repo/build.py)
STANDINS = "for p in $(dpkg-query -W -f '${Package}\\n'); do [ -e /usr/share/doc/$p/STAND-IN ] && echo $p; done; true"


def bare(sandbox):
    """Purge the stand-ins and the stage's files, power-cycle when a stand-in driver ran: the host is bare (and shows
    its scenario) again."""
    pkgs = sandbox.exec(HOST, STANDINS).stdout.split()
    if pkgs:
        sandbox.exec(HOST, "dpkg --purge --force-hold %s" % " ".join(pkgs), timeout=120)
    sandbox.exec(HOST, "rm -f %s" % " ".join(STAGE_FILES))
    sandbox.scenario(HOST, "healthy")     # the emulated /proc/modules of the scenario again
    # the emulator's boot snapshot of the stack (sandbox/hwemu/hoststack.py) goes with a boot
    if pkgs or sandbox.exec(HOST, "grep -q '\"driver\": {' /run/hwemu/hoststack-boot.json", check=False).returncode == 0:
        sandbox.run([str(sandbox.root / "sandbox" / "fleet.sh"), "reboot", HOST], timeout=300)


def recap(out, host):
    m = re.search(r"^%s\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)" % host, out, re.M)
    assert m, out[-3000:]
    return {k: int(v) for k, v in zip(("ok", "changed", "unreachable", "failed"), m.groups())}


def stage(sandbox, *extra, enabled=True):
    t0 = time.monotonic()
    r = sandbox.ansible_playbook("playbooks/host_stack.yml", "-e", "host_stack_enabled=%s" % enabled, *extra,
                                 limit=HOST, check=False, timeout=900)
    return r, round(time.monotonic() - t0, 1)


def both_hosts_run(sandbox, *extra, playbook="playbooks/host_stack.yml"):
    """playbook (the stage's own, or site.yml: the users' main command, the stage first, then the gates, NCCL standing
    aside on serving hosts, and the deploy) with both hosts in the run (the SGLang plan and the router need them) and
    the stage on HOST only: b300a runs the router (its own reboot would be an outage) and keeps its scenario's
    hand-installed stack."""
    t0 = time.monotonic()
    r = sandbox.ansible_playbook(playbook, "-e", "sglang_profile=kimi_k3", "-e",
                                 json.dumps({"host_stack_enabled": "{{ inventory_hostname == '%s' }}" % HOST}),
                                 "-e", "host_stack_reboot=reboot", *extra, limit="b300a,b300b", check=False,
                                 timeout=900)
    return r, round(time.monotonic() - t0, 1)


def both_hosts_run_interrupted(sandbox, after, playbook="site.yml", timeout=600):
    """both_hosts_run's site.yml, and the operator's Ctrl-C (SIGINT to its process group, as a terminal sends it) as
    soon as its output shows the task named `after` done on HOST. Returns (rc, output, seconds)."""
    argv = ["ansible-playbook", playbook, "-i", sandbox.inventory, "-l", "b300a,b300b", "-e", "sglang_profile=kimi_k3",
            "-e", json.dumps({"host_stack_enabled": "{{ inventory_hostname == '%s' }}" % HOST}),
            "-e", "host_stack_reboot=reboot"]
    p = subprocess.Popen(argv, cwd=sandbox.root, env=dict(sandbox.env, PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines, in_task, sent = [], False, False
    t0 = time.monotonic()
    end = t0 + timeout
    try:
        for line in p.stdout:
            lines.append(line)
            if line.startswith("TASK ["):
                in_task = after in line
            elif in_task and not sent and line.startswith(("changed: [%s]" % HOST, "ok: [%s]" % HOST)):
                os.killpg(p.pid, signal.SIGINT)
                sent = True
            if time.monotonic() > end:
                break
    finally:
        if p.poll() is None:
            try:
                p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    out = "".join(lines)
    assert sent, "the run never reached %r on %s:\n%s" % (after, HOST, out[-4000:])
    return p.returncode, out, round(time.monotonic() - t0, 1)


@contextlib.contextmanager
def units_started_before_the_stack_changed(sandbox):
    """HOST's emulated boot record (sandbox/hwemu/hoststack.py: hoststack-boot.json, hoststack-fm.json) says, inside
    the block, that this boot loaded the installed open driver and its fabric manager started; put back after."""
    boot, fm = "%s/hoststack-boot.json" % EMU_RUN, "%s/hoststack-fm.json" % EMU_RUN
    saved = json.loads(sandbox.exec(HOST, "cat %s" % boot).stdout)
    assert saved["driver"] is None, "step 2 expects a boot without the driver (the reboot owed): %s" % saved
    fm_saved = sandbox.exec(HOST, "cat %s" % fm, check=False).stdout.strip()
    # the driver and the NVSwitch bridge modules loaded (the fabric manager's start needs both), its start long ago
    # ("at" 1: the emulator counts the fabric delay from it; hoststack.py apply)
    mods = saved["modules"] + [m for m in ("nvidia", "mlx5_ib", "ib_umad") if m not in saved["modules"]]
    loaded = dict(saved, driver={"flavour": "open", "version": DRIVER}, modules=mods)
    try:
        sandbox.exec(HOST, "printf '%%s' '%s' > %s && printf '%%s' '%s' > %s" % (
            json.dumps(loaded), boot, json.dumps({"ok": True, "at": 1, "driver": DRIVER}), fm))
        yield
    finally:
        sandbox.exec(HOST, "printf '%%s' '%s' > %s" % (json.dumps(saved), boot))
        sandbox.exec(HOST, ("printf '%%s' '%s' > %s" % (fm_saved, fm)) if fm_saved else "rm -f %s" % fm)


def serving_units(sandbox):
    """HOST's running SGLang units -> their InvocationID (a restart or a reboot changes it)."""
    units = sandbox.exec(HOST, "systemctl list-units --type=service --state=active --no-legend --plain 'sglang-*' "
                               "| cut -d' ' -f1").stdout.split()
    return {u: sandbox.exec(HOST, "systemctl show -p InvocationID --value %s" % u).stdout.strip() for u in units}


def wait_serving(timeout=240):
    """Both kimi_k3 workers listed healthy by the router (the stub workers start in seconds)."""
    end = time.monotonic() + timeout
    while healthy_workers() != WORKERS and time.monotonic() < end:
        time.sleep(3)
    return healthy_workers() == WORKERS


@pytest.fixture(scope="module")
def kimi(sandbox):
    """The kimi_k3 fleet serving (test_nic_firmware_update.py leaves it so in the fleet order; alone: deploy it)."""
    if not wait_serving(timeout=20):
        r = sandbox.run(["ansible-playbook", "-i", sandbox.inventory, "playbooks/sglang_deploy.yml", "-l",
                         "b300a,b300b", "-e", "sglang_profile=kimi_k3"], check=False, timeout=1500)
        assert r.returncode == 0 and healthy_workers() == WORKERS, (r.stdout + r.stderr)[-4000:]
    return sandbox


def audit(sandbox, tmp_path, name, enabled):
    """tools/fw-audit on HOST (its JSON report), timed."""
    t0 = time.monotonic()
    r = sandbox.run([str(sandbox.root / "tools" / "fw-audit"), "-i", "inventory/sandbox", "-l", HOST, "--json",
                     "--report-dir", str(tmp_path / name), "-e", "host_stack_enabled=%s" % enabled], check=False,
                    timeout=300)
    assert r.returncode in (0, 2), r.stdout[-3000:] + r.stderr[-3000:]
    return r.returncode, json.loads(r.stdout)["hosts"][HOST], round(time.monotonic() - t0, 1)


def test_bare_host_to_proven_stack_a_reboot_not_back_in_time_then_the_owed_reboot_while_serving(kimi, request,
                                                                                                 tmp_path):
    """Long on purpose: one story on one host in the order an operator meets it (bare host installed, a reboot that
    does not come back, the PD refusal, the owed reboot while serving under load, a no-change run, the audit), each
    step starting from the state the step before left, so the fleet is deployed and made bare once."""
    sandbox = kimi
    bare(sandbox)       # (healthy: the proof expects the healthy NVLink links and NICs)
    assert wait_serving(), "kimi_k3 does not serve on both hosts after %s was made bare" % HOST
    was_serving = sorted(serving_units(sandbox))
    assert was_serving, "%s serves no SGLang unit (kimi_k3 deployed?)" % HOST

    def back():
        sandbox.exec(HOST, "systemctl start ssh", check=False)
        sandbox.exec(HOST, "rm -f /var/lib/b300-maintenance/lock", check=False)
        bare(sandbox)       # its reboot starts the enabled units again: the router lists the worker again
        sandbox.exec(HOST, "systemctl start %s" % " ".join(was_serving), check=False)
        assert wait_serving(), "kimi_k3 not serving on both hosts after the test (router %s)" % ROUTER
    request.addfinalizer(back)
    assert sandbox.exec(HOST, STANDINS).stdout.split() == []
    # the mirror is the one source the stage may use
    pol = sandbox.exec(HOST, "apt-cache policy nvidia-driver-580-server-open").stdout
    assert "file:/opt/b300-hoststack-repo ./ Packages" in pol and DRIVER in pol

    # 1. day zero by the users' main command, site.yml -l b300a,b300b (b300b serves nothing: its units stopped for
    # this step) - the stage installs and holds, then its reboot does not come back in time (the reboot command stops
    # the host's sshd instead): the stage fails naming the host, the wait and the fix, and site.yml stops there
    # (nothing after the stage runs on any host); the stack stays installed and held
    sandbox.exec(HOST, "systemctl stop 'sglang-*'")
    timeout_s = 10
    r, install_s = both_hosts_run(sandbox, "-e", "host_stack_reboot_timeout=%d" % timeout_s, "-e",
                                 '{"host_stack_reboot_command": ["podman", "exec", "b300-%s", "systemctl", "stop", '
                                 '"ssh"]}' % HOST, playbook="site.yml")
    out = r.stdout + r.stderr
    assert r.returncode != 0, out[-3000:]
    assert "PLAY [Preflight" not in out and "PLAY [SGLang" not in out, "site.yml went on after the stage failed"
    assert "install (in order): linux-modules-extra-" in out and "nvidia-driver-580-server-open=%s" % DRIVER in out
    assert ("host_stack on %s: rebooted for" % HOST) in out and "not answering after %d s" % timeout_s in out
    assert "fix: look at its console/BMC" in out
    sandbox.exec(HOST, "systemctl start ssh")
    held = set(sandbox.exec(HOST, "apt-mark showhold").stdout.split())
    assert {"nvidia-driver-580-server-open", "nvidia-fabricmanager-580", "nvlsm"} <= held, held

    # 2. b300b serves kimi_k3 again, and still owes the reboot. On a real host that state is units started BEFORE
    # the stack changed under them (running CUDA processes keep the module they opened; a NEW process - nvidia-smi,
    # the units' fabric wait - fails while no driver, or another version, is loaded). The emulator cannot start a
    # process in the past, so the units start while its boot record says the installed driver is loaded and the
    # fabric up, and the record is put back at once: the host then owes the reboot, as before.
    with units_started_before_the_stack_changed(sandbox):
        assert sandbox.exec(HOST, "/opt/hwemu/bin/nvidia-smi -L", check=False).returncode == 0
        sandbox.exec(HOST, "systemctl start %s" % " ".join(was_serving), timeout=300)
        assert wait_serving(), "b300b's worker not back in the router after its units started"
    assert sandbox.exec(HOST, "/opt/hwemu/bin/nvidia-smi -L", check=False).returncode == 9, "the driver of the last boot is back"
    before = serving_units(sandbox)

    # 2a. glm52_pd: refused before any change, naming the host, the profile, the flag and the fix
    r, pd_s = both_hosts_run(sandbox, "-e", "sglang_profile=glm52_pd")
    out = r.stdout + r.stderr
    text = " ".join(out.split())
    assert r.returncode != 0, out[-3000:]
    assert "host_stack on %s: REFUSED before any change: a reboot is owed" % HOST in text, out[-3000:]
    assert "while it serves profile glm52_pd" in text and "prefill/decode disaggregated" in text
    assert "Refused: pass -e nic_firmware_update_maintenance=true in a maintenance window" in text
    assert "Serving | " not in out, "play 3 ran after the refusal"
    assert serving_units(sandbox) == before and healthy_workers() == WORKERS

    # 2b. kimi_k3, by the users' main command (site.yml -l b300a,b300b): the owed reboot through the out-of-service
    # path while requests flow through the router - and the operator's Ctrl-C in the middle of it: the first run takes
    # b300b out of the router, drains it, stops its units, and is interrupted right there (before the reboot). The host
    # stays out of service under the maintenance lock, which names the units; b300a serves alone. The next site.yml run
    # takes the gone run's host lock over, RESUMES that path from the lock (the reboot (the controller's command), the
    # fabric wait and the proof, its units health-gated and back in the router), then the gates, NCCL and the deploy on
    # the proven stack; b300a serves throughout - 0 failed requests over both runs
    with Load(prompt="host-stack") as load:
        rc_cut, cut, cut_s = both_hosts_run_interrupted(sandbox, after="Serving | this host's SGLang units stopped")
        assert rc_cut != 0 and "Reboot | through the controller's command" not in cut, cut[-4000:]
        assert healthy_workers() == [WORKERS[0]], "b300b should be out of the router after the Ctrl-C"
        assert serving_units(sandbox) == {}, "b300b's units should be stopped after the Ctrl-C"
        mlock = json.loads(sandbox.exec(HOST, "cat /var/lib/b300-maintenance/lock").stdout)
        assert mlock["holder"] == "host_stack" and sorted(mlock["units"]) == sorted(before), mlock
        r, reboot_s = both_hosts_run(sandbox, playbook="site.yml")
    out = r.stdout + r.stderr
    figures = load.figures()
    assert r.returncode == 0, out[-5000:] + failed_tasks(r.stdout)
    assert all(v["failed"] == 0 and v["unreachable"] == 0 for v in (recap(out, "b300a"), recap(out, HOST)))
    for play in ("PLAY [Preflight", "PLAY [NCCL validation", "PLAY [SGLang"):
        assert play in out, "site.yml ran no %s play after the stage" % play
    text = " ".join(out.split())
    assert "%s serves (%s) and owes a reboot" % (HOST, ", ".join(before)) in " ".join(cut.split()), cut[-5000:]
    assert "took the host run lock over from" in text, out[-5000:]
    assert "%s has been out of service since %s" % (HOST, mlock["since"]) in text, out[-5000:]
    assert "the one-host-at-a-time play resumes it" in text, out[-5000:]
    for step in ("Serving | out of the router, every other planned worker healthy first",
                 "Serving | drained (the rolling path's drain, on the router host)",
                 "Reboot | through the controller's command", "Serving | healthy (and generating)",
                 "Serving | back in the router, listed healthy"):
        assert step in out, step
    assert out.index("Serving | drained") < out.index("Reboot | through the controller's command") < \
        out.index("Serving | back in the router")
    assert figures["failed"] == 0 and figures["sent"] > 10, figures
    assert healthy_workers() == WORKERS
    after = serving_units(sandbox)
    assert sorted(after) == sorted(before) and all(after[u] != before[u] for u in before), (before, after)
    assert sandbox.exec(HOST, "test -e /var/lib/b300-maintenance/lock", check=False).returncode != 0
    smi = sandbox.exec(HOST, "/opt/hwemu/bin/nvidia-smi -q").stdout
    assert re.search(r"^Driver Version\s+: %s$" % re.escape(DRIVER), smi, re.M), smi[:400]
    assert "Completed" in smi and "In Progress" not in smi
    journal = sandbox.exec(HOST, "journalctl -b -u nvidia-fabricmanager --no-pager").stdout
    assert "Successfully configured all the available GPUs and NVSwitches to route NVLink traffic" in journal
    assert sandbox.exec(HOST, "cat /opt/hwemu/proc/driver/nvidia/version").stdout.startswith(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  %s" % DRIVER)

    # 3. site.yml again changes nothing (the stage on for b300b); the stage's own cost in a no-change run is its
    # playbook with the stage on minus the same playbook with it off (the fixed part: lock, facts), against that site.yml
    r, site_again_s = both_hosts_run(sandbox, playbook="site.yml")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:] + failed_tasks(r.stdout)
    assert recap(out, HOST)["changed"] == 0 and recap(out, "b300a")["changed"] == 0, out[-3000:]
    assert "install (in order): nothing" in out and "reboot: no" in out
    r, again_s = stage(sandbox)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert recap(out, HOST)["changed"] == 0, out[-3000:]
    assert "install (in order): nothing" in out and "reboot: no" in out
    off, off_s = stage(sandbox, enabled=False)      # the same playbook with the stage off: the fixed part
    assert off.returncode == 0 and recap(off.stdout, HOST)["changed"] == 0

    # 4. the on-call audit reads the same proof read-only: clean, then a lost hold (drift) is a finding
    _, on, audit_s = audit(sandbox, tmp_path, "on", True)
    assert on["host_stack"]["failures"] == [], on["host_stack"]["failures"]
    sandbox.exec(HOST, "apt-mark unhold nvidia-fabricmanager-580")
    try:
        rc, drift, _ = audit(sandbox, tmp_path, "drift", True)
    finally:
        sandbox.exec(HOST, "apt-mark hold nvidia-fabricmanager-580")
    assert rc == 2 and any(m.startswith("%s: host_stack check packages_held failed: found not held: "
                                        "nvidia-fabricmanager-580" % HOST) for m in drift["messages"]), drift
    print("host_stack on %s: site.yml install run %.1f s (incl. the %d s reboot timeout), glm52_pd refusal %.1f s, site.yml "
          "with the serving reboot + proof %.1f s (resumed after the Ctrl-C; requests over both %s), no-change site.yml %.1f s, no-change stage %.1f s "
          "(stage off: %.1f s; the stage adds %.0f%% to the no-change site.yml); fw-audit with the stack's checks "
          "%.1f s; the Ctrl-C'd site.yml %.1f s (rc %d)" % (HOST, install_s, timeout_s, pd_s, reboot_s, figures, site_again_s, again_s, off_s,
                      100.0 * max(0.0, again_s - off_s) / site_again_s, audit_s, cut_s, rc_cut))
