"""tools/runner_cli.py, the one ansible-runner wrapper of tools/fw-audit and tools/triage: the common arguments,
the extra variables each playbook gets, the runner's arguments (paramiko + --known-hosts), the events kept for a run
without a report, the exit-code policy (0/2/3 from the report, 1 the tool) and the venv re-exec. ansible-runner is
replaced by a fake that writes what the playbook would; tests/integration/test_firmware_audit.py and test_triage.py
run the real thing against the sandbox."""
import importlib.machinery
import importlib.util
import json
import os
import pathlib
import sys
import types

import pytest
import runner_cli  # tools/runner_cli.py (tools/ is on sys.path through pytest.ini), as the commands import it
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]


def load_command(name):
    """tools/fw-audit or tools/triage (no .py suffix) as a module."""
    loader = importlib.machinery.SourceFileLoader(name.replace("-", "_"), str(ROOT / "tools" / name))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


FW_AUDIT = load_command("fw-audit")
TRIAGE = load_command("triage")


def exits_with(code, fn, *a):
    with pytest.raises(SystemExit) as e:
        fn(*a)
    assert e.value.code == code
    return e


# --- arguments -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ["--bogus"],
    ["-c", "telnet"],
    ["--known-hosts", "/x"],                # without -c paramiko
    ["-c", "ssh", "--known-hosts", "/x"],
    ["-e", "no_equals_sign"],
])
def test_bad_arguments_exit_1_not_argparse_2_which_reads_as_a_finding(argv, capsys):
    exits_with(1, FW_AUDIT.parse_args, argv)
    exits_with(1, TRIAGE.parse_args, argv)
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize("argv, words", [
    (["--force-traffic"], "--force-traffic needs --traffic"),
    (["--since", "5x"], "expected a duration like 2h"),
    (["--since=-2h"], "expected a duration like 2h"),
    (["--since", "2 h"], "expected a duration like 2h"),
])
def test_triage_own_arguments_are_checked(argv, words, capsys):
    exits_with(1, TRIAGE.parse_args, argv)
    assert words in capsys.readouterr().err


def test_triage_arguments_are_not_the_audits():
    exits_with(1, FW_AUDIT.parse_args, ["--traffic"])
    a = TRIAGE.parse_args(["--since", "90m", "--traffic", "--force-traffic"])
    assert (a.since, a.traffic, a.force_traffic) == ("90m", True, True)
    assert TRIAGE.parse_args([]).since == "2h"


def test_defaults():
    a = FW_AUDIT.parse_args([])
    assert (a.inventory, a.limit, a.hosts, a.extra_vars, a.check, a.json, a.connection, a.known_hosts, a.verbose) == \
        ("inventory/production", None, None, [], False, False, None, None, False)
    assert a.report_dir == str(ROOT / "artifacts" / "firmware-audit")
    assert TRIAGE.parse_args([]).report_dir == str(ROOT / "artifacts" / "triage")


# --- what the playbook gets --------------------------------------------------------------------------------------

def test_extra_vars_report_dir_name_hosts_own_then_e_wins(tmp_path):
    a = TRIAGE.parse_args(["--hosts", "b300b", "--report-dir", str(tmp_path), "-e", "triage_since=6h",
                           "-e", "x=a=b", "--since", "1h"])
    ev = runner_cli.extravars(TRIAGE.TOOL, a, "triage-N", {"triage_since": a.since, "triage_traffic": False})
    assert ev == {"triage_report_dir": str(tmp_path), "triage_report_name": "triage-N", "triage_hosts": "b300b",
                  "triage_since": "6h", "triage_traffic": False, "x": "a=b"}
    a = FW_AUDIT.parse_args(["--report-dir", "rel"])
    ev = runner_cli.extravars(FW_AUDIT.TOOL, a, "fw-audit-N")
    assert ev == {"audit_report_dir": os.path.abspath("rel"), "audit_report_name": "fw-audit-N"}


