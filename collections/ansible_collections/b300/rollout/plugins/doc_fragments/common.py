# -*- coding: utf-8 -*-
"""Documentation fragment b300.rollout.common: what every module of the collection shares - its author and the
attributes most of them have (check mode full, no diff mode, posix).

A module lists it after ansible.builtin.action_common_attributes (which defines the attributes) and overrides any
attribute in its own `attributes:` (a check_mode with details, a module without check mode, facts).
"""
from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
author: b300-rollout maintainers (@b300-rollout)
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
"""
