#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: stage model directories on a host (inspect, stage, serve), verified against SGLang manifests
(the engine: module_utils/weights/model_weights_stage.py)."""
from __future__ import absolute_import, division, print_function
__metaclass__ = type

DOCUMENTATION = r"""
---
module: model_weights_stage
short_description: Stage model weight directories on a GPU host, each file verified by sha256 while it is written
description:
  - "Three modes, one per step of roles/model_weights. C(inspect): read-only, one C(stat) per file plus the stage
    marker: what each model directory holds and still needs (files to fetch, resume, hash), the free space per file
    system; no weight byte is read (RV(weight_bytes_read) is 0, RV(io) shows the process's own counters)."
  - "C(stage): makes each model directory complete. Files come from the model's source (a path the host reads, an
    HTTP(S) URL through curl, an S3-compatible store through C(rclone cat), a peer host or the controller through
    curl) into a sibling staging directory C(<parent>/.<name>.b300-staging/), each hashed while it is written and
    compared with the manifest (size, sha256); a file that fails is removed and never served, a .part left by an
    earlier run resumes, files the serving copy already holds are hard-linked. Only when every file is verified is
    the staging directory swapped into place, so a worker never sees half a model. Sources and free space are checked
    before the first byte. Meant for C(async); progress is written to O(run_dir)/progress.json every 2 s."
  - "One stage run per model directory at a time (C(flock) on C(<parent>/.<name>.b300-lock), the holder written
    into it): another run waits up to O(lock_wait_s), then is refused naming the holder; with O(takeover) it ends the
    holder first. A directory holding files its manifest does not list is rebuilt and swapped, never relabelled in
    place. Symlinks are refused in a path source; every model path and file name is re-checked here (no C(..), no
    absolute path, no NUL). How each step is made safe: module_utils/weights/model_weights_stage.py."
  - "C(serve): a read-only HTTP server with byte ranges bound to O(bind_address) for the hosts that pull from this one
    (or, O(kind=source), for the controller's path source); every request needs the run's token; it serves verified
    files only and stops when O(stop_file) appears, the run O(watch_run) ends, or after O(max_s)."
  - "The engine: module_utils/weights/model_weights_stage.py (decisions model_weights.py, I/O model_weights_io.py)."
version_added: "1.2.0"
extends_documentation_fragment: [ansible.builtin.action_common_attributes, b300.rollout.common]
attributes:
  check_mode:
    support: full
    details: inspect runs in check mode (it changes nothing); stage and serve report what they would do and return.
options:
  mode:
    description: The step.
    type: str
    choices: [inspect, stage, serve]
    required: true
  host:
    description: Inventory name of this host (first word of every message).
    type: str
    required: true
  models:
    description:
      - "The model directories of this host. Each a mapping with C(rel) (path below the model root, the same at the
        source), C(final) (absolute directory), C(need) (C(full) or C(tokenizer)), C(files) (the manifest's files,
        name to sha256 and size), C(digest) (its manifest digest), C(where) (where the manifest came from, for
        messages), C(source) (a mapping, below) and C(fallback) (the source to use when a peer fails, or null)."
      - "A source: C(type) one of C(path) (C(path): a directory holding <rel>/ that this host reads), C(http) (C(url):
        base URL, <url>/<rel>/<name>; optional C(ca_file)), C(s3) (C(endpoint), C(bucket), C(prefix), C(region),
        C(provider)), C(peer) or C(controller) (C(url) of a serve-mode server, C(host) its name)."
    type: list
    elements: dict
    default: []
  secrets_file:
    description: JSON file (mode 0600) with the run's secrets (C(peer_token), C(s3_access_key_id),
      C(s3_secret_access_key), C(http_token), C(http_user), C(http_password)); never module arguments.
    type: path
  run_dir:
    description: Directory of this run's progress, status and served files (created 0700).
    type: path
    default: /run/b300-weights
  owner:
    description: Owner of the staged files and directories.
    type: str
    default: root
  group:
    description: Group of the staged files and directories (the service user's group reads them).
    type: str
    default: sglang
  file_mode:
    description: Mode of the staged files.
    type: str
    default: "0640"
  dir_mode:
    description: Mode of the staged directories.
    type: str
    default: "0750"
  parallel:
    description: Files copied at the same time.
    type: int
    default: 4
  writeback:
    description: "C(behind): each file's write-back starts as its bytes come (every 64 MiB, sync_file_range, at most
      two windows in flight), so the host's dirty pages stay far below the kernel's limit. C(end): the kernel's own
      write-back (issue 28). Either way the file is fdatasynced before it is verified."
    type: str
    choices: [behind, end]
    default: behind
  drop_cache:
    description: With O(writeback=behind), each window written and on disk leaves the page cache
      (POSIX_FADV_DONTNEED), and the whole file after its fdatasync, so staging a model does not evict what the host
      reads next. Reading a dropped file again (a peer pulling from this host) reads the disk.
    type: bool
    default: false
  retries:
    description: Attempts after the first one per file when the source fails (each resumes where the last stopped);
      also for the pre-check when the source answers 5xx, refuses or resets the connection, or times out.
    type: int
    default: 3
  retry_delay_s:
    description: Seconds before the first retry; each next one waits twice as long, at most O(retry_max_delay_s).
    type: float
    default: 2.0
  retry_max_delay_s:
    description: The longest wait between two retries.
    type: float
    default: 30.0
  lock_wait_s:
    description: stage mode, seconds to wait for another run holding a model directory's lock before this run is
      refused (naming the holder).
    type: int
    default: 300
  takeover:
    description: stage mode, end the run holding a model directory's lock (SIGTERM to its process, when it is this
      module) instead of only waiting for it; its verified files and .part files are kept and resumed. serve mode,
      end an earlier run's server of this port (it holds C(<parent of run_dir>/.serve-<port>.b300-lock)) instead of
      being refused naming it.
    type: bool
    default: false
  run_id:
    description: The run's name, written into the lock as part of the holder (default the basename of O(run_dir)).
    type: str
    default: ""
  reserve_bytes:
    description: Bytes that must stay free on each file system after the stage.
    type: int
    default: 0
  verify:
    description: C(marker) trusts a directory whose marker matches one stat per file; C(full) re-hashes every file.
    type: str
    choices: [marker, full]
    default: marker
  protect_home:
    description: Refuse model directories under /home, /root and /run/user (hidden from the units by ProtectHome=).
    type: bool
    default: true
  peer_wait_s:
    description: Seconds a host waits on a peer that makes no progress before it turns to the fallback source.
    type: int
    default: 600
  stall_s:
    description: Seconds without a byte after which a transfer is aborted and resumed (curl --speed-time).
    type: int
    default: 60
  bind_address:
    description: serve mode, the address to listen on (this host's data-network address).
    type: str
  port:
    description: serve mode, the TCP port.
    type: int
    default: 31990
  kind:
    description: serve mode, C(staged) (this host's staged or staging directories) or C(source) (files under O(root)).
    type: str
    choices: [staged, source]
    default: staged
  root:
    description: serve mode with O(kind=source), the directory holding <rel>/<name>.
    type: path
  stop_file:
    description: serve mode, the server stops when this file exists.
    type: path
  max_s:
    description: serve mode, the server stops after this many seconds in any case.
    type: int
    default: 86400
  watch_run:
    description: serve mode on the run's own controller, that run (C(pid) and C(start) as lookup b300.rollout.run_identity gives them);
      the server stops within a second once it is gone (Ctrl-C, kill -9), not O(max_s) later.
    type: dict
"""

EXAMPLES = r"""
- name: What each model directory still needs (stat only)
  b300.rollout.model_weights_stage:
    mode: inspect
    host: "{{ inventory_hostname }}"
    models: "{{ my_models }}"
  register: inspect

- name: Stage (async, progress in /run/b300-weights/<run>/progress.json)
  b300.rollout.model_weights_stage:
    mode: stage
    host: "{{ inventory_hostname }}"
    models: "{{ my_models }}"
    secrets_file: /run/b300-weights/run1/secrets.json
    run_dir: /run/b300-weights/run1
  async: 21600
  poll: 0
"""

RETURN = r"""
models:
  description: Per model directory (inspect and stage) - C(rel), C(final), C(state) (absent, complete, relabel,
    incomplete), C(marker) (none, valid, invalid), C(need_bytes), C(fetch_bytes), C(hash_bytes), C(files) (count),
    C(actions) (count per action - link, have, adopt, resume, fetch), C(changed_files), C(missing_files),
    C(extra_files), and after stage C(result) (done, failed, relabelled, adopted, unchanged), C(bytes_fetched),
    C(bytes_hashed), C(swap) (exchange, rename, rename-aside, in-place), C(writeback) (end, behind (sfr), behind
    (fadvise)), C(sources), C(errors), C(elapsed_s).
  returned: inspect, stage
  type: list
  elements: dict
filesystems:
  description: Per file system the models share - C(mount), C(fstype), C(device), C(avail_bytes), C(need_bytes),
    C(reserve_bytes), C(models), C(problem) (the refusal, or null).
  returned: inspect, stage
  type: list
  elements: dict
problems:
  description: Refusals found before any byte was written (space, source lacks a file, a path ProtectHome hides).
  returned: always
  type: list
  elements: str
errors:
  description: Failures while staging (each names the host, the file, what was found and what was expected).
  returned: stage
  type: list
  elements: str
weight_bytes_read:
  description: Bytes this process read from weight files (re-hashed prefixes, adopted files, full verification).
  returned: always
  type: int
bytes_fetched:
  description: Bytes received from sources and peers.
  returned: stage
  type: int
fsync_s:
  description: "Seconds the files' fdatasync before verification took, summed over the files (what the write-back
    left for the end; near 0 with O(writeback=behind))."
  returned: stage
  type: float
io:
  description: Deltas of this process's /proc/self/io (rchar, wchar, read_bytes, write_bytes, syscr) over the work.
  returned: always
  type: dict
elapsed_s:
  description: Seconds of the work.
  returned: always
  type: float
lock_waited_s:
  description: stage mode, seconds this run waited for the model directories' locks.
  returned: stage, when something needed staging
  type: float
lock_holder:
  description: When refused for a held lock, the holder the lock file names (C(pid), C(run_id), C(user), C(since),
    C(host), C(module)).
  returned: failure on a held lock
  type: dict
served:
  description: serve mode, per model C(requests), C(bytes), and C(refused) requests (wrong token).
  returned: serve
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.b300.rollout.plugins.module_utils.weights import model_weights_stage as engine


def main():
    module = AnsibleModule(
        argument_spec=dict(
            mode=dict(type="str", required=True, choices=["inspect", "stage", "serve"]),
            host=dict(type="str", required=True),
            models=dict(type="list", elements="dict", default=[]),
            secrets_file=dict(type="path"),
            run_dir=dict(type="path", default="/run/b300-weights"),
            owner=dict(type="str", default="root"), group=dict(type="str", default="sglang"),
            file_mode=dict(type="str", default="0640"), dir_mode=dict(type="str", default="0750"),
            parallel=dict(type="int", default=4),
            writeback=dict(type="str", default="behind", choices=["behind", "end"]),
            drop_cache=dict(type="bool", default=False),
            retries=dict(type="int", default=3), retry_delay_s=dict(type="float", default=2.0),
            retry_max_delay_s=dict(type="float", default=30.0), reserve_bytes=dict(type="int", default=0),
            verify=dict(type="str", default="marker", choices=["marker", "full"]),
            protect_home=dict(type="bool", default=True),
            peer_wait_s=dict(type="int", default=600), stall_s=dict(type="int", default=60),
            lock_wait_s=dict(type="int", default=300), takeover=dict(type="bool", default=False),
            run_id=dict(type="str", default=""),
            bind_address=dict(type="str"), port=dict(type="int", default=31990),  # serve mode
            kind=dict(type="str", default="staged", choices=["staged", "source"]),
            root=dict(type="path"), stop_file=dict(type="path"), max_s=dict(type="int", default=86400),
            watch_run=dict(type="dict"),
        ),
        supports_check_mode=True,
    )
    try:
        result = engine.run(module.params, module.check_mode)
    except engine.StageFailed as exc:
        module.fail_json(msg=exc.msg, **exc.result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
