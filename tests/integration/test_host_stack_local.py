"""Issue 36 without the fleet: playbooks/host_stack.yml on the controller (connection local, --check, no become).

This controller has none of the declared stack's packages in its apt lists, which is exactly the "not offered by the
declared source" trap on a real host without the mirror: the stage prints its plan, then refuses before touching
anything, naming the host, the package and the fix. With host_stack_enabled false (the sandbox inventory's value) the
stage ends each host in one task. ~10 s, no fleet.
"""
import os
import pathlib
import subprocess
import sys

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
VENV_BIN = ROOT / ".venv" / "bin"

pytestmark = [pytest.mark.integration, pytest.mark.controller]


def play(tmp_path, enabled, *extra):
    inv = tmp_path / ("inv-%s.yml" % enabled)
    inv.write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {"hosts": {"b300a": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable, "ansible_become": False,
        "host_stack_enabled": enabled}}}}}}))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_CACHE_PLUGIN="memory", NO_COLOR="1",
               ANSIBLE_FORCE_COLOR="0", PATH="%s:%s" % (VENV_BIN, os.environ.get("PATH", "")))
    return subprocess.run([str(VENV_BIN / "ansible-playbook"), "-i", str(inv), "playbooks/host_stack.yml", "--check"]
                          + list(extra), cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=180)


def test_plan_printed_then_refused_before_any_change(tmp_path):
    p = play(tmp_path, True)
    out = p.stdout + p.stderr
    assert p.returncode != 0, out[-2000:]
    assert "install (in order): nothing" in out and "reboot: no" in out
    assert "host_stack on b300a: refusing to change the host stack (b300-noble-580.173)" in out
    assert "apt knows no package nvidia-driver-580-server-open" in out and "fix: add that apt source" in out
    # refused in preflight: no install task ran
    assert "Install | the declared packages in order" not in out


def test_stage_off_ends_the_host_in_one_task(tmp_path):
    p = play(tmp_path, False)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-2000:]
    assert "host_stack :" not in out and "b300a" in out
