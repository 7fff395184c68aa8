"""One module run compares and converges every file roles/sglang writes on a host (module_utils/sglang/host_files.py,
module b300.rollout.sglang_host_files; issue 40: a no-change re-run paid a template/copy/file module run per file).
These tests prove what counts as a difference (content, mode, owner, group, absent, the wrong kind), that only the
entries that differ are written, that `changed` is true only then, and that check mode writes nothing."""
import grp
import os
import pwd
import stat

import pytest

from ansible_collections.b300.rollout.plugins.module_utils.sglang import host_files as hf
from test_facts_modules import run_module

ME = pwd.getpwuid(os.getuid()).pw_name
MY_GROUP = grp.getgrgid(os.getgid()).gr_name


def _entry(path, content="a=1\n", mode="0640", **kw):
    e = {"path": str(path), "state": "file", "content": content, "mode": mode, "owner": ME, "group": MY_GROUP}
    e.update(kw)
    return e


def test_the_same_file_has_no_difference(tmp_path):
    p = tmp_path / "x.env"
    p.write_text("a=1\n")
    os.chmod(p, 0o640)
    assert hf.differences(_entry(p), hf.read_state(str(p))) == []


def test_each_kind_of_difference_is_named(tmp_path):
    p = tmp_path / "x.env"
    p.write_text("a=2\n")
    os.chmod(p, 0o644)
    reasons = hf.differences(_entry(p, owner="nobody-such", group="nogroup-such"), hf.read_state(str(p)))
    assert reasons == ["content", "mode 0644 (wanted 0640)", "owner %s (wanted nobody-such)" % ME,
                       "group %s (wanted nogroup-such)" % MY_GROUP]
    assert hf.differences(_entry(tmp_path / "missing"), hf.read_state(str(tmp_path / "missing"))) == ["absent"]
    assert hf.differences(_entry(tmp_path), hf.read_state(str(tmp_path))) == ["a directory where a file is wanted"]


def test_a_trailing_newline_is_a_difference(tmp_path):
    p = tmp_path / "unit"
    p.write_text("[Unit]\n")
    os.chmod(p, 0o640)
    assert hf.differences(_entry(p, content="[Unit]"), hf.read_state(str(p))) == ["content"]


def test_bad_entries_are_named_with_their_path():
    assert hf.entry_problems({"path": "rel/x", "content": "", "mode": "0644", "owner": "root", "group": "root"}) == [
        "path 'rel/x' is not absolute"]
    assert hf.entry_problems({"path": "/x", "mode": "u+rw", "owner": "root", "group": "root"}) == [
        "/x: a file needs its content (a string)", "/x: mode 'u+rw' is not an octal mode (expected e.g. '0644')"]
    assert hf.entry_problems({"path": "/d", "state": "directory", "content": "x", "mode": "0755", "owner": "root",
                              "group": ""}) == ["/d: a directory has no content",
                                                "/d: group is missing (expected a name, e.g. root)"]
    assert hf.parse_mode("644") == 0o644 and hf.parse_mode(0o755) == 0o755
    with pytest.raises(ValueError):
        hf.parse_mode("17777")


def test_converge_writes_content_mode_and_makes_directories(tmp_path):
    d = tmp_path / "etc"
    want_dir = {"path": str(d), "state": "directory", "mode": "0750", "owner": ME, "group": MY_GROUP}
    hf.converge(want_dir, hf.differences(want_dir, hf.read_state(str(d))))
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o750
    f = _entry(d / "x.env", content="K=v\n")
    hf.converge(f, hf.differences(f, hf.read_state(f["path"])))
    assert (d / "x.env").read_text() == "K=v\n" and stat.S_IMODE(os.stat(d / "x.env").st_mode) == 0o640
    # only the mode differs: changed in place (same inode), content kept
    os.chmod(d / "x.env", 0o600)
    inode = os.stat(d / "x.env").st_ino
    reasons = hf.differences(f, hf.read_state(f["path"]))
    assert reasons == ["mode 0600 (wanted 0640)"]
    hf.converge(f, reasons)
    assert os.stat(d / "x.env").st_ino == inode and stat.S_IMODE(os.stat(d / "x.env").st_mode) == 0o640
    assert [n for n in os.listdir(d) if n.startswith(".")] == []  # no temporary file left behind
    with pytest.raises(KeyError, match="user nobody-such does not exist"):
        hf.converge(_entry(d / "y", owner="nobody-such"), ["absent"])
    with pytest.raises(ValueError, match="a directory where a file is wanted"):
        hf.converge(_entry(d), ["a directory where a file is wanted"])


