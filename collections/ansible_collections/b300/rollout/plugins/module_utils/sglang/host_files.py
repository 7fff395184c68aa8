# -*- coding: utf-8 -*-
"""The files and directories roles/sglang writes on a host, compared and converged in one module run (issue 40).

A no-change re-run used to pay one module run per file (ansible.builtin.template / copy / file: the env and unit
file of every instance, the fabric wait script, the module-load file, the journald drop-in, the directories), each
a Python start-up on the host to find nothing to do. Here one call takes every wanted entry of a host (path, state
file or directory, content for a file, mode, owner, group), reads what is there, says per entry what differs and why,
and writes only those entries. Content is compared byte for byte; mode as the permission bits; owner and group by
name (resolved on the host).

Plain functions; the file system is read and written under the paths given. Unit tests in
tests/unit/test_sglang_host_files.py.
"""
from __future__ import absolute_import, division, print_function
__metaclass__ = type

import grp
import os
import pwd
import stat as statmod
import tempfile

STATES = ("file", "directory")
KEYS = ("path", "state", "content", "mode", "owner", "group")


def entry_problems(entry):
    """What is wrong with one wanted entry (a list of sentences, [] when it is usable)."""
    problems = []
    path = entry.get("path")
    if not isinstance(path, str) or not path.startswith("/"):
        problems.append("path %r is not absolute" % (path,))
    state = entry.get("state") or "file"
    if state not in STATES:
        problems.append("%s: state %r is not one of %s" % (path, state, ", ".join(STATES)))
    if state == "file" and not isinstance(entry.get("content"), str):
        problems.append("%s: a file needs its content (a string)" % (path,))
    if state == "directory" and entry.get("content") is not None:
        problems.append("%s: a directory has no content" % (path,))
    try:
        parse_mode(entry.get("mode"))
    except ValueError as e:
        problems.append("%s: %s" % (path, e))
    for key in ("owner", "group"):
        if not isinstance(entry.get(key), str) or not entry.get(key):
            problems.append("%s: %s is missing (expected a name, e.g. root)" % (path, key))
    unknown = sorted(set(entry) - set(KEYS))
    if unknown:
        problems.append("%s: unknown keys %s (expected %s)" % (path, ", ".join(unknown), ", ".join(KEYS)))
    return problems


def parse_mode(mode):
    """'0644' / '644' / 420 -> 0o644. Anything else (symbolic modes, out of range) is a ValueError."""
    if isinstance(mode, int) and not isinstance(mode, bool):
        value = mode
    elif isinstance(mode, str) and mode and all(c in "01234567" for c in mode):
        value = int(mode, 8)
    else:
        raise ValueError("mode %r is not an octal mode (expected e.g. '0644')" % (mode,))
    if not 0 <= value <= 0o7777:
        raise ValueError("mode %r is out of range (expected 0000-7777)" % (mode,))
    return value


def read_state(path, with_content=True):
    """What is at path now: {'kind': None | 'file' | 'directory' | 'other', 'mode', 'owner', 'group', 'content'}.
    Owner and group are names (the number as a string when the host has no name for it); content is bytes."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return {"kind": None}
    if statmod.S_ISREG(st.st_mode):
        kind = "file"
    elif statmod.S_ISDIR(st.st_mode):
        kind = "directory"
    else:
        kind = "other"
    have = {"kind": kind, "mode": statmod.S_IMODE(st.st_mode), "owner": _user_name(st.st_uid),
            "group": _group_name(st.st_gid), "content": None}
    if kind == "file" and with_content:
        with open(path, "rb") as fh:
            have["content"] = fh.read()
    return have


def _user_name(uid):
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _group_name(gid):
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def differences(want, have):
    """Why the entry on the host is not the wanted one: a list of short reasons ([] when it is).
    want: an entry (entry_problems() is empty); have: read_state()."""
    state = want.get("state") or "file"
    if have["kind"] is None:
        return ["absent"]
    if have["kind"] != state:
        return ["a %s where a %s is wanted" % (have["kind"], state)]
    reasons = []
    if state == "file" and have["content"] != want["content"].encode("utf-8"):
        reasons.append("content")
    mode = parse_mode(want["mode"])
    if have["mode"] != mode:
        reasons.append("mode %04o (wanted %04o)" % (have["mode"], mode))
    if have["owner"] != want["owner"]:
        reasons.append("owner %s (wanted %s)" % (have["owner"], want["owner"]))
    if have["group"] != want["group"]:
        reasons.append("group %s (wanted %s)" % (have["group"], want["group"]))
    return reasons


def resolve_ids(entry):
    """(uid, gid) of the entry's owner and group on this host; KeyError names the one that does not exist."""
    try:
        uid = pwd.getpwnam(entry["owner"]).pw_uid
    except KeyError:
        raise KeyError("user %s does not exist" % entry["owner"]) from None
    try:
        gid = grp.getgrnam(entry["group"]).gr_gid
    except KeyError:
        raise KeyError("group %s does not exist" % entry["group"]) from None
    return uid, gid


