# -*- coding: utf-8 -*-
"""The weights stage's I/O (issue 28): bytes in, sha256 while writing, fsync, rename; the sources' readers; the
read-only HTTP server a seed (or the controller) runs for the hosts that pull from it; the swap into place.

Why a writer of our own (measured, docs/weights-staging.md): the field's tools move the bytes (curl for an HTTP(S)
mirror, a peer or the controller; rclone for an S3-compatible store; a plain read for a path the host sees), but none
of them hashes what it writes: `rsync`/`rclone copy` followed by `sha256sum` reads every byte a second time, and the
project needs sha256 (SGLang's manifest), not rsync's MD5 or rclone's size/modtime. So the tool streams to a pipe and
copy_stream() hashes each buffer in the reading thread while a writer thread writes the previous ones (hash and disk
overlap), then fdatasync()s: no second read.

Stdlib only (these run inside Ansible modules on the hosts).
"""
from __future__ import absolute_import, division, print_function
__metaclass__ = type

import ctypes
import ctypes.util
import errno
import hashlib
import json
import os
import queue
import shutil
import socket
import subprocess
import tempfile
import threading
import time

try:
    from http.server import BaseHTTPRequestHandler, HTTPServer
    from socketserver import ThreadingMixIn
    from urllib.parse import quote, unquote
except ImportError:  # pragma: no cover  (Python 2 is not a target; keeps ansible-test's import check quiet)
    BaseHTTPRequestHandler = HTTPServer = ThreadingMixIn = object
    quote = unquote = None

BUF = 8 << 20          # 8 MiB reads (large blocks: fewer syscalls, hashlib releases the GIL above 2 KiB)
DEPTH = 4              # buffers queued for the writer thread
WINDOW = 64 << 20      # write-behind: write-back of every 64 MiB written starts at once, the one before is waited on
PIPE_SIZE = 1 << 20    # a tool's stdout pipe (the kernel's default 64 KiB: a 100 KiB curl write blocks, many wakeups)
CURL_RANGE_ERROR = 33  # curl: "HTTP server doesn't seem to support byte ranges. Cannot resume." (CURLE_RANGE_ERROR)


class SourceError(Exception):
    """The source failed (missing file, connection lost, tool error); `retry` says whether trying again may help."""

    def __init__(self, msg, retry=True, range_unsupported=False, status=None, kind="other"):
        super().__init__(msg)
        self.retry, self.range_unsupported, self.status, self.kind = retry, range_unsupported, status, kind


class WriteError(Exception):
    """Writing on this host failed (ENOSPC, EIO): not the source's fault, never retried."""


# --- readers ------------------------------------------------------------------------------------------------------------
class FileReader:
    """A file the host can read (local disk, NFS), from `offset`."""

    def __init__(self, path, offset=0, root=None):
        self.path = path
        try:
            if root:    # the source directory: no symlink between it and the file (open_below)
                self.fd = open_below(root, os.path.relpath(path, root))
            else:
                self.fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise SourceError("cannot open %s: %s" % (path, exc.strerror), retry=exc.errno not in (
                errno.ENOENT, errno.EACCES, errno.EISDIR, errno.ELOOP),
                kind="missing" if exc.errno == errno.ENOENT else "other") from None
        if offset:
            os.lseek(self.fd, offset, os.SEEK_SET)

    def readinto(self, buf):
        try:
            return os.readv(self.fd, [buf])
        except OSError as exc:
            raise SourceError("reading %s: %s" % (self.path, exc.strerror)) from None

    def close(self, ok=True):
        os.close(self.fd)


CHILDREN = set()     # the transfer tools running now (kill_children ends them on SIGTERM)


def kill_children():
    for proc in list(CHILDREN):
        try:
            proc.kill()
        except OSError:
            pass


