# -*- coding: utf-8 -*-
"""Lookup b300.rollout.run_identity: who this ansible-playbook run is, for the host run lock (roles/host_lock)."""
from __future__ import annotations

DOCUMENTATION = r"""
name: run_identity
author: b300-rollout maintainers (@b300-rollout)
short_description: The identity of this Ansible run on its controller (for the host run lock)
description:
  - >-
    Returns one mapping naming the running ansible-playbook process, the same for every task of the run -
    C(id) (C(<controller>-<pid>-<start>)), C(user) (C(SUDO_USER) or the login name), C(controller) (host name),
    C(pid) (the ansible-playbook process) and C(start) (its start time in clock ticks since boot, from
    C(/proc/PID/stat); with the PID it names one process, so a later run with a reused PID is another run).
  - The main process is found by walking up from the process that evaluates the lookup (Ansible's task workers are
    forks of it and carry its command line).
  - Used by roles/host_lock with the module b300.rollout.host_lock; the filter b300.rollout.host_lock_run_gone tells a
    finished run from a running one with the same fields.
options: {}
"""

EXAMPLES = r"""
- name: Who this run is
  ansible.builtin.debug:
    msg: "{{ query('b300.rollout.run_identity') | first }}"
"""

RETURN = r"""
_raw:
  description: One mapping with id, user, controller, pid, start.
  type: list
  elements: dict
"""

import getpass
import os
import socket

from ansible.plugins.lookup import LookupBase
from ansible_collections.b300.rollout.plugins.module_utils.common.host_lock import proc_start


def _cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read()
    except OSError:
        return None


def main_pid(pid=None):
    """The ansible-playbook process: the highest ancestor with the same command line as PID (workers are forks)."""
    pid = pid or os.getpid()
    mine = _cmdline(pid)
    while True:
        try:
            with open("/proc/%d/stat" % pid) as f:
                data = f.read()
            ppid = int(data[data.rfind(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            return pid
        if ppid <= 1 or mine is None or _cmdline(ppid) != mine:
            return pid
        pid = ppid


def identity():
    pid = main_pid()
    start = proc_start(pid) or "0"
    controller = socket.gethostname()
    user = os.environ.get("SUDO_USER") or getpass.getuser()
    return {"id": "%s-%d-%s" % (controller, pid, start), "user": user, "controller": controller, "pid": pid,
            "start": str(start)}


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        return [identity()]
