"""In-process runner of the hwemu stand-ins for the triage's unit tests (no subprocess per tool: the same
hwemu_cli functions the sandbox hosts run, called directly with stdout captured)."""
import contextlib
import io
import os
import shutil

import hwemu_cli

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HWEMU = os.path.join(ROOT, "sandbox", "hwemu")
BIN = os.path.join(HWEMU, "bin")


class EmuModule:
    """The slice of AnsibleModule the collector uses (run_command, get_bin_path), over the emulated host in ``root``."""

    def __init__(self, root):
        self.root = root
        self.calls = []

    def get_bin_path(self, name, required=False, opt_dirs=None):
        for d in opt_dirs or []:
            p = os.path.join(d, name)
            if os.path.exists(p):
                return p
        return shutil.which(name)

    def run_command(self, argv, environ_update=None, **kw):
        self.calls.append(list(argv))
        tool = os.path.basename(argv[0])
        if os.path.dirname(argv[0]) != BIN or tool not in hwemu_cli.TOOLS:
            return 127, "", "%s: not emulated in the unit tests" % argv[0]
        out, err = io.StringIO(), io.StringIO()
        rc = 0
        old = dict(os.environ)
        os.environ.update(environ_update or {})
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                hwemu_cli.main(tool, list(argv[1:]))
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        finally:
            os.environ.clear()
            os.environ.update(old)
        return rc, out.getvalue(), err.getvalue()


def emulated_host(tmp, scenario, hostname="b300b", monkeypatch=None):
    """Render scenario into tmp (an emulator root) and point the stand-ins at it; returns (module, sysfs, proc)."""
    root = str(tmp)
    if monkeypatch is not None:
        monkeypatch.setenv("HWEMU_ROOT", root)
        monkeypatch.setenv("HWEMU_HOSTNAME", hostname)
    else:
        os.environ["HWEMU_ROOT"] = root
        os.environ["HWEMU_HOSTNAME"] = hostname
    hwemu_cli.set_scenario(scenario, root)
    return EmuModule(root), os.path.join(root, "sys"), os.path.join(root, "proc")
