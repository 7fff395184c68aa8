#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: stage model directories on a host (inspect, stage, serve), verified against SGLang manifests."""
from __future__ import absolute_import, division, print_function
__metaclass__ = type

DOCUMENTATION = r"""
---
module: model_weights_stage
short_description: Stage model weight directories on a GPU host, each file verified by sha256 while it is written
description:
  - "Three modes, one per step of roles/model_weights. C(inspect): read-only, one C(stat) per file plus the stage
    marker: what each model directory holds, what it still needs (files to fetch, to resume, to hash), the free space
    per file system; no weight byte is read (RV(weight_bytes_read) is 0, RV(io) shows the process's own counters)."
  - "C(stage): makes each model directory complete. Files come from the model's source (a path the host reads, an
    HTTP(S) URL through curl, an S3-compatible store through C(rclone cat), a peer host or the controller through
    curl) into C(<parent>/.<name>.b300-staging/<file>.part); each buffer is hashed while it is written (no second
    read), the file is fsynced, its size and sha256 compared with the manifest, chowned and renamed. A .part left by
    an earlier run resumes after its prefix is re-hashed. A file that fails verification is removed and never served.
    Files the serving copy already holds (proven by its marker) are hard-linked. Only when every file is verified is
    the staging directory swapped into place (renameat2 RENAME_EXCHANGE), so a worker never sees half a model. The
    source of every file to fetch (existence and size) and the free space are checked before the first byte. Meant
    for C(async); progress is written to O(run_dir)/progress.json every 2 s."
  - "One stage run per model directory at a time: C(flock) on C(<parent>/.<name>.b300-lock), held on a descriptor
    the process keeps open until it ends (a killed run frees it), the holder (pid, run id, user, since) written into
    it. Another run waits up to O(lock_wait_s) (its progress file says on whom), then is refused naming the holder;
    with O(takeover) it sends the holder (only a process of this module) SIGTERM first. Only the holder touches the
    staging directory, so no run deletes another run's .part. A verified file is renamed while the descriptor that
    was hashed is open and its inode is compared before and after; the marker records the inodes verified."
  - "A directory holding files its manifest does not list (a shard a new manifest dropped) is rebuilt through the
    staging directory and swapped, never relabelled in place. Symlinks are refused in a path source and by the
    controller's server (named with their target); in a model directory a symlink counts as missing and is replaced
    by a verified file; ownership is changed through C(O_NOFOLLOW) descriptors only. Every model path and file name
    is re-checked here (no C(..), no absolute path, no NUL), whatever the controller checked."
  - "C(serve): a read-only HTTP server with byte ranges bound to O(bind_address) for the hosts that pull from this one
    (or, O(kind=source), for the controller's path source); every request needs the run's token; it serves verified
    files only and stops when O(stop_file) appears or after O(max_s)."
  - "The decisions are plain Python in module_utils/model_weights.py, the I/O in module_utils/model_weights_io.py."
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
    description:
      - "C(behind): the write-back of each file starts as its bytes come (every 64 MiB, sync_file_range) and at most
        two such windows per file are dirty or in flight, so the fdatasync before the file is verified finds little
        left and the host's dirty pages stay far below the kernel's limit. C(end): the kernel's own write-back and
        the fdatasync at the end (the issue 28 behaviour). Either way the file is fdatasynced before it is verified."
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
    description: Seconds a host pulling from a peer waits on a peer that makes no progress before it turns to the
      fallback source.
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
  description: Bytes this process read from weight files on this host (re-hashed prefixes, adopted files, full
    verification); 0 for a stat-only inspect.
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

import errno
import grp
import hashlib
import json
import os
import pwd
import shutil
import signal
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.b300.rollout.plugins.module_utils import model_weights as mw
from ansible_collections.b300.rollout.plugins.module_utils import model_weights_io as mio

HIDDEN_BY_PROTECT_HOME = ("/home", "/root", "/run/user")


class Counters:
    def __init__(self):
        self.lock = threading.Lock()
        self.weight_read = 0
        self.fetched = 0
        self.meta_read = 0
        self.fsync_s = 0.0

    def add(self, attr, n):
        with self.lock:
            setattr(self, attr, getattr(self, attr) + n)


# --- inspect -------------------------------------------------------------------------------------------------------------
def _stat(path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st


def _files_stats(base, names):
    """{name: stat key} of the regular files among names (lstat: a symlink, or a name reached through one, counts
    as missing and is replaced by a verified file; the stage never reads, links or chowns through a link)."""
    out = {}
    for n in names:
        try:
            st = os.lstat(os.path.join(base, n))
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and not mio.symlink_below(base, n):
            out[n] = mw.stat_key(st)
    return out


def _extras(final, files):
    """Names in the final directory (top level and the manifest's subdirectories) the manifest does not list."""
    out = []
    try:
        for dirpath, dirnames, filenames in os.walk(final):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for f in filenames:
                rel = os.path.relpath(os.path.join(dirpath, f), final)
                if not f.startswith(".") and rel not in files:
                    out.append(rel)
            if len(out) > 50:
                break
    except OSError:
        pass
    return sorted(out)[:50]


def staging_path(final):
    return os.path.join(os.path.dirname(final), "." + os.path.basename(final) + mw.STAGING_SUFFIX)


def inspect_model(m, verify_full, counters):
    final = os.path.realpath(m["final"])
    files = mw.subset(m["files"], m.get("need", "full"))
    digest = mw.manifest_digest(files)
    exists = os.path.isdir(final)
    marker = mio.read_json(os.path.join(final, mw.MARKER_NAME), lambda n: counters.add("meta_read", n)) if exists else None
    fstats = _files_stats(final, files) if exists else {}
    judged = mw.judge_final(files, digest, marker, fstats, exists)
    staging = staging_path(final)
    sstate = mio.read_json(os.path.join(staging, mw.STAGING_STATE), lambda n: counters.add("meta_read", n)) or {}
    sstats = _files_stats(staging, files) if os.path.isdir(staging) else {}
    parts = {}
    if sstats or os.path.isdir(staging):
        for n in files:
            st = _stat(os.path.join(staging, n + mw.PART_SUFFIX))
            if st is not None:
                parts[n] = st.st_size
    if sstate.get("manifest_sha256") is None:
        sstate = {}
    actions = mw.plan_files(files, judged, sstate, sstats, parts, verify_full=verify_full)
    if judged["state"] == "complete" and not verify_full:
        actions = [{"name": n, "action": "link", "bytes": 0} for n in mw.fetch_order(files)]
    counts = {}
    for a in actions:
        counts[a["action"]] = counts.get(a["action"], 0) + 1
    return {
        "rel": m["rel"], "final": final, "requested": m["final"], "need": m.get("need", "full"), "digest": digest,
        "state": judged["state"] if not verify_full else ("verify" if exists else "absent"),
        "marker": judged["marker"], "files": len(files), "bytes_total": mw.total_bytes(files),
        "actions": counts, "need_bytes": mw.space_need(actions, files),
        "fetch_bytes": sum(a["bytes"] for a in actions if a["action"] in ("fetch", "resume")),
        "hash_bytes": sum(a.get("hash_bytes", 0) for a in actions),
        "changed_files": judged["changed"][:20], "missing_files": judged["missing"][:20],
        "wrong_size": dict(list(judged["wrong_size"].items())[:20]),
        "extra_files": _extras(final, files) if exists and judged["state"] != "complete" else [],
        "_actions": actions, "_files": files, "_judged": judged, "_staging": staging, "_sstate": sstate,
    }


def protect_home_problem(host, m):
    p = os.path.normpath(m["final"])
    for h in HIDDEN_BY_PROTECT_HOME:
        if p == h or p.startswith(h + "/"):
            return ("%s: model directory %s is under %s, which the units' ProtectHome= hides from SGLang (a worker "
                    "would see nothing); fix: set sglang_model_root to a path outside /home, /root and /run/user "
                    "(e.g. /models)" % (host, p, h))
    return None


def existing_ancestor(path):
    p = path
    while p and not os.path.exists(p):
        p = os.path.dirname(p)
    return p or "/"


def filesystems(host, results, reserve):
    """Need per file system (models sharing one are summed), with the refusal when it does not fit."""
    by_dev = {}
    for r in results:
        anc = existing_ancestor(os.path.dirname(r["final"]))
        st = os.statvfs(anc)
        dev = os.stat(anc).st_dev
        mp, fstype, device = mio.mount_of(anc)
        fs = by_dev.setdefault(dev, {"mount": mp, "fstype": fstype, "device": device,
                                     "avail_bytes": st.f_bavail * st.f_frsize, "need_bytes": 0,
                                     "reserve_bytes": int(reserve), "models": []})
        fs["need_bytes"] += r["need_bytes"]
        fs["models"].append(r["rel"])
    out = []
    for fs in by_dev.values():
        fs["problem"] = None
        if fs["need_bytes"] > 0:
            fs["problem"] = mw.space_verdict(host, "%s (%s, %s)" % (fs["mount"], fs["fstype"], fs["device"]),
                                             fs["need_bytes"], fs["avail_bytes"], fs["reserve_bytes"], fs["models"])
        out.append(fs)
    return out


def public(r):
    return {k: v for k, v in r.items() if not k.startswith("_")}


# --- sources ---------------------------------------------------------------------------------------------------------------
def describe(src):
    t = src.get("type")
    if t == "path":
        return "path %s" % src.get("path")
    if t == "http":
        return src.get("url")
    if t == "s3":
        return "s3 %s bucket %s" % (src.get("endpoint"), src.get("bucket"))
    if t == "controller":
        return "the controller (%s)" % src.get("url")
    if t == "peer":
        return "peer %s (%s)" % (src.get("host") or "?", src.get("url"))
    return str(t)


class Fetcher:
    """Opens a reader at an offset for one file of one model from one source."""

    def __init__(self, src, rel, secrets, stall_s):
        self.src, self.rel, self.secrets, self.stall_s = src, rel, secrets, stall_s
        self.t = src.get("type")

    def _curl_stdin(self):
        if self.t in ("peer", "controller"):
            return mio.curl_config(["Authorization: Bearer " + (self.secrets.get("peer_token") or "")])
        headers = []
        if self.secrets.get("http_token"):
            headers.append("Authorization: Bearer " + self.secrets["http_token"])
        return mio.curl_config(headers, self.secrets.get("http_user"), self.secrets.get("http_password"))

    def url(self, name):
        base = self.src["url"]
        if self.t in ("peer", "controller"):
            base = base.rstrip("/") + "/v1/files"
        return mio.url_for(base, self.rel, name)

    def open(self, name, offset):
        if self.t == "path":
            return mio.FileReader(os.path.join(self.src["path"], self.rel, name), offset, root=self.src["path"])
        redact = [self.secrets.get(k) for k in ("peer_token", "http_token", "http_password", "s3_secret_access_key",
                                                "s3_access_key_id")]
        if self.t in ("http", "peer", "controller"):
            return mio.ProcessReader(mio.curl_argv(self.url(name), offset, self.src.get("ca_file", ""),
                                                   stall_s=self.stall_s),
                                     stdin=self._curl_stdin(), describe="curl %s" % self.url(name), redact=redact)
        if self.t == "s3":
            return mio.ProcessReader(mio.rclone_cat_argv(self.src, self.rel, name, offset),
                                     env=mio.rclone_env(self.src, self.secrets),
                                     describe="rclone cat src:%s" % mio.s3_key(self.src, self.rel, name),
                                     redact=redact, classify=mio.classify_rclone)
        raise mio.SourceError("source type %r has no reader" % self.t, retry=False)

    def probe(self, names, files, parallel, delays=()):
        """{name: (kind, why)} of the files the source lacks, holds with another size, refuses, or does not answer
        for (after the bounded retries of `delays`), before the first byte. kind: missing, size, denied, symlink,
        network, server, other (model_weights.probe_message words each)."""
        bad = {}
        if self.t == "path":
            root = self.src["path"]
            for n in names:
                p = os.path.join(root, self.rel, n)
                link = mio.symlink_below(root, self.rel + "/" + n)
                st = _stat(p)
                if link:
                    bad[n] = ("symlink", "%s is a symlink to %s" % link)
                elif st is None:
                    bad[n] = ("missing", "not found (%s)" % p)
                elif st.st_size != int(files[n]["size"]):
                    bad[n] = ("size", "%d bytes at %s" % (st.st_size, p))
            return bad
        if self.t == "s3":
            listing, err = None, None
            for d in list(delays) + [None]:
                try:
                    listing = mio.rclone_list(self.src, self.rel, self.secrets)
                    break
                except mio.SourceError as exc:
                    err = exc
                    if not exc.retry or d is None:
                        break
                    time.sleep(d)
            if listing is None:   # one entry: the listing failed, so none of the names could be checked
                return {names[0]: ("listing", "listing src:%s failed: %s" % (mio.s3_key(self.src, self.rel), err))}
            for n in names:
                if n not in listing:
                    bad[n] = ("missing", "no object src:%s" % mio.s3_key(self.src, self.rel, n))
                elif listing[n] != int(files[n]["size"]):
                    bad[n] = ("size", "object of %d bytes" % listing[n])
            return bad
        if self.t in ("http", "controller"):
            redact = [self.secrets.get("http_token"), self.secrets.get("http_password"), self.secrets.get("peer_token")]

            def head_once(n):
                rd = mio.ProcessReader(mio.curl_argv(self.url(n), 0, self.src.get("ca_file", ""), head=True),
                                       stdin=self._curl_stdin(), describe="curl --head %s" % self.url(n),
                                       redact=redact)
                out = bytearray()
                buf = bytearray(65536)
                try:
                    while True:
                        k = rd.readinto(buf)
                        if not k:
                            break
                        out += buf[:k]
                    rd.close()
                except mio.SourceError as exc:
                    return exc
                return mio.head_content_length(out.decode("latin-1"))

            def head(n):
                for d in list(delays) + [None]:
                    got = head_once(n)
                    if not isinstance(got, mio.SourceError):
                        break
                    if not got.retry or d is None:
                        return (got.kind, str(got))
                    time.sleep(d)
                if got is not None and got != int(files[n]["size"]):
                    return ("size", "%d bytes at the source (Content-Length)" % got)
                return None
            with ThreadPoolExecutor(max_workers=max(1, min(8, parallel * 2))) as ex:
                for n, why in zip(names, ex.map(head, names)):
                    if why:
                        bad[n] = why
        return bad


class PeerState:
    """What a peer has verified of one model (GET /v1/state/<rel>, at most once a second, shared by the workers)."""

    def __init__(self, src, rel, token):
        self.src, self.rel, self.token = src, rel, token
        self.lock = threading.Lock()
        self.at, self.doc, self.err = 0.0, None, None

    def get(self):
        import http.client
        from urllib.parse import urlsplit
        with self.lock:
            if time.time() - self.at < 1.0:
                return self.doc, self.err
            self.at = time.time()
            u = urlsplit(self.src["url"])
            try:
                conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=10)
                conn.request("GET", "/v1/state/" + mio.quote(self.rel, safe="/"),
                             headers={"Authorization": "Bearer " + self.token})
                resp = conn.getresponse()
                body = resp.read()
                conn.close()
                if resp.status != 200:
                    self.doc, self.err = None, "HTTP %d" % resp.status
                else:
                    self.doc, self.err = json.loads(body.decode()), None
            except (OSError, ValueError) as exc:
                self.doc, self.err = None, str(exc)
            return self.doc, self.err


