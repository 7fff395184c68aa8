#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: plan SGLang instances and the router (thin wrapper around module_utils/sglang/sglang_plan.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_plan
short_description: Derive SGLang worker instances and the router command line from a profile, and validate them
description:
  - "Pure computation, meant to run once on the controller (C(delegate_to: localhost), C(run_once: true))."
  - Takes the profile data (roles/sglang/files/profiles/*.yml), inventory overrides, the hosts with their groups,
    addresses and optional C(gpu_topology)/C(rdma_nics) facts, and the option catalogs of the pinned SGLang and
    sglang-router versions.
  - Returns one entry per instance (host, role, GPUs, ports, RDMA devices, argv, env, unit and env file names), the
    router argv and every validation error. Fails when there is any error, unless O(fail_on_errors=false).
version_added: "1.0.0"
extends_documentation_fragment: [ansible.builtin.action_common_attributes, b300.rollout.common]
options:
  profile:
    description: Profile data (the YAML file as a dict, C(name) must be set).
    type: dict
    required: true
  profile_overrides:
    description: Deep-merged onto O(profile) (dicts merge, other values replace; C(false)/C(null) drops a flag).
    type: dict
    default: {}
  hosts:
    description:
      - One dict per host with C(name), C(address), C(groups) and optionally C(gpu_topology), C(rdma_nics)
        (CONTRACTS.md schemas) and C(instance_overrides) (per instance name, e.g. C(P0)).
    type: list
    elements: dict
    required: true
  settings:
    description:
      - C(sglang_version), C(sglang_versions) (version per profile name; the plan picks C(sglang_version), else this
        profile's entry, else the profile's pin), C(router_version), C(model_root), C(executable), C(router_python), C(bind_host),
        C(router_bind_host), C(prometheus_host), C(known_combinations), C(api_key_enabled), C(timeouts),
        C(unit_prefix), C(env_dir), C(extra_args), C(extra_env), C(router_flag_sets) (the shared router flag sets,
        roles/sglang/files/router_flag_sets.yml), C(router_flag_set) (the set to use, merged with the profile's own
        C(router_flag_sets) entry), C(router_extra_args).
    type: dict
    default: {}
  server_options_dir:
    description: Directory with C(server-options-<version>.json) catalogs (dumped from the real SGLang parsers).
    type: path
    required: true
  router_options_dir:
    description: Directory with C(router-options-<version>.json) catalogs.
    type: path
    required: true
  fail_on_errors:
    description: Fail the task when the plan has validation errors (the messages are in RV(errors) and in C(msg)).
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Plan SGLang instances
  sglang_plan:
    profile: "{{ sglang_profile_data }}"
    profile_overrides: "{{ sglang_profile_overrides }}"
    hosts: "{{ sglang_plan_hosts }}"
    settings:
      sglang_version: "0.5.17"
      router_version: "0.3.2"
      model_root: /models
    server_options_dir: "{{ role_path }}/files/options"
    router_options_dir: "{{ role_path }}/files/options"
  delegate_to: localhost
  run_once: true
  register: sglang_plan
"""

RETURN = r"""
instances:
  description: Planned worker instances.
  returned: always
  type: list
  elements: dict
  sample:
    - {name: P0, id: b300a/P0, host: b300a, role: prefill, gpus: [0, 1, 2, 3], cuda_visible_devices: "0,1,2,3",
       port: 30001, nccl_port: 31701, bootstrap_port: 8998, ib_devices: [mlx5_0, mlx5_1, mlx5_2, mlx5_3],
       argv: ["/opt/sglang/0.5.17/bin/sglang", "serve", "--model-path", "..."], env: {NCCL_NVLS_ENABLE: "0"},
       unit_name: sglang-glm52_pd-p0.service, env_file: /etc/sglang/glm52_pd-p0.env, url: "http://10.0.0.1:30001"}
router:
  description: Router host, ports, argv and the worker list it is started with.
  returned: always
  type: dict
errors:
  description: Validation errors (each names host, instance, flag/port/GPU and the expected value).
  returned: always
  type: list
  elements: str
warnings_list:
  description: Non-fatal findings.
  returned: always
  type: list
  elements: str
exec_start:
  description: Rendered systemd ExecStart= argument strings, by instance id and C(router).
  returned: always
  type: dict
"""

import glob
import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.b300.rollout.plugins.module_utils.sglang.sglang_plan import build_plan, exec_start_line, merge_overrides


def _load_catalogs(directory, prefix, key=None):
    out = {}
    for path in sorted(glob.glob(os.path.join(directory, prefix + "*.json"))):
        version = os.path.basename(path)[len(prefix):-len(".json")]
        with open(path) as fh:
            data = json.load(fh)
        out[version] = data[key] if key else data
    return out


def main():
    module = AnsibleModule(
        argument_spec=dict(
            profile=dict(type="dict", required=True),
            profile_overrides=dict(type="dict", default={}),
            hosts=dict(type="list", elements="dict", required=True),
            settings=dict(type="dict", default={}),
            server_options_dir=dict(type="path", required=True),
            router_options_dir=dict(type="path", required=True),
            fail_on_errors=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    p = module.params
    for d in (p["server_options_dir"], p["router_options_dir"]):
        if not os.path.isdir(d):
            module.fail_json(msg="sglang_plan: option catalog directory %s does not exist (expected the role's files/options)" % d)
    catalogs = {"server": _load_catalogs(p["server_options_dir"], "server-options-"),
                "router": _load_catalogs(p["router_options_dir"], "router-options-", key="options")}
    profile = merge_overrides(p["profile"], p["profile_overrides"] or {})
    plan = build_plan(profile, p["hosts"], p["settings"] or {}, catalogs)
    exec_start = {i["id"]: exec_start_line(i["argv"]) for i in plan["instances"]}
    if plan.get("router"):
        exec_start["router"] = exec_start_line(plan["router"]["argv"])
    result = dict(changed=False, instances=plan["instances"], router=plan["router"], errors=plan["errors"],
                  warnings_list=plan["warnings"], exec_start=exec_start,
                  **{k: plan.get(k) for k in ("profile", "mode", "version", "router_version", "model_path",
                                              "served_model_name", "needs_mooncake")})
    for warning in plan["warnings"]:
        module.warn(warning)
    if plan["errors"] and p["fail_on_errors"]:
        module.fail_json(msg="SGLang plan for profile %s has %d error(s):\n- %s"
                         % (plan.get("profile"), len(plan["errors"]), "\n- ".join(plan["errors"])), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
