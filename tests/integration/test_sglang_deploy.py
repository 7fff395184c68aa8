"""SGLang deployment on the sandbox hosts b300a/b300b: the SGLang TEST DOUBLE (sandbox/sglang_stub) as workers under
our systemd units, the REAL sglang-router 0.3.2 in front of them.

Needs the `sandbox` fixture (tests/integration/conftest.py, by the sandbox helper): a running 2-host fleet reachable
through inventory/sandbox. Sandbox-only settings: inventory/sandbox/group_vars/all.yml.
Checks: the router serves a chat completion through the stubs; units active, enabled, running as `sglang`; a second
run changes nothing and restarts nothing (MainPID and ActiveEnterTimestamp unchanged); rendered units pass
`systemd-analyze verify` on the host (any stderr is a failure).
"""
import json
import os
import pathlib
import re
import subprocess

import pytest

from conftest import failed_tasks

ROOT = pathlib.Path(__file__).resolve().parents[2]
VENV_BIN = ROOT / ".venv" / "bin"
INVENTORY = ROOT / "inventory" / "sandbox"
# the main command of the users: site.yml (preflight gates -> NCCL validation -> deploy -> summary)
PLAYBOOK = os.environ.get("SGLANG_DEPLOY_PLAYBOOK", "site.yml")

pytestmark = pytest.mark.integration


def _env():
    env = dict(os.environ)
    env.update(ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1",
               CONTAINERS_CONF=str(ROOT / "sandbox" / "containers.conf"))
    env["PATH"] = str(VENV_BIN) + os.pathsep + env.get("PATH", "")
    return env


def deploy(profile, *extra, playbook=PLAYBOOK):
    cmd = [str(VENV_BIN / "ansible-playbook"), "-i", str(INVENTORY), playbook, "-l", "b300a,b300b",
           "-e", "sglang_profile=%s" % profile, *extra]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=1500, check=False)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:] + failed_tasks(proc.stdout)
    return proc.stdout


def recap(output):
    """{host: {ok, changed, failed, ...}} from the PLAY RECAP."""
    out = {}
    for m in re.finditer(r"^(\S+)\s+:\s+(.*)$", output.split("PLAY RECAP")[-1], re.M):
        out[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
    return out


def on_host(host, command):
    proc = subprocess.run([str(VENV_BIN / "ansible"), "-i", str(INVENTORY), host, "-o", "-m", "ansible.builtin.shell",
                           "-a", command], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # one-line output: "host | CHANGED | rc=0 | (stdout) ..."; \n are escaped as literal "\n"
    text = proc.stdout.split("(stdout)", 1)[-1].strip()
    return text.replace("\\n", "\n")


def unit_props(host, unit):
    out = on_host(host, "systemctl show -p MainPID,ActiveEnterTimestamp,ActiveState,UnitFileState,User %s" % unit)
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


PROFILES = {
    "kimi_k3": {"units": {"b300a": ["sglang-kimi_k3-w0.service"], "b300b": ["sglang-kimi_k3-w0.service"]},
                "router_port": 30080, "workers": 2, "ports": {"b300a": [30000, 30080], "b300b": [30000]}},
    "glm52_pd": {"units": {"b300a": ["sglang-glm52_pd-p0.service", "sglang-glm52_pd-p1.service"],
                           "b300b": ["sglang-glm52_pd-d0.service", "sglang-glm52_pd-d1.service"]},
                 "router_port": 30000, "workers": 4,
                 "ports": {"b300a": [30001, 30002, 30000], "b300b": [33002, 33003]}},
}


@pytest.mark.parametrize("profile", ["kimi_k3", "glm52_pd"])
def test_deploy_serves_and_is_idempotent(sandbox, profile):  # `sandbox` is unused by name: requesting it brings the fleet up
    spec = PROFILES[profile]
    first = deploy(profile)
    # the smoke line shows the text: content, or "(reasoning) <think text>" from a model still thinking
    assert re.search(r" via http://\S+ answered (\(reasoning\) )?\S", first), "no smoke answer with text printed"
    units = spec["units"]
    before = {(h, u): unit_props(h, u) for h, us in units.items() for u in us + (["sglang-router.service"] if h == "b300a" else [])}
    for (host, unit), props in before.items():
        assert props["ActiveState"] == "active", (host, unit, props)
        assert props["UnitFileState"] == "enabled", (host, unit, props)
        assert props["User"] == "sglang", (host, unit, props)
        owner = on_host(host, "ps -o user= -p %s" % props["MainPID"]).strip()
        assert owner == "sglang", (host, unit, owner)
    # ports listening
    for host, ports in spec["ports"].items():
        listening = on_host(host, "ss -ltnH")
        for port in ports:
            assert re.search(r":%d\s" % port, listening), (host, port, listening)
    # the real router lists the planned workers, healthy, and answers a chat completion
    workers = json.loads(on_host("b300a", "python3 -c \"import urllib.request;print(urllib.request.urlopen("
                                             "'http://127.0.0.1:%d/workers').read().decode())\"" % spec["router_port"]))
    assert workers["total"] == spec["workers"]
    assert all(w["is_healthy"] for w in workers["workers"])
    if profile == "glm52_pd":
        assert sorted(w["worker_type"] for w in workers["workers"]) == ["decode", "decode", "prefill", "prefill"]
        assert sorted(w.get("bootstrap_port") for w in workers["workers"] if w["worker_type"] == "prefill") == [8998, 8999]
    front_before = unit_props("b300a", "sglang-router-front.service")
    # second run: nothing changes, nothing restarts; NCCL validation stands aside on a serving fleet
    second = deploy(profile)
    if PLAYBOOK == "site.yml":
        assert "NCCL validation skipped: SGLang is serving on b300a, b300b" in second, second[-4000:]
    for host, counts in recap(second).items():
        assert counts["changed"] == 0, (host, counts, second[-4000:])
    after = {k: unit_props(*k) for k in before}
    # the router's front (HAProxy, its own user) is not restarted or reloaded either by a run with nothing to change
    front = unit_props("b300a", "sglang-router-front.service")
    assert front["ActiveState"] == "active" and front["User"] == "haproxy", front
    assert (front["MainPID"], front["ActiveEnterTimestamp"]) == (front_before["MainPID"],
                                                                 front_before["ActiveEnterTimestamp"]), front
    for key in before:
        assert (after[key]["MainPID"], after[key]["ActiveEnterTimestamp"]) == (
            before[key]["MainPID"], before[key]["ActiveEnterTimestamp"]), key
    # rendered units verify cleanly on the host (stderr is a failure)
    for host, us in units.items():
        for unit in us:
            res = on_host(host, "systemd-analyze verify /etc/systemd/system/%s 2>&1; echo rc=$?" % unit)
            assert res.strip() == "rc=0", (host, unit, res)
