#!/usr/bin/env python3
"""Start an SGLang server or the sglang-router with the API key OFF every argv and OUT of the log (issue 15).

SGLang 0.5.17/0.5.18 (`sglang serve`) and sglang-router 0.3.2 take the key only as `--api-key KEY` (no environment
variable, no file: see the option catalogs in roles/sglang/files/options/). With `--api-key ${SGLANG_API_KEY}` in
ExecStart=, systemd puts the key into the argv and every local user reads it in /proc/<pid>/cmdline.

The unit runs instead (`$$` keeps systemd from expanding the token):
    ExecStart=/usr/bin/python3 /usr/local/lib/sglang-launch/sglang_launch.py EXE serve ... --api-key ${SGLANG_API_KEY}
    ExecStart=/usr/bin/python3 /usr/local/lib/sglang-launch/sglang_launch.py PY -m sglang_router.launch_router ...
This launcher
  1. re-executes itself ONCE with the target's interpreter (the venv python: EXE's `#!` line, or PY), the token
     still literal, so no exec ever carries the key;
  2. replaces the literal token `${SGLANG_API_KEY}` by the value of that variable (the 0640 root:sglang env file,
     EnvironmentFile=) in sys.argv only, inside the process, and removes the variable from the environment;
  3. sends its own stdout/stderr through a pipe to a forked filter (same argv as this process: no key) that writes
     every line to the journal with the key and any `api_key='...'` value replaced by `<redacted>` (SGLang logs
     `server_args=ServerArgs(... api_key='...')` at INFO; systemd's LogFilterPatterns= needs systemd >= 253, Debian 12
     has 252);
  4. runs the target in-process: runpy.run_path(EXE) or runpy.run_module(MODULE) with that sys.argv;
  5. when the target returns (a SIGTERM drain or the router's graceful shutdown ended), closes its end of the pipe
     and waits (at most FILTER_WAIT_S) until the filter has written the last lines and exited. Without that, systemd
     (KillMode=mixed) SIGKILLs the filter the moment the main process is gone, mid-write; on the sandbox a filter
     killed that way once stayed in the unit's cgroup for the whole TimeoutStopSec (200 s: "Processes still around
     after final SIGKILL"), and the router's restart, the API key's removal, waited for it.
Stdlib only.
"""
import os
import re
import runpy
import shutil
import sys
import time

TOKEN = "${SGLANG_API_KEY}"
ENV = "SGLANG_API_KEY"
REEXEC = "SGLANG_LAUNCH_REEXEC"
REDACTED = "<redacted>"
FILTER_WAIT_S = 5.0
API_KEY_RE = re.compile(r"""((?:api[_-]?key|Authorization)['"]?\s*[=:]\s*(?:Bearer\s+)?)(['"]?)[^'"\s,)]+""", re.I)


def usage(msg):
    sys.stderr.write("sglang_launch: %s\nusage: sglang_launch.py EXE ARGS... | sglang_launch.py PYTHON -m MODULE ARGS...\n"
                     % msg)
    return 2


def interpreter_of(script):
    """The interpreter of a `#!` script (`#!/usr/bin/env python3` resolved on PATH)."""
    with open(script, "rb") as fh:
        first = fh.readline(512).decode(errors="replace").strip()
    if not first.startswith("#!"):
        return None
    parts = first[2:].split()
    if not parts:
        return None
    if os.path.basename(parts[0]) == "env" and len(parts) > 1:
        return shutil.which(parts[1])
    return parts[0]


def redact(line, key):
    if key:
        line = line.replace(key, REDACTED)
    return API_KEY_RE.sub(lambda m: m.group(1) + m.group(2) + REDACTED, line)


def start_filter(key):
    """Fork a filter that copies our stdout+stderr to the original stdout, redacted, line by line."""
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(write_fd)
        out = os.fdopen(os.dup(1), "w", buffering=1, errors="replace")
        with os.fdopen(read_fd, "r", errors="replace") as src:
            for line in src:
                out.write(redact(line, key))
        out.flush()
        os._exit(0)
    os.close(read_fd)
    os.dup2(write_fd, 1)
    os.dup2(write_fd, 2)
    os.close(write_fd)
    return pid


def finish_filter(pid, timeout_s=FILTER_WAIT_S):
    """Close this process's ends of the filter's pipe, then wait (bounded) for the filter to reach EOF and exit.
    True when it exited (reaped here, so no process of the unit is left after the main one)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    for fd in (1, 2):
        try:
            os.close(fd)
        except OSError:
            pass
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return True
        if done or time.monotonic() >= deadline:
            return bool(done)
        time.sleep(0.02)


def main(argv):
    if not argv:
        return usage("nothing to start")
    module = None
    if len(argv) >= 3 and argv[1] == "-m":
        interp, module, rest = shutil.which(argv[0]) or argv[0], argv[2], argv[3:]
    else:
        interp, rest = interpreter_of(argv[0]), argv[1:]
        if not interp:
            return usage("%s is not a #! script" % argv[0])
    if os.environ.get(REEXEC) != "1":
        os.environ[REEXEC] = "1"
        os.execv(interp, [interp, os.path.abspath(__file__)] + argv)   # token still literal: no key in this exec
    os.environ.pop(REEXEC, None)
    key = os.environ.pop(ENV, "") or ""
    if TOKEN in rest and not key:
        return usage("%s is in the arguments but %s is empty (env file)" % (TOKEN, ENV))
    filter_pid = start_filter(key)
    args = [key if a == TOKEN else a for a in rest]
    try:
        if module:
            sys.argv = [module] + args
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            sys.argv = [argv[0]] + args
            sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
            runpy.run_path(argv[0], run_name="__main__")
    finally:      # also when the target ends with SystemExit (sys.exit from its main)
        finish_filter(filter_pid)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
