# -*- coding: utf-8 -*-
"""Filter host_lock_run_gone: whether the run holding a host's lock is provably gone (module_utils/common/host_lock.py
run_gone), evaluated on the controller where that run's process would be. Used by roles/host_lock/tasks/main.yml.
Documentation: host_lock_run_gone.yml next to this file."""

from __future__ import annotations

from ansible_collections.b300.rollout.plugins.module_utils.common.host_lock import run_gone


def host_lock_run_gone(record):
    """The lock record a host returned -> True when that run started on this controller and its process is gone."""
    return run_gone(record or {})


class FilterModule:
    """The host run lock's controller-side check."""

    def filters(self):
        return {"host_lock_run_gone": host_lock_run_gone}