class ProcessReader:
    """The stdout of a transfer tool (curl, rclone cat). Secrets go in `env` or as `stdin` (curl -K -), never argv.
    close() waits for the tool and raises SourceError with its exit code and the tail of its stderr."""

    def __init__(self, argv, env=None, stdin=None, describe=None, redact=(), classify=None):
        self.describe = describe or argv[0]
        self.classify = classify or classify_failure
        self.redact = [r for r in redact if r]
        self.err = tempfile.TemporaryFile()
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                                         stdout=subprocess.PIPE, stderr=self.err, env=env, bufsize=0,
                                         close_fds=True)
        except OSError as exc:
            raise SourceError("cannot run %s: %s" % (argv[0], exc.strerror), retry=False) from None
        CHILDREN.add(self.proc)
        if stdin is not None:
            try:
                self.proc.stdin.write(stdin)
                self.proc.stdin.close()
            except OSError:
                pass
        self.out = self.proc.stdout
        try:   # F_SETPIPE_SZ: fewer, larger reads and writes between the tool and us (Linux; best effort)
            import fcntl
            fcntl.fcntl(self.out.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_SIZE)
        except (OSError, ImportError):
            pass

    def readinto(self, buf):
        return self.out.readinto(buf) or 0

    def stderr_text(self):
        self.err.seek(0)
        text = self.err.read()[-4000:].decode("utf-8", "replace")
        for secret in self.redact:
            text = text.replace(secret, "<redacted>")
        return text

    def close(self, ok=True):
        if not ok and self.proc.poll() is None:
            self.proc.kill()
        try:
            self.out.close()
        except OSError:
            pass
        rc = self.proc.wait()
        CHILDREN.discard(self.proc)
        text = self.stderr_text()
        self.err.close()
        if ok and rc != 0:
            lines = [ln for ln in text.splitlines() if ln.strip()]
            code = [ln.split("=", 1)[1] for ln in lines if ln.startswith("b300-http-code=")]
            msg = [ln for ln in lines if not ln.startswith("b300-http-code=")]
            status = int(code[-1]) if code and code[-1].isdigit() and int(code[-1]) else None
            why = "; ".join(msg[-3:]) or "no message"
            kind, transient = self.classify(rc, status)
            if rc == CURL_RANGE_ERROR:
                kind, transient = "other", True
            raise SourceError("%s exited %d%s: %s" % (self.describe, rc, " (HTTP %d)" % status if status else "", why),
                              retry=transient, range_unsupported=rc == CURL_RANGE_ERROR, status=status, kind=kind)
        return rc


def curl_argv(url, offset=0, ca_file="", connect_timeout_s=10, stall_s=60, head=False):
    """curl for one HTTP(S) GET (or HEAD) to stdout; credentials come on stdin as a curl config (-K -), never in argv.
    `-C N` makes curl fail with exit 33 when the server ignores the range (answers 200): the caller restarts the
    file from 0 instead of appending a second copy of its start."""
    argv = ["curl", "--silent", "--show-error", "--fail", "--location", "--proto", "=http,https",
            "--connect-timeout", str(int(connect_timeout_s)), "--speed-limit", "1", "--speed-time", str(int(stall_s)),
            "-K", "-", "--write-out", "%{stderr}b300-http-code=%{http_code}\\n"]
    if ca_file:
        argv += ["--cacert", ca_file]
    if head:
        argv += ["--head", "--output", "-"]     # the headers on stdout: the pre-check reads Content-Length
    else:
        argv += ["--output", "-"]
        if offset:
            argv += ["--continue-at", str(int(offset))]
    return argv + ["--url", url]


def curl_config(headers=None, user=None, password=None):
    """curl -K config text: one quoted `header = "..."` per header, `user = "u:p"` (never on argv)."""
    lines = []
    for h in headers or []:
        lines.append('header = "%s"' % h.replace("\\", "\\\\").replace('"', '\\"'))
    if user:
        lines.append('user = "%s:%s"' % (user.replace("\\", "\\\\").replace('"', '\\"'),
                                         (password or "").replace("\\", "\\\\").replace('"', '\\"')))
    return ("\n".join(lines) + "\n").encode()


def rclone_env(source, secrets, base_env=None):
    """Environment of an rclone child for an S3-compatible store: the remote 'src' defined by RCLONE_CONFIG_SRC_*
    (rclone's documented env config), the keys from the secrets file; nothing on argv, no config file."""
    env = dict(base_env if base_env is not None else os.environ)
    env.update({
        "RCLONE_CONFIG": "/dev/null",
        "RCLONE_CONFIG_SRC_TYPE": "s3",
        "RCLONE_CONFIG_SRC_PROVIDER": source.get("provider") or "Other",
        "RCLONE_CONFIG_SRC_ENDPOINT": source.get("endpoint") or "",
        "RCLONE_CONFIG_SRC_REGION": source.get("region") or "",
        "RCLONE_CONFIG_SRC_ACCESS_KEY_ID": secrets.get("s3_access_key_id") or "",
        "RCLONE_CONFIG_SRC_SECRET_ACCESS_KEY": secrets.get("s3_secret_access_key") or "",
        "RCLONE_CONFIG_SRC_FORCE_PATH_STYLE": "true",
    })
    if not secrets.get("s3_access_key_id"):
        env["RCLONE_CONFIG_SRC_ENV_AUTH"] = "true"
    return env


def s3_key(source, rel, name=None):
    parts = [source.get("bucket", "").strip("/"), (source.get("prefix") or "").strip("/"), rel] + ([name] if name else [])
    return "/".join(p for p in parts if p)