# --- stage ----------------------------------------------------------------------------------------------------------------
class Progress:
    def __init__(self, path, host):
        self.path, self.host = path, host
        self.lock = threading.Lock()
        self.total = self.done = self.files_total = self.files_done = self.files_verified = self.hashed = 0
        self.sources = []
        self.samples = []
        self.finished = False
        self.waiting = 0
        self.lock_wait = None
        self.t0 = time.time()

    def add(self, n):
        with self.lock:
            self.done += n

    def write(self):
        with self.lock:
            now = time.time()
            self.samples.append((now, self.done))
            self.samples = [s for s in self.samples if now - s[0] <= 10.5]
            t0, d0 = self.samples[0]
            rate = (self.done - d0) / (now - t0) if now - t0 > 0.5 else (self.done / max(now - self.t0, 1e-3))
            doc = {"host": self.host, "bytes_done": self.done, "bytes_total": self.total, "rate_bps": rate,
                   "files_done": self.files_done, "files_total": self.files_total, "bytes_hashed": self.hashed,
                   "sources": self.sources, "waiting_on_peer": self.waiting, "elapsed_s": round(now - self.t0, 1),
                   "finished": self.finished, "time": now, "waiting_on_lock": self.lock_wait}
        try:
            mio.write_json_atomic(self.path, doc, mode=0o600)
        except OSError:
            pass


