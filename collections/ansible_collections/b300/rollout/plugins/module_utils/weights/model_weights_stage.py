# -*- coding: utf-8 -*-
"""The weights stage's engine on a host (issue 28; moved out of plugins/modules/model_weights_stage.py by issue 39,
which is now its shell): inspect what each model directory holds, stage what it lacks through a sibling staging
directory (fetch, resume, adopt, verify, swap into place under the directory's lock), or serve verified files to the
peer hosts. `run(params, check_mode)` returns the module's result or raises StageFailed with the failure's result.
The decisions are model_weights.py (pure); the file system and HTTP work is model_weights_io.py.

How each step is made safe (kept from the module's documentation): each buffer is hashed while it is written (no
second read), the file is fsynced, its size and sha256 compared with the manifest, chowned and renamed; a .part left
by an earlier run resumes after its prefix is re-hashed; the staging directory is swapped into place with renameat2
RENAME_EXCHANGE. The directory lock is a flock held on a descriptor the process keeps open until it ends (a killed
run frees it), with the holder (pid, run id, user, since) written into it; takeover sends SIGTERM only to a process
of this module. Only the holder touches the staging directory, so no run deletes another run's .part. A verified
file is renamed while the descriptor that was hashed is open and its inode is compared before and after; the marker
records the inodes verified. The controller's server refuses symlinks naming their target; in a model directory a
symlink counts as missing and is replaced by a verified file; ownership is changed through O_NOFOLLOW descriptors
only."""
from __future__ import absolute_import, division, print_function
__metaclass__ = type

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

from ansible_collections.b300.rollout.plugins.module_utils.common import host_lock as hl
from ansible_collections.b300.rollout.plugins.module_utils.weights import model_weights as mw
from ansible_collections.b300.rollout.plugins.module_utils.weights import model_weights_io as mio

HIDDEN_BY_PROTECT_HOME = ("/home", "/root", "/run/user")


