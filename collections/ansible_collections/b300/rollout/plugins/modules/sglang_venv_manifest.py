#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: whether a venv still holds what its last good install put there (skip a no-op pip install)."""
from __future__ import absolute_import, division, print_function
__metaclass__ = type

DOCUMENTATION = r"""
---
module: sglang_venv_manifest
short_description: Check a venv's installed distributions against its pins and the record of its last good install
description:
  - Reads the distributions installed in O(venv) (name and version of every C(*.dist-info/METADATA) in its
    site-packages, what C(importlib.metadata) reads) and compares them with O(pins), O(absent) and the record of the
    last good install (C(.b300-venv-manifest.json) in O(venv)). RV(matches) is true only when the record exists for
    the same pins, every pin is installed at its version, no O(absent) name is installed and the venv holds exactly
    the recorded distributions; roles/sglang then skips the no-op C(pip install) (1-3 s of pip start-up per venv and
    run). Any mismatch or a missing record gives RV(matches) false with RV(reasons), and pip runs as before.
  - With O(record), writes the record of what is installed now (after a good install). The record is bookkeeping,
    not a change of the venv; the module never reports C(changed).
  - The logic is in C(module_utils/sglang/venv_manifest.py).
version_added: "1.4.0"
extends_documentation_fragment: [ansible.builtin.action_common_attributes, b300.rollout.common]
attributes:
  check_mode:
    support: full
    details: Reads the same in check mode; O(record) writes nothing in check mode.
options:
  venv:
    description: The venv directory. A missing venv has no distributions (RV(matches) false).
    type: path
    required: true
  pins:
    description: What pip installs into the venv, C(NAME==VERSION) or C(NAME) (any version).
    type: list
    elements: str
    required: true
  absent:
    description: Distribution names that must not be installed (e.g. the other CUDA build of the Mooncake engine).
    type: list
    elements: str
    default: []
  record:
    description: Write the record of the distributions installed now, for O(pins) and O(absent).
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Install | does the venv still hold its last good install?
  b300.rollout.sglang_venv_manifest:
    venv: /opt/sglang/0.5.18
    pins: ["cuda-tile==1.6.0rc5", "sglang==0.5.18"]
  register: manifest

- name: Install | record the good install
  b300.rollout.sglang_venv_manifest:
    venv: /opt/sglang/0.5.18
    pins: ["cuda-tile==1.6.0rc5", "sglang==0.5.18"]
    record: true
  when: not manifest.matches
"""

RETURN = r"""
matches:
  description: True when the no-op C(pip install) can be skipped (see the description).
  returned: always
  type: bool
  sample: true
reasons:
  description: Why pip must run (empty when RV(matches)).
  returned: always
  type: list
  elements: str
  sample: ["no record of a good install"]
installed:
  description: Canonical (PEP 503) name to version of every distribution installed in O(venv).
  returned: always
  type: dict
  sample: {"sglang": "0.5.18", "cuda-tile": "1.6.0rc5"}
record_path:
  description: Path of the record in O(venv).
  returned: always
  type: str
  sample: /opt/sglang/0.5.18/.b300-venv-manifest.json
"""

import os
import socket

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.b300.rollout.plugins.module_utils.sglang import venv_manifest as vm


def main():
    module = AnsibleModule(
        argument_spec=dict(
            venv=dict(type="path", required=True),
            pins=dict(type="list", elements="str", required=True),
            absent=dict(type="list", elements="str", default=[]),
            record=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    p = module.params
    host = socket.gethostname()
    try:
        for pin in p["pins"]:
            vm.parse_pin(pin)
    except ValueError as e:
        module.fail_json(msg="sglang_venv_manifest on %s: %s for the venv %s; expected NAME or NAME==VERSION"
                         % (host, e, p["venv"]))
    now = vm.installed(p["venv"])
    reasons = vm.mismatches(p["pins"], p["absent"], now, vm.read_record(p["venv"]))
    path = os.path.join(p["venv"], vm.RECORD_NAME)
    if p["record"] and not module.check_mode:
        if not os.path.isdir(p["venv"]):
            module.fail_json(msg="sglang_venv_manifest on %s: the venv %s does not exist; expected the venv the "
                             "install just made (record only after a good install)" % (host, p["venv"]))
        try:
            vm.write_record(p["venv"], p["pins"], p["absent"], now)
        except OSError as e:
            module.fail_json(msg="sglang_venv_manifest on %s: cannot write %s: %s; expected a writable venv "
                             "directory" % (host, path, e))
        reasons = vm.mismatches(p["pins"], p["absent"], now, vm.read_record(p["venv"]))
    module.exit_json(changed=False, matches=not reasons, reasons=reasons, installed=now, record_path=path)


if __name__ == "__main__":
    main()
