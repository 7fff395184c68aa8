"""Issue 12 item 3: before anything starts, the validate phase proves the TCP paths the profile needs (router host ->
every worker port, decode host -> every prefill bootstrap port) with a short-lived listener on the target host and a
bounded connect from the source host.

Block one path between the two sandbox hosts: decode host b300b -> prefill bootstrap port 8998 on b300a (glm52_pd).
A real nftables `drop` rule for saddr b300b tcp dport 8998 in b300a's network namespace (set from the controller with
nsenter: the container itself may not change its firewall), i.e. what a host firewall that forgot the port does.
Then the deploy is refused in its validate play naming both hosts and the port, and nothing on the hosts changed
(no glm52_pd unit written, the running units untouched). Finally the block is lifted and the same check passes (the
deploy run with --tags always: the validate play and read-only preflight only).
"""
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PLAYBOOK = ROOT / "playbooks" / "sglang_deploy.yml"
B300B_ADDR = "10.89.30.12"
PORT = 8998

pytestmark = pytest.mark.integration

NFT_RULES = ["add table inet b300test",
             "add chain inet b300test input { type filter hook input priority 0 ; policy accept ; }",
             "add rule inet b300test input ip saddr %s tcp dport %d drop" % (B300B_ADDR, PORT)]


def _nft(sandbox, host, *cmds, check=True):
    """nft in HOST's network namespace (the container's), run from the controller."""
    pid = subprocess.run(["podman", "inspect", "-f", "{{.State.Pid}}", sandbox.container(host)], env=sandbox.env,
                         capture_output=True, text=True, check=True).stdout.strip()
    for c in cmds:
        r = subprocess.run(["nsenter", "-t", pid, "-n", "nft"] + c.split(), capture_output=True, text=True)
        if check and r.returncode != 0:
            raise AssertionError("nft %s in %s: %s" % (c, host, r.stderr))


def _state(sandbox):
    """What the deploy would change: unit files (names + checksums) and running sglang units, per host."""
    out = {}
    for host in ("b300a", "b300b"):
        r = sandbox.exec(host, "cd /etc/systemd/system && sha256sum sglang-*.service 2>/dev/null | sort; "
                               "systemctl show -p MainPID --value 'sglang-*' 2>/dev/null | sort", check=False)
        out[host] = r.stdout
    return out


def test_blocked_bootstrap_port_is_refused_before_anything_changes(sandbox):
    method = "nftables drop rule"
    _nft(sandbox, "b300a", "delete table inet b300test", check=False)
    _nft(sandbox, "b300a", *NFT_RULES)
    try:
        before = _state(sandbox)
        r = sandbox.ansible_playbook(PLAYBOOK, "-e", "sglang_profile=glm52_pd", limit="b300a,b300b", check=False,
                                     timeout=600)
        text = r.stdout + r.stderr
        if os.environ.get("REACH_DEBUG_OUT"):
            pathlib.Path(os.environ["REACH_DEBUG_OUT"]).write_text(text)
        assert r.returncode != 0, "deploy passed although b300b -> b300a tcp/%d is blocked (%s)" % (PORT, method)
        assert "b300b -> b300a" in text and "tcp port %d" % PORT in text, text[-5000:]
        assert "ip saddr %s tcp dport %d accept" % (B300B_ADDR, PORT) in text, text[-5000:]
        assert "SGLang | workers" not in text, "the workers play ran after a refused validate:\n" + text[-3000:]
        assert _state(sandbox) == before, "hosts changed although the validate play refused"
        print("refused (%s): %s" % (method, [ln for ln in text.splitlines() if "tcp port %d" % PORT in ln][:1]))
    finally:
        _nft(sandbox, "b300a", "delete table inet b300test", check=False)
    # unblocked: the same paths pass (validate entry point only: read-only apart from the listener)
    ok = sandbox.ansible_playbook(PLAYBOOK, "-e", "sglang_profile=glm52_pd", "--tags", "always", "--skip-tags",
                                  "install,units,deploy", limit="b300a,b300b", check=False, timeout=600)
    text = ok.stdout + ok.stderr
    assert "tcp port %d" % PORT not in text, text[-4000:]
    assert "Reach | every path the profile needs is open" in text, text[-4000:]
