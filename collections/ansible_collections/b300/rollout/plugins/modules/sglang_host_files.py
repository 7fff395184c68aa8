#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: every file and directory roles/sglang writes on a host, compared and converged in one run."""
from __future__ import absolute_import, division, print_function
__metaclass__ = type

DOCUMENTATION = r"""
---
module: sglang_host_files
short_description: Compare a host's SGLang files, directories and accounts with the wanted ones; fix only what differs
description:
  - Takes every file and directory roles/sglang manages on one host (the instances' env and unit files, the router's,
    the fabric wait script, the module-load file, the journald drop-in, the install and env directories), reads what
    is there, and returns per path whether it differs and why (RV(files)). Only the entries that differ are written
    (files atomically, through a temporary file renamed over the old one); C(changed) is true only when something
    was written. One module run per host instead of one per file, which is what a no-change re-run paid for
    (docs/rerun-profile.md).
  - Entries are converged in the order given (list a directory before the files in it).
  - A file's content is given as text (a template rendered on the controller with the C(template) lookup, or a
    C(file) lookup); it is never returned. Env files can hold the API key; the task sets C(no_log) then.
  - With O(accounts), the service groups and users are compared the same way (one read of the group and user
    databases) and only what differs is fixed, with C(groupadd), C(useradd) or C(usermod) (argument lists).
  - The logic is in C(module_utils/sglang/host_files.py) (C(entry_problems), C(differences), C(converge),
    C(account_commands)).
version_added: "1.4.0"
extends_documentation_fragment: [ansible.builtin.action_common_attributes, b300.rollout.common]
attributes:
  check_mode:
    support: full
    details: Reports what differs and would be written (C(changed) true when something would be) and writes nothing.
options:
  accounts:
    description: Service accounts, converged before O(files) (files may be owned by them).
    type: dict
    suboptions:
      groups:
        description: System groups that must exist (created with C(groupadd --system)).
        type: list
        elements: str
        default: []
      users:
        description: System users without a login shell. Each C(name), C(group) (primary), C(shell), C(home)
          (optional; never created) and C(groups) (supplementary groups joined when they exist on the host; a user
          is never removed from a group).
        type: list
        elements: dict
        default: []
  files:
    description: The wanted entries of this host, in the order they are converged.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path.
        type: str
        required: true
      state:
        description: C(file) (needs O(files[].content)) or C(directory).
        type: str
        choices: [file, directory]
        default: file
      content:
        description: The file's full content (text, written as UTF-8). Not for directories.
        type: str
      mode:
        description: Octal permission bits as a string, e.g. C('0644').
        type: str
        required: true
      owner:
        description: User name that owns the entry (must exist on the host).
        type: str
        default: root
      group:
        description: Group name of the entry (must exist on the host).
        type: str
        default: root
"""

EXAMPLES = r"""
- name: Units | env, unit and host files of this host (one module run)
  b300.rollout.sglang_host_files:
    files:
      - {path: /usr/local/libexec, state: directory, mode: "0755"}
      - path: /etc/sglang/kimi_k3-w0.env
        content: "{{ lookup('ansible.builtin.template', 'etc/sglang/instance.env.j2') }}"
        mode: "0640"
        group: sglang
  register: host_files
  no_log: true

- name: Reload systemd when a unit file was written
  ansible.builtin.systemd_service:
    daemon_reload: true
  when: host_files.files['/etc/systemd/system/sglang-kimi_k3-w0.service'].changed
"""

RETURN = r"""
accounts:
  description: What differed in O(accounts) (one reason per command run, or to run in check mode); empty when the
    accounts are as wanted.
  returned: always
  type: list
  elements: str
  sample: ["user sglang: not in video, render"]
files:
  description: Per wanted path, C(changed) (it differed and was written, or would be in check mode) and C(reasons)
    (why it differed, e.g. C(absent), C(content), C(mode 0644 (wanted 0640)), C(owner nobody (wanted root)); empty
    when it is as wanted).
  returned: always
  type: dict
  sample: {"/etc/sglang/kimi_k3-w0.env": {"changed": true, "reasons": ["content"]},
           "/usr/local/libexec": {"changed": false, "reasons": []}}
written:
  description: The paths that differed, in the order given (written, or to be written in check mode).
  returned: always
  type: list
  elements: str
  sample: ["/etc/sglang/kimi_k3-w0.env"]
"""