@pytest.mark.parametrize("mod, own", [(FW_AUDIT, ()), (TRIAGE, ("triage_since", "triage_traffic", "triage_force_traffic"))])
def test_every_variable_the_wrapper_sets_is_one_the_playbook_reads(mod, own):
    text = (ROOT / "playbooks" / mod.TOOL.playbook).read_text()
    for var in ["%s_%s" % (mod.TOOL.var_prefix, v) for v in ("report_dir", "report_name", "hosts")] + list(own):
        assert var in text, (mod.TOOL.playbook, var)
    yaml.safe_load(text)


def test_report_name_is_prog_utc_pid():
    assert runner_cli.report_name("fw-audit", now=0, pid=42) == "fw-audit-19700101T000000Z-42"


def test_runner_kwargs_plain(tmp_path):
    a = FW_AUDIT.parse_args(["-l", "b300b"])
    kw = runner_cli.runner_kwargs(FW_AUDIT.TOOL, a, "/inv", {"k": "v"}, str(tmp_path), environ={"PATH": "/usr/bin"})
    assert kw["playbook"] == str(ROOT / "playbooks" / "firmware_audit.yml")
    assert (kw["inventory"], kw["limit"], kw["extravars"], kw["private_data_dir"], kw["project_dir"], kw["quiet"]) == \
        ("/inv", "b300b", {"k": "v"}, str(tmp_path), str(ROOT), True)
    assert kw["envvars"] == {"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
                             "PATH": str(ROOT / ".venv" / "bin") + os.pathsep + "/usr/bin"}
    assert "cmdline" not in kw and kw["settings"] == {"suppress_env_files": True}
    assert "limit" not in runner_cli.runner_kwargs(FW_AUDIT.TOOL, FW_AUDIT.parse_args(["-v"]), "/i", {}, str(tmp_path))


def test_runner_kwargs_paramiko_known_hosts_check(tmp_path):
    kh = tmp_path / "kh"
    kh.write_text("10.89.30.11 ssh-ed25519 AAAA\n")
    a = TRIAGE.parse_args(["-c", "paramiko", "--known-hosts", str(kh), "--check", "-v"])
    ev = {"triage_since": "2h"}
    kw = runner_cli.runner_kwargs(TRIAGE.TOOL, a, "/inv", ev, str(tmp_path / "pd"), environ={})
    home = tmp_path / "pd" / "home"
    assert (home / ".ssh" / "known_hosts").read_text() == kh.read_text()
    assert oct((home / ".ssh").stat().st_mode & 0o777) == "0o700"
    env = kw["envvars"]
    assert (env["HOME"], env["ANSIBLE_HOST_KEY_CHECKING"], env["ANSIBLE_PARAMIKO_RECORD_HOST_KEYS"],
            env["ANSIBLE_USE_PERSISTENT_CONNECTIONS"]) == (str(home), "True", "False", "True")
    assert kw["extravars"] == {"triage_since": "2h", "ansible_host_key_checking": True}
    assert ev == {"triage_since": "2h"}, "the caller's dict is not changed"
    assert kw["cmdline"] == "-c paramiko --check" and kw["quiet"] is False


# --- events and the exit-code policy -----------------------------------------------------------------------------

def test_failures_keeps_every_event_and_notes_failed_and_unreachable_tasks():
    f = runner_cli.Failures()
    events = [
        {"event": "playbook_on_task_start", "event_data": {"task": "t"}},
        {"event": "runner_on_ok", "event_data": {"host": "b300a", "task": "t", "res": {}}},
        {"event": "runner_on_failed", "event_data": {"host": "b300a", "task": "ignored", "ignore_errors": True,
                                                     "res": {"msg": "no"}}},
        {"event": "runner_on_failed", "event_data": {"host": "b300b", "task": "Read the NICs",
                                                     "res": {"msg": "mlxfwmanager\n  exited 3"}}},
        {"event": "runner_on_unreachable", "event_data": {"host": "b300c", "task": "Gathering Facts",
                                                          "res": {"msg": "ssh: timeout"}}},
        {"event": "runner_on_failed", "event_data": {"host": "b300d", "task": "t", "res": {"stderr": "boom"}}},
        {"event": "runner_on_failed", "event_data": {"host": "b300e", "task": "t", "res": {}}},
    ]
    assert all(f(e) is True for e in events)
    assert f.seen == ["b300b FAILED: Read the NICs: mlxfwmanager exited 3", "b300c UNREACHABLE: Gathering Facts: ssh: timeout",
                      "b300d FAILED: t: boom", "b300e FAILED: t"]