class StageFailed(Exception):
    """The run failed: msg and the rest of the module's failure result (the module passes both to fail_json)."""

    def __init__(self, msg, **result):
        Exception.__init__(self, msg)
        self.msg, self.result = msg, result


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
    def __init__(self, p, secrets, counters):
        self.p, self.secrets, self.counters = p, secrets, counters
        self.host = p["host"]
        try:
            self.uid = pwd.getpwnam(p["owner"]).pw_uid
            self.gid = grp.getgrnam(p["group"]).gr_gid
        except KeyError as exc:
            raise StageFailed("%s: %s does not exist (the staged files are owned by %s:%s so that the service user "
                              "reads them); fix: create it, or set model_weights_owner / model_weights_group"
                              % (self.host, exc, p["owner"], p["group"]), problems=[]) from None
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
        """Bring one model directory to its manifest: relabel or adopt it in place where its bytes already are,
        else fetch what it lacks into its staging directory and swap that into place. Its result, never raised."""
        t0 = time.time()
        files, actions = r["_files"], [dict(a) for a in r["_actions"]]
        ctx = {"rel": r["rel"], "final": r["final"], "staging": r["_staging"], "files": files, "digest": r["digest"],
               "need": r["need"], "where": m.get("where", "?"), "source": m.get("source") or {"type": "none"},
               "fallback": m.get("fallback"), "verified": {}, "parts": {}, "failed": {}, "status": "running",
               "notes": [], "lock": threading.Lock()}
        res = {"result": "unchanged", "errors": [], "sources": [], "bytes_fetched": 0, "swap": None, "notes": []}
        if r["state"] == "complete":
            return res
        if self.in_place(ctx, r, actions, res):
            return res
        fetch = [a for a in actions if a["action"] in ("fetch", "resume")]
        if self.unfetchable(ctx, r, fetch, res):
            return res
        src = ctx["source"]
        if src.get("type") == "peer":
            ctx["peer_state"] = PeerState(src, r["rel"], self.secrets.get("peer_token") or "")
        res["sources"] = [describe(src)]
        self.gather(ctx, r, actions, fetch, pool)
        list(pool.map(lambda a: self.fetch_one(ctx, r, a), fetch))
        res["notes"] = ctx["notes"]
        if ctx["failed"]:
            ctx["status"] = "failed"
            self.write_status(ctx)
            res.update(result="failed", errors=sorted(ctx["failed"].values()), elapsed_s=round(time.time() - t0, 2))
            return res
        return self.switch_into_place(ctx, r, res, t0)

    def in_place(self, ctx, r, actions, res):
        """A directory whose bytes are all there is relabelled, or its unproven files hashed (adopted), where it is;
        True when that finished r (res says how). A directory holding files its new manifest does not list (a
        dropped shard: SGLang loads every *.safetensors of a directory without an index) is rebuilt through the
        staging directory and swapped, never relabelled or adopted in place. Adopts that fail become fetches."""
        files = r["_files"]
        rebuild = bool(r.get("extra_files"))
        if rebuild:
            self.note(ctx, "%s: %s held %s that its manifest (%s) does not list: the directory was rebuilt without "
                           "them" % (self.host, r["final"], ", ".join(r["extra_files"][:10]), ctx["where"]))
        if r["state"] == "relabel" and not rebuild:
            self.write_marker(ctx, r["final"], {n: r["_judged"]["good"][n] for n in files})
            res["result"] = "relabelled"
            return True
        in_place = all(a["action"] == "link" or (a["action"] == "adopt" and a["from"] == "final") for a in actions)
        if r["state"] == "absent" or rebuild or not in_place:
            return False
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
            return True
        for a in bad:
            a.update(action="fetch", offset=0, bytes=int(files[a["name"]]["size"]))
        return False

    def unfetchable(self, ctx, r, fetch, res):
        """True (res failed, the error recorded) when files must be fetched and no source can give them: source
        type none, or the source's probe finds files missing or of the wrong size. Marks ctx active otherwise."""
        src = ctx["source"]
        if fetch and src.get("type") == "none":
            msg = ("%s: %s lacks %d files of its manifest (%s) and model_weights_source is type none, so nothing can "
                   "fetch them; found: %s; expected: every file of %s; fix: copy them there, or set "
                   "model_weights_source" % (self.host, r["final"], len(fetch), ", ".join(a["name"] for a in fetch[:5]),
                                             "missing or other content", ctx["where"]))
            res.update(result="failed", errors=[msg])
            with self.lock:
                self.errors.append(msg)
            return True
        self.active.append(ctx)
        if not fetch or src.get("type") == "peer":
            return False
        bad = Fetcher(src, r["rel"], self.secrets, self.p["stall_s"]).probe(
            [a["name"] for a in fetch], r["_files"], self.p["parallel"], self.delays)
        if not bad:
            return False
        msg = mw.probe_message(self.host, describe(src), r["rel"], bad, r["_files"], ctx["where"])
        ctx["status"] = "failed"
        for n in bad:
            ctx["failed"][n] = msg
        self.write_status(ctx)
        res.update(result="failed", errors=[msg])
        with self.lock:
            self.errors.append(msg)
        return True

    def gather(self, ctx, r, actions, fetch, pool):
        """Into the staging directory: the record, links to the final directory's good files, adopted files (those
        that fail their hash join fetch); fetch is then sorted largest first."""
        files, staging = r["_files"], r["_staging"]
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

    def switch_into_place(self, ctx, r, res, t0):
        """Every file verified: check none changed since (size, mtime, inode), write the marker, fsync, swap the
        staging directory into place (never interrupted by SIGTERM); res updated and returned."""
        files, staging = r["_files"], r["_staging"]
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


def take_locks(p, finals, prog):
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
            raise StageFailed(mw.lock_refusal(p["host"], final, mio.holder_text(doc, lock.path), time.time() - t0,
                                              p["takeover"]),
                              problems=[], weight_bytes_read=0, io={}, elapsed_s=round(time.time() - t0, 3),
                              lock_holder=doc)
        held.append(lock)
    prog.lock_wait = None
    return {"locks": held, "waited_s": round(time.time() - t0, 2)}


def do_inspect(p, counters):
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