import socket

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.b300.rollout.plugins.module_utils.sglang import host_files as hf
from ansible_collections.b300.rollout.plugins.module_utils.hw.tools import find_tool


def main():
    module = AnsibleModule(
        argument_spec=dict(accounts=dict(type="dict", options=dict(
            groups=dict(type="list", elements="str", default=[]),
            users=dict(type="list", elements="dict", default=[]),
        )), files=dict(type="list", elements="dict", default=[], options=dict(
            path=dict(type="str", required=True),
            state=dict(type="str", choices=list(hf.STATES), default="file"),
            content=dict(type="str", no_log=True),
            mode=dict(type="str", required=True),
            owner=dict(type="str", default="root"),
            group=dict(type="str", default="root"),
        ))),
        supports_check_mode=True,
    )
    host = socket.gethostname()
    entries = [{k: v for k, v in e.items() if v is not None} for e in module.params["files"]]
    problems = [p for e in entries for p in hf.entry_problems(e)]
    if problems:
        module.fail_json(msg="sglang_host_files on %s: bad wanted entries: %s; fix the role's list (roles/sglang)"
                         % (host, "; ".join(problems)))
    accounts = _accounts(module, host, module.params["accounts"])
    result = {}
    written = []
    for entry in entries:
        path = entry["path"]
        try:
            have = hf.read_state(path, (entry.get("state") or "file") == "file")
        except OSError as e:
            module.fail_json(msg="sglang_host_files on %s: cannot read %s: %s; expected a readable %s"
                             % (host, path, e, entry.get("state") or "file"))
        reasons = hf.differences(entry, have)
        result[path] = {"changed": bool(reasons), "reasons": reasons}
        if not reasons:
            continue
        written.append(path)
        if module.check_mode:
            continue
        try:
            hf.converge(entry, reasons)
        except (OSError, KeyError, ValueError) as e:
            module.fail_json(msg="sglang_host_files on %s: cannot write %s (found: %s; wanted %s %s %s:%s): %s. "
                             "Fix the path on the host (or the service user/group: roles/sglang/tasks/user.yml "
                             "creates them first)" % (host, path, ", ".join(reasons), entry.get("state") or "file",
                                                      entry["mode"], entry["owner"], entry["group"], e),
                             files=result, written=written, accounts=accounts)
    module.exit_json(changed=bool(written or accounts), files=result, written=written, accounts=accounts)


def _accounts(module, host, wanted):
    """Fix the accounts that differ (check mode: only say so); returns the reasons."""
    if not wanted:
        return []
    users = wanted["users"]
    bad = [u for u in users if not all(isinstance(u.get(k), str) and u.get(k) for k in ("name", "group", "shell"))]
    if bad:
        module.fail_json(msg="sglang_host_files on %s: every account user needs name, group and shell: %r; fix the "
                         "role's list (roles/sglang/tasks/user.yml)" % (host, bad))
    commands, reasons = hf.account_commands(wanted["groups"], users, hf.read_accounts())
    if module.check_mode:
        return reasons
    for argv, reason in zip(commands, reasons):
        tool = find_tool(module, argv[0])
        if not tool:
            module.fail_json(msg="sglang_host_files on %s: %s not found on PATH (needed because %s); expected the "
                             "shadow-utils tools (package passwd)" % (host, argv[0], reason))
        rc, out, err = module.run_command([tool] + argv[1:])
        if rc != 0:
            module.fail_json(msg="sglang_host_files on %s: %s failed (rc %d) because %s: %s; fix the account by hand "
                             "or the role's account variables (sglang_user, sglang_group, ...)"
                             % (host, " ".join(argv), rc, reason, (err or out).strip()))
    return reasons


if __name__ == "__main__":
    main()
