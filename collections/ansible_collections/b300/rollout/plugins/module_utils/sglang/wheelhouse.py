# -*- coding: utf-8 -*-
"""Wheelhouse manifests: name, size and sha256 of every file at the top of a directory, and what a copy lacks.

pip reads a --find-links directory's top level only, so that is what a manifest covers (subdirectories and hidden
files are listed apart and never copied). Hashing gigabytes on every run is what made a no-change deploy cost as much
as the payload (ansible.builtin.copy of a directory checksums every byte on both sides); here a file is hashed only
when its stat key (size, mtime_ns, ctime_ns, inode) differs from the one recorded when it was last hashed. The record
is a JSON file in the directory itself. ctime cannot be set from user space (touch sets atime/mtime only), so a file
rewritten in place with the same size and a restored mtime still gets a new ctime and is hashed again.

Pure functions with the file system passed in as paths; unit tests in tests/unit/test_wheelhouse_manifest.py.
"""
from __future__ import absolute_import, division, print_function
__metaclass__ = type

import hashlib
import json
import os
import re
import stat as statmod

RECORD_NAME = ".b300-wheelhouse.json"
RECORD_VERSION = 1
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


def stat_key(st):
    """What must stay the same for a recorded hash to stand: size, mtime_ns, ctime_ns, inode."""
    return [int(st.st_size), int(st.st_mtime_ns), int(st.st_ctime_ns), int(st.st_ino)]


def sha256_file(path, bufsize=1 << 20):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            chunk = f.read(bufsize)
            if not chunk:
                break
            h.update(chunk)
    return h.hexdigest()


def scan(path):
    """({name: os.stat_result} of the regular files at the top of path, [ignored names]).

    Ignored: subdirectories and other non-files, hidden names (the record among them). Symlinks to files count as
    the file they point to."""
    files, ignored = {}, []
    with os.scandir(path) as it:
        for entry in it:
            if entry.name.startswith("."):
                if entry.name != RECORD_NAME:
                    ignored.append(entry.name)
                continue
            try:
                st = os.stat(entry.path)
            except OSError:
                ignored.append(entry.name)
                continue
            if statmod.S_ISREG(st.st_mode):
                files[entry.name] = st
            else:
                ignored.append(entry.name)
    return files, sorted(ignored)


def load_record(path):
    """{name: {"key": [...], "sha256": hex}} recorded in path, and a note when the record was unusable."""
    rpath = os.path.join(path, RECORD_NAME)
    try:
        with open(rpath, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}, None
    except (OSError, ValueError) as e:
        return {}, "hash record %s unreadable (%s): every file is hashed again" % (rpath, e)
    files = data.get("files") if isinstance(data, dict) and data.get("version") == RECORD_VERSION else None
    if not isinstance(files, dict):
        return {}, "hash record %s has an unknown format: every file is hashed again" % rpath
    good = {}
    for name, rec in files.items():
        if isinstance(rec, dict) and isinstance(rec.get("key"), list) and SHA256_RE.match(str(rec.get("sha256", ""))):
            good[name] = {"key": [int(x) for x in rec["key"]], "sha256": rec["sha256"]}
    return good, None


def manifest(path, record, hasher=sha256_file, stat=os.stat):
    """Manifest of path reusing record's hashes where the stat key is unchanged.

    Returns (files, new_record, hashed): files = [{name, size, sha256}] sorted by name; new_record = what to record
    (a file that changed while it was being hashed is left out, so the next run hashes it again); hashed = names whose
    content was read this time."""
    found, _ignored = scan(path)
    files, new_record, hashed = [], {}, []
    for name in sorted(found):
        full = os.path.join(path, name)
        key = stat_key(found[name])
        rec = record.get(name)
        if rec and rec["key"] == key:
            digest = rec["sha256"]
        else:
            digest = hasher(full)
            hashed.append(name)
            after = stat_key(stat(full))
            if after != key:  # written to while being read: report what was read, record nothing
                files.append({"name": name, "size": key[0], "sha256": digest})
                continue
        files.append({"name": name, "size": key[0], "sha256": digest})
        new_record[name] = {"key": key, "sha256": digest}
    return files, new_record, hashed


def record_text(new_record):
    return json.dumps({"version": RECORD_VERSION, "files": new_record}, sort_keys=True, indent=1) + "\n"


def write_record(path, new_record):
    """Atomically replace the record (a temporary file renamed over it)."""
    rpath = os.path.join(path, RECORD_NAME)
    tmp = rpath + ".tmp.%d" % os.getpid()
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(record_text(new_record))
    os.chmod(tmp, 0o644)
    os.replace(tmp, rpath)


def check_expected(expected):
    """Errors in an expected manifest (from the controller): each entry a plain top-level name, a size, a sha256."""
    errors, seen = [], set()
    for i, e in enumerate(expected or []):
        if not isinstance(e, dict):
            errors.append("expected[%d] is not a mapping: %r" % (i, e))
            continue
        name = str(e.get("name", ""))
        if not name or "/" in name or name.startswith(".") or name in (".", ".."):
            errors.append("expected[%d]: %r is not a file name at the top of the wheelhouse" % (i, name))
        if name in seen:
            errors.append("expected[%d]: %s listed twice" % (i, name))
        seen.add(name)
        try:
            if int(e.get("size")) < 0:
                raise ValueError
        except (TypeError, ValueError):
            errors.append("expected[%d] (%s): size %r is not a byte count" % (i, name, e.get("size")))
        if not SHA256_RE.match(str(e.get("sha256", ""))):
            errors.append("expected[%d] (%s): sha256 %r is not 64 lowercase hex digits" % (i, name, e.get("sha256")))
    return errors


def compare(expected, files):
    """What the copy at `files` lacks against `expected`: {stale, extra, current}.

    stale: expected names that are missing or differ in size or sha256 (sorted); extra: names present but not expected
    (left in place: they were never copied from this controller, or came from an older wheelhouse); current: how many
    expected files are already right."""
    have = {f["name"]: f for f in files}
    stale, current = [], 0
    for e in expected:
        got = have.get(e["name"])
        if got and int(got["size"]) == int(e["size"]) and got["sha256"] == e["sha256"]:
            current += 1
        else:
            stale.append(e["name"])
    want = {e["name"] for e in expected}
    return {"stale": sorted(stale), "extra": sorted(n for n in have if n not in want), "current": current}


def total_bytes(files):
    return sum(int(f["size"]) for f in files)