def converge(want, reasons):
    """Make the entry on the host the wanted one (reasons: differences()). A file whose content differs (or that is
    absent) is written to a temporary file beside it, given its mode and owner, then renamed over the old one, so a
    reader never sees half a file; a file or directory that only differs in mode/owner/group is changed in place.
    A wrong kind (a directory where a file is wanted) is not replaced: ValueError."""
    path = want["path"]
    state = want.get("state") or "file"
    uid, gid = resolve_ids(want)
    mode = parse_mode(want["mode"])
    if reasons and reasons[0].startswith("a "):
        raise ValueError("%s is %s; remove it or change the wanted path" % (path, reasons[0]))
    if state == "directory":
        if reasons == ["absent"]:
            os.mkdir(path, 0o700)
        os.chown(path, uid, gid)
        os.chmod(path, mode)
        return
    if reasons == ["absent"] or "content" in reasons:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".%s." % os.path.basename(path))
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(want["content"].encode("utf-8"))
                fh.flush()
                os.fsync(fh.fileno())
            os.chown(tmp, uid, gid)
            os.chmod(tmp, mode)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return
    os.chown(path, uid, gid)
    os.chmod(path, mode)


def plan(entries, read=read_state):
    """{path: reasons} for every entry, in order (read: the reader of what is there, replaceable in tests)."""
    return {e["path"]: differences(e, read(e["path"], (e.get("state") or "file") == "file")) for e in entries}


# ---- service accounts ------------------------------------------------------------------------------------------
# The same one-read comparison for the accounts roles/sglang needs (tasks/user.yml): system groups, system users
# without a login shell, and the device groups a user joins when they exist on the host. What differs becomes the
# shadow-utils command that fixes it (groupadd/useradd/usermod, argument lists); nothing runs when nothing differs.

def read_accounts():
    """{'groups': {name: members}, 'users': {name: {'group', 'shell', 'home'}}} of this host (getent's view)."""
    groups = {g.gr_name: list(g.gr_mem) for g in grp.getgrall()}
    by_gid = {g.gr_gid: g.gr_name for g in grp.getgrall()}
    users = {u.pw_name: {"group": by_gid.get(u.pw_gid, str(u.pw_gid)), "shell": u.pw_shell, "home": u.pw_dir}
             for u in pwd.getpwall()}
    return {"groups": groups, "users": users}


def account_commands(groups, users, have):
    """(commands, reasons): the argv lists that make the accounts the wanted ones, and one reason per command.
    groups: names of system groups; users: [{'name', 'group', 'shell', 'home' (None: not managed), 'groups' (joined
    when they exist on the host, never left)}]; have: read_accounts()."""
    commands, reasons = [], []
    known = set(have["groups"])
    for name in groups:
        if name not in known:
            commands.append(["groupadd", "--system", name])
            reasons.append("group %s is absent" % name)
            known.add(name)
    for user in users:
        name = user["name"]
        extra = [g for g in user.get("groups") or [] if g in known]
        now = have["users"].get(name)
        if now is None:
            argv = ["useradd", "--system", "--gid", user["group"], "--shell", user["shell"], "--no-create-home"]
            if user.get("home"):
                argv += ["--home-dir", user["home"]]
            if extra:
                argv += ["--groups", ",".join(extra)]
            commands.append(argv + [name])
            reasons.append("user %s is absent" % name)
            continue
        fix, why = [], []
        for key, flag in (("group", "--gid"), ("shell", "--shell"), ("home", "--home")):
            if user.get(key) and now[key] != user[key]:
                fix += [flag, user[key]]
                why.append("%s %s (wanted %s)" % (key, now[key], user[key]))
        missing = [g for g in extra if name not in have["groups"].get(g, [])]
        if missing:
            fix += ["--append", "--groups", ",".join(missing)]
            why.append("not in %s" % ", ".join(missing))
        if fix:
            commands.append(["usermod"] + fix + [name])
            reasons.append("user %s: %s" % (name, "; ".join(why)))
    return commands, reasons
