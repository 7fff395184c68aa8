"""The one ansible-runner wrapper of the on-call commands (tools/fw-audit, tools/triage, and the next one).

A command is a `Tool` (its name, its playbook, the prefix of its report variables, its default report dir) plus the
arguments and extra variables of its own; everything else is here, once:

- the common arguments (-i/-l/--hosts/-e/--check/--json/--report-dir/-c/--known-hosts/-v), relative inventories
  read from the repository root, `-e K=V` parsed (a bad one is exit 1, like every bad argument);
- the re-exec into the project's `.venv` when the Python that started the command has no ansible-runner;
- the run itself: ansible-runner with the project's ansible.cfg and `.venv/bin` first on PATH, a private data dir
  removed afterwards, `-c paramiko --known-hosts FILE` as a HOME whose known_hosts is FILE (checking on, nothing
  recorded, no prompt);
- the events: failed and unreachable tasks are collected, so a run that wrote no report says which host and task;
- the report: `<report_dir>/<prog>-<UTC>-<pid>.json|.md`, printed (Markdown, or the JSON with --json);
- the exit-code policy: 0 ok, 2 a finding/fault, 3 a host not read (3 wins over 2; the playbook's report computes
  it as `summary.exit_code`), 1 the tool failed (bad arguments, no report, a report without a valid exit code).

tools/ is not a package: the commands find this file beside them (Python puts a script's directory first on
sys.path); tests/unit/test_runner_cli.py imports it the same way.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, ".venv")
VENV_PY = os.path.join(VENV, "bin", "python")
# set for the re-exec'd process, so a .venv without ansible-runner fails instead of re-executing itself for ever
REEXEC_ENV = "B300_TOOL_REEXEC"

OK, FINDING, UNREAD, TOOL_ERROR = 0, 2, 3, 1
REPORT_CODES = (OK, FINDING, UNREAD)


class Tool:
    """What one command adds to the wrapper.

    prog: the command's name (messages, report file names); playbook: under playbooks/; var_prefix: the playbook's
    report variables are <prefix>_report_dir, <prefix>_report_name and <prefix>_hosts; noun: what the playbook does
    ("audit"), for the message of a run without a report; what: the --hosts help's object; textfiles: the playbook
    writes node_exporter textfiles in <report_dir>/<name>/ (the last line says so); reports: the default report dir
    under artifacts/."""

    def __init__(self, prog, playbook, var_prefix, noun, reports, what=None, textfiles=False):
        self.prog = prog
        self.playbook = playbook
        self.var_prefix = var_prefix
        self.noun = noun
        self.default_report_dir = os.path.join(ROOT, "artifacts", reports)
        self.what = what or noun
        self.textfiles = textfiles


class ArgumentParser(argparse.ArgumentParser):
    """argparse that exits 1 on a bad argument: its own 2 would read as "a finding" in the exit-code policy."""

    def error(self, message):
        self.print_usage(sys.stderr)
        self.exit(TOOL_ERROR, "%s: error: %s\n" % (self.prog, message))


def parser(tool, doc, e_example):
    """The common arguments; the command adds its own, then calls parse_args(tool, parser, argv)."""
    p = ArgumentParser(prog=tool.prog, description=doc.split("\n\n")[0],
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=doc)
    p.add_argument("-i", "--inventory", default="inventory/production",
                   help="inventory path (default inventory/production; relative paths are from the repo root)")
    p.add_argument("-l", "--limit", default=None, help="limit to these hosts/groups (ansible --limit syntax)")
    p.add_argument("--hosts", default=None, help="host pattern to %s (default: the gpu_nodes group)" % tool.what)
    p.add_argument("-e", "--extra-vars", action="append", default=[], metavar="K=V",
                   help="extra variables (K=V), e.g. -e %s" % e_example)
    p.add_argument("--check", action="store_true", help="run the playbook with --check (it is read-only anyway)")
    p.add_argument("--json", action="store_true", help="print the JSON report instead of the Markdown")
    p.add_argument("--report-dir", default=tool.default_report_dir)
    p.add_argument("-c", "--connection", choices=("ssh", "paramiko"), default=None,
                   help="connection plugin (ansible -c): ssh (OpenSSH, the default) or paramiko (pure Python, for "
                        "hosts or laptops where OpenSSH multiplexing is unavailable)")
    p.add_argument("--known-hosts", default=None, metavar="FILE",
                   help="with -c paramiko: check host keys against FILE only (a missing or different key makes the "
                        "host unreachable, exit 3); without it the inventory's host key setting applies")
    p.add_argument("-v", "--verbose", action="store_true", help="print the ansible output too")
    return p


def parse_args(p, argv):
    """Parse and check what is common; the command checks its own arguments on the result (p.error exits 1)."""
    a = p.parse_args(argv)
    if a.known_hosts and a.connection != "paramiko":
        p.error("--known-hosts needs -c paramiko (OpenSSH takes UserKnownHostsFile from the inventory's ssh args)")
    for kv in a.extra_vars:
        if "=" not in kv:
            p.error("-e expects K=V, got %r" % kv)
    return a


def ansible_runner_module(prog):
    """ansible_runner, importing it from the project's .venv (re-exec) when this Python has none; exit 1 without."""
    try:
        import ansible_runner
    except ImportError:
        if os.path.exists(VENV_PY) and os.path.realpath(sys.prefix) != os.path.realpath(VENV) \
                and not os.environ.get(REEXEC_ENV):
            os.environ[REEXEC_ENV] = "1"
            os.execv(VENV_PY, [VENV_PY] + sys.argv)
        sys.stderr.write("%s: ansible-runner is not installed (make venv)\n" % prog)
        sys.exit(TOOL_ERROR)
    return ansible_runner


