# -*- coding: utf-8 -*-
"""Documentation fragment b300.rollout.hw: the two options of every module of the action group `hw` (meta/runtime.yml).

The roles and playbooks give both through `module_defaults: {group/b300.rollout.hw: "{{ hw_module_defaults }}"}`
(roles/b300_defaults). The modules' argument spec for them is module_utils/hw/tools.py hw_argument_spec();
tests/unit/test_module_docs.py keeps the group, this fragment and that spec to the same modules.
"""
from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  bin_path:
    description:
      - Directories searched for the hardware tools this module runs (its description names them) before C(PATH), the
        C(hw_bin_path) inventory variable, given by the action group C(b300.rollout.hw). Empty - C(PATH) only.
    type: list
    elements: path
    default: []
  sysfs_root:
    description:
      - Root of the sysfs tree read for devices and counters (the C(hw_sysfs_root) inventory variable, given by the
        action group C(b300.rollout.hw)); the sandbox points it at its emulated tree.
    type: path
    default: /sys
"""
