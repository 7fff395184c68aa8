#!/usr/bin/env python3
"""Check an `sglang serve` argv with the REAL parser of sglang <VER>, on a CPU machine.

    python tools/sglang_argcheck/check_argv.py --sglang-version 0.5.18 [--json] -- ARGV...
    python tools/sglang_argcheck/check_argv.py --sglang-version 0.5.18 --batch argvs.json

With --sglang-version it builds or reuses the CPU venv (.cache/sglang-argcheck/<VER>/venv, see build_venv.sh) and
re-runs itself with that venv's python. Without it, the current python must hold sglang (e.g. run by the venv
python directly). The check itself is roles/sglang/files/sglang_argv_check.py (the same file the role's
preflight runs on the GPU hosts); this wrapper only adds the triton/torchvision import stand-ins (standins/, placed
AFTER the real site-packages on sys.path so real packages win where they exist).

Exit status: 0 accepted, 2 refused, 3 sglang not importable, 4 version mismatch (see sglang_argv_check.py).
"""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
STANDINS = os.path.join(HERE, "standins")
ROLE_CHECK = os.path.join(ROOT, "roles", "sglang", "files")


def venv_python(version, build=True):
    """Path of the venv python for VER, building the venv when missing (build_venv.sh prints its path)."""
    base = os.environ.get("SGLANG_ARGCHECK_CACHE", os.path.join(ROOT, ".cache", "sglang-argcheck"))
    py = os.path.join(base, version, "venv", "bin", "python")
    done = os.path.join(base, version, ".done")
    if not (os.path.exists(done) and os.path.exists(py)) and build:
        subprocess.run([os.path.join(HERE, "build_venv.sh"), version], check=True, stdout=subprocess.DEVNULL)
    return py


def _split_version(argv):
    out, version, i = [], None, 0
    while i < len(argv):
        if argv[i] == "--":
            out += argv[i:]
            break
        if argv[i] == "--sglang-version" and i + 1 < len(argv):
            version, i = argv[i + 1], i + 2
            continue
        if argv[i].startswith("--sglang-version="):
            version, i = argv[i].split("=", 1)[1], i + 1
            continue
        out.append(argv[i])
        i += 1
    return version, out


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    version, rest = _split_version(argv)
    if version:
        py = venv_python(version)
        venv_dir = os.path.dirname(os.path.dirname(py))
        if os.path.abspath(sys.prefix) != os.path.abspath(venv_dir):
            return subprocess.call([py, os.path.abspath(__file__), "--expect-version", version] + rest)
    sys.path.append(STANDINS)
    sys.path.insert(0, ROLE_CHECK)
    import sglang_argv_check  # only now: the role's files/ dir (ROLE_CHECK) is on sys.path from the line above
    return sglang_argv_check.main(rest)


if __name__ == "__main__":
    sys.exit(main())
