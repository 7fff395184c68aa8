"""The wheelhouse is brought to the hosts by manifest (module_utils/sglang/wheelhouse.py, module wheelhouse_manifest,
roles/sglang/tasks/wheelhouse.yml): a run with nothing to copy reads no file's content on either side, so its cost does
not grow with the payload (issue 24: ansible.builtin.copy of a 2.4 GB directory took 17.3 s per host when nothing had
changed). These tests prove what is hashed when, what counts as stale, and, through the role's own task file run
against a local "host", that a re-run copies and hashes nothing while a changed or tampered file is copied again."""
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import types

import pytest
import yaml

from ansible_collections.b300.rollout.plugins.module_utils.sglang import wheelhouse as wh

ROOT = pathlib.Path(__file__).resolve().parents[2]
VENV_BIN = ROOT / ".venv" / "bin"


def _sha(data):
    return hashlib.sha256(data).hexdigest()


def _write(d, name, data):
    p = d / name
    p.write_bytes(data)
    return p


class CountingHasher:
    def __init__(self):
        self.read = []

    def __call__(self, path):
        self.read.append(os.path.basename(path))
        return wh.sha256_file(path)


@pytest.fixture
def house(tmp_path):
    d = tmp_path / "wh"
    d.mkdir()
    _write(d, "a-1.0-py3-none-any.whl", b"a" * 1000)
    _write(d, "b-2.0-py3-none-any.whl", b"b" * 2000)
    return d


def test_first_manifest_hashes_every_file_and_lists_name_size_sha(house):
    h = CountingHasher()
    files, rec, hashed = wh.manifest(str(house), {}, hasher=h)
    assert files == [{"name": "a-1.0-py3-none-any.whl", "size": 1000, "sha256": _sha(b"a" * 1000)},
                     {"name": "b-2.0-py3-none-any.whl", "size": 2000, "sha256": _sha(b"b" * 2000)}]
    assert sorted(h.read) == sorted(hashed) == ["a-1.0-py3-none-any.whl", "b-2.0-py3-none-any.whl"]
    assert set(rec) == {f["name"] for f in files}


def test_with_a_record_nothing_is_read_again(house):
    _files, rec, _ = wh.manifest(str(house), {})
    wh.write_record(str(house), rec)
    record, note = wh.load_record(str(house))
    assert note is None and record == rec
    h = CountingHasher()
    files, rec2, hashed = wh.manifest(str(house), record, hasher=h)
    assert h.read == [] and hashed == [] and rec2 == rec
    assert [f["name"] for f in files] == ["a-1.0-py3-none-any.whl", "b-2.0-py3-none-any.whl"]  # record not listed


def test_a_changed_file_is_hashed_again_even_with_size_and_mtime_restored(house):
    _files, rec, _ = wh.manifest(str(house), {})
    p = house / "a-1.0-py3-none-any.whl"
    st = p.stat()
    p.write_bytes(b"X" * 1000)  # same size
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime put back: only ctime tells
    h = CountingHasher()
    files, _rec, hashed = wh.manifest(str(house), rec, hasher=h)
    assert hashed == h.read == ["a-1.0-py3-none-any.whl"]
    assert files[0]["sha256"] == _sha(b"X" * 1000)


def test_a_replaced_file_is_hashed_again(house):
    _files, rec, _ = wh.manifest(str(house), {})
    tmp = _write(house.parent, "new", b"b" * 2000)
    os.replace(tmp, house / "b-2.0-py3-none-any.whl")  # new inode, same content and size
    _files, _rec, hashed = wh.manifest(str(house), rec)
    assert hashed == ["b-2.0-py3-none-any.whl"]


def test_subdirectories_and_hidden_files_are_outside_the_manifest(house):
    (house / "sub").mkdir()
    _write(house / "sub", "c-1-py3-none-any.whl", b"c")
    _write(house, ".DS_Store", b"x")
    _write(house, wh.RECORD_NAME, b"{}")
    files, ignored = wh.scan(str(house))
    assert sorted(files) == ["a-1.0-py3-none-any.whl", "b-2.0-py3-none-any.whl"]
    assert ignored == [".DS_Store", "sub"]


def test_a_file_written_while_hashed_is_not_recorded(house):
    calls = []

    def stat_that_moves(path):  # the file grew while it was read
        calls.append(path)
        st = os.stat(path)
        return types.SimpleNamespace(st_size=st.st_size + 1, st_mtime_ns=st.st_mtime_ns, st_ctime_ns=st.st_ctime_ns,
                                     st_ino=st.st_ino)

    files, rec, hashed = wh.manifest(str(house), {}, stat=stat_that_moves)
    assert len(files) == 2 and len(hashed) == 2 and rec == {} and len(calls) == 2


@pytest.mark.parametrize("content, note", [
    ("not json", "unreadable"),
    (json.dumps({"version": 99, "files": {}}), "unknown format"),
    (json.dumps({"version": 1, "files": []}), "unknown format"),
])
def test_a_bad_record_means_hash_again_with_a_note(house, content, note):
    _write(house, wh.RECORD_NAME, content.encode())
    record, msg = wh.load_record(str(house))
    assert record == {} and note in msg and wh.RECORD_NAME in msg


