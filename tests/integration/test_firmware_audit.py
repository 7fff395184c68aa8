"""Integration: the NIC firmware gate and the on-call audit against the sandbox hosts (emulated hardware).

b300b is switched to the SYNTHESIZED hwemu scenario `cx8_fw_mismatch` (exactly mlx5_3 runs 40.44.1036 under
DOCA-OFED 25.10-1.2.2, which bundles 40.47.1026); a finalizer puts it back to `healthy`.

"Nothing changed on a host" is proven with a marker file: every file outside the volatile paths (/proc, /sys, /dev,
/run, /tmp, /var/log, /var/cache, /var/lib/systemd, /root/.ansible, the emulator's own /opt/hwemu, the health history's
own files) that is newer than the marker is a change. The helper first proves it sees a change (positive control) before it is trusted.
"""
import json
import pathlib
import re
import time

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
HOSTS = ("b300a", "b300b")
MARKER = "/tmp/.fwgate-marker"
_HISTORY = yaml.safe_load((ROOT / "roles" / "health_history" / "defaults" / "main.yml").read_text())
# + what the health-history service (site.yml installs it) writes by itself every sampling interval: its samples, and
# in the node_exporter textfile directory its own textfile (atomic write: a temp file renamed, which also touches the
# directory). Any other file there (the audit's textfile, say) still counts as a change.
PRUNE = ["/proc", "/sys", "/dev", "/run", "/tmp", "/var/tmp", "/var/log", "/var/cache", "/var/lib/systemd",
         "/root/.ansible", "/opt/hwemu", _HISTORY["health_history_dir"]]
HISTORY_OWN = re.compile(r"^%s(/\.?b300_health_history\.prom(\.\d+\.tmp)?)?$"
                         % re.escape(_HISTORY["health_history_textfile_dir"]))


def mark(fleet, host):
    fleet["sb"].exec(host, "touch %s; sleep 1.1" % MARKER)


def changed_files(fleet, host):
    prune = " -o ".join("-path %s" % p for p in PRUNE)
    out = fleet["sb"].exec(host, "find / -xdev \\( %s \\) -prune -o -newer %s -print" % (prune, MARKER),
                           check=False).stdout
    return sorted(line for line in out.splitlines() if line and line != MARKER and not HISTORY_OWN.match(line))


def run(fleet, argv, timeout=600):
    return fleet["sb"].run(argv, check=False, timeout=timeout)


@pytest.fixture(scope="module")
def fleet(sandbox, request):
    """The 2-host sandbox, b300b on cx8_fw_mismatch while tests run."""
    f = {"sb": sandbox}
    # positive control: the change detector sees a file written after the marker
    mark(f, "b300a")
    sandbox.exec("b300a", "mkdir -p /srv && touch /srv/.fwgate-probe")
    assert "/srv/.fwgate-probe" in changed_files(f, "b300a")
    sandbox.exec("b300a", "rm -f /srv/.fwgate-probe")
    sandbox.scenarios_back_to_healthy(request, HOSTS)
    sandbox.scenario("b300a", "healthy")
    sandbox.scenario("b300b", "cx8_fw_mismatch")
    pci = sandbox.exec("b300b", "basename $(readlink -f /opt/hwemu/sys/class/infiniband/mlx5_3/device)").stdout.strip()
    assert re.match(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$", pci)
    f["mlx5_3_pci"] = pci
    return f


def test_site_stops_in_preflight_before_any_change(fleet):
    for h in HOSTS:
        mark(fleet, h)
    r = run(fleet, ["ansible-playbook", "site.yml", "-i", "inventory/sandbox", "-l", "b300a,b300b"])
    out = r.stdout + r.stderr
    assert r.returncode != 0, out[-3000:]
    gate = [line for line in out.splitlines() if "mlx5_3" in line and "MISMATCH" in line]
    assert gate, "gate message missing:\n" + out[-4000:]
    for part in ("b300b", fleet["mlx5_3_pci"], "ConnectX-8", "fw 40.44.1036", "doca_ofed 25.10-1.2.2",
                 "expected 40.47.1026", "mlxfwreset -d %s reset" % fleet["mlx5_3_pci"]):
        assert part in gate[0], (part, gate[0])
    # no play started after the gate failed (any_errors_fatal), and nothing changed on either host
    after = out[out.index("NIC firmware gate FAILED"):]
    assert not re.search(r"^PLAY \[", after, re.M), after[:3000]
    for h in HOSTS:
        assert changed_files(fleet, h) == [], (h, changed_files(fleet, h))
    recap = dict(re.findall(r"^(b300[ab])\s+:\s+(.*)$", out, re.M))
    assert set(recap) == set(HOSTS)
    assert all("changed=0" in v for v in recap.values()), recap


def test_audit_reports_exactly_mlx5_3_and_exits_2(fleet, tmp_path):
    r = run(fleet, [str(ROOT / "tools" / "fw-audit"), "-i", "inventory/sandbox", "-l", "b300a,b300b", "--json",
             "--report-dir", str(tmp_path)])
    assert r.returncode == 2, r.stdout[-3000:] + r.stderr[-3000:]
    rep = json.loads(r.stdout)
    bad = [(x["host"], x["device"], x["verdict"], x["pci_address"], x["fw"], x["expected"])
           for x in rep["nic_rows"] if x["verdict"] not in ("ok", "ignored")]
    assert bad == [("b300b", "mlx5_3", "mismatch", fleet["mlx5_3_pci"], "40.44.1036", "40.47.1026")]
    ignored = [(x["host"], x["device"], x["model"]) for x in rep["nic_rows"] if x["verdict"] == "ignored"]
    assert sorted(ignored) == [("b300a", "mlx5_8", "ConnectX-7"), ("b300b", "mlx5_8", "ConnectX-7")]
    assert {h: e["status"] for h, e in rep["hosts"].items()} == {"b300a": "ok", "b300b": "fail"}
    assert rep["gpu"]["problems"] == [] and len(rep["gpu"]["driver_versions"]) == 1
    md = sorted(tmp_path.glob("fw-audit-*.md"))
    assert md and "| b300b | mlx5_3 | ConnectX-8 | %s | 40.44.1036 |" % fleet["mlx5_3_pci"] in md[-1].read_text()


def test_audit_in_check_mode_changes_nothing(fleet, tmp_path):
    for h in HOSTS:
        mark(fleet, h)
    r = run(fleet, ["ansible-playbook", "playbooks/firmware_audit.yml", "-i", "inventory/sandbox", "-l", "b300a,b300b",
             "--check", "-e", "audit_report_dir=%s" % tmp_path, "-e", "audit_report_name=check"])
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    recap = dict(re.findall(r"^(\S+)\s+:\s+ok=\d+\s+(changed=\d+)", out, re.M))
    assert recap and set(HOSTS) <= set(recap) and set(recap.values()) == {"changed=0"}, recap
    assert json.loads((tmp_path / "check.json").read_text())["summary"]["exit_code"] == 2
    for h in HOSTS:
        assert changed_files(fleet, h) == [], (h, changed_files(fleet, h))


def test_unreachable_host_reported_and_exit_3(fleet, tmp_path):
    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "group_vars").symlink_to(ROOT / "inventory" / "sandbox" / "group_vars")
    # b300y: an address on the sandbox network that no container holds
    (inv / "hosts.yml").write_text(
        "all:\n  children:\n    gpu_nodes:\n      hosts:\n"
        "        b300a: {ansible_host: 10.89.30.11}\n        b300b: {ansible_host: 10.89.30.12}\n"
        "        b300y: {ansible_host: 10.89.30.249}\n")
    # the key path in group_vars is relative to the inventory dir: point it at the real one
    t0 = time.monotonic()
    r = run(fleet, [str(ROOT / "tools" / "fw-audit"), "-i", str(inv), "--json", "--report-dir", str(tmp_path / "rep"),
             "-e", "ansible_ssh_private_key_file=%s" % (ROOT / ".cache" / "sandbox" / "id_ed25519")])
    assert r.returncode == 3, r.stdout[-3000:] + r.stderr[-3000:]
    rep = json.loads(r.stdout)
    assert rep["hosts"]["b300y"]["status"] == "unreachable"
    assert rep["summary"]["unreachable_or_failed"] == ["b300y"]
    # 3 wins over 2, but the finding is still reported
    assert [(x["host"], x["device"]) for x in rep["nic_rows"] if x["verdict"] == "mismatch"] == [("b300b", "mlx5_3")]
    assert time.monotonic() - t0 < 120


