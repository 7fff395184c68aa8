"""The rolling pass's opt-in quality gate (roles/sglang/tasks/quality_gate.yml, issue 37) run by ansible-playbook
on the controller against one sglang stub on loopback (no fleet, about 20 s): an unchanged worker passes, a worker
whose table_qa answers got worse stops the pass with a message that names the instance and the type."""
import json
import os
import subprocess
import sys

import pytest

# the unit lane's stub runner
from test_sglang_stub import Stub

pytestmark = [pytest.mark.integration, pytest.mark.controller]
ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
QUESTIONS = ROOT / "tools" / "golive" / "questions.json"

PLAY = """
- name: the rolling gate of one instance (the vars rolling_pass.yml and the plan give it)
  hosts: localhost
  connection: local
  gather_facts: false
  vars:
    sglang_profile: kimi_k3
    sglang_api_key: ""
    sglang_rolling_quality_baseline: %(baseline)s
    sglang_plan: {router: {url: "http://127.0.0.1:9"}}
    inst: {id: b300a-w0, host: b300a, role: worker, url: "%(url)s"}
  tasks:
    - name: gate
      ansible.builtin.include_role:
        name: sglang
        tasks_from: quality_gate
"""


def play(tmp_path, url, baseline):
    pb = tmp_path / "gate.yml"
    pb.write_text(PLAY % {"baseline": baseline, "url": url})
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), NO_COLOR="1", ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_LOCALHOST_WARNING="0", ANSIBLE_INVENTORY_UNPARSED_WARNING="0")
    # ansible_playbook_python is this interpreter: the one with rouge-score (requirements.txt)
    r = subprocess.run([sys.executable, "-m", "ansible.cli.playbook", str(pb)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    return r.returncode, " ".join((r.stdout + r.stderr).split())


def test_the_rolling_gate_passes_an_unchanged_worker_and_stops_on_a_worse_one(tmp_path):
    s = Stub(tmp_path, env={"SGLANG_STUB_ANSWER_BOOK": str(QUESTIONS)})
    try:
        base = tmp_path / "gate" / "baseline.json"
        r = subprocess.run([sys.executable, str(ROOT / "tools" / "quality-gate"), "record", "--url", s.url,
                            "--out", str(base)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        rc, out = play(tmp_path, s.url, base)
        assert rc == 0, out[-3000:]
        assert "quality gate verdict | b300a-w0" in out and "failed=0" in out
        s.control("degrade", "table_qa:0.05")
        rc, out = play(tmp_path, s.url, base)
    finally:
        s.stop()
    assert rc != 0, out[-3000:]
    assert "quality gate after the restart of b300a-w0 (host b300a): quality gate FAILED for table_qa." in out, \
        out[-3000:]
    assert "The pass stops here: b300a-w0 serves the change, the others do not." in out
    reports = sorted((tmp_path / "gate").glob("rolling-b300a-w0-*/quality-gate.json"))
    assert reports and json.loads(reports[-1].read_text())["verdict"]["failed_types"] == ["table_qa"]