class VerifyError(Exception):
    """The bytes are not the manifest's (after the one clean retry a resumed file gets)."""


class Stager:
    def __init__(self, module, p, secrets, counters):
        self.module, self.p, self.secrets, self.counters = module, p, secrets, counters
        self.host = p["host"]
        try:
            self.uid = pwd.getpwnam(p["owner"]).pw_uid
            self.gid = grp.getgrnam(p["group"]).gr_gid
        except KeyError as exc:
            module.fail_json(msg="%s: %s does not exist (the staged files are owned by %s:%s so that the service user "
                                 "reads them); fix: create it, or set model_weights_owner / model_weights_group"
                                 % (self.host, exc, p["owner"], p["group"]), problems=[])
        self.fmode = int(p["file_mode"], 8)
        self.dmode = int(p["dir_mode"], 8)
        self.behind = p.get("writeback", "behind") == "behind"
        self.errors = []
        self.lock = threading.Lock()
        self.active = []
        self.progress = Progress(os.path.join(p["run_dir"], "progress.json"), self.host)
        self.delays = mio.backoff_delays(p["retries"], p["retry_delay_s"], p["retry_max_delay_s"])

    def install_sigterm(self):
        """SIGTERM (a takeover by the next run, or an operator's kill): the transfer tools end at once and the
        process exits 143, but never inside the switch into place (that finishes first). Verified files and .part
        files stay where they are; the next run resumes them."""
        self.critical = threading.Lock()
        self.term = False

        def handler(signum, frame):
            self.term = True
            mio.kill_children()
            if self.critical.acquire(False):
                os._exit(143)
        signal.signal(signal.SIGTERM, handler)

    # --- the record in the staging directory (what is verified) and the run status (what the server reports) ---
    def write_status(self, ctx):
        with ctx["lock"]:
            doc = {"rel": ctx["rel"], "status": ctx["status"], "failed": dict(ctx["failed"]), "heartbeat": time.time(),
                   "manifest_sha256": ctx["digest"]}
        mio.write_json_atomic(os.path.join(self.p["run_dir"], mw.status_name(ctx["rel"])), doc, mode=0o600)

    def write_record(self, ctx):
        with ctx["lock"]:
            doc = {"manifest_sha256": ctx["digest"], "model": ctx["rel"], "verified": dict(ctx["verified"]),
                   "parts": dict(ctx["parts"])}
        mio.write_json_atomic(os.path.join(ctx["staging"], mw.STAGING_STATE), doc, mode=self.fmode, uid=self.uid,
                              gid=self.gid)

    def heartbeat(self):
        for ctx in list(self.active):
            try:
                self.write_status(ctx)
            except OSError:
                pass

    def fail(self, ctx, name, msg):
        with ctx["lock"]:
            ctx["failed"][name] = msg
        with self.lock:
            self.errors.append(msg)

    def note(self, ctx, msg):
        with ctx["lock"]:
            ctx["notes"].append(msg)

    # --- directories and ownership ---
    def makedirs(self, path, mode, owned=True):
        missing = []
        p = path
        while not os.path.isdir(p):
            missing.append(p)
            p = os.path.dirname(p)
        for d in reversed(missing):
            try:
                os.mkdir(d, mode)
            except OSError as exc:
                if exc.errno != errno.EEXIST:
                    raise
            os.chown(d, self.uid if owned else 0, self.gid if owned else 0)
            os.chmod(d, mode)

    def own(self, target):
        """chown/chmod a file of the model directory through a descriptor opened without following a symlink
        (O_NOFOLLOW: ELOOP on a link), so nothing outside the model root is ever changed."""
        if isinstance(target, int):
            os.fchown(target, self.uid, self.gid)
            os.fchmod(target, self.fmode)
            return
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            os.fchown(fd, self.uid, self.gid)
            os.fchmod(fd, self.fmode)
        finally:
            os.close(fd)

    def record_verified(self, ctx, name, path, st=None):
        key = mw.stat_key(st if st is not None else os.lstat(path))
        with ctx["lock"]:
            ctx["verified"][name] = {"sha256": ctx["files"][name]["sha256"], "size": int(ctx["files"][name]["size"]),
                                     "stat": key}
            ctx["parts"].pop(name, None)
        self.write_record(ctx)
        with self.progress.lock:
            self.progress.files_verified += 1

    # --- one file ---
    def hashed(self, n):
        self.counters.add("weight_read", n)
        with self.progress.lock:
            self.progress.hashed += n

    def fetched(self, n):
        self.counters.add("fetched", n)
        self.progress.add(n)

    def fetch_file(self, ctx, a):
        """Fetch, hash while writing, fsync, verify, chown, rename. Tries the model's source, and after a peer that
        failed, the fallback source."""
        name = a["name"]
        dest = os.path.join(ctx["staging"], name)
        self.makedirs(os.path.dirname(dest), self.dmode)
        with ctx["lock"]:
            ctx["parts"][name] = ctx["files"][name]["sha256"]
        self.write_record(ctx)
        sources = [ctx["source"]] + ([ctx["fallback"]] if ctx.get("fallback") else [])
        for i, src in enumerate(sources):
            why = self.fetch_from(ctx, name, src, last=i == len(sources) - 1)
            if why is None:
                with self.progress.lock:
                    self.progress.files_done += 1
                return
            self.note(ctx, "%s: %s/%s: %s %s failed (%s); fetched from %s instead" % (
                self.host, ctx["rel"], name, src["type"], src.get("host") or "", why, describe(sources[i + 1])))

    def fetch_from(self, ctx, name, src, last):
        """None when the file is verified in place; a reason when this peer failed and the next source should be
        tried; raises SourceError / VerifyError / WriteError / OSError otherwise."""
        want = ctx["files"][name]
        size = int(want["size"])
        part = os.path.join(ctx["staging"], name + mw.PART_SUFFIX)
        fetcher = Fetcher(src, ctx["rel"], self.secrets, self.p["stall_s"])
        clean_retry = False
        while True:
            fd = os.open(part, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                have = os.fstat(fd).st_size
                if have > size:
                    os.ftruncate(fd, 0)
                    have = 0
                h = hashlib.sha256()
                if have:
                    mio.hash_prefix(fd, have, h, self.hashed)
                resumed, segments, attempt = have, 0, 0
                while have < size or segments == 0:
                    if src["type"] == "peer":
                        why = self.wait_peer(ctx, name)
                        if why:
                            if not last:
                                return why
                            raise mio.SourceError("peer %s: %s" % (src.get("host"), why), retry=False)
                    os.lseek(fd, have, os.SEEK_SET)
                    try:
                        rd = fetcher.open(name, have)
                        ok = False
                        try:
                            n = mio.copy_stream(rd, fd, h, size - have, on_bytes=self.fetched,
                                                write_behind=mio.WINDOW if self.behind else None,
                                                drop=self.behind and self.p["drop_cache"],
                                                how=ctx.get("wb_how", "sfr"))
                            ok = True
                        finally:
                            rd.close(ok)
                        segments += 1
                        have += n
                        if n == 0:
                            break            # the source ended early: a short file, judged below
                    except mio.SourceError as exc:
                        segments += 1
                        got = os.fstat(fd).st_size
                        if exc.range_unsupported and got == have:
                            # the server answered 200 to a range (curl exit 33): start the file from its first byte
                            os.ftruncate(fd, 0)
                            have, h, resumed = 0, hashlib.sha256(), 0
                            continue
                        have = got           # every byte handed to the writer was written and hashed
                        attempt += 1
                        if not exc.retry or attempt > self.p["retries"]:
                            if src["type"] == "peer" and not last:
                                return str(exc)
                            raise mio.SourceError(mw.source_failure_text(exc, exc.kind, attempt, have, size, part),
                                                  retry=False, kind=exc.kind) from None
                        time.sleep(self.delays[min(attempt, len(self.delays)) - 1] if self.delays else 0)
                t_sync = time.time()
                os.fdatasync(fd)
                self.counters.add("fsync_s", time.time() - t_sync)
                if self.behind and self.p["drop_cache"]:
                    mio.drop_cache(fd)
                got = h.hexdigest()
                if have == size and got == want["sha256"]:
                    self.own(fd)
                    dest = os.path.join(ctx["staging"], name)
                    mio.rename_verified(fd, part, dest)
                    self.record_verified(ctx, name, dest, os.fstat(fd))
                    return None
                os.close(fd)
                fd = None
                os.unlink(part)
                if src["type"] == "peer" and not last:
                    return "its bytes did not verify (sha256 %s, %d bytes)" % (got, have)
                if (resumed or segments > 1) and not clean_retry:
                    clean_retry = True       # it came in pieces: one clean fetch from the first byte decides
                    continue
                shown = ("more than %d" % size) if have > size else str(have)
                raise VerifyError(mw.mismatch_message(self.host, ctx["rel"], name, describe(src), got, shown, want,
                                                      ctx["where"]))
            finally:
                if fd is not None:
                    os.close(fd)

    def wait_peer(self, ctx, name):
        """None once the peer has verified `name`; else why it never will (the fallback source is used then)."""
        ps = ctx["peer_state"]
        start = time.time()
        last_count, last_change = -1, start
        with self.progress.lock:
            self.progress.waiting += 1
        try:
            while True:
                doc, err = ps.get()
                now = time.time()
                if doc is not None:
                    if name in doc.get("verified", []):
                        return None
                    if name in (doc.get("failed") or {}):
                        return "the peer could not stage it: %s" % doc["failed"][name]
                    if doc.get("status") in ("failed", "complete"):
                        return "the peer's stage ended (%s) without this file" % doc.get("status")
                    if len(doc.get("verified", [])) != last_count:
                        last_count, last_change = len(doc.get("verified", [])), now
                    age = doc.get("heartbeat_age")
                    if age is not None and age > 120:
                        return "the peer's stage has not reported for %d s" % age
                elif now - start > 60:
                    return "the peer's weights server does not answer (%s)" % err
                if now - last_change > self.p["peer_wait_s"]:
                    return "the peer verified no file for %d s (model_weights_peer_wait_s)" % self.p["peer_wait_s"]
                time.sleep(0.5)
        finally:
            with self.progress.lock:
                self.progress.waiting -= 1

    def adopt(self, ctx, a):
        """Hash a present file nothing proves; True when it is the manifest's (it is then linked or kept)."""
        name = a["name"]
        base = ctx["final"] if a["from"] == "final" else ctx["staging"]
        path = os.path.join(base, name)
        if mio.symlink_below(base, name):
            return False
        got, size = mio.hash_file(path, self.hashed)
        want = ctx["files"][name]
        if got == want["sha256"] and size == int(want["size"]):
            return True
        self.note(ctx, "%s: %s/%s held sha256 %s, %d bytes; expected %s, %d bytes: fetched again" % (
            self.host, ctx["rel"], name, got, size, want["sha256"], int(want["size"])))
        if a["from"] == "staging":
            os.unlink(path)
        return False

    def link_from_final(self, ctx, name):
        src = os.path.join(ctx["final"], name)
        dest = os.path.join(ctx["staging"], name)
        self.makedirs(os.path.dirname(dest), self.dmode)
        if os.path.lexists(dest):
            os.unlink(dest)
        if mio.symlink_below(ctx["final"], name):
            raise OSError(errno.ELOOP, "%s is a symlink (never linked into the new directory)" % src)
        os.link(src, dest)
        self.own(dest)
        self.record_verified(ctx, name, dest)

    def write_marker(self, ctx, directory, keys):
        files = ctx["files"]
        mio.write_json_atomic(os.path.join(directory, mw.MANIFEST_NAME), json.loads(mw.manifest_text(files)),
                              mode=self.fmode, uid=self.uid, gid=self.gid)
        doc = mw.marker_doc(ctx["rel"], ctx["digest"], files, keys, describe(ctx["source"]), ctx["need"],
                            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        mio.write_json_atomic(os.path.join(directory, mw.MARKER_NAME), doc, mode=self.fmode, uid=self.uid,
                              gid=self.gid)
        os.chown(directory, self.uid, self.gid)
        os.chmod(directory, self.dmode)

    def avail(self, path):
        try:
            st = os.statvfs(existing_ancestor(path))
            return st.f_bavail * st.f_frsize
        except OSError:
            return 0

    # --- one model directory ---
    def prepare_staging(self, ctx, r, actions):
        """The staging directory of r holds this manifest's files only (an older content, a foreign file: removed);
        what a resumed or already verified file carries over is recorded."""
        files, staging = r["_files"], r["_staging"]
        self.makedirs(os.path.dirname(r["final"]), 0o755, owned=False)
        self.makedirs(staging, self.dmode)
        keep = set(files) | {a["name"] + mw.PART_SUFFIX for a in actions if a["action"] == "resume"}
        keep.add(mw.STAGING_STATE)
        for dirpath, _dirs, names in os.walk(staging, topdown=False):
            for f in names:
                rel = os.path.relpath(os.path.join(dirpath, f), staging)
                if rel not in keep or (rel in files and any(a["name"] == rel and a["action"] == "fetch"
                                                            for a in actions)):
                    os.unlink(os.path.join(dirpath, f))
        for a in actions:
            if a["action"] == "have":
                ctx["verified"][a["name"]] = r["_sstate"]["verified"][a["name"]]
            elif a["action"] == "resume":
                ctx["parts"][a["name"]] = files[a["name"]]["sha256"]

    def fetch_one(self, ctx, r, a):
        """Fetch one file of r into its staging directory; a failure is recorded on ctx, never raised."""
        files, staging, src = r["_files"], r["_staging"], ctx["source"]
        name, want = a["name"], files[a["name"]]
        try:
            self.fetch_file(ctx, a)
        except VerifyError as exc:
            self.fail(ctx, name, str(exc))
        except mio.IdentityError as exc:
            self.fail(ctx, name, "%s: %s/%s: %s; it was not put in place; expected the file this run hashed; the "
                                 "serving copy is untouched; fix: something outside the stage writes into %s (stage "
                                 "runs hold %s): stop it, then re-run" % (self.host, r["rel"], name, exc, staging,
                                                                          mio.lock_path(r["final"])))
        except mio.SourceError as exc:
            self.fail(ctx, name, "%s: %s/%s from %s: %s; found: no complete file; expected %d bytes, sha256 %s; "
                                 "the serving copy is untouched" % (self.host, r["rel"], name, describe(src), exc,
                                                                    int(want["size"]), want["sha256"]))
        except (mio.WriteError, OSError) as exc:
            fs = mio.mount_of(staging)
            self.fail(ctx, name, "%s: writing %s/%s into %s (file system %s, %s): %s; found %s free; expected "
                                 "room for %d bytes; the serving copy is untouched" % (
                                     self.host, r["rel"], name, staging, fs[0], fs[1],
                                     getattr(exc, "strerror", None) or exc, mw.human(self.avail(staging)),
                                     int(want["size"])))

    def run_model(self, r, m, pool):
        t0 = time.time()
        files, actions, staging = r["_files"], [dict(a) for a in r["_actions"]], r["_staging"]
        ctx = {"rel": r["rel"], "final": r["final"], "staging": staging, "files": files, "digest": r["digest"],
               "need": r["need"], "where": m.get("where", "?"), "source": m.get("source") or {"type": "none"},
               "fallback": m.get("fallback"), "verified": {}, "parts": {}, "failed": {}, "status": "running",
               "notes": [], "lock": threading.Lock()}
        res = {"result": "unchanged", "errors": [], "sources": [], "bytes_fetched": 0, "swap": None, "notes": []}
        if r["state"] == "complete":
            return res
        # a directory that holds files its new manifest does not list (a dropped shard: SGLang loads every
        # *.safetensors of a directory without an index) is rebuilt through the staging directory and swapped,
        # never relabelled or adopted in place
        rebuild = bool(r.get("extra_files"))
        if rebuild:
            self.note(ctx, "%s: %s held %s that its manifest (%s) does not list: the directory was rebuilt without "
                           "them" % (self.host, r["final"], ", ".join(r["extra_files"][:10]), ctx["where"]))
        if r["state"] == "relabel" and not rebuild:
            self.write_marker(ctx, r["final"], {n: r["_judged"]["good"][n] for n in files})
            res["result"] = "relabelled"
            return res
        in_place = all(a["action"] == "link" or (a["action"] == "adopt" and a["from"] == "final") for a in actions)
        if r["state"] != "absent" and not rebuild and in_place:
            # everything is there already: hash what nothing proves; the directory stays where it is
            bad = [a for a in actions if a["action"] == "adopt" and not self.adopt(ctx, a)]
            if not bad:
                keys = {}
                for n in files:
                    path = os.path.join(r["final"], n)
                    self.own(path)
                    keys[n] = mw.stat_key(os.stat(path))
                self.write_marker(ctx, r["final"], keys)
                res.update(result="adopted", swap="in-place", notes=ctx["notes"])
                return res
            for a in bad:
                a.update(action="fetch", offset=0, bytes=int(files[a["name"]]["size"]))
        src = ctx["source"]
        fetch = [a for a in actions if a["action"] in ("fetch", "resume")]
        if fetch and src.get("type") == "none":
            msg = ("%s: %s lacks %d files of its manifest (%s) and model_weights_source is type none, so nothing can "
                   "fetch them; found: %s; expected: every file of %s; fix: copy them there, or set "
                   "model_weights_source" % (self.host, r["final"], len(fetch), ", ".join(a["name"] for a in fetch[:5]),
                                             "missing or other content", ctx["where"]))
            res.update(result="failed", errors=[msg])
            with self.lock:
                self.errors.append(msg)
            return res
        self.active.append(ctx)
        if fetch and src.get("type") != "peer":
            bad = Fetcher(src, r["rel"], self.secrets, self.p["stall_s"]).probe(
                [a["name"] for a in fetch], files, self.p["parallel"], self.delays)
            if bad:
                msg = mw.probe_message(self.host, describe(src), r["rel"], bad, files, ctx["where"])
                ctx["status"] = "failed"
                for n in bad:
                    ctx["failed"][n] = msg
                self.write_status(ctx)
                res.update(result="failed", errors=[msg])
                with self.lock:
                    self.errors.append(msg)
                return res
        if src.get("type") == "peer":
            ctx["peer_state"] = PeerState(src, r["rel"], self.secrets.get("peer_token") or "")
        res["sources"] = [describe(src)]
        self.prepare_staging(ctx, r, actions)
        ctx["wb_how"] = mio.write_behind_how(mio.mount_of(staging)[1])
        self.write_record(ctx)
        self.write_status(ctx)
        for a in actions:
            if a["action"] == "link":
                self.link_from_final(ctx, a["name"])
        adopts = [a for a in actions if a["action"] == "adopt"]
        for a, ok in zip(adopts, pool.map(lambda a: self.adopt(ctx, a), adopts)):
            if not ok:
                a.update(action="fetch", offset=0, bytes=int(files[a["name"]]["size"]))
                fetch.append(a)
            elif a["from"] == "final":
                self.link_from_final(ctx, a["name"])
            else:
                self.own(os.path.join(staging, a["name"]))
                self.record_verified(ctx, a["name"], os.path.join(staging, a["name"]))
        fetch.sort(key=lambda a: (-int(files[a["name"]]["size"]), a["name"]))

        list(pool.map(lambda a: self.fetch_one(ctx, r, a), fetch))
        res["notes"] = ctx["notes"]
        if ctx["failed"]:
            ctx["status"] = "failed"
            self.write_status(ctx)
            res.update(result="failed", errors=sorted(ctx["failed"].values()), elapsed_s=round(time.time() - t0, 2))
            return res
        keys = {n: mw.stat_key(os.lstat(os.path.join(staging, n))) for n in files}
        moved = mw.not_as_verified(keys, ctx["verified"])
        if moved:
            msg = ("%s: %s: %s in %s %s; expected the file%s this run verified (size, mtime, inode as recorded); "
                   "nothing was switched into place; the serving copy is untouched; fix: something outside the stage "
                   "writes into %s: stop it, then re-run" % (
                       self.host, r["rel"], ", ".join(moved[:5]), staging,
                       "is another file" if len(moved) == 1 else "are other files", "" if len(moved) == 1 else "s",
                       staging))
            ctx["status"] = "failed"
            self.write_status(ctx)
            res.update(result="failed", errors=[msg])
            with self.lock:
                self.errors.append(msg)
            return res
        self.write_marker(ctx, staging, keys)
        os.unlink(os.path.join(staging, mw.STAGING_STATE))
        for dirpath, _dirs, _names in os.walk(staging):
            mio.fsync_dir(dirpath)
        crit = getattr(self, "critical", None) or threading.Lock()
        with crit:
            old, how = mio.swap_into_place(staging, r["final"])
            if old:
                shutil.rmtree(old, ignore_errors=True)
        if getattr(self, "term", False):
            os._exit(143)
        ctx["status"] = "complete"
        self.write_status(ctx)
        res.update(result="done", swap=how, elapsed_s=round(time.time() - t0, 2),
                   writeback=("behind (%s)" % ctx["wb_how"]) if self.behind else "end")
        return res


def load_secrets(path):
    if not path:
        return {}
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, IOError, ValueError):
        return {}


def io_delta(before):
    after = mio.proc_io()
    return {k: after.get(k, 0) - before.get(k, 0) for k in ("rchar", "wchar", "syscr", "read_bytes", "write_bytes")}


def holder_doc(p):
    """Who holds a lock: this process, the run, the user (and whom sudo ran it for), since when."""
    user = pwd.getpwuid(os.getuid()).pw_name
    return {"pid": os.getpid(), "run_id": p["run_id"] or os.path.basename(p["run_dir"]), "since": time.time(),
            "user": user + (" (sudo from %s)" % os.environ["SUDO_USER"] if os.environ.get("SUDO_USER") else ""),
            "host": p["host"], "module": "model_weights_stage", "mode": p["mode"]}


def take_locks(module, p, finals, prog):
    """The lock of every model directory this run changes (model_weights_io.DirLock, sorted by path so two runs
    never wait on each other crosswise), held until the process ends. A directory another run holds: waited on up
    to lock_wait_s (the progress file says on whom), or with takeover that run (this module, by its pid) is ended
    first; then refused naming the holder."""
    t0 = time.time()
    holder = holder_doc(p)
    held = []
    for final in sorted(set(finals)):
        os.makedirs(os.path.dirname(final), 0o755, exist_ok=True)
        lock = mio.DirLock(final, holder)

        def on_wait(doc, waited, final=final):
            prog.lock_wait = "%s: %s is being staged by another run (%s); waited %d of %d s" % (
                p["host"], final, mio.holder_text(doc, mio.lock_path(final)), waited, p["lock_wait_s"])
            prog.write()
        if not lock.acquire(p["lock_wait_s"], takeover=p["takeover"], on_wait=on_wait):
            doc = mio.read_holder(lock.path)
            module.fail_json(msg=mw.lock_refusal(p["host"], final, mio.holder_text(doc, lock.path),
                                                 time.time() - t0, p["takeover"]),
                             problems=[], weight_bytes_read=0, io={}, elapsed_s=round(time.time() - t0, 3),
                             lock_holder=doc)
        held.append(lock)
    prog.lock_wait = None
    return {"locks": held, "waited_s": round(time.time() - t0, 2)}


def do_inspect(module, p, counters, io0, t0):
    verify_full = p["verify"] == "full"
    results, problems = [], []
    for m in p["models"]:
        if p["protect_home"]:
            why = protect_home_problem(p["host"], m)
            if why:
                problems.append(why)
        results.append(inspect_model(m, verify_full, counters))
    fss = filesystems(p["host"], results, p["reserve_bytes"])
    problems += [fs["problem"] for fs in fss if fs["problem"]]
    return results, fss, problems


def main():
    module = AnsibleModule(
        argument_spec=dict(
            mode=dict(type="str", required=True, choices=["inspect", "stage", "serve"]),
            host=dict(type="str", required=True),
            models=dict(type="list", elements="dict", default=[]),
            secrets_file=dict(type="path"),
            run_dir=dict(type="path", default="/run/b300-weights"),
            owner=dict(type="str", default="root"),
            group=dict(type="str", default="sglang"),
            file_mode=dict(type="str", default="0640"),
            dir_mode=dict(type="str", default="0750"),
            parallel=dict(type="int", default=4),
            writeback=dict(type="str", default="behind", choices=["behind", "end"]),
            drop_cache=dict(type="bool", default=False),
            retries=dict(type="int", default=3),
            reserve_bytes=dict(type="int", default=0),
            verify=dict(type="str", default="marker", choices=["marker", "full"]),
            protect_home=dict(type="bool", default=True),
            peer_wait_s=dict(type="int", default=600),
            stall_s=dict(type="int", default=60),
            bind_address=dict(type="str"),
            port=dict(type="int", default=31990),
            kind=dict(type="str", default="staged", choices=["staged", "source"]),
            root=dict(type="path"),
            stop_file=dict(type="path"),
            max_s=dict(type="int", default=86400),
            retry_delay_s=dict(type="float", default=2.0),
            retry_max_delay_s=dict(type="float", default=30.0),
            lock_wait_s=dict(type="int", default=300),
            takeover=dict(type="bool", default=False),
            run_id=dict(type="str", default=""),
        ),
        supports_check_mode=True,
    )
    p = module.params
    t0 = time.time()
    io0 = mio.proc_io()
    counters = Counters()
    bad_names = mw.check_models(p["host"], p["models"])
    if bad_names:
        module.fail_json(msg=" || ".join(bad_names[:20]), problems=bad_names, weight_bytes_read=0, io={},
                         elapsed_s=0.0)
    if p["mode"] == "serve":
        return serve(module, p, t0, io0)
    results, fss, problems = do_inspect(module, p, counters, io0, t0)
    out = dict(changed=False, problems=problems, filesystems=fss, models=[public(r) for r in results])
    if p["mode"] == "inspect" or module.check_mode or (not problems and all(
            r["state"] == "complete" for r in results)):
        out.update(weight_bytes_read=counters.weight_read, meta_bytes_read=counters.meta_read, io=io_delta(io0),
                   elapsed_s=round(time.time() - t0, 3))
        module.exit_json(**out)
    if problems:
        module.fail_json(msg=" || ".join(problems), weight_bytes_read=0, io=io_delta(io0), **{
            k: v for k, v in out.items() if k != "changed"})
    os.makedirs(p["run_dir"], 0o700, exist_ok=True)
    stager = Stager(module, p, load_secrets(p["secrets_file"]), counters)
    prog = stager.progress
    locks = take_locks(module, p, [r["final"] for r in results], prog)
    # under the locks, the directories are judged again: another run may have finished (or changed) them meanwhile
    results, fss, problems = do_inspect(module, p, counters, io0, t0)
    out.update(problems=problems, filesystems=fss, models=[public(r) for r in results])
    if problems:
        module.fail_json(msg=" || ".join(problems), weight_bytes_read=0, io=io_delta(io0), **{
            k: v for k, v in out.items() if k != "changed"})
    if all(r["state"] == "complete" for r in results):
        prog.finished = True
        prog.write()
        out.update(weight_bytes_read=counters.weight_read, meta_bytes_read=counters.meta_read, io=io_delta(io0),
                   elapsed_s=round(time.time() - t0, 3), lock_waited_s=locks["waited_s"])
        module.exit_json(**out)
    stager.install_sigterm()
    prog.total = sum(r["fetch_bytes"] for r in results)
    prog.files_total = sum(r["actions"].get("fetch", 0) + r["actions"].get("resume", 0) for r in results)
    prog.sources = sorted({describe(m.get("source") or {"type": "none"}) for m, r in zip(p["models"], results)
                           if r["state"] not in ("complete",)})
    stop = threading.Event()

    def ticker():
        while not stop.wait(2.0):
            prog.write()
            stager.heartbeat()
    prog.write()
    tk = threading.Thread(target=ticker)
    tk.daemon = True
    tk.start()
    res = []
    with ThreadPoolExecutor(max_workers=max(1, p["parallel"])) as pool:
        for r, m in zip(results, p["models"]):
            res.append(stager.run_model(r, m, pool))
    stop.set()
    prog.finished = True
    prog.write()
    for r, x in zip(out["models"], res):
        r.update(x)
    notes = [n for x in res for n in x.get("notes") or []]
    changed = any(x["result"] not in ("unchanged",) for x in res)
    elapsed = round(time.time() - t0, 3)
    fetched = counters.fetched
    out.update(changed=changed, errors=stager.errors, notes=notes, weight_bytes_read=counters.weight_read,
               lock_waited_s=locks["waited_s"],
               bytes_fetched=fetched, io=io_delta(io0), elapsed_s=elapsed, fsync_s=round(counters.fsync_s, 2),
               rate_bps=round(fetched / elapsed, 1) if elapsed else 0)
    if stager.errors:
        module.fail_json(msg=" || ".join(stager.errors[:20]), **out)
    module.exit_json(**out)


def serve(module, p, t0, io0):
    if module.check_mode:
        module.exit_json(changed=False, served={}, problems=[], weight_bytes_read=0, io={}, elapsed_s=0.0)
    secrets = load_secrets(p["secrets_file"])
    token = secrets.get("peer_token") or ""
    if not token:
        module.fail_json(msg="%s: serve mode needs peer_token in the secrets file" % p["host"], problems=[])
    models = []
    for m in p["models"]:
        files = mw.subset(m["files"], m.get("need", "full"))
        final = os.path.realpath(m["final"]) if m.get("final") else None
        models.append({"rel": m["rel"], "names": set(files), "digest": mw.manifest_digest(files), "final": final,
                       "staging": staging_path(final) if final else None, "root": p["root"],
                       "status_name": mw.status_name(m["rel"])})
    # one server per port: an earlier run's server (a Ctrl-C'd play leaves its async job) holds this lock; with
    # takeover it is ended (SIGTERM) like an earlier stage, else this run is refused naming it
    run_parent = os.path.dirname(os.path.abspath(p["run_dir"]))
    os.makedirs(run_parent, 0o700, exist_ok=True)
    port_lock = mio.DirLock(os.path.join(run_parent, "serve-%d" % p["port"]), holder_doc(p))
    if not port_lock.acquire(10 if p["takeover"] else 0, takeover=p["takeover"]):
        module.fail_json(msg="%s: port %s is served by an earlier run's weights server: %s; fix: re-run with -e "
                             "model_weights_takeover=true to end it, or wait until it stops (its max_s)" % (
                                 p["host"], p["port"], mio.holder_text(mio.read_holder(port_lock.path),
                                                                       port_lock.path)),
                         problems=[], lock_holder=mio.read_holder(port_lock.path))
    try:
        srv = mio.WeightsServer(p["bind_address"], p["port"], token, models, kind=p["kind"], run_dir=p["run_dir"])
    except OSError as exc:
        module.fail_json(msg="%s: cannot listen on %s:%s for the hosts that pull from it: %s; fix: free the port or "
                             "set model_weights_serve_port" % (p["host"], p["bind_address"], p["port"], exc.strerror),
                         problems=[])
    srv.start()
    os.makedirs(p["run_dir"], 0o700, exist_ok=True)
    served_path = os.path.join(p["run_dir"], "served-%s.json" % p["kind"])
    try:
        while time.time() - t0 < p["max_s"] and not (p["stop_file"] and os.path.exists(p["stop_file"])):
            time.sleep(0.5)
            mio.write_json_atomic(served_path, srv.stats(), mode=0o600)
    finally:
        srv.stop()
    stats = srv.stats()
    mio.write_json_atomic(served_path, stats, mode=0o600)
    module.exit_json(changed=False, served=stats, problems=[], weight_bytes_read=0, io=io_delta(io0),
                     elapsed_s=round(time.time() - t0, 3))


if __name__ == "__main__":
    main()