def sandbox_known_hosts(sb, path, swap=False):
    """known_hosts for the sandbox: each host's address with the SSH host key it really presents, read out of band
    through `podman exec` (as an operator reads it on the console; the copy fleet.sh keeps in .cache/sandbox/hosts
    belongs to the checkout that created the hosts, which need not be this one). swap=True gives b300b the key of
    b300a: a wrong key."""
    keys = {h: sb.exec(h, "cat /etc/ssh/ssh_host_ed25519_key.pub").stdout.split()[:2] for h in HOSTS}
    assert all(len(k) == 2 and k[0] == "ssh-ed25519" for k in keys.values()), keys
    if swap:
        keys["b300b"] = keys["b300a"]
    path.write_text("".join("%s %s %s\n" % (ip, k[0], k[1]) for ip, k in
                            (("10.89.30.11", keys["b300a"]), ("10.89.30.12", keys["b300b"]))))
    return path


def test_audit_over_paramiko_checks_the_sandbox_host_keys(fleet, tmp_path):
    """The on-call audit over -c paramiko (no OpenSSH client involved), host keys checked against the sandbox's."""
    env = dict(fleet["sb"].env, ANSIBLE_VERBOSITY="3")
    r = fleet["sb"].run([str(ROOT / "tools" / "fw-audit"), "-i", "inventory/sandbox", "-l", "b300a,b300b", "-v",
                         "-c", "paramiko", "--known-hosts", str(sandbox_known_hosts(fleet["sb"], tmp_path / "known_hosts")),
                         "--report-dir", str(tmp_path / "rep")], check=False, env=env, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 2, out[-4000:]
    assert "ESTABLISH PARAMIKO SSH CONNECTION FOR USER: root" in out, out[-4000:]
    assert "ESTABLISH SSH CONNECTION" not in out, "OpenSSH was used"
    rep = json.loads(sorted((tmp_path / "rep").glob("fw-audit-*.json"))[-1].read_text())
    bad = [(x["host"], x["device"], x["verdict"]) for x in rep["nic_rows"] if x["verdict"] not in ("ok", "ignored")]
    assert bad == [("b300b", "mlx5_3", "mismatch")]
    # a wrong host key for b300b: paramiko refuses it, b300b is reported unreachable (exit 3), b300a still audited
    r = fleet["sb"].run([str(ROOT / "tools" / "fw-audit"), "-i", "inventory/sandbox", "-l", "b300a,b300b", "--json",
                         "-c", "paramiko", "--known-hosts", str(sandbox_known_hosts(fleet["sb"], tmp_path / "bad", swap=True)),
                         "--report-dir", str(tmp_path / "rep2")], check=False, timeout=600)
    assert r.returncode == 3, r.stdout[-3000:] + r.stderr[-3000:]
    rep = json.loads(r.stdout)
    assert rep["hosts"]["b300b"]["status"] == "unreachable" and rep["hosts"]["b300a"]["status"] == "ok", rep["hosts"]
