#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: check the sglang role's inputs against the value rules (thin wrapper around module_utils/common/input_rules.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_input_check
short_description: Check every sglang role input that reaches a host against what it must survive
description:
  - "Pure computation, meant to run on the controller (C(delegate_to: localhost)) once per host, before anything
    on a host changes."
  - "Rules (module_utils/common/input_rules.py), never lists of bad strings: the API key as a Bearer token (RFC 6750/7235
    token68, a length range, no whitespace or control characters), paths written into unit files unquoted or passed
    as one quoted argument, names (units, users, groups, environment variables, packages), addresses, ports, whole
    numbers and booleans given as strings, empty required values, the flag values and env values of the profile,
    the overrides and the extra args/env."
  - Each problem names the host, the variable, what was found, the rule and the fix. A secret's value is never in a
    message (only its length and the position and class of an offending character).
version_added: "1.0.0"
extends_documentation_fragment: [ansible.builtin.action_common_attributes, b300.rollout.common]
options:
  host:
    description: Inventory name of the host whose values these are (prefix of every message).
    type: str
    required: true
  values:
    description: The role's variables, name -> value (every variable of the role defaults, secrets left out).
    type: dict
    default: {}
  secrets:
    description:
      - Secret values, name -> value; checked like the others, never shown. C(sglang_api_key) by its rule; any other
        name (e.g. the key a running router holds, read from its env file) as a key that may be empty and must only
        be sendable as a Bearer token (any length).
    type: dict
    default: {}
  host_values:
    description: Per-host variables checked only when set, e.g. C(sglang_advertise_address).
    type: dict
    default: {}
  profile:
    description: The profile data (roles/sglang/files/profiles/<profile>.yml as a dict); its args, env and ports are checked.
    type: dict
    default: {}
  fail_on_problems:
    description: Fail the task when a rule is broken (the messages are in RV(problems) and in C(msg)).
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Check the inputs (controller)
  b300.rollout.sglang_input_check:
    host: "{{ inventory_hostname }}"
    values:
      sglang_model_root: /models
      sglang_health_timeout_s: "3600"
    secrets:
      sglang_api_key: "{{ sglang_api_key }}"
  delegate_to: localhost
"""

RETURN = r"""
problems:
  description: One line per broken rule, "HOST - VARIABLE - what was found; rule - ...; fix - ..." (with colons).
  returned: always
  type: list
  elements: str
checked:
  description: Names of the variables that were checked (secrets included, their values never returned).
  returned: success
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.b300.rollout.plugins.module_utils.common.input_rules import (
    ROLE_RULES, check_host_inputs, check_profile_data, check_role_inputs, check_secret)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            host=dict(type="str", required=True),
            values=dict(type="dict", default={}),
            secrets=dict(type="dict", default={}, no_log=True),
            host_values=dict(type="dict", default={}),
            profile=dict(type="dict", default={}),
            fail_on_problems=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    p = module.params
    host = p["host"]
    values = dict(p["values"] or {})
    other_secrets = {k: v for k, v in (p["secrets"] or {}).items() if k not in ROLE_RULES}
    values.update({k: v for k, v in (p["secrets"] or {}).items() if k in ROLE_RULES})
    problems = check_role_inputs(values, host)
    for name, value in sorted(other_secrets.items()):
        problems += check_secret(name, value, host, min_len=1, max_len=8192)
    host_values = dict(p["host_values"] or {})
    host_values.setdefault("sglang_instance_overrides", values.get("sglang_instance_overrides"))
    problems += check_host_inputs(host, host_values)
    if p["profile"]:
        problems += check_profile_data(p["profile"], "profile %s" % p["profile"].get("name", "?"), host)
    checked = sorted(k for k in values if k in ROLE_RULES) + sorted(other_secrets) + sorted(host_values)
    if problems and p["fail_on_problems"]:
        module.fail_json(msg="%d input value(s) would not survive the way to the host; nothing was changed:\n- %s"
                         % (len(problems), "\n- ".join(problems)), problems=problems)
    module.exit_json(changed=False, problems=problems, checked=checked)


if __name__ == "__main__":
    main()
