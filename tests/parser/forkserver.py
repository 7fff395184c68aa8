"""One interpreter per CPU venv that imports the real sglang ONCE, then runs each probe in a forked child (CI time).

Importing `sglang.srt.server_args` costs about 15 s of CPU (torch and the rest of sglang's import tree); the parser
part ran about twenty such imports, each its own process. A server here imports it once; each `run(argv)` forks a
child from that imported state and runs the script exactly as `python SCRIPT ARGS...` (or `python -m MODULE ARGS`)
would: `runpy` with `run_name="__main__"`, its own `sys.argv`, working directory, stdout/stderr (files, fds 1 and 2)
and exit status (SystemExit's code; an uncaught exception prints its traceback and exits 1). The child is a fresh copy
of the server after the preload, so no run sees another's state. Only the preloaded module and what it imports are
shared: nothing the scripts would not import themselves (check_argv.py, dump_options.py and the weights verifier all
import `sglang.srt.server_args` or sit below `sglang.srt`), and the stand-ins directory is appended after the real
site-packages exactly as check_argv.py does it, so real packages still win.
`B300_PARSER_FORKSERVER=0` runs every probe as its own process instead (the behaviour before).
"""
import atexit
import json
import os
import subprocess
import tempfile

SERVER = r"""
import json, os, runpy, sys, traceback, warnings
cfg = json.loads(sys.argv[1])
for p in cfg["append_path"]:
    sys.path.append(p)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    for m in cfg["preload"]:
        __import__(m)
proto = os.fdopen(os.dup(1), "w")
devnull = os.open(os.devnull, os.O_WRONLY)
os.dup2(devnull, 1)
for line in sys.stdin:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
                f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.dup2(f, fd)
                os.close(f)
            sys.stdout = open(1, "w", closefd=False)
            sys.stderr = open(2, "w", closefd=False)
            os.chdir(req["cwd"])
            os.environ.update(req["env"])
            argv = req["argv"]
            try:
                if argv[0] == "-m":
                    sys.argv = [argv[1]] + argv[2:]
                    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
                else:
                    sys.argv = list(argv)
                    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
                    runpy.run_path(argv[0], run_name="__main__")
                code = 0
            except SystemExit as exc:
                if exc.code is None:
                    code = 0
                elif isinstance(exc.code, int):
                    code = exc.code
                else:
                    print(exc.code, file=sys.stderr)
                    code = 1
            except BaseException:
                traceback.print_exc()
                code = 1
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    _, status = os.waitpid(pid, 0)
    rc = os.waitstatus_to_exitcode(status)
    proto.write(json.dumps({"rc": rc}) + "\n")
    proto.flush()
"""

_SERVERS = {}


class ForkServer:
    """A running server in `python` (a venv's interpreter) with `preload` imported; see the module docstring."""

    def __init__(self, python, preload, append_path=()):
        self.python = str(python)
        cfg = {"preload": list(preload), "append_path": [str(p) for p in append_path]}
        self.proc = subprocess.Popen([self.python, "-c", SERVER, json.dumps(cfg)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def run(self, argv, cwd=".", env=None):
        """(rc, stdout, stderr) of `python ARGV...` run in a child of the server."""
        if self.proc.poll() is not None:
            raise RuntimeError("the fork server in %s died (rc %s) while importing its preload: %s" % (
                self.python, self.proc.returncode, self.proc.stderr.read()[-3000:]))
        with tempfile.TemporaryDirectory(prefix="forkserver-") as d:
            out, err = os.path.join(d, "stdout"), os.path.join(d, "stderr")
            self.proc.stdin.write(json.dumps({"argv": [str(a) for a in argv], "cwd": str(cwd), "env": env or {},
                                              "stdout": out, "stderr": err}) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("the fork server in %s died (rc %s): %s" % (
                    self.python, self.proc.wait(), self.proc.stderr.read()[-3000:]))
            rc = json.loads(line)["rc"]
            with open(out, encoding="utf-8", errors="replace") as fo, open(err, encoding="utf-8",
                                                                            errors="replace") as fe:
                return rc, fo.read(), fe.read()

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def enabled():
    return os.environ.get("B300_PARSER_FORKSERVER", "1") != "0"


STANDINS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tools",
                        "sglang_argcheck", "standins")


def sglang(python):
    """The server of one CPU venv with sglang's parser imported and the stand-ins after site-packages, as
    check_argv.py arranges them: what every parser test runs its probes in (one per venv, whoever asks first)."""
    return get(python, ["sglang.srt.server_args"], [STANDINS])


def get(python, preload, append_path=()):
    """The shared server of (python, preload, append_path), started on first use; closed at exit. Keyed by the
    interpreter's path as given, NOT its realpath: every venv's bin/python links to the same base interpreter, and
    the venv (its site-packages, so its sglang version) is told by the link's own path."""
    key = (os.path.abspath(str(python)), tuple(preload), tuple(str(p) for p in append_path))
    if key not in _SERVERS:
        _SERVERS[key] = ForkServer(python, preload, append_path)
    return _SERVERS[key]


@atexit.register
def _close_all():
    for s in _SERVERS.values():
        s.close()