def run(p, check_mode):
    """The module's whole run on params p (its argument spec's keys): the result of a success, StageFailed else."""
    t0 = time.time()
    io0 = mio.proc_io()
    counters = Counters()
    bad_names = mw.check_models(p["host"], p["models"])
    if bad_names:
        raise StageFailed(" || ".join(bad_names[:20]), problems=bad_names, weight_bytes_read=0, io={}, elapsed_s=0.0)
    if p["mode"] == "serve":
        return serve(p, check_mode, t0, io0)
    results, fss, problems = do_inspect(p, counters)
    out = dict(changed=False, problems=problems, filesystems=fss, models=[public(r) for r in results])
    if p["mode"] == "inspect" or check_mode or (not problems and all(
            r["state"] == "complete" for r in results)):
        out.update(weight_bytes_read=counters.weight_read, meta_bytes_read=counters.meta_read, io=io_delta(io0),
                   elapsed_s=round(time.time() - t0, 3))
        return out
    _refuse_problems(problems, out, io0)
    os.makedirs(p["run_dir"], 0o700, exist_ok=True)
    stager = Stager(p, load_secrets(p["secrets_file"]), counters)
    prog = stager.progress
    locks = take_locks(p, [r["final"] for r in results], prog)
    # under the locks, the directories are judged again: another run may have finished (or changed) them meanwhile
    results, fss, problems = do_inspect(p, counters)
    out.update(problems=problems, filesystems=fss, models=[public(r) for r in results])
    _refuse_problems(problems, out, io0)
    if all(r["state"] == "complete" for r in results):
        prog.finished = True
        prog.write()
        out.update(weight_bytes_read=counters.weight_read, meta_bytes_read=counters.meta_read, io=io_delta(io0),
                   elapsed_s=round(time.time() - t0, 3), lock_waited_s=locks["waited_s"])
        return out
    res = stage_models(p, stager, results)
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
        raise StageFailed(" || ".join(stager.errors[:20]), **out)
    return out


def _refuse_problems(problems, out, io0):
    if problems:
        raise StageFailed(" || ".join(problems), weight_bytes_read=0, io=io_delta(io0), **{
            k: v for k, v in out.items() if k != "changed"})


def stage_models(p, stager, results):
    """Stage every model of results (the pool fetches p["parallel"] files at once) while a ticker writes the
    progress file and the heartbeats every 2 s; one result per model, in order."""
    prog = stager.progress
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
    return res


def run_gone(run):
    """Whether the run a server was started for (run_identity's pid and start) has ended; no run named: never.
    A PID reused by a later process has another start time (the host lock's own process_alive)."""
    return bool(run and run.get("pid")) and not hl.process_alive(run["pid"], run.get("start"))


def serve(p, check_mode, t0, io0):
    """serve mode: the verified files of p["models"] to the peers that hold the token, until max_s or stop_file."""
    if check_mode:
        return dict(changed=False, served={}, problems=[], weight_bytes_read=0, io={}, elapsed_s=0.0)
    secrets = load_secrets(p["secrets_file"])
    token = secrets.get("peer_token") or ""
    if not token:
        raise StageFailed("%s: serve mode needs peer_token in the secrets file" % p["host"], problems=[])
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
        raise StageFailed("%s: port %s is served by an earlier run's weights server: %s; fix: re-run with -e "
                          "model_weights_takeover=true to end it, or wait until it stops (its max_s)" % (
                              p["host"], p["port"], mio.holder_text(mio.read_holder(port_lock.path),
                                                                    port_lock.path)),
                          problems=[], lock_holder=mio.read_holder(port_lock.path))
    try:
        srv = mio.WeightsServer(p["bind_address"], p["port"], token, models, kind=p["kind"], run_dir=p["run_dir"])
    except OSError as exc:
        raise StageFailed("%s: cannot listen on %s:%s for the hosts that pull from it: %s; fix: free the port or "
                          "set model_weights_serve_port" % (p["host"], p["bind_address"], p["port"], exc.strerror),
                          problems=[]) from None
    srv.start()
    os.makedirs(p["run_dir"], 0o700, exist_ok=True)
    served_path = os.path.join(p["run_dir"], "served-%s.json" % p["kind"])
    try:
        while time.time() - t0 < p["max_s"] and not (p["stop_file"] and os.path.exists(p["stop_file"])):
            if run_gone(p.get("watch_run")):
                break       # the run that started it is gone (Ctrl-C, kill -9): no one pulls from it any more
            time.sleep(0.5)
            mio.write_json_atomic(served_path, srv.stats(), mode=0o600)
    finally:
        srv.stop()
    stats = srv.stats()
    mio.write_json_atomic(served_path, stats, mode=0o600)
    return dict(changed=False, served=stats, problems=[], weight_bytes_read=0, io=io_delta(io0),
                elapsed_s=round(time.time() - t0, 3))
