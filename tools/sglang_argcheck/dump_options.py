#!/usr/bin/env python3
"""Dump the option catalog of the REAL `sglang serve` parser as JSON (the stub's options/server-options-<ver>.json).

    python tools/sglang_argcheck/dump_options.py --sglang-version 0.5.18 [-o FILE]

Structure (same as roles/sglang/files/options/server-options-<ver>.json, copies of
../shared/reference/sglang/): one key per option string, sorted,
{"action": <argparse action class name>, "choices": list|null, "dest": str, "nargs": ...,
 "type": <name of the type callable>|null}, indent 1. With --sglang-version it runs itself in the CPU venv of that
version (tools/sglang_argcheck/build_venv.sh).
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def catalog(parser):
    out = {}
    for action in parser._actions:  # argparse lists its actions only in this private attribute
        for opt in action.option_strings:
            tname = None
            if action.type is not None:
                tname = getattr(action.type, "__name__", type(action.type).__name__)
            out[opt] = {
                "action": type(action).__name__,
                "choices": list(action.choices) if action.choices is not None else None,
                "dest": action.dest,
                "nargs": action.nargs,
                "type": tname,
            }
    return out


def render(cat):
    return json.dumps(cat, indent=1, sort_keys=True)  # no trailing newline, like the reference files


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sglang-version")
    ap.add_argument("-o", "--output", help="write here (default: stdout)")
    opts = ap.parse_args(argv)
    if opts.sglang_version:
        sys.path.insert(0, HERE)
        import check_argv
        py = check_argv.venv_python(opts.sglang_version)
        venv_dir = os.path.dirname(os.path.dirname(py))
        if os.path.abspath(sys.prefix) != os.path.abspath(venv_dir):
            import subprocess
            rest = ["-o", os.path.abspath(opts.output)] if opts.output else []
            return subprocess.call([py, os.path.abspath(__file__)] + rest)
    sys.path.append(os.path.join(HERE, "standins"))
    import warnings
    warnings.filterwarnings("ignore")
    from sglang.srt.server_args import ServerArgs  # only now: the venv and the stand-ins are chosen above
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    text = render(catalog(parser))
    if opts.output:
        with open(opts.output, "w", encoding="utf-8") as fh:
            fh.write(text)
        print("wrote %s (%d options)" % (opts.output, len(json.loads(text))), file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