def rclone_cat_argv(source, rel, name, offset=0):
    argv = ["rclone", "cat", "--low-level-retries", "3", "--retries", "1"]
    if offset:
        argv += ["--offset", str(int(offset))]
    if source.get("ca_file"):
        argv += ["--ca-cert", source["ca_file"]]
    return argv + ["src:" + s3_key(source, rel, name)]


def rclone_list(source, rel, secrets, timeout_s=300):
    """{name: size} of the objects under the model's prefix (one listing, `rclone lsjson -R --files-only`)."""
    argv = ["rclone", "lsjson", "-R", "--files-only", "--no-mimetype", "--no-modtime"]
    if source.get("ca_file"):
        argv += ["--ca-cert", source["ca_file"]]
    argv.append("src:" + s3_key(source, rel))
    what = "rclone lsjson src:%s" % s3_key(source, rel)
    keys = (secrets.get("s3_secret_access_key"), secrets.get("s3_access_key_id"))
    try:
        res = subprocess.run(argv, env=rclone_env(source, secrets), capture_output=True, timeout=timeout_s,
                             check=False)
    except subprocess.TimeoutExpired:
        raise SourceError("%s gave no answer in %d s (timed out)" % (what, timeout_s), kind="network") from None
    except OSError as exc:
        raise SourceError("cannot run rclone: %s" % exc.strerror, retry=False, kind="tool") from None
    if res.returncode != 0:
        err = redact(res.stderr.decode("utf-8", "replace"), keys)
        if res.returncode == 3:   # rclone: directory not found
            return {}
        # rclone's exit codes (rclone docs, "Exit Code"): 1 syntax or usage error, 2 error not otherwise
        # categorised, 5 temporary error (one that more retries might fix), 6 less serious (NoRetry), 7 fatal
        lines = [ln.strip() for ln in err.strip().splitlines() if ln.strip()]
        raise SourceError("%s exited %d: %s" % (what, res.returncode, " / ".join(lines[-2:]) or "no message"),
                          retry=res.returncode == 5, kind="network" if res.returncode == 5 else "other")
    try:
        return {e["Path"]: int(e["Size"]) for e in json.loads(res.stdout.decode() or "[]")}
    except (ValueError, KeyError, TypeError) as exc:
        raise SourceError("%s printed no listing rclone lsjson writes (%s): %r" % (
            what, exc, redact(res.stdout.decode("utf-8", "replace")[:200], keys)), retry=False) from None


def url_for(base, rel, name):
    return base.rstrip("/") + "/" + quote(rel + "/" + name, safe="/")


# curl's exit codes (curl(1) EXIT CODES, libcurl-errors(3)) that say the transfer broke or never connected: worth a
# bounded retry. 6 (host not resolved) is not among them: a wrong name does not heal by waiting.
CURL_TRANSIENT = {7: "connection refused or host unreachable (curl 7)", 18: "transfer closed with bytes missing "
                  "(curl 18)", 28: "timed out (curl 28)", 52: "empty reply from the server (curl 52)",
                  55: "connection broken while sending (curl 55)", 56: "connection reset or broken while receiving "
                  "(curl 56)", 35: "TLS handshake failed (curl 35)"}


def classify_failure(rc, status):
    """(kind, transient) of a failed transfer from curl's exit code and the HTTP status it saw:
    kind one of missing (404/410), denied (401/403), short (416: the source holds fewer bytes than asked for),
    server (5xx), network (refused, reset, timed out), other."""
    if status in (404, 410):
        return "missing", False
    if status in (401, 403):
        return "denied", False
    if status == 416:
        return "short", False
    if status is not None and 500 <= status <= 599:
        return "server", True
    if rc in CURL_TRANSIENT:
        return "network", True
    if status == 429 or status == 408:
        return "server", True
    return "other", rc not in (6, 22, 23, CURL_RANGE_ERROR)


def classify_rclone(rc, status=None):
    """(kind, transient) of a failed `rclone cat` from its exit code (rclone docs, "Exit Code"): 3 directory not
    found and 4 file not found are missing, 5 a temporary error (retries might fix) is network, 7 a fatal error (one
    that more retries won't fix) and 1 a usage error are not retried; others (2 uncategorised, 6) are retried."""
    if rc in (3, 4):
        return "missing", False
    if rc == 5:
        return "network", True
    if rc in (1, 7):
        return "other", False
    return "other", True


def backoff_delays(retries, first_s, max_s):
    """The waits before each retry: first_s, doubling, at most max_s each (bounded, deterministic)."""
    out, d = [], max(0.0, float(first_s))
    for _i in range(max(0, int(retries))):
        out.append(min(float(max_s), d))
        d = d * 2 if d else 0.0
    return out


