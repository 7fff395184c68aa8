#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: what the SGLang units of a host run now (read-only)."""
from __future__ import absolute_import, division, print_function
__metaclass__ = type

DOCUMENTATION = r"""
---
module: sglang_units_state
short_description: The state of a host's SGLang units and of their unit and env files (read-only)
description:
  - Reads, in one module run, what roles/sglang needs to decide what a rollout restarts and what a rollback puts
    back. For every unit in O(units) C(systemctl show) gives C(ActiveState), C(SubState), C(InvocationID) (it
    changes on every start) and C(ExecMainStartTimestamp); for every path in O(files) its modification time and,
    with O(content), its content (base64).
  - With O(instances), returns the instances whose unit or env file is newer than the process that runs now
    (RV(pending_restart)), as when an earlier run stopped between writing the files and restarting.
  - The decisions are plain functions in C(module_utils/sglang/sglang_rollout.py) (C(parse_systemctl_show),
    C(pending_restart), C(snapshot_units)). The module never changes anything.
  - Env files can hold the API key; a task with O(content) must set C(no_log).
version_added: "1.2.0"
extends_documentation_fragment: [ansible.builtin.action_common_attributes, b300.rollout.common]
attributes:
  check_mode:
    support: full
    details: Read-only; runs the same in check mode.
options:
  units:
    description: systemd unit names (e.g. C(sglang-kimi_k3-w0.service)). Units systemd does not know are reported
      with C(ActiveState) C(inactive) and C(LoadState) C(not-found).
    type: list
    elements: str
    default: []
  files:
    description: Paths whose modification time (and with O(content), content) to read. A missing file is reported
      with C(exists) false.
    type: list
    elements: path
    default: []
  content:
    description: Also return the content of O(files) (base64) as RV(snapshot), the shape tasks/rollback.yml restores.
    type: bool
    default: false
  instances:
    description:
      - Planned instances of this host, each with C(id), C(unit_name) and C(env_file); their unit file is
        C(/etc/systemd/system/<unit_name>). The unit names and both files are read even when not in O(units) and
        O(files).
    type: list
    elements: dict
    default: []
"""

EXAMPLES = r"""
- name: Snapshot of what serves now (for an automatic rollback)
  b300.rollout.sglang_units_state:
    units: ["sglang-kimi_k3-w0.service"]
    files: ["/etc/systemd/system/sglang-kimi_k3-w0.service", "/etc/sglang/kimi_k3-w0.env"]
    content: true
  register: snap
  no_log: true

- name: Instances whose files are newer than their running process
  b300.rollout.sglang_units_state:
    instances: "{{ sglang_host_instances }}"
  register: state
"""

RETURN = r"""
units:
  description: Per unit the properties read (C(Id), C(ActiveState), C(SubState), C(InvocationID),
    C(ExecMainStartTimestamp) as unix seconds with a leading C(@), C(LoadState)).
  returned: always
  type: dict
  sample: {"sglang-kimi_k3-w0.service": {"Id": "sglang-kimi_k3-w0.service", "ActiveState": "active",
           "SubState": "running", "InvocationID": "0f1e2d3c4b5a69788796a5b4c3d2e1f0",
           "ExecMainStartTimestamp": "@1764720000", "LoadState": "loaded"}}
files:
  description: Per path whether it exists and its modification time (unix seconds, C(null) when absent).
  returned: always
  type: dict
  sample: {"/etc/sglang/kimi_k3-w0.env": {"exists": true, "mtime": 1764719990}}
snapshot:
  description: With O(content), the snapshot tasks/rollback.yml restores, C(files) path to base64 content
    (C('') when absent) and C(units) unit to C(invocation) and C(active).
  returned: when O(content) is true
  type: dict
  sample: {"files": {"/etc/sglang/kimi_k3-w0.env": "UlVTVF9MT0c9aW5mbwo="},
           "units": {"sglang-kimi_k3-w0.service": {"invocation": "0f1e2d3c", "active": "active"}}}
pending_restart:
  description: Ids of O(instances) that are active and whose unit or env file is newer than the process start.
  returned: always
  type: list
  elements: str
  sample: ["W0"]
"""

import base64
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.b300.rollout.plugins.module_utils.sglang import sglang_rollout as ro
from ansible_collections.b300.rollout.plugins.module_utils.hw.tools import find_tool

PROPS = "Id,ActiveState,SubState,InvocationID,ExecMainStartTimestamp,LoadState"


def main():
    module = AnsibleModule(
        argument_spec=dict(
            units=dict(type="list", elements="str", default=[]),
            files=dict(type="list", elements="path", default=[]),
            content=dict(type="bool", default=False),
            instances=dict(type="list", elements="dict", default=[]),
        ),
        supports_check_mode=True,
    )
    p = module.params
    bad = [i for i in p["instances"] if not all(isinstance(i.get(k), str) for k in ("id", "unit_name", "env_file"))]
    if bad:
        module.fail_json(msg="sglang_units_state: every instance needs id, unit_name and env_file (strings): %r" % bad)
    units = list(dict.fromkeys(p["units"] + [i["unit_name"] for i in p["instances"]]))
    files = list(dict.fromkeys(p["files"] + [f for i in p["instances"]
                                             for f in ("/etc/systemd/system/" + i["unit_name"], i["env_file"])]))
    shown = {}
    if units:
        systemctl = find_tool(module, "systemctl")
        if not systemctl:
            module.fail_json(msg="sglang_units_state: systemctl not found on PATH; expected a systemd host")
        rc, out, err = module.run_command([systemctl, "show", "--timestamp=unix", "-p", PROPS] + units)
        if rc != 0:
            module.fail_json(msg="sglang_units_state: systemctl show %s failed (rc %d): %s"
                             % (" ".join(units), rc, err.strip()))
        shown = ro.parse_systemctl_show(out)
    stats, mtimes, contents = {}, {}, {}
    for path in files:
        try:
            st = os.stat(path)
        except OSError:
            stats[path] = {"exists": False, "mtime": None}
            contents[path] = ""
            continue
        stats[path] = {"exists": True, "mtime": int(st.st_mtime)}
        mtimes[path] = int(st.st_mtime)
        if p["content"]:
            try:
                with open(path, "rb") as fh:
                    contents[path] = base64.b64encode(fh.read()).decode("ascii")
            except OSError as e:
                module.fail_json(msg="sglang_units_state: cannot read %s: %s" % (path, e))
    result = dict(changed=False, units=shown, files=stats,
                  pending_restart=ro.pending_restart(p["instances"], shown, mtimes))
    if p["content"]:
        result["snapshot"] = {"files": contents, "units": ro.snapshot_units(shown)}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