def inventory_path(path):
    return path if os.path.isabs(path) else os.path.join(ROOT, path)


def report_name(prog, now=None, pid=None):
    return "%s-%s-%d" % (prog, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now)), os.getpid() if pid is None else pid)


def extravars(tool, args, name, own=None):
    """The playbook's variables: its report dir and name, --hosts, the command's own, then -e K=V (which win)."""
    ev = {"%s_report_dir" % tool.var_prefix: os.path.abspath(args.report_dir), "%s_report_name" % tool.var_prefix: name}
    if args.hosts:
        ev["%s_hosts" % tool.var_prefix] = args.hosts
    ev.update(own or {})
    for kv in args.extra_vars:
        k, v = kv.split("=", 1)
        ev[k] = v
    return ev


def runner_kwargs(tool, args, inventory, ev, tmp, environ=None):
    """ansible_runner.run's arguments. With --known-hosts FILE, paramiko_ssh (which reads ~/.ssh/known_hosts) gets
    a HOME whose known_hosts is a copy of FILE; checking on whatever the inventory says (extra vars win over host
    vars), never recording a key, raising instead of prompting for an unknown one (persistent connections on)."""
    environ = os.environ if environ is None else environ
    env = {"ANSIBLE_CONFIG": os.path.join(ROOT, "ansible.cfg"),
           "PATH": os.path.join(VENV, "bin") + os.pathsep + environ.get("PATH", "")}
    ev = dict(ev)
    cmdline = []
    if args.connection:
        cmdline += ["-c", args.connection]
    if args.known_hosts:
        home = os.path.join(tmp, "home")
        os.makedirs(os.path.join(home, ".ssh"), mode=0o700)
        shutil.copyfile(os.path.expanduser(args.known_hosts), os.path.join(home, ".ssh", "known_hosts"))
        env.update(HOME=home, ANSIBLE_HOST_KEY_CHECKING="True", ANSIBLE_PARAMIKO_RECORD_HOST_KEYS="False",
                   ANSIBLE_USE_PERSISTENT_CONNECTIONS="True", ANSIBLE_LOCAL_TEMP=os.path.join(tmp, "ansible-tmp"))
        ev["ansible_host_key_checking"] = True
    if args.check:
        cmdline.append("--check")
    kw = dict(private_data_dir=tmp, project_dir=ROOT, playbook=os.path.join(ROOT, "playbooks", tool.playbook),
              inventory=inventory, extravars=ev, envvars=env, quiet=not args.verbose,
              settings={"suppress_env_files": True})
    if args.limit:
        kw["limit"] = args.limit
    if cmdline:
        kw["cmdline"] = " ".join(cmdline)
    return kw


class Failures:
    """ansible-runner event handler: keeps every event (returns True) and notes the failed and unreachable tasks
    (host, task, message; ignored failures left out), for the message of a run that wrote no report."""

    def __init__(self):
        self.seen = []

    def __call__(self, event):
        kind = event.get("event")
        data = event.get("event_data") or {}
        if kind == "runner_on_unreachable" or (kind == "runner_on_failed" and not data.get("ignore_errors")):
            res = data.get("res") or {}
            msg = " ".join(str(res.get("msg") or res.get("stderr") or "").split())
            self.seen.append("%s %s: %s%s" % (data.get("host", "?"), "UNREACHABLE" if kind.endswith("unreachable")
                                                else "FAILED", data.get("task", "?"), ": " + msg[:300] if msg else ""))
        return True


def exit_code(report):
    """The report's own summary.exit_code when it is one of 0/2/3, else None (the tool then fails, exit 1)."""
    try:
        code = int(report["summary"]["exit_code"])
    except (KeyError, TypeError, ValueError):
        return None
    return code if code in REPORT_CODES else None


def run(tool, args, own_vars=None, runner=None, out=None, err=None):
    """Run the tool's playbook, print its report, return the exit code (0/2/3 from the report, 1 tool error)."""
    out = out or sys.stdout
    err = err or sys.stderr
    inventory = inventory_path(args.inventory)
    if not os.path.exists(inventory):
        err.write("%s: inventory %s not found\n" % (tool.prog, inventory))
        return TOOL_ERROR
    runner = runner or ansible_runner_module(tool.prog)
    name = report_name(tool.prog)
    ev = extravars(tool, args, name, own_vars)
    report_dir = ev["%s_report_dir" % tool.var_prefix]
    base = os.path.join(report_dir, name)
    failures = Failures()
    tmp = tempfile.mkdtemp(prefix=tool.prog + "-")
    try:
        r = runner.run(event_handler=failures, **runner_kwargs(tool, args, inventory, ev, tmp))
        if not os.path.exists(base + ".json"):
            text = r.stdout.read() if r.stdout else ""
            err.write("%s: the %s playbook wrote no report (runner status %s, rc %s)\n%s%s\n"
                      % (tool.prog, tool.noun, r.status, r.rc, "".join(f + "\n" for f in failures.seen), text[-4000:]))
            return TOOL_ERROR
        with open(base + ".json") as f:
            report = json.load(f)
        code = exit_code(report)
        if code is None:
            err.write("%s: %s.json has no summary.exit_code of 0, 2 or 3\n" % (tool.prog, base))
            return TOOL_ERROR
        if args.json:
            out.write(json.dumps(report, indent=2, sort_keys=True) + "\n")
        else:
            with open(base + ".md") as f:
                out.write(f.read())
            out.write("\nreport: %s.md (.json)%s\n" % (base, "; textfiles: %s/" % base if tool.textfiles else ""))
        return code
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
