"""The sandbox fleet itself: two hosts that look like separate machines, reachable over SSH, systemd running."""
import re

import pytest

pytestmark = pytest.mark.sandbox


def test_ansible_ping_over_ssh(sandbox):
    res = sandbox.ansible_json("gpu_nodes", "ping", None, "-e", "ansible_connection=ssh")
    assert set(res) == set(sandbox.hosts)
    for host, r in res.items():
        assert r["ping"] == "pong", (host, r)


def test_each_host_has_its_own_machine_id(sandbox):
    res = sandbox.ansible_json("gpu_nodes", "command", "cat /etc/machine-id")
    ids = {h: r["stdout"].strip() for h, r in res.items()}
    assert set(ids) == set(sandbox.hosts)
    for host, mid in ids.items():
        assert re.fullmatch(r"[0-9a-f]{32}", mid), "%s: machine-id %r" % (host, mid)
    assert len(set(ids.values())) == len(ids), ids


def test_each_host_presents_its_own_ssh_host_key(sandbox):
    keys = {}
    for host, ip in sandbox.hosts.items():
        r = sandbox.run(["ssh-keyscan", "-T", "5", "-t", "ed25519", ip])
        line = [ln for ln in r.stdout.splitlines() if ln.startswith(ip)]
        assert len(line) == 1, r.stdout + r.stderr
        keys[host] = line[0].split()[2]
        # what sshd presents is the key file of that host
        pub = sandbox.exec(host, "cat /etc/ssh/ssh_host_ed25519_key.pub").stdout.split()[1]
        assert pub == keys[host], host
    assert len(set(keys.values())) == len(keys), keys


def test_systemd_is_pid1_and_running(sandbox):
    for host in sandbox.hosts:
        assert sandbox.exec(host, "cat /proc/1/comm").stdout.strip() == "systemd", host
        # booted: 'running', or 'degraded' when a unit failed; units that roles install (/etc/systemd/system, e.g.
        # a stub service another test left failed) are not the sandbox's business, the image's own units are
        state = sandbox.ssh(host, "systemctl is-system-running", check=False).stdout.strip()
        assert state in ("running", "degraded"), "%s: system %s" % (host, state)
        failed = sandbox.exec(host, "systemctl list-units --failed --plain --no-legend | awk '{print $1}'").stdout.split()
        image_failed = [u for u in failed if not sandbox.exec(
            host, ["systemctl", "show", "-P", "FragmentPath", u]).stdout.strip().startswith("/etc/systemd/system/")]
        assert image_failed == [], "%s: failed units of the image: %s" % (host, image_failed)
        for unit in ("ssh.service", "dbus.service", "systemd-journald.service"):
            assert sandbox.ssh(host, "systemctl is-active %s" % unit, check=False).stdout.strip() == "active", (host, unit)
        assert sandbox.ssh(host, "hostname").stdout.strip() == host


def test_hosts_have_no_route_out(sandbox):
    for host, ip in sandbox.hosts.items():
        routes = sandbox.exec(host, ["ip", "-4", "route", "show"]).stdout
        assert "default" not in routes, "%s has a default route:\n%s" % (host, routes)
        assert "10.89.30.0/24" in routes and "src %s" % ip in routes, routes


def test_hosts_reach_each_other_by_name(sandbox):
    r = sandbox.exec("b300a", "getent hosts b300b")
    assert r.stdout.split()[0] == sandbox.hosts["b300b"], r.stdout


def test_scenario_switch_and_restore(sandbox):
    # other tests may hold b300b on some scenario: switch away from whatever it is and put it back
    before = sandbox.current_scenario("b300b")
    other_before = sandbox.current_scenario("b300a")
    target = "cx8_fw_mismatch" if before != "cx8_fw_mismatch" else "healthy"
    tree = sandbox.exec("b300b", "readlink /opt/hwemu/sys").stdout.strip()
    try:
        sandbox.scenario("b300b", target)
        assert sandbox.exec("b300b", "readlink /opt/hwemu/sys").stdout.strip() != tree
        assert sandbox.current_scenario("b300a") == other_before  # the other host is untouched
    finally:
        sandbox.scenario("b300b", before)
    assert sandbox.exec("b300b", "readlink /opt/hwemu/sys").stdout.strip() == tree
