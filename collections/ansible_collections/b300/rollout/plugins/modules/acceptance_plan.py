#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: plan one acceptance run (GSP shape from the target hit, bench_serving argv, workers)."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: acceptance_plan
short_description: Plan a go-live acceptance run of an SGLang profile (shape, client command, workers)
description:
  - Computes the generated-shared-prefix shape (system-prompt and question lengths) that reaches the seed's target
    prefix-cache hit rate under the router's policy, scaled by O(scale), and the C(python -m sglang.bench_serving)
    command line (native C(sglang) backend, local tokenizer, hub off, C(--cache-report), C(--warmup-requests 0), no
    C(--flush-cache) because the client flushes every worker itself, with retries).
  - Pure computation; logic in module_utils/verdicts/acceptance.py. Supports check mode.
version_added: "1.0.0"
extends_documentation_fragment: [ansible.builtin.action_common_attributes, b300.rollout.common]
options:
  plan:
    description: The C(sglang_plan) registered by roles/sglang tasks/plan.yml.
    type: dict
    required: true
  seed:
    description: The seed figures and shape of the profile (roles/acceptance/vars/main.yml).
    type: dict
    required: true
  scale:
    description: Scale of lengths and groups, in (0, 1]; C(1) is the seed shape.
    type: float
    default: 1.0
  client_python:
    description: Python that runs bench_serving.
    type: str
    required: true
  tokenizer:
    description: Local tokenizer directory (a path, not a secret).
    type: str
    required: true
  outdir:
    description: Run directory on the client host.
    type: str
    required: true
  tag:
    description: The C(--tag) of bench_serving.
    type: str
    required: true
  base_url:
    description: Router URL (default the plan's router URL).
    type: str
  extra_args:
    description: Extra bench_serving arguments.
    type: list
    elements: str
    default: []
  sample_s:
    description: Seconds between C(/metrics) samples during the run.
    type: float
    default: 2.0
  client_env:
    description:
      - Extra environment of the client. No secret (a name with KEY, TOKEN, SECRET, PASSWORD, PASSWD or CREDENTIAL
        is refused) since this lands in spec.json; the API key reaches the client on its stdin.
    type: dict
    default: {}
  flush:
    description:
      - "How the client flushes every worker's prefix cache before the run: C(timeout_s) (C(POST
        /flush_cache?timeout=...): the server waits that long for an idle scheduler), C(attempts) (tries before the
        run stops, naming the worker) and C(pause_s) (between tries). Missing keys: 10, 6 and 5."
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Plan the run
  b300.rollout.acceptance_plan:
    plan: "{{ sglang_plan }}"
    seed: "{{ acceptance_seeds[sglang_profile] }}"
    scale: 0.05
    client_python: /opt/sglang/0.5.17/bin/python
    tokenizer: /models/GLM-5.2-NVFP4
    outdir: /var/tmp/acceptance/20261201T000000Z
    tag: glm52_pd
"""

RETURN = r"""
run_plan:
  description: >-
    Shape, argv, env, workers, policy, mode, engine_type and the client spec (acceptance_client.py: outdir, argv,
    env, workers, router_url, total, sample_s, flush); no secret.
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.b300.rollout.plugins.module_utils.verdicts import acceptance


def main():
    module = AnsibleModule(argument_spec={
        "plan": {"type": "dict", "required": True}, "seed": {"type": "dict", "required": True},
        "scale": {"type": "float", "default": 1.0}, "client_python": {"type": "str", "required": True},
        "tokenizer": {"type": "str", "required": True, "no_log": False}, "outdir": {"type": "str", "required": True},
        "tag": {"type": "str", "required": True}, "base_url": {"type": "str"},
        "extra_args": {"type": "list", "elements": "str", "default": []},
        "sample_s": {"type": "float", "default": 2.0},
        "client_env": {"type": "dict", "default": {}},
        "flush": {"type": "dict", "default": {}}}, supports_check_mode=True)
    p = module.params
    try:
        run_plan = acceptance.plan_run(p["plan"], p["seed"], p["scale"], p["client_python"], p["tokenizer"],
                                       p["outdir"], p["tag"], p["base_url"], p["extra_args"], p["sample_s"],
                                       p["client_env"], p["flush"])
    except (ValueError, KeyError, TypeError) as exc:
        module.fail_json(msg="acceptance plan: %s" % exc)
    module.exit_json(changed=False, run_plan=run_plan)


if __name__ == "__main__":
    main()