def test_record_entries_without_a_sha256_are_dropped(house):
    _write(house, wh.RECORD_NAME, json.dumps({"version": 1, "files": {
        "a-1.0-py3-none-any.whl": {"key": [1, 2, 3, 4], "sha256": "zz"},
        "b-2.0-py3-none-any.whl": {"key": [1, 2, 3, 4], "sha256": "0" * 64}}}).encode())
    record, msg = wh.load_record(str(house))
    assert msg is None and list(record) == ["b-2.0-py3-none-any.whl"]


def test_compare_names_stale_extra_current():
    exp = [{"name": "a.whl", "size": 1, "sha256": "1" * 64}, {"name": "b.whl", "size": 2, "sha256": "2" * 64},
           {"name": "c.whl", "size": 3, "sha256": "3" * 64}, {"name": "d.whl", "size": 4, "sha256": "4" * 64}]
    have = [{"name": "a.whl", "size": 1, "sha256": "1" * 64},
            {"name": "b.whl", "size": 2, "sha256": "f" * 64},   # same size, other content
            {"name": "c.whl", "size": 30, "sha256": "3" * 64},  # other size
            {"name": "old.whl", "size": 9, "sha256": "9" * 64}]
    assert wh.compare(exp, have) == {"stale": ["b.whl", "c.whl", "d.whl"], "extra": ["old.whl"], "current": 1}
    assert wh.compare(exp, []) == {"stale": ["a.whl", "b.whl", "c.whl", "d.whl"], "extra": [], "current": 0}


@pytest.mark.parametrize("entry, fragment", [
    ({"name": "../etc/passwd", "size": 1, "sha256": "0" * 64}, "not a file name"),
    ({"name": ".b300-wheelhouse.json", "size": 1, "sha256": "0" * 64}, "not a file name"),
    ({"name": "a.whl", "size": "big", "sha256": "0" * 64}, "not a byte count"),
    ({"name": "a.whl", "size": 1, "sha256": "ABC"}, "not 64 lowercase hex"),
    ("a.whl", "not a mapping"),
])
def test_a_malformed_expected_manifest_is_refused(entry, fragment):
    errors = wh.check_expected([entry])
    assert errors and fragment in errors[0]


def test_an_expected_name_listed_twice_is_refused():
    e = {"name": "a.whl", "size": 1, "sha256": "0" * 64}
    assert "listed twice" in wh.check_expected([e, dict(e)])[0]


def test_the_record_is_replaced_atomically_and_readable(house):
    wh.write_record(str(house), {"a": {"key": [1, 2, 3, 4], "sha256": "0" * 64}})
    assert oct((house / wh.RECORD_NAME).stat().st_mode & 0o777) == "0o644"
    assert not [p for p in house.iterdir() if ".tmp." in p.name]


# ---------------------------------------------------------------------------------------------------------------------
# The role's task file, run for real: controller wheelhouse -> a local "host" directory.

STEP = """
    - name: A new run ({step}) knows nothing of an earlier one
      ansible.builtin.set_fact:
        _sglang_wheelhouse_synced: ""
    - name: Bring the wheelhouse ({step})
      ansible.builtin.include_role:
        name: sglang
        tasks_from: wheelhouse
    - name: Report ({step})
      ansible.builtin.copy:
        content: "{{{{ {{'src_hashed': _sglang_wheelhouse_src.hashed, 'dest_hashed': _sglang_wheelhouse_dest.hashed,
                        'stale': _sglang_wheelhouse_dest.stale, 'extra': _sglang_wheelhouse_dest.extra,
                        'after_hashed': _sglang_wheelhouse_after.hashed | default(None),
                        'after_stale': _sglang_wheelhouse_after.stale | default(None)}} | to_json }}}}"
        dest: "{tmp}/report-{step}.json"
        mode: "0644"
      check_mode: false
"""
# between the steps: a file the controller no longer lists appears on the host; then a new build of one wheel on the
# controller, and a host copy damaged in place with its size and mtime put back (only its ctime tells)
BETWEEN = {
    "again": """
    - name: A file on the host that the controller does not list
      ansible.builtin.copy:
        content: "o"
        dest: "{dest}/old-0.1-py3-none-any.whl"
        mode: "0644"
""",
    "reuse": """
    - name: A second include in the same run (the router's install on a worker host) reuses the first one
      ansible.builtin.include_role:
        name: sglang
        tasks_from: wheelhouse
    - name: Report (reuse)
      ansible.builtin.copy:
        content: >-
          {{{{ {{'skipped': _sglang_wheelhouse_dest is skipped, 'synced': _sglang_wheelhouse_synced}} | to_json }}}}
        dest: "{tmp}/report-reuse.json"
        mode: "0644"
      check_mode: false
""",
    "third": """
    - name: A new build of one wheel on the controller, a host copy damaged in place
      ansible.builtin.command:
        argv:
          - "{python}"
          - -c
          - |
            import os
            open("{src}/a-1.0-py3-none-any.whl", "wb").write(b"A" * 4096)
            v = "{dest}/b-2.0-py3-none-any.whl"
            st = os.stat(v)
            open(v, "r+b").write(b"Z" * 8192)
            os.utime(v, ns=(st.st_atime_ns, st.st_mtime_ns))
      changed_when: true
""",
}