def head_content_length(text):
    """Content-Length of the last response in `curl --head` output (redirects print one block each), or None."""
    blocks = [b for b in text.replace("\r\n", "\n").split("\n\n") if b.strip()]
    if not blocks:
        return None
    for line in blocks[-1].splitlines():
        k, sep, v = line.partition(":")
        if sep and k.strip().lower() == "content-length" and v.strip().isdigit():
            return int(v.strip())
    return None


def redact(text, secrets):
    for secret in secrets:
        if secret:
            text = text.replace(secret, "<redacted>")
    return text


# --- symlinks and names -------------------------------------------------------------------------------------------------
def symlink_below(root, name):
    """(link, target) of the first symlink on the way from `root` (itself trusted) to root/name, or None.
    Every component is lstat()ed: a source or a model directory never hands out a file from elsewhere."""
    p = root
    for part in name.split("/"):
        p = os.path.join(p, part)
        try:
            if os.path.islink(p):
                return p, os.readlink(p)
        except OSError:
            return None
    return None


def open_below(root, name, flags=os.O_RDONLY):
    """os.open of root/name refusing a symlink in any component (OSError ELOOP naming the link and its target)."""
    link = symlink_below(root, name)
    if link:
        raise OSError(errno.ELOOP, "%s is a symlink to %s (refused: only regular files inside the directory)" % link)
    return os.open(os.path.join(root, name), flags | getattr(os, "O_NOFOLLOW", 0))


class IdentityError(WriteError):
    """The file at a path is not the one this process hashed (another writer in the staging directory)."""


def rename_verified(fd, part, dest):
    """Rename `part` to `dest` only when it is the file held open on `fd` (the one hashed): (st_dev, st_ino) of the
    path is compared with fstat(fd) before and after the rename; IdentityError otherwise (nothing unverified is
    ever given the final name by this call without being caught)."""
    want = os.fstat(fd)
    ident = (want.st_dev, want.st_ino)
    st = os.lstat(part)
    if (st.st_dev, st.st_ino) != ident:
        raise IdentityError("%s is no longer the file that was hashed (inode %d, found %d)" % (
            part, want.st_ino, st.st_ino))
    os.rename(part, dest)
    st = os.lstat(dest)
    if (st.st_dev, st.st_ino) != ident:
        raise IdentityError("%s is not the file that was hashed after the rename (inode %d, found %d)" % (
            dest, want.st_ino, st.st_ino))


# --- the per-directory lock -------------------------------------------------------------------------------------------
LOCK_SUFFIX = ".b300-lock"


def lock_path(final):
    """<parent>/.<name>.b300-lock beside the model directory: kept for good (removing a flock file races)."""
    return os.path.join(os.path.dirname(final), "." + os.path.basename(final) + LOCK_SUFFIX)


def read_holder(path):
    """The holder a lock file names ({pid, run_id, user, since, host}) or {}."""
    try:
        with open(path, "rb") as fh:
            return json.loads(fh.read(65536).decode("utf-8") or "{}")
    except (OSError, IOError, ValueError):
        return {}


def holder_text(doc, path):
    if not doc:
        return "an unknown holder (lock file %s)" % path
    since = doc.get("since")
    return "pid %s, run %s, user %s, since %s (%s ago) (lock file %s)" % (
        doc.get("pid"), doc.get("run_id") or "-", doc.get("user") or "?",
        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since)) if since else "?",
        "%d s" % (time.time() - since) if since else "?", path)


def pid_is_stage(pid):
    """Whether `pid` runs this module (its command line names model_weights_stage): the only process a takeover
    may end."""
    try:
        with open("/proc/%d/cmdline" % int(pid), "rb") as fh:
            return b"model_weights_stage" in fh.read()
    except (OSError, IOError, ValueError, TypeError):
        return False