@pytest.mark.parametrize("summary, code", [
    ({"exit_code": 0}, 0), ({"exit_code": 2}, 2), ({"exit_code": "3"}, 3),
    ({"exit_code": 1}, None), ({"exit_code": 4}, None), ({"exit_code": None}, None), ({}, None), (None, None),
])
def test_exit_code_only_0_2_3_come_from_the_report(summary, code):
    assert runner_cli.exit_code({"summary": summary}) == code
    assert runner_cli.exit_code({}) is None


class FakeRunner:
    """ansible_runner stand-in: writes the report the playbook would (or none) and records what it was given."""

    def __init__(self, report=None, md="# report\n", events=()):
        self.report, self.md, self.events, self.calls = report, md, events, []

    def run(self, **kw):
        self.calls.append(kw)
        assert os.path.isdir(kw["private_data_dir"])
        for e in self.events:
            kw["event_handler"](e)
        ev = kw["extravars"]
        prefix = "audit" if "audit_report_dir" in ev else "triage"
        d, name = ev[prefix + "_report_dir"], ev[prefix + "_report_name"]
        if self.report is not None:
            os.makedirs(d, exist_ok=True)
            pathlib.Path(d, name + ".json").write_text(json.dumps(self.report))
            pathlib.Path(d, name + ".md").write_text(self.md)
        return types.SimpleNamespace(status="successful" if self.report else "failed", rc=0 if self.report else 2,
                                     stdout=None)


@pytest.mark.parametrize("code", [0, 2, 3])
def test_run_prints_the_markdown_and_returns_the_reports_code(code, tmp_path, capsys):
    fake = FakeRunner({"summary": {"exit_code": code}}, md="# NIC firmware / GPU audit\n")
    a = FW_AUDIT.parse_args(["-i", str(tmp_path), "--report-dir", str(tmp_path / "rep")])
    assert runner_cli.run(FW_AUDIT.TOOL, a, runner=fake) == code
    out = capsys.readouterr().out
    name = fake.calls[0]["extravars"]["audit_report_name"]
    assert name.startswith("fw-audit-")
    assert out == "# NIC firmware / GPU audit\n\nreport: %s.md (.json)\n" % (tmp_path / "rep" / name)
    assert not os.path.exists(fake.calls[0]["private_data_dir"]), "the private data dir is removed"


def test_run_json_and_triage_textfiles_line(tmp_path, capsys):
    rep = {"summary": {"exit_code": 2}, "hosts": {"b300b": {"status": "fault"}}}
    a = TRIAGE.parse_args(["-i", str(tmp_path), "--report-dir", str(tmp_path), "--json"])
    assert runner_cli.run(TRIAGE.TOOL, a, {"triage_since": "2h"}, runner=FakeRunner(rep)) == 2
    assert json.loads(capsys.readouterr().out) == rep
    a = TRIAGE.parse_args(["-i", str(tmp_path), "--report-dir", str(tmp_path)])
    fake = FakeRunner(rep)
    runner_cli.run(TRIAGE.TOOL, a, runner=fake)
    base = tmp_path / fake.calls[0]["extravars"]["triage_report_name"]
    assert capsys.readouterr().out.endswith("\nreport: %s.md (.json); textfiles: %s/\n" % (base, base))


