#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Benchmark floor: the cheapest custom module there is (one Python run on the host, no work)."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: bench_noop
short_description: Do nothing on the host (benchmark floor for tools/bench_audit.sh)
description:
  - Returns C(changed=false) and the host's load average. Used only to measure Ansible's own per-host cost.
version_added: "1.0.0"
author: b300-rollout
options: {}
"""

EXAMPLES = r"""
- name: Floor
  bench_noop:
"""

RETURN = r"""
loadavg:
  description: os.getloadavg() on the host.
  returned: always
  type: list
  elements: float
"""

import os

from ansible.module_utils.basic import AnsibleModule


def main():
    module = AnsibleModule(argument_spec={}, supports_check_mode=True)
    module.exit_json(changed=False, loadavg=list(os.getloadavg()))


if __name__ == "__main__":
    main()