class DirLock:
    """flock(LOCK_EX) on lock_path(final), held on an fd this process keeps open for its whole life: the kernel
    releases it when the process ends, however it ends (SIGKILL included), so a dead holder never blocks anyone.
    The holder writes who it is into the file; a refused run names that holder."""

    def __init__(self, final, holder):
        self.final, self.path, self.holder, self.fd = final, lock_path(final), holder, None

    def try_lock(self):
        import fcntl
        flags = getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | flags, 0o644)
        except PermissionError:
            # another user's lock file (a controller shared by two users): flock works on a read-only descriptor;
            # the holder named in it then stays the last one that could write it
            fd = os.open(self.path, os.O_RDONLY | flags)
            self.holder = None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                return False
            raise
        self.fd = fd
        if self.holder is not None:
            data = json.dumps(self.holder, sort_keys=True).encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
        return True

    def acquire(self, wait_s, takeover=False, on_wait=None, term_wait_s=30, sleep=time.sleep):
        """True once held. While another run holds it: with takeover, that holder (when it is this module) gets
        SIGTERM once and is waited on; else wait up to wait_s, on_wait(holder doc, waited s) about every second.
        False when still held after that (read_holder(self.path) names who)."""
        import signal
        t0 = time.time()
        termed = False
        while True:
            if self.try_lock():
                return True
            doc = read_holder(self.path)
            waited = time.time() - t0
            if takeover and not termed and doc.get("pid") and pid_is_stage(doc["pid"]) \
                    and int(doc["pid"]) != os.getpid():
                try:
                    os.kill(int(doc["pid"]), signal.SIGTERM)
                except OSError:
                    pass
                termed = True
                wait_s = max(wait_s, waited + term_wait_s)
            if waited >= wait_s:
                return False
            if on_wait:
                on_wait(doc, waited)
            sleep(min(1.0, max(0.05, wait_s - waited)))

    def release(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


# --- the copy ------------------------------------------------------------------------------------------------------------
def hash_prefix(fd, length, h, counter=None):
    """Feed the first `length` bytes of fd into h (the resumed .part's prefix: re-hashed once, never re-fetched)."""
    buf = bytearray(BUF)
    off = 0
    while off < length:
        n = os.preadv(fd, [memoryview(buf)[:min(BUF, length - off)]], off)
        if n <= 0:
            raise WriteError("the .part file shrank while it was being re-hashed (%d of %d bytes)" % (off, length))
        h.update(memoryview(buf)[:n])
        off += n
        if counter:
            counter(n)
    return off


def hash_file(path, counter=None):
    """(sha256 hex, size) of a whole file (a file adopted without proof; the full-verify option)."""
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        hash_prefix(fd, size, h, counter)
    finally:
        os.close(fd)
    return h.hexdigest(), size


_SFR_WAIT_BEFORE, _SFR_WRITE, _SFR_WAIT_AFTER = 1, 2, 4
_SFR = []


def _sync_file_range_fn():
    """libc's sync_file_range(2), or None (not Linux, not in this libc)."""
    if not _SFR:
        fn = None
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            fn = getattr(libc, "sync_file_range", None)
            if fn is not None:
                fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
                fn.restype = ctypes.c_int
        except OSError:
            fn = None
        _SFR.append(fn)
    return _SFR[0]


def drop_cache(fd, offset=0, length=0):
    """posix_fadvise(DONTNEED): the clean pages of that range leave the page cache (best effort)."""
    try:
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
    except (OSError, AttributeError):
        pass


# file systems whose sync_file_range(2) does nothing: overlayfs hands the write to the file below it, but
# sync_file_range works on the overlay's own (empty) page mapping; posix_fadvise is passed down
SFR_NOOP_FS = ("overlay",)


class WriteBehind:
    """Write-back as the bytes come, not at the end: once `window` bytes more are written, their write-back starts
    and the window before is waited on, so at most two windows per file are dirty or in flight, the final fdatasync
    finds little left, and the dirty pages never reach the kernel's background threshold late (the disk idle until
    then) or its dirty limit (where every writer on the host is throttled at once).

    how: 'sfr' sync_file_range (WRITE on the new window, WAIT_BEFORE|WRITE|WAIT_AFTER on the one before);
    'fadvise' for a file system where sync_file_range does nothing (overlayfs: SFR_NOOP_FS): POSIX_FADV_DONTNEED
    on the window just written starts its write-back in the file below (its pages are dirty then, so they stay
    cached) and nothing is waited on (the kernel's dirty throttling bounds it); with `drop`, the window before is
    dropped by a second DONTNEED.
    drop: the window waited on leaves the page cache too (POSIX_FADV_DONTNEED), so a copy written once does not
    evict what is read next. Neither replaces the fdatasync before the file is verified and renamed
    (sync_file_range writes no metadata and flushes no device cache). An I/O error it sees raises OSError (the
    writer reports it like a write's)."""

    def __init__(self, fd, start, window=WINDOW, drop=False, how="sfr"):
        self.fd, self.window, self.drop, self.how = fd, int(window), bool(drop), how
        self.done = start            # write-back started for every byte before this offset
        self.inflight = []
        self.sfr = _sync_file_range_fn() if how == "sfr" else None

    def _call(self, off, n, flags):
        if self.sfr is None:
            return
        if self.sfr(self.fd, off, n, flags) != 0:
            e = ctypes.get_errno()
            if e in (errno.ENOSYS, errno.EINVAL, errno.ESPIPE, getattr(errno, "ENOTSUP", errno.EINVAL)):
                self.sfr = None      # this file system or kernel cannot: the final fdatasync does it all
                return
            raise OSError(e, os.strerror(e))

    def wrote(self, pos):
        """The file now holds every byte before `pos`."""
        while pos - self.done >= self.window:
            off, self.done = self.done, self.done + self.window
            if self.how == "fadvise":
                drop_cache(self.fd, off, self.window)
            else:
                self._call(off, self.window, _SFR_WRITE)
            self.inflight.append(off)
            if len(self.inflight) > 1:
                old = self.inflight.pop(0)
                if self.how != "fadvise":
                    self._call(old, self.window, _SFR_WAIT_BEFORE | _SFR_WRITE | _SFR_WAIT_AFTER)
                if self.drop:
                    drop_cache(self.fd, old, self.window)


def write_behind_how(fs_type):
    """The WriteBehind method for a file system type (mount_of()'s second field)."""
    return "fadvise" if fs_type in SFR_NOOP_FS else "sfr"


def copy_stream(reader, fd, h, limit, on_bytes=None, bufsize=BUF, depth=DEPTH, write_behind=None, drop=False,
                how="sfr"):
    """Read from `reader` until EOF (or `limit` + 1 bytes: more than the manifest's size is already wrong), hash each
    buffer here, write it in a writer thread (the disk write overlaps the next read and hash). Each buffer is filled
    before it is handed over (a pipe returns at most its size per read: one hand-over per 8 MiB, not per 64 KiB).
    write_behind: a window in bytes (WriteBehind; None or 0: the write-back is left to the kernel and the caller's
    fdatasync); drop: the written windows leave the page cache; how: WriteBehind's method. Returns the bytes written. A write error raises
    WriteError; the reader's own errors propagate after the writer drained (the bytes read before them are hashed
    and written)."""
    q = queue.Queue(depth)
    bufs = [bytearray(bufsize) for _i in range(depth + 2)]
    state = {"err": None}
    wb = WriteBehind(fd, os.lseek(fd, 0, os.SEEK_CUR), write_behind, drop, how) if write_behind else None

    def writer():
        pos = os.lseek(fd, 0, os.SEEK_CUR)
        while True:
            mv = q.get()
            if mv is None:
                return
            if state["err"] is not None:
                continue
            try:
                while mv:
                    n = os.write(fd, mv)
                    mv = mv[n:]
                    pos += n
                if wb is not None:
                    wb.wrote(pos)
            except OSError as exc:
                state["err"] = exc

    th = threading.Thread(target=writer, name="weights-writer")
    th.daemon = True
    th.start()
    total, i = 0, 0
    try:
        while total <= limit:
            if state["err"] is not None:
                break
            buf = bufs[i % len(bufs)]
            i += 1
            want = min(bufsize, limit + 1 - total)
            n, eof, err = 0, False, None
            while n < want:
                try:
                    got = reader.readinto(memoryview(buf)[n:want])
                except SourceError as exc:
                    err = exc
                    break
                if not got:
                    eof = True
                    break
                n += got
            if n:
                mv = memoryview(buf)[:n]
                h.update(mv)
                q.put(mv)
                total += n
                if on_bytes:
                    on_bytes(n)
            if err is not None:
                raise err
            if eof or not n:
                break
    finally:
        q.put(None)
        th.join()
    if state["err"] is not None:
        exc = state["err"]
        raise WriteError("%s%s" % (exc.strerror or exc, " (no space left on the device)" if exc.errno == errno.ENOSPC
                                   else ""))
    return total


# --- files and directories -------------------------------------------------------------------------------------------
def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path, doc, mode=0o640, uid=-1, gid=-1):
    """Write JSON next to `path`, fsync, rename over it (readers see the old or the new file, never half)."""
    tmp = "%s.tmp-%d-%d" % (path, os.getpid(), threading.get_ident())
    data = json.dumps(doc, indent=1, sort_keys=True).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        if uid != -1 or gid != -1:
            os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)
    return len(data)


