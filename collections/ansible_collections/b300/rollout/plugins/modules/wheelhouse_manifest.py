#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: manifest (name, size, sha256) of a wheelhouse directory, hashing only what changed."""
from __future__ import absolute_import, division, print_function
__metaclass__ = type

DOCUMENTATION = r"""
---
module: wheelhouse_manifest
short_description: Manifest of a wheelhouse directory (name, size, sha256), and which expected files a copy lacks
description:
  - Lists the regular files at the top of O(path) (what pip's C(--find-links) reads) with their size and sha256.
    A file is hashed only when its size, mtime, ctime or inode differs from the values recorded when it was last
    hashed; the record is C(.b300-wheelhouse.json) in O(path). A directory whose files did not change costs one
    C(stat) per file, whatever their size.
  - With O(expected) (the manifest of the controller's wheelhouse), returns the expected files that are missing or
    differ in size or sha256 (RV(stale)); the caller copies exactly those, then runs the module again to hash the
    copies and prove they match.
  - Subdirectories and hidden files are not part of the manifest (pip does not read them); they are listed in
    RV(ignored).
  - Writing the record is bookkeeping, not a change of the wheelhouse; the module never reports C(changed). The
    logic lives in C(module_utils/sglang/wheelhouse.py).
version_added: "1.0.0"
extends_documentation_fragment: [ansible.builtin.action_common_attributes, b300.rollout.common]
attributes:
  check_mode:
    support: full
    details: In check mode the record is not written (files whose record is out of date are hashed every time).
options:
  path:
    description: The wheelhouse directory. A missing directory is an empty wheelhouse (RV(exists) false).
    type: path
    required: true
  expected:
    description:
      - Manifest the directory should match (RV(files) of this module run on the controller's wheelhouse). Each
        entry a mapping with C(name) (a file name at the top of the wheelhouse), C(size) (bytes) and C(sha256).
    type: list
    elements: dict
  record:
    description: Keep the hash record in O(path) up to date (never in check mode). Without it, files are hashed
      on every run.
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Manifest of the controller's wheelhouse
  b300.rollout.wheelhouse_manifest:
    path: /srv/wheelhouse
  delegate_to: localhost
  run_once: true
  register: src

- name: What the host's copy lacks
  b300.rollout.wheelhouse_manifest:
    path: /opt/sglang-wheelhouse
    expected: "{{ src.files }}"
  register: dest

- name: Copy exactly those files
  ansible.builtin.copy:
    src: "/srv/wheelhouse/{{ item }}"
    dest: "/opt/sglang-wheelhouse/{{ item }}"
    mode: "0644"
  loop: "{{ dest.stale }}"
"""

RETURN = r"""
exists:
  description: Whether O(path) exists (as a directory).
  returned: always
  type: bool
  sample: true
files:
  description: The manifest, sorted by name.
  returned: always
  type: list
  elements: dict
  sample: [{"name": "sglang-0.5.18-cp311-cp311-manylinux_2_34_x86_64.whl", "size": 24022793,
            "sha256": "0f5c9e3b8a9a3c5e1d7f0b4c7c2e8d1a6b5f4e3d2c1b0a99887766554433221a"}]
total_bytes:
  description: Sum of the files' sizes.
  returned: always
  type: int
  sample: 182312345
hashed:
  description: Files whose content was read this run (their stat key differed from the record, or none was kept).
  returned: always
  type: list
  elements: str
  sample: []
ignored:
  description: Names at the top of O(path) outside the manifest (subdirectories, hidden files, non-files).
  returned: always
  type: list
  elements: str
  sample: []
record_written:
  description: Whether the hash record was rewritten this run (false in check mode and when nothing changed).
  returned: always
  type: bool
  sample: false
stale:
  description: Names from O(expected) that are missing here or differ in size or sha256, sorted.
  returned: when O(expected) is given
  type: list
  elements: str
  sample: ["sglang-0.5.18-cp311-cp311-manylinux_2_34_x86_64.whl"]
extra:
  description: Names here that O(expected) does not list (left in place).
  returned: when O(expected) is given
  type: list
  elements: str
  sample: []
current:
  description: How many files of O(expected) are present with the expected size and sha256.
  returned: when O(expected) is given
  type: int
  sample: 28
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.b300.rollout.plugins.module_utils.sglang import wheelhouse as wh


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            expected=dict(type="list", elements="dict"),
            record=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    path, expected = module.params["path"], module.params["expected"]
    if expected is not None:
        errors = wh.check_expected(expected)
        if errors:
            module.fail_json(msg="wheelhouse_manifest: the expected manifest for %s is malformed: %s"
                             % (path, "; ".join(errors)))
    result = dict(changed=False, exists=os.path.isdir(path), files=[], total_bytes=0, hashed=[], ignored=[],
                  record_written=False)
    if result["exists"]:
        record, note = wh.load_record(path)
        if note:
            module.warn(note)
        try:
            files, new_record, hashed = wh.manifest(path, record)
            _found, ignored = wh.scan(path)
        except OSError as e:
            module.fail_json(msg="wheelhouse_manifest: cannot read %s: %s" % (path, e), **result)
        result.update(files=files, total_bytes=wh.total_bytes(files), hashed=hashed, ignored=ignored)
        if module.params["record"] and not module.check_mode and new_record != record:
            try:
                wh.write_record(path, new_record)
                result["record_written"] = True
            except OSError as e:
                module.warn("cannot keep the hash record in %s (%s): every file of it is hashed on every run"
                            % (path, e))
    if expected is not None:
        result.update(wh.compare(expected, result["files"]))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
