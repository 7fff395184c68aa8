#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: the host run lock (take, renew, take over, release, read)."""
from __future__ import absolute_import, division, print_function
__metaclass__ = type

DOCUMENTATION = r"""
---
module: host_lock
short_description: One run at a time changes a host - a kernel-released lock that names its holder
version_added: "1.4.0"
description:
  - Takes, renews, takes over, releases or reads the host run lock that every stage changing a host holds for its
    life (roles/host_lock wraps it; the mechanism is described in C(module_utils/common/host_lock.py)).
  - The lock is C(flock) on O(path), kept open by a small holder process (C(comm) C(b300-host-lock)) that the module
    starts; the kernel frees the lock when that process dies. The record beside it (O(path)C(.json)) names the run,
    the operator, the controller, the playbook and stage, since when and the lease.
  - O(state=held) by the run that holds the lock already renews it (new lease and stage, C(changed) false).
    Another run's lock is waited for at most O(wait_s) seconds, then the module fails naming that run and the fix.
    With O(takeover) naming the holding run, its holder is ended and the lock taken.
  - O(state=released) releases the lock if, and only if, O(run) holds it (and removes its reboot record, if one is
    left).
  - O(state=rebooting), by the run that holds the lock and is about to reboot the host (a reboot ends the holder and
    clears C(/run/lock)), writes the reboot record O(reboot_path) on disk. Until that run takes its lock again after
    the boot (O(state=held), which removes the record), or O(reboot_s) seconds pass, or it is taken over, no other
    run takes the host, even though the lock itself is free.
extends_documentation_fragment: [ansible.builtin.action_common_attributes, b300.rollout.common]
attributes:
  check_mode:
    support: full
    details: In check mode nothing is taken, renewed or released; the holder is reported (RV(holder)) and a lock
      another run holds is a warning, not a failure.
options:
  state:
    description: C(held) takes or renews the lock, C(released) gives it back, C(rebooting) keeps the host this run's
      through a reboot, C(query) only reads the record.
    type: str
    choices: [held, released, rebooting, query]
    default: held
  path:
    description: The lock file (its record is this path plus C(.json)). Its directory is created (0755) if missing.
    type: path
    default: /run/lock/b300-rollout/host.lock
  run:
    description:
      - Who asks - the mapping the lookup C(b300.rollout.run_identity) returns on the controller - C(id) (the run
        id), C(user), C(controller) (host name), C(pid) and C(start) (the controller process and its start time in
        clock ticks, which tell a finished run from a running one), optionally C(playbook).
      - Required unless O(state=query).
    type: dict
  stage:
    description: What the run does on the host while it holds the lock (shown to anyone refused).
    type: str
    default: ""
  playbook:
    description: The playbook that runs (shown to anyone refused).
    type: str
    default: ""
  lease_s:
    description: The lock ends by itself this many seconds after it was taken or last renewed, if the run never
      releases it (a lost controller on another machine). Every later lock task of the same run renews it.
    type: int
    default: 28800
  wait_s:
    description: How long to wait for another run's lock before failing (0 fails at once).
    type: int
    default: 0
  host:
    description: The host's name in messages (roles pass C(inventory_hostname)); default the host's own name.
    type: str
    default: ""
  takeover:
    description: The run id of a holder to take the lock from (its holder process is ended; only when it is that
      run that holds the lock, or whose reboot record keeps the host). Empty does nothing.
    type: str
    default: ""
  reboot_path:
    description: The reboot record, on a file system a reboot keeps (its directory is created, 0755).
    type: path
    default: /var/lib/b300-rollout/host-lock.rebooting.json
  reboot_s:
    description: With O(state=rebooting), how long the reboot record keeps the host at most (the reboot, the wait for
      the host, and the re-take), in seconds.
    type: int
    default: 3600
  changed_before:
    description: This run changed the host before this step (a re-take after its own reboot); a refusal then says so
      instead of "Nothing was changed".
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Take the host for the firmware update (or renew this run's lock)
  b300.rollout.host_lock:
    run: "{{ lookup('b300.rollout.run_identity') }}"
    stage: firmware-update
    playbook: playbooks/nic_firmware_update.yml
    wait_s: 0
  register: lock
  retries: 6
  delay: 10
  until: lock is not failed

- name: Keep the host through the reboot that follows (the reboot ends the holder and clears /run/lock)
  b300.rollout.host_lock:
    state: rebooting
    run: "{{ lookup('b300.rollout.run_identity') }}"
    reboot_s: 900
- name: Give the host back
  b300.rollout.host_lock:
    state: released
    run: "{{ lookup('b300.rollout.run_identity') }}"
"""

