"""The opt-in strategy b300.rollout.mitogen_linear (plugins/strategy/mitogen_linear.py; ansible.cfg keeps the builtin
linear one): with Mitogen installed the tasks of a run share one Python per host (the modules' parent process is the
same for two tasks; under the builtin linear strategy every task starts its own); without it the run is the builtin
linear strategy and says so."""
import os
import pathlib
import subprocess
import sys

MITOGEN = {"ANSIBLE_STRATEGY": "b300.rollout.mitogen_linear"}

ROOT = pathlib.Path(__file__).resolve().parents[2]
PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: First task's module process
      ansible.builtin.command: sh -c 'echo PPID=$PPID'
      register: one
      changed_when: false
    - name: Second task's module process
      ansible.builtin.command: sh -c 'echo PPID=$PPID'
      register: two
      changed_when: false
    - name: Both
      ansible.builtin.debug:
        msg: "PIDS {{ one.stdout }} {{ two.stdout }}"
"""


def run(tmp_path, **env):
    play = tmp_path / "play.yml"
    play.write_text(PLAY)
    e = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"),
             ANSIBLE_CACHE_PLUGIN="memory", ANSIBLE_NOCOLOR="1", ANSIBLE_LOCALHOST_WARNING="false",
             ANSIBLE_INVENTORY_UNPARSED_WARNING="false", **env)
    r = subprocess.run([str(pathlib.Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                        "-e", "ansible_python_interpreter=%s" % sys.executable, str(play)], cwd=ROOT, env=e,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    pids = r.stdout.split("PIDS ", 1)[1].split('"', 1)[0].split()
    return pids, r.stdout + r.stderr


def test_mitogen_runs_every_task_in_one_interpreter(tmp_path):
    pids, out = run(tmp_path, **MITOGEN)
    assert pids[0] == pids[1], "two tasks ran in two interpreters: Mitogen is not active\n" + out[-2000:]
    assert "Mitogen is not installed" not in out
    builtin, _ = run(tmp_path, ANSIBLE_STRATEGY="ansible.builtin.linear")   # the control: one interpreter per task
    assert builtin[0] != builtin[1], builtin


def test_without_mitogen_the_builtin_linear_strategy_runs_and_says_so(tmp_path):
    block = tmp_path / "block" / "ansible_mitogen"              # an ansible_mitogen that cannot be imported
    block.mkdir(parents=True)
    (block / "__init__.py").write_text("raise ImportError('blocked by the test')\n")
    pids, out = run(tmp_path, PYTHONPATH=str(tmp_path / "block"), **MITOGEN)
    assert "Mitogen is not installed here (blocked by the test): running the builtin linear strategy" in " ".join(
        out.split()), out[-2000:]
    assert pids[0] != pids[1], pids