def test_module_writes_only_what_differs_and_check_mode_writes_nothing(tmp_path):
    keep, change = tmp_path / "keep.conf", tmp_path / "change.conf"
    keep.write_text("same\n")
    os.chmod(keep, 0o644)
    change.write_text("old\n")
    os.chmod(change, 0o644)
    files = [{"path": str(tmp_path / "sub"), "state": "directory", "mode": "0755", "owner": ME, "group": MY_GROUP},
             _entry(keep, content="same\n", mode="0644"),
             _entry(change, content="new\n", mode="0644"),
             _entry(tmp_path / "sub" / "new.conf", content="n\n")]
    rc, res = run_module("sglang_host_files", {"files": files}, tmp_path, check=True)
    assert rc == 0 and res["changed"] is True, res
    assert res["written"] == [str(tmp_path / "sub"), str(change), str(tmp_path / "sub" / "new.conf")]
    assert res["files"][str(keep)] == {"changed": False, "reasons": []}
    assert res["files"][str(change)] == {"changed": True, "reasons": ["content"]}
    assert change.read_text() == "old\n" and not (tmp_path / "sub").exists()
    assert "new\n" not in res["_stderr"] and "new\\n" not in str(res)  # content is never returned

    rc, res = run_module("sglang_host_files", {"files": files}, tmp_path)
    assert rc == 0 and res["changed"] is True and len(res["written"]) == 3, res
    assert change.read_text() == "new\n" and (tmp_path / "sub" / "new.conf").read_text() == "n\n"

    rc, res = run_module("sglang_host_files", {"files": files}, tmp_path)
    assert rc == 0 and res["changed"] is False and res["written"] == [], res


def test_module_failure_names_the_file_what_was_found_and_the_fix(tmp_path):
    rc, res = run_module("sglang_host_files", {"files": [_entry(tmp_path / "x", group="no-such-group-b300")]},
                         tmp_path)
    assert rc != 0 and res["failed"], res
    assert str(tmp_path / "x") in res["msg"] and "absent" in res["msg"] and "no-such-group-b300" in res["msg"]
    assert "roles/sglang/tasks/user.yml" in res["msg"]


# accounts: `have` is what read_accounts() returns (getent group / getent passwd as dicts)
HAVE = {"groups": {"root": [], "video": [], "render": ["sglang"], "sglang": []},
        "users": {"root": {"group": "root", "shell": "/bin/bash", "home": "/root"},
                  "sglang": {"group": "sglang", "shell": "/usr/sbin/nologin", "home": "/var/lib/sglang"}}}
WORKER = {"name": "sglang", "group": "sglang", "shell": "/usr/sbin/nologin", "home": "/var/lib/sglang",
          "groups": ["video", "render", "infiniband"]}


def test_accounts_as_wanted_run_nothing_and_a_missing_device_group_is_joined():
    assert hf.account_commands(["sglang"], [dict(WORKER, groups=["render", "infiniband"])], HAVE) == ([], [])
    cmds, why = hf.account_commands(["sglang"], [WORKER], HAVE)  # video exists, sglang is not in it; infiniband absent
    assert cmds == [["usermod", "--append", "--groups", "video", "sglang"]] and why == ["user sglang: not in video"]


def test_absent_accounts_are_created_and_changed_ones_fixed():
    have = {"groups": {"root": [], "video": []}, "users": {}}
    cmds, why = hf.account_commands(["sglang"], [WORKER, {"name": "router", "group": "sglang",
                                                          "shell": "/usr/sbin/nologin"}], have)
    assert cmds == [["groupadd", "--system", "sglang"],
                    ["useradd", "--system", "--gid", "sglang", "--shell", "/usr/sbin/nologin", "--no-create-home",
                     "--home-dir", "/var/lib/sglang", "--groups", "video", "sglang"],
                    ["useradd", "--system", "--gid", "sglang", "--shell", "/usr/sbin/nologin", "--no-create-home",
                     "router"]]
    assert why == ["group sglang is absent", "user sglang is absent", "user router is absent"]
    cmds, why = hf.account_commands([], [dict(WORKER, shell="/bin/false", groups=[])], HAVE)
    assert cmds == [["usermod", "--shell", "/bin/false", "sglang"]]
    assert why == ["user sglang: shell /usr/sbin/nologin (wanted /bin/false)"]
