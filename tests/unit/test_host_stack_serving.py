"""Issue 36 item 4: a serving host that owes a host-stack reboot goes the firmware update's out-of-service path.

The decision (may this host leave service) is the firmware update's own rule, module_utils/firmware/fw_update.py
service_mode (tested in test_fw_update.py), reached from playbooks/host_stack.yml through the filter
out_of_service_mode: here with the planner's real instances for the sandbox's two hosts (kimi_k3: one TP8 worker per
host, router on b300a; glm52_pd: prefill on one host, decode on the other), and the refusal text the playbook puts
in front of it. The wiring (one host at a time, the sglang entry points in their order around the whole stage) is
read from the playbook and the role, as Ansible will run them. The behaviour itself, with traffic through the router
during the reboot: tests/integration/test_host_stack_fleet.py.
"""
import pathlib

import yaml

from ansible_collections.b300.rollout.plugins.filter.out_of_service import out_of_service_mode

ROOT = pathlib.Path(__file__).resolve().parents[2]
KIMI = [{"host": "b300a", "role": "worker", "id": "w0@b300a", "url": "http://10.89.30.11:30000"},
        {"host": "b300b", "role": "worker", "id": "w0@b300b", "url": "http://10.89.30.12:30000"}]
PD = [{"host": "b300a", "role": "prefill", "id": "P0", "url": "http://10.89.30.11:30000"},
      {"host": "b300b", "role": "decode", "id": "D0", "url": "http://10.89.30.12:30001"}]


def test_kimi_worker_host_leaves_the_router_the_other_keeps_serving():
    r = out_of_service_mode(KIMI, "b300b", ["b300a"], False)
    assert r == {"mode": "rolling", "allowed": True, "instances": ["w0@b300b"],
                 "reason": "b300b leaves the router (drained first); the other hosts keep serving"}


def test_router_host_and_pd_refused_without_the_maintenance_flag_which_the_reason_names():
    r = out_of_service_mode(KIMI, "b300a", ["b300a"], False)
    assert (r["mode"], r["allowed"]) == ("outage", False)
    assert "b300a runs the router" in r["reason"] and "-e nic_firmware_update_maintenance=true" in r["reason"]
    r = out_of_service_mode(PD, "b300b", ["b300a"], False)
    assert (r["mode"], r["allowed"], r["instances"]) == ("outage", False, ["D0"])
    assert "prefill/decode disaggregated: losing b300b stops every request" in r["reason"]
    assert "Refused: pass -e nic_firmware_update_maintenance=true in a maintenance window" in r["reason"]
    r = out_of_service_mode(PD, "b300b", ["b300a"], True)
    assert r["allowed"] and r["reason"].endswith("allowed by nic_firmware_update_maintenance=true")


def test_a_host_with_nothing_planned_serves_nothing():
    assert out_of_service_mode([], "b300b", None, False)["mode"] == "none"
    assert out_of_service_mode(None, "b300b", ["b300a"], False)["allowed"] is True


def _tasks(path):
    return yaml.safe_load((ROOT / path).read_text())


def test_playbook_takes_serving_hosts_one_at_a_time_after_the_guard():
    plays = _tasks("playbooks/host_stack.yml")
    first, guard, serving = plays[0], plays[1], plays[2]
    guard_tasks = _tasks("roles/host_stack/tasks/serving_guard.yml")
    role = next(t for t in first["tasks"] if t.get("ansible.builtin.import_role", {}).get("name") == "host_stack")
    assert role["vars"] == {"host_stack_serving": "defer"}
    group = next(t for t in first["tasks"] if "ansible.builtin.group_by" in t)
    assert group["ansible.builtin.group_by"]["key"] == serving["hosts"] == "host_stack_serving_reboot"
    # the guard play plans SGLang and refuses before play 3 touches anything; any failure there stops every host
    assert guard["any_errors_fatal"] is True
    assert guard["tasks"][-1]["ansible.builtin.include_role"] == {"name": "host_stack", "tasks_from": "serving_guard"}
    names = [t["name"] for t in guard_tasks]
    pd_first = names.index("Serving guard | a prefill/decode profile stops the whole fleet while one host reboots "
                           "(refused first)")
    plan = names.index("Serving guard | the SGLang plan (which instances each host serves, the router)")
    decide = names.index("Serving guard | how this host would leave service")
    refuse = names.index("Serving guard | may this serving host leave service (refused before anything is installed on it)")
    assert pd_first < plan < decide < refuse
    assert "nic_firmware_update_maintenance" in guard_tasks[pd_first]["ansible.builtin.assert"]["that"]
    assert "b300.rollout.out_of_service_mode" in guard_tasks[decide]["ansible.builtin.set_fact"]["host_stack_service"]
    assert "nic_firmware_update_maintenance" in guard_tasks[decide]["vars"]["_window"]
    assert guard_tasks[refuse]["ansible.builtin.assert"]["that"] == "host_stack_service.allowed"
    assert (serving["serial"], serving["max_fail_percentage"]) == (1, 0)
    assert serving["tasks"][-1]["ansible.builtin.include_role"] == {"name": "host_stack", "tasks_from": "serving"}


def test_serving_entry_point_calls_the_sglang_entry_points_around_the_whole_stage_in_order():
    tasks = _tasks("roles/host_stack/tasks/serving.yml")
    block = next(t for t in tasks if "block" in t)
    steps = []
    for t in block["block"]:
        inc = t.get("ansible.builtin.include_role")
        if inc:
            steps.append("sglang:" + inc["tasks_from"])
        elif "ansible.builtin.include_tasks" in t:
            steps.append(t["ansible.builtin.include_tasks"])
        elif "ansible.builtin.systemd_service" in t:
            steps.append("units:" + t["ansible.builtin.systemd_service"]["state"])
    assert steps == ["sglang:take_out", "sglang:drain", "units:stopped", "preflight.yml", "install.yml", "proof.yml",
                     "sglang:restart", "sglang:start_and_wait", "sglang:put_back"]
    # the units stopped are the units started again, through sglang's one restart block (the router's unit included)
    start = next(t for t in block["block"] if t.get("ansible.builtin.include_role", {}).get("tasks_from") == "restart")
    assert start["vars"] == {"_sglang_restart_state": "started", "_sglang_restart_insts": "{{ _host_stack_restart }}"}
    assert block["when"] == "not ansible_check_mode"
    # a failure out of service says so (never silently left out of the router)
    assert "stays OUT of service" in block["rescue"][0]["ansible.builtin.fail"]["msg"]