def read_json(path, counter=None):
    try:
        with open(path, "rb") as fh:
            data = fh.read(64 << 20)
    except (OSError, IOError):
        return None
    if counter:
        counter(len(data))
    try:
        return json.loads(data.decode("utf-8"))
    except ValueError:
        return None


_RENAME_EXCHANGE = 2


def _renameat2(a, b, flags):
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is None:
        raise OSError(errno.ENOSYS, "renameat2 not in this libc")
    at_fdcwd = -100
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def swap_into_place(staging, final):
    """Put the complete staging directory at `final` in one step: rename() when nothing is there, else an atomic
    exchange (renameat2 RENAME_EXCHANGE: a reader sees the old directory or the new one, never neither, never half).
    Where the file system cannot exchange (EINVAL, ENOSYS), the old one is renamed aside first: for an instant the
    path does not exist (a worker starting then fails and restarts; none ever sees half a model). Returns the path
    that now holds the old directory (to be removed), or None, and the method used."""
    parent = os.path.dirname(final)
    if not os.path.lexists(final):
        os.rename(staging, final)
        fsync_dir(parent)
        return None, "rename"
    try:
        _renameat2(staging, final, _RENAME_EXCHANGE)
        fsync_dir(parent)
        return staging, "exchange"
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOSYS, getattr(errno, "ENOTSUP", errno.EINVAL)):
            raise
    old = final + ".b300-old"
    if os.path.lexists(old):
        shutil.rmtree(old, ignore_errors=True)
    os.rename(final, old)
    os.rename(staging, final)
    fsync_dir(parent)
    return old, "rename-aside"


