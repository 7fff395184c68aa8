"""inventory/production as shipped: every operator value is a placeholder that preflight refuses by name; host key
checking is on for production and off only in the sandbox inventory."""
import configparser
import os
import subprocess
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLAYBOOK = """
- hosts: b300a
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: sglang
        tasks_from: plan
"""


def _validate(tmp_path, *extra):
    pb = os.path.join(ROOT, "playbooks", "_test_prod_placeholders_%d.yml" % os.getpid())
    with open(pb, "w") as fh:
        fh.write(PLAYBOOK)
    try:
        env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
                   ANSIBLE_FACT_CACHING_CONNECTION=str(tmp_path / "facts"))
        exe = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
        return subprocess.run([exe, "-i", os.path.join(ROOT, "inventory", "production"), pb,
                               "-e", "ansible_connection=local", *extra], capture_output=True, text=True, env=env,
                              cwd=ROOT, timeout=300, check=False)
    finally:
        os.unlink(pb)


def test_shipped_placeholders_are_refused_by_name(tmp_path):
    r = _validate(tmp_path)
    out = " ".join((r.stdout + r.stderr).split())
    assert r.returncode != 0
    assert ("b300a: ansible_user, sglang_model_root, sglang_api_key, sglang_advertise_address are still CHANGE_ME"
            in out), out[-2000:]


def test_set_values_pass_the_placeholder_check(tmp_path):
    r = _validate(tmp_path, "-e", "ansible_user=ops sglang_model_root=/models sglang_advertise_address=10.0.0.11",
                  "-e", "vault_sglang_api_key=s3cret")
    out = r.stdout + r.stderr
    assert "Validate | no placeholder left" in out
    assert "still CHANGE_ME" not in out
    assert "s3cret" not in out


def test_vault_example_and_production_vars_documented():
    with open(os.path.join(ROOT, "inventory", "production", "group_vars", "all.yml")) as fh:
        text = fh.read()
    data = yaml.safe_load(text)
    assert data["sglang_api_key"] == "{{ vault_sglang_api_key | default('CHANGE_ME') }}"
    assert "ansible-vault encrypt" in text
    with open(os.path.join(ROOT, "inventory", "production", "group_vars", "vault.yml.example")) as fh:
        assert "vault_sglang_api_key" in yaml.safe_load(fh)


def test_host_key_checking_on_for_production_off_for_the_sandbox():
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "ansible.cfg"))
    assert cfg.getboolean("defaults", "host_key_checking") is True
    with open(os.path.join(ROOT, "inventory", "sandbox", "group_vars", "all.yml")) as fh:
        sandbox = yaml.safe_load(fh)
    assert sandbox["ansible_host_key_checking"] is False
    assert "StrictHostKeyChecking=no" in sandbox["ansible_ssh_common_args"]