def _play(tmp_path, src, dest, steps=("first", "again", "third"), check=False):
    """Run the role's wheelhouse.yml for each step in one play; a step named in BETWEEN gets those tasks first (the
    "reuse" step is only those tasks)."""
    fmt = dict(tmp=tmp_path, src=src, dest=dest, python=sys.executable)
    pb = tmp_path / "play.yml"
    pb.write_text("- name: Wheelhouse to a local host, three times\n  hosts: localhost\n  gather_facts: false\n"
                  "  tasks:\n" + "".join(BETWEEN.get(s, "").format(**fmt)
                                        + ("" if s == "reuse" else STEP.format(step=s, **fmt)) for s in steps))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"),
               ANSIBLE_CACHE_PLUGIN="memory", ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_ROLES_PATH=str(ROOT / "roles"))
    exe = VENV_BIN / "ansible-playbook"
    proc = subprocess.run([str(exe) if exe.exists() else "ansible-playbook", "-i", "localhost,", "-c", "local",
                           "-e", "ansible_python_interpreter=%s" % sys.executable,
                           "-e", "sglang_wheelhouse_dir=%s/" % src, "-e", "sglang_wheelhouse_remote_dir=%s" % dest,
                           str(pb)] + (["--check"] if check else []), cwd=str(ROOT), env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return [json.loads((tmp_path / ("report-%s.json" % s)).read_text()) for s in steps]


def test_the_role_copies_what_differs_and_a_rerun_reads_nothing(tmp_path):
    src, dest = tmp_path / "controller", tmp_path / "host" / "wheelhouse"
    src.mkdir()
    _write(src, "a-1.0-py3-none-any.whl", b"a" * 4096)
    _write(src, "b-2.0-py3-none-any.whl", b"b" * 8192)
    _write(src, "SHA256SUMS", b"x\n")
    names = ["SHA256SUMS", "a-1.0-py3-none-any.whl", "b-2.0-py3-none-any.whl"]

    first, again, reuse, third = _play(tmp_path, src, dest, steps=("first", "again", "reuse", "third"))
    # first: everything copied, then hashed on the host and found equal
    assert first["stale"] == names and first["after_stale"] == [] and sorted(first["after_hashed"]) == names
    # again: nothing read on either side but the one new file on the host, nothing copied, the stranger reported
    assert again == {"src_hashed": [], "dest_hashed": ["old-0.1-py3-none-any.whl"], "stale": [],
                     "extra": ["old-0.1-py3-none-any.whl"], "after_hashed": None, "after_stale": None}
    # the same run again: nothing compared, the first pass's proof reused
    assert reuse == {"skipped": True, "synced": "%s -> %s" % (src, dest)}
    # third: the changed controller file and the damaged host copy, and only they, are read and copied again
    assert third["src_hashed"] == ["a-1.0-py3-none-any.whl"]
    assert third["dest_hashed"] == ["b-2.0-py3-none-any.whl"]
    assert third["stale"] == ["a-1.0-py3-none-any.whl", "b-2.0-py3-none-any.whl"] and third["after_stale"] == []
    assert (dest / "a-1.0-py3-none-any.whl").read_bytes() == b"A" * 4096
    assert (dest / "b-2.0-py3-none-any.whl").read_bytes() == b"b" * 8192
    assert (dest / "old-0.1-py3-none-any.whl").exists()
    assert sorted(p.name for p in dest.iterdir()) == sorted(
        names + [".b300-wheelhouse.json", "old-0.1-py3-none-any.whl"])


def test_check_mode_copies_nothing_and_writes_no_record(tmp_path):
    src, dest = tmp_path / "controller", tmp_path / "host" / "wheelhouse"
    src.mkdir()
    _write(src, "a-1.0-py3-none-any.whl", b"a" * 4096)
    (report,) = _play(tmp_path, src, dest, steps=("check",), check=True)
    assert report["stale"] == ["a-1.0-py3-none-any.whl"] and report["after_stale"] is None
    assert not dest.exists() and not (src / wh.RECORD_NAME).exists()


def test_the_controller_side_task_does_not_become_root_on_the_controller():
    """The deploy plays run with become: true for the hosts; a task delegated to the controller must not ask for sudo
    there (the operator's controller account reads its own wheelhouse)."""
    tasks = yaml.safe_load((ROOT / "roles/sglang/tasks/wheelhouse.yml").read_text())
    flat = [t for block in tasks for t in block.get("block", [block])]
    local = [t for t in flat if t.get("delegate_to") == "localhost"]
    assert local and all(t.get("become") is False for t in local), local