RETURN = r"""
outcome:
  description: What was done (not C(action), which Ansible's own result keys use) - C(acquired), C(renewed),
    C(took_over), C(released), C(not_held) (released by a run that did not hold it, so nothing was done),
    C(rebooting) (the reboot record written), C(read) (query, or check mode).
  returned: always
  type: str
  sample: acquired
holder:
  description: The lock's record after the call (run_id, user, controller, controller_pid, controller_start,
    playbook, stage, since, renewed, lease_until, holder_pid, holder_start, state, and took_over or released_at
    where they apply), or null when no record exists. When another run's reboot record keeps the host, that record
    (state C(rebooting), with reboot_since and reboot_until); with O(state=rebooting), the reboot record written.
  returned: always
  type: dict
  sample: {"run_id": "ctl1-20417-8812345", "user": "alice", "controller": "ctl1", "stage": "weights", "state": "held"}
previous:
  description: The record before the call (the run taken over, or this run's own before a renewal), or null.
  returned: always
  type: dict
  sample: null
locked:
  description: Whether a process holds the lock after the call.
  returned: always
  type: bool
  sample: true
held_by_other:
  description: Whether another run than O(run) holds the lock, or keeps the host through its reboot (check mode and
    query; otherwise a failure).
  returned: always
  type: bool
  sample: false
"""

import socket

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.b300.rollout.plugins.module_utils.common import host_lock as hl


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", default="held", choices=["held", "released", "rebooting", "query"]),
            path=dict(type="path", default=hl.DEFAULT_PATH),
            run=dict(type="dict"),
            stage=dict(type="str", default=""),
            playbook=dict(type="str", default=""),
            lease_s=dict(type="int", default=28800),
            wait_s=dict(type="int", default=0),
            takeover=dict(type="str", default=""),
            host=dict(type="str", default=""),
            reboot_path=dict(type="path", default=hl.DEFAULT_REBOOT_PATH),
            reboot_s=dict(type="int", default=3600),
            changed_before=dict(type="bool", default=False),
        ),
        required_if=[("state", "held", ("run",)), ("state", "released", ("run",)), ("state", "rebooting", ("run",))],
        supports_check_mode=True,
    )
    p = module.params
    path, run, state = p["path"], p["run"] or {}, p["state"]
    host = p["host"] or socket.gethostname()
    if state != "query":
        errors = hl.check_run(run)
        if errors:
            module.fail_json(msg="host_lock on %s: %s" % (host, "; ".join(errors)))
    if p["lease_s"] < 60 or p["wait_s"] < 0 or p["reboot_s"] < 60:
        module.fail_json(msg="host_lock on %s: lease_s and reboot_s must be >= 60 and wait_s >= 0 (found %d, %d, %d)"
                         % (host, p["lease_s"], p["reboot_s"], p["wait_s"]))
    before = hl.read_record(path)
    mine = bool(before and before.get("run_id") == str(run.get("id")) and before.get("state") == "held")
    result = dict(changed=False, outcome="read", holder=before, previous=before, locked=hl.is_locked(path),
                  held_by_other=False)
    result["held_by_other"] = bool(result["locked"] and not mine)
    rebooting = hl.read_reboot(p["reboot_path"])
    if not result["locked"] and hl.reboot_pending(rebooting) and rebooting.get("run_id") != str(run.get("id")):
        result.update(held_by_other=True, holder=rebooting)  # free lock, but another run is rebooting the host
    if state == "query" or module.check_mode:
        if module.check_mode and state == "held" and result["held_by_other"]:
            module.warn("%s is held by another run (check mode takes no lock): %s" % (host, hl.describe(result["holder"])))
        module.exit_json(**result)
    try:
        if state == "released":
            result["outcome"] = hl.release(path, run["id"], reboot_path=p["reboot_path"])
            result["changed"] = result["outcome"] == "released"
        elif state == "rebooting":
            res = hl.reserve_reboot(path, p["reboot_path"], run["id"], p["reboot_s"], host=host)
            result.update(outcome="rebooting", changed=True, holder=res)
            module.exit_json(**result)
        else:
            out = hl.acquire(path, run, p["stage"], p["lease_s"], wait_s=p["wait_s"], takeover=p["takeover"] or None,
                             playbook=p["playbook"], host=host, reboot_path=p["reboot_path"],
                             changed_before=p["changed_before"])
            result.update(outcome=out["action"], previous=out["previous"], held_by_other=False)
            result["changed"] = out["action"] != "renewed"
    except hl.LockError as e:
        result["held_by_other"] = True
        if e.holder is not None:
            result["holder"] = e.holder  # the run in the way: the lock's holder, or the run rebooting the host
        module.fail_json(msg=str(e), **result)
    except OSError as e:
        module.fail_json(msg="host_lock on %s: %s: %s (fix: the lock's directory must be writable by root; "
                         "/run/lock is a tmpfs on systemd hosts)" % (host, path, e), **result)
    result["holder"] = hl.read_record(path)
    result["locked"] = hl.is_locked(path)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