def test_run_without_a_report_is_a_tool_error_naming_the_failed_tasks(tmp_path, capsys):
    fake = FakeRunner(None, events=[{"event": "runner_on_failed",
                                     "event_data": {"host": "b300b", "task": "Audit | read", "res": {"msg": "boom"}}}])
    a = FW_AUDIT.parse_args(["-i", str(tmp_path), "--report-dir", str(tmp_path)])
    assert runner_cli.run(FW_AUDIT.TOOL, a, runner=fake) == 1
    err = capsys.readouterr().err
    assert "fw-audit: the audit playbook wrote no report (runner status failed, rc 2)" in err
    assert "b300b FAILED: Audit | read: boom" in err


def test_run_with_a_report_without_a_valid_code_is_a_tool_error(tmp_path, capsys):
    a = FW_AUDIT.parse_args(["-i", str(tmp_path), "--report-dir", str(tmp_path)])
    assert runner_cli.run(FW_AUDIT.TOOL, a, runner=FakeRunner({"summary": {"exit_code": 1}})) == 1
    assert "has no summary.exit_code of 0, 2 or 3" in capsys.readouterr().err


def test_run_missing_inventory_is_a_tool_error_before_any_run(tmp_path, capsys):
    fake = FakeRunner({"summary": {"exit_code": 0}})
    a = FW_AUDIT.parse_args(["-i", str(tmp_path / "nope")])
    assert runner_cli.run(FW_AUDIT.TOOL, a, runner=fake) == 1
    assert fake.calls == [] and "inventory %s not found" % (tmp_path / "nope") in capsys.readouterr().err
    assert runner_cli.inventory_path("inventory/sandbox") == str(ROOT / "inventory" / "sandbox")


# --- the re-exec into .venv --------------------------------------------------------------------------------------

def no_ansible_runner(monkeypatch):
    monkeypatch.setitem(sys.modules, "ansible_runner", None)  # `import ansible_runner` raises ImportError


def test_reexec_into_the_venv_when_this_python_has_no_ansible_runner(monkeypatch):
    no_ansible_runner(monkeypatch)
    calls = []
    monkeypatch.setattr(runner_cli.os, "execv", lambda path, argv: calls.append((path, argv)) or sys.exit(99))
    monkeypatch.setattr(runner_cli.os.path, "exists", lambda p: p == runner_cli.VENV_PY)
    monkeypatch.setattr(runner_cli.sys, "prefix", "/usr")
    monkeypatch.setattr(runner_cli.sys, "argv", ["tools/triage", "-l", "b300b"])
    monkeypatch.delenv(runner_cli.REEXEC_ENV, raising=False)
    exits_with(99, runner_cli.ansible_runner_module, "triage")
    assert calls == [(runner_cli.VENV_PY, [runner_cli.VENV_PY, "tools/triage", "-l", "b300b"])]
    assert os.environ[runner_cli.REEXEC_ENV] == "1"


@pytest.mark.parametrize("why", ["already re-executed", "already the venv"])
def test_no_reexec_loop_exit_1(why, monkeypatch, capsys):
    no_ansible_runner(monkeypatch)
    monkeypatch.setattr(runner_cli.os, "execv", lambda *a: pytest.fail("execv"))
    if why == "already re-executed":
        monkeypatch.setenv(runner_cli.REEXEC_ENV, "1")
        monkeypatch.setattr(runner_cli.sys, "prefix", "/usr")
    else:
        monkeypatch.delenv(runner_cli.REEXEC_ENV, raising=False)
        monkeypatch.setattr(runner_cli.sys, "prefix", runner_cli.VENV)
    exits_with(1, runner_cli.ansible_runner_module, "fw-audit")
    assert "fw-audit: ansible-runner is not installed (make venv)" in capsys.readouterr().err


def test_ansible_runner_is_returned_when_importable():
    pytest.importorskip("ansible_runner")
    assert runner_cli.ansible_runner_module("x").__name__ == "ansible_runner"
