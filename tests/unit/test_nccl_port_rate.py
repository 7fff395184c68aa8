"""roles/nccl_validation/tasks/port_rate.yml: a data port below the inventory's expected rate for its NIC model fails,
naming host, device, found and expected rate (run through ansible-playbook on localhost with given facts)."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _dev(name, model, rate, role="data"):
    return {"name": name, "model": model, "pci_address": "0000:%s:00.0" % name[-2:], "role": role,
            "ports": [{"port": 1, "state": "ACTIVE", "rate_gbps": rate}]}


def _run(tmp_path, devices, data_nics, expected=None):
    facts = {"rdma_nics": {"devices": devices, "usable_devices": data_nics}}
    pb = tmp_path / "pb.yml"
    extra = {"facts_in": facts, "nccl_validation_data_nics": data_nics}
    if expected is not None:
        extra["nccl_validation_expected_port_gbps"] = expected
    (tmp_path / "vars.json").write_text(json.dumps(extra))
    (tmp_path / "library").mkdir()
    # a module returning its argument as ansible_facts, as rdma_nic_facts would
    (tmp_path / "library" / "fake_facts.py").write_text(
        "from ansible.module_utils.basic import AnsibleModule\n"
        "m = AnsibleModule(argument_spec={'facts': {'type': 'dict'}})\n"
        "m.exit_json(changed=False, ansible_facts=m.params['facts'])\n")
    pb.write_text("""
- hosts: localhost
  gather_facts: false
  roles: [b300_defaults]   # the shared settings every play loads (docs/CONTRACTS.md "Settings: one home")
  tasks:
    - fake_facts:
        facts: "{{ facts_in }}"
    - ansible.builtin.include_role:
        name: nccl_validation
        tasks_from: port_rate
""")
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_ROLES_PATH=os.path.join(ROOT, "roles"),
               ANSIBLE_FACT_CACHING_CONNECTION=str(tmp_path / "facts"), ANSIBLE_LIBRARY=str(tmp_path / "library"))
    exe = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    r = subprocess.run([exe, "-i", "localhost,", "-c", "local", str(pb), "-e", "@" + str(tmp_path / "vars.json"),
                        "-e", "ansible_python_interpreter=" + sys.executable],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False)
    return r.returncode, " ".join((r.stdout + r.stderr).split())


def test_port_trained_down_fails_naming_host_device_found_and_expected(tmp_path):
    devs = [_dev("mlx5_0%d" % i, "ConnectX-8", 800) for i in range(3)] + [_dev("mlx5_03", "ConnectX-8", 400)]
    rc, out = _run(tmp_path, devs, [d["name"] for d in devs], {"ConnectX-8": 800, "ConnectX-7": 400})
    assert rc != 0
    assert "nccl_validation on localhost: data port(s) below the expected link rate" in out
    assert "mlx5_03 port 1 (ConnectX-8, 0000:03:00.0): 400 Gb/s, expected 800 Gb/s" in out
    assert "mlx5_00 port" not in out


def test_ports_at_the_expected_rate_pass_and_unlisted_models_or_non_data_nics_are_not_checked(tmp_path):
    devs = [_dev("mlx5_0%d" % i, "ConnectX-8", 800) for i in range(4)]
    devs += [_dev("mlx5_09", "ConnectX-7", 25, role="fabric_manager"), _dev("mlx5_10", "ConnectX-9", 100)]
    rc, out = _run(tmp_path, devs, ["mlx5_00", "mlx5_01", "mlx5_02", "mlx5_03", "mlx5_10"],
                   {"ConnectX-8": 800, "ConnectX-7": 400})
    assert rc == 0, out[-1500:]


def test_unknown_rate_fails(tmp_path):
    rc, out = _run(tmp_path, [_dev("mlx5_00", "ConnectX-8", None)], ["mlx5_00"])
    assert rc != 0 and "mlx5_00 port 1 (ConnectX-8, 0000:00:00.0): unknown Gb/s, expected 400 Gb/s" in out


def test_role_default_matches_the_emulated_cx8_rate(tmp_path):
    # the sandbox's CX8 data ports train at 400 Gb/s (sandbox/hwemu/model.py): the default expectation passes there
    rc, out = _run(tmp_path, [_dev("mlx5_00", "ConnectX-8", 400)], ["mlx5_00"])
    assert rc == 0, out[-1500:]