def mount_of(path, mountinfo="/proc/self/mountinfo"):
    """(mount point, fs type, source) of the file system holding `path` (the longest mount point prefix)."""
    real = os.path.realpath(path)
    best = ("/", "?", "?")
    try:
        with open(mountinfo) as fh:
            for line in fh:
                left, _sep, right = line.partition(" - ")
                fields, rest = left.split(), right.split()
                if len(fields) < 5 or len(rest) < 2:
                    continue
                mp = fields[4].replace("\\040", " ")
                if (real == mp or real.startswith(mp.rstrip("/") + "/")) and len(mp) >= len(best[0]):
                    best = (mp, rest[0], rest[1])
    except (OSError, IOError):
        pass
    return best


def proc_io():
    """This process's /proc/self/io counters (rchar: every byte read() returned, page cache included)."""
    out = {}
    try:
        with open("/proc/self/io") as fh:
            for line in fh:
                k, _sep, v = line.partition(":")
                out[k.strip()] = int(v)
    except (OSError, IOError, ValueError):
        pass
    return out


# --- the server a seed or the controller runs ------------------------------------------------------------------------
class _Server(ThreadingMixIn, HTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        """A request that broke (a client gone mid-file): counted, not printed over the module's JSON."""
        self.errors = getattr(self, "errors", 0) + 1


class WeightsServer:
    """Read-only HTTP/1.1 with byte ranges (RFC 7233: `Range: bytes=N-` / `N-M` -> 206 + Content-Range; 416 past the
    end) for the hosts that pull from this one, bound to one address, every request carrying the run's token.

      GET|HEAD /v1/files/<model rel>/<name>   a file of a model this server knows, and only a name of its manifest
      GET      /v1/state/<model rel>          {"status", "verified": [names], "failed": {name: error}, "heartbeat_age"}

    kind 'source' (the controller's path): files come from <root>/<rel>/<name>. kind 'staged' (a host): from the
    final directory when its marker is for this manifest, else from the staging directory, and only files its
    record lists as verified, opened and checked against the recorded inode (a file swapped away in between is
    never served as the other one). Counts bytes and requests per model (stats())."""

    def __init__(self, address, port, token, models, kind="staged", run_dir=None):
        self.token, self.kind, self.run_dir = token, kind, run_dir
        self.models = {m["rel"]: m for m in models}
        self.lock = threading.Lock()
        self.counts = {}
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            server_version = "b300-weights"

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                outer._handle(self, head=True)

            def do_GET(self):
                outer._handle(self, head=False)

        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        _Server.address_family = family
        self.httpd = _Server((address, int(port)), Handler)
        self.thread = None

    def start(self):
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.2})
        self.thread.daemon = True
        self.thread.start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def stats(self):
        with self.lock:
            return json.loads(json.dumps(self.counts))

    def _count(self, rel, key, n=1):
        with self.lock:
            c = self.counts.setdefault(rel, {"requests": 0, "bytes": 0, "refused": 0})
            c[key] += n

    @staticmethod
    def _reply(h, code, body=b"", ctype="application/json", head=False, extra=None):
        h.send_response(code)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            h.send_header(k, v)
        h.end_headers()
        if body and not head:
            h.wfile.write(body)

    def state(self, rel):
        """What this server can serve of a model now."""
        m = self.models.get(rel)
        if m is None:
            return None
        if self.kind == "source":
            return {"status": "complete", "verified": sorted(m["names"]), "failed": {}, "heartbeat_age": 0}
        marker = read_json(os.path.join(m["final"], ".b300-stage.json")) or {}
        if marker.get("manifest_sha256") == m["digest"]:
            return {"status": "complete", "verified": sorted(marker.get("files") or {}), "failed": {},
                    "heartbeat_age": 0, "_dir": m["final"], "_files": marker.get("files") or {}}
        status = read_json(os.path.join(self.run_dir or "/nonexistent", m["status_name"])) or {}
        if status.get("manifest_sha256") != m["digest"]:
            return {"status": "pending", "verified": [], "failed": {}, "heartbeat_age": None}
        age = round(time.time() - float(status.get("heartbeat") or 0), 1)
        rec = read_json(os.path.join(m["staging"], ".b300-staging.json")) or {}
        verified = (rec.get("verified") or {}) if rec.get("manifest_sha256") == m["digest"] else {}
        return {"status": status.get("status", "running"), "verified": sorted(verified),
                "failed": status.get("failed") or {}, "heartbeat_age": age, "_dir": m["staging"], "_files": verified}

    def _handle(self, h, head):
        auth = h.headers.get("Authorization", "")
        path = unquote(h.path.split("?", 1)[0])
        if auth != "Bearer " + self.token:
            self._count("-", "refused")
            return self._reply(h, 401, b'{"error": "token"}', head=head)
        prefix = next((p for p in ("/v1/state/", "/v1/files/") if path.startswith(p)), None)
        if prefix is None:
            return self._reply(h, 404, b'{"error": "path"}', head=head)
        what = "state" if prefix == "/v1/state/" else "file"
        rest = path[len(prefix):]
        rel = next((r for r in sorted(self.models, key=len, reverse=True) if rest == r or rest.startswith(r + "/")),
                   None)
        if rel is None:
            return self._reply(h, 404, b'{"error": "model"}', head=head)
        if what == "state":
            st = self.state(rel)
            body = json.dumps({k: v for k, v in st.items() if not k.startswith("_")}).encode()
            return self._reply(h, 200, body, head=head)
        name = rest[len(rel) + 1:]
        m = self.models[rel]
        if name not in m["names"]:
            return self._reply(h, 404, b'{"error": "not in the manifest"}', head=head)
        if self.kind == "source":
            # the controller serves regular files under its root only: a symlink anywhere below it is refused
            link = symlink_below(m["root"], rel + "/" + name)
            if link:
                self._count(rel, "refused")
                return self._reply(h, 403, json.dumps({"error": "%s is a symlink to %s; the controller serves "
                                                                "regular files only" % link}).encode(), head=head)
            full, want_ino = os.path.join(m["root"], rel, name), None
        else:
            st = self.state(rel)
            if name in st["failed"]:
                return self._reply(h, 410, json.dumps({"error": st["failed"][name]}).encode(), head=head)
            if name not in st["verified"]:
                return self._reply(h, 503, b'{"error": "not verified yet"}', head=head, extra={"Retry-After": "1"})
            full = os.path.join(st["_dir"], name)
            want_ino = ((st["_files"].get(name) or {}).get("stat") or [None, None, None])[2]
        self._send_file(h, rel, full, want_ino, head)

    def _send_file(self, h, rel, full, want_ino, head):
        try:
            fd = os.open(full, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            return self._reply(h, 503, b'{"error": "moved, ask again"}', head=head, extra={"Retry-After": "1"})
        try:
            st = os.fstat(fd)
            if want_ino is not None and st.st_ino != want_ino:
                return self._reply(h, 503, b'{"error": "replaced, ask again"}', head=head, extra={"Retry-After": "1"})
            size = st.st_size
            start, end = 0, size - 1
            rng = h.headers.get("Range")
            code = 200
            if rng:
                try:
                    unit, spec = rng.split("=", 1)
                    a, b = spec.split(",")[0].strip().split("-", 1)
                    start = int(a) if a else max(0, size - int(b))
                    end = min(size - 1, int(b)) if (a and b) else size - 1
                    if unit.strip() != "bytes" or start > end or start >= size:
                        raise ValueError
                    code = 206
                except ValueError:
                    return self._reply(h, 416, b"", head=head, extra={"Content-Range": "bytes */%d" % size})
            h.send_response(code)
            h.send_header("Content-Type", "application/octet-stream")
            h.send_header("Accept-Ranges", "bytes")
            h.send_header("Content-Length", str(end - start + 1))
            if code == 206:
                h.send_header("Content-Range", "bytes %d-%d/%d" % (start, end, size))
            h.end_headers()
            self._count(rel, "requests")
            if head:
                return
            h.wfile.flush()
            off, left = start, end - start + 1
            sock = h.connection
            ahead, stop = off, end + 1
            while left > 0:
                # WILLNEED up to two windows ahead of the socket: a copy no longer in the page cache (a writer that
                # dropped it, memory pressure) is read from the disk before it is sent, in large requests
                while ahead < min(stop, off + 2 * WINDOW):
                    try:
                        os.posix_fadvise(fd, ahead, min(WINDOW, stop - ahead), os.POSIX_FADV_WILLNEED)
                    except (OSError, AttributeError):
                        pass
                    ahead += WINDOW
                n = os.sendfile(sock.fileno(), fd, off, min(left, WINDOW))
                if n <= 0:
                    break
                off += n
                left -= n
                self._count(rel, "bytes", n)
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            os.close(fd)
