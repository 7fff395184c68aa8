#!/usr/bin/env python3
"""Check an `sglang serve` command line with the REAL parser of the installed sglang, without starting anything.

Run it with the python of the venv that holds sglang (on a GPU host: the server venv):

    <venv>/bin/python sglang_argv_check.py [--expect-version VER] [--json] -- ARGV...
    <venv>/bin/python sglang_argv_check.py [--expect-version VER] --batch FILE    # FILE: JSON list of argv lists

It does what `sglang serve ARGV` does before loading a model: strip `--model-type`, turn a leading positional
model path into `--model-path`, merge `--config FILE`, then `argparse.ArgumentParser(prog="sglang serve")` +
`ServerArgs.add_cli_args(parser)` + `parser.parse_args(argv)`. It stops there: the later `ServerArgs.__post_init__`
needs an accelerator and is not run, so checks that sglang makes after parsing (e.g. the speculative algorithm
name) are not covered.

Exit status: 0 accepted, 2 refused (the parser's own message, e.g. "unrecognized arguments: --foo"),
3 sglang not importable with this python, 4 the installed sglang is not --expect-version.
Prefix abbreviations that argparse accepts (`--tp` -> `--tp-size`) are reported as warnings: render long names.
Standard library only (besides sglang itself).
"""

import argparse
import contextlib
import io
import json
import os
import sys
import warnings

EXIT_OK, EXIT_REFUSED, EXIT_NO_SGLANG, EXIT_VERSION = 0, 2, 3, 4


def _installed_version(sglang_mod):
    try:
        from sglang.version import __version__
        return __version__
    except ImportError:
        import importlib.metadata
        return getattr(sglang_mod, "__version__", None) or importlib.metadata.version("sglang")


def load_sglang():
    """(version, ServerArgs, serve_module_or_None); raises ImportError with the cause."""
    # sglang is imported here, not at the top: a missing or broken sglang is a finding this script reports (exit 3)
    warnings.filterwarnings("ignore")
    with contextlib.redirect_stdout(io.StringIO()):
        import sglang
        from sglang.srt.server_args import ServerArgs
        try:
            import sglang.cli.serve as serve_mod
        except ImportError:
            serve_mod = None
    return _installed_version(sglang), ServerArgs, serve_mod


def _extract_model_type(argv):
    out, i, model_type = [], 0, "auto"
    while i < len(argv):
        if argv[i] == "--model-type":
            if i + 1 >= len(argv):
                raise ValueError("--model-type requires a value. Valid values are: auto, llm, diffusion.")
            model_type, i = argv[i + 1], i + 2
            continue
        if argv[i].startswith("--model-type="):
            model_type = argv[i].split("=", 1)[1]
            i += 1
            continue
        out.append(argv[i])
        i += 1
    if model_type not in ("auto", "llm", "diffusion"):
        raise ValueError("invalid --model-type '%s'. Valid values are: auto, llm, diffusion." % model_type)
    return model_type, out


def serve_preprocess(argv, serve_mod=None):
    """What `sglang serve` does to argv before the parser (uses sglang's own private helpers when present: the code
    `sglang serve` of the installed version runs)."""
    if serve_mod is not None and hasattr(serve_mod, "_extract_model_type_override"):
        try:
            model_type, argv = serve_mod._extract_model_type_override(list(argv))
        except Exception as exc:  # sglang raises a bare Exception here
            raise ValueError(str(exc)) from None
    else:
        model_type, argv = _extract_model_type(list(argv))
    if serve_mod is not None and hasattr(serve_mod, "_normalize_positional_model_path"):
        argv, _ = serve_mod._normalize_positional_model_path(argv)
    elif argv and not argv[0].startswith("-"):
        argv = ["--model-path", argv[0]] + argv[1:]
    return model_type, argv


def build_parser(server_args_cls):
    parser = argparse.ArgumentParser(prog="sglang serve")
    server_args_cls.add_cli_args(parser)
    return parser


# --- begin argparse_abbrev: a copy of collections/ansible_collections/b300/rollout/plugins/module_utils/sglang/argparse_abbrev.py
# (this file runs alone through ansible.builtin.script; tests/unit/test_one_copy.py keeps the copy exact)
def prefix_matches(name, options):
    """Options (sorted) that start with `name`, e.g. --tp -> [--tp-size]."""
    return sorted(o for o in options if o.startswith(name))


def expand(name, options):
    """The long option argparse would take `name` for: None when `name` is an option itself, or no unique prefix."""
    if name in options or not name.startswith("--") or len(name) < 3:
        return None
    matches = prefix_matches(name, options)
    return matches[0] if len(matches) == 1 else None


def abbreviations(argv, options):
    """[{"used": "--tp", "long": "--tp-size"}] for each abbreviated option in argv (up to a bare --)."""
    found = []
    for tok in argv:
        if tok == "--":
            break
        name = tok.split("=", 1)[0]
        long_name = expand(name, options)
        if long_name:
            found.append({"used": name, "long": long_name})
    return found


def long_names(argv, options):
    """argv with every abbreviated option written out (`--tp=4` -> `--tp-size=4`)."""
    out = []
    for tok in argv:
        name = tok.split("=", 1)[0]
        long_name = expand(name, options)
        out.append(long_name + tok[len(name):] if long_name else tok)
    return out
# --- end argparse_abbrev


def check_one(argv, server_args_cls, serve_mod, version):
    """Dict: ok, rc, error, warnings, abbreviations, argv (as parsed after preprocessing)."""
    result = {"ok": False, "rc": EXIT_REFUSED, "version": version, "error": None, "warnings": [],
              "abbreviations": [], "argv": list(argv)}
    try:
        model_type, argv2 = serve_preprocess(argv, serve_mod)
    except ValueError as exc:
        result["error"] = str(exc)
        return result
    if model_type not in ("auto", "llm"):
        registry = getattr(serve_mod, "_create_backend_registry", None)
        if model_type != "diffusion" and registry is not None:
            try:  # 0.5.18+: backends come from a registry (out-of-tree entry points can add some)
                registry().get(model_type)
            except Exception as exc:  # whatever the registry raises for an unknown backend is the answer
                result["error"] = str(exc)
                return result
        result["error"] = ("--model-type %s selects another serve backend; this check covers the LLM server only"
                           % model_type)
        return result
    parser = build_parser(server_args_cls)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            if "--config" in argv2:
                from sglang.srt.server_args_config_parser import ConfigArgumentMerger
                argv2 = ConfigArgumentMerger(parser).merge_config_with_args(argv2)
            parser.parse_args(argv2)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else EXIT_REFUSED
        if code == 0:  # --help
            result.update(ok=True, rc=EXIT_OK)
            return result
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        msg = [ln for ln in lines if ": error: " in ln]
        result["error"] = (msg[-1] if msg else (lines[-1] if lines else "argparse exit %s" % code))
        result["rc"] = EXIT_REFUSED
        return result
    except Exception as exc:  # config merge errors and the like: reported as the check's error, not a traceback
        result["error"] = "%s: %s" % (type(exc).__name__, exc)
        return result
    result["abbreviations"] = abbreviations(argv2, parser._option_string_actions)  # argparse keeps its option map private
    result["warnings"] = ["%s is an argparse prefix abbreviation of %s: render the long name"
                          % (a["used"], a["long"]) for a in result["abbreviations"]]
    result.update(ok=True, rc=EXIT_OK)
    return result


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--" in argv:
        idx = argv.index("--")
        opts_argv, server_argv = argv[:idx], argv[idx + 1:]
    else:
        opts_argv, server_argv = argv, None
    ap = argparse.ArgumentParser(prog="sglang_argv_check.py",
                                 description="check an `sglang serve` argv with the installed sglang's parser")
    ap.add_argument("--expect-version", help="fail (exit 4) unless the installed sglang is this version")
    ap.add_argument("--json", action="store_true", help="print one JSON object (a list with --batch)")
    ap.add_argument("--batch", help="JSON file (or - for stdin) holding a list of argv lists")
    opts = ap.parse_args(opts_argv)
    if server_argv is None and not opts.batch:
        ap.error("give the server argv after --, or --batch FILE")

    try:
        version, server_args_cls, serve_mod = load_sglang()
    except Exception as exc:  # ImportError, or a dependency failing at import: both mean "no usable sglang"
        msg = ("sglang_argv_check: cannot import sglang with %s: %s: %s. Run this check with the python of the "
               "server venv (<venv>/bin/python) where sglang is installed." % (sys.executable, type(exc).__name__,
                                                                                   exc))
        if opts.json:
            print(json.dumps({"ok": False, "rc": EXIT_NO_SGLANG, "error": msg}))
        else:
            print(msg, file=sys.stderr)
        return EXIT_NO_SGLANG

    if opts.expect_version and version != opts.expect_version:
        msg = ("sglang_argv_check: %s has sglang %s, expected %s"
               % (sys.executable, version, opts.expect_version))
        if opts.json:
            print(json.dumps({"ok": False, "rc": EXIT_VERSION, "version": version, "error": msg}))
        else:
            print(msg, file=sys.stderr)
        return EXIT_VERSION

    if opts.batch:
        fh = sys.stdin if opts.batch == "-" else open(opts.batch, encoding="utf-8")
        with fh:
            argvs = json.load(fh)
        results = [check_one(a, server_args_cls, serve_mod, version) for a in argvs]
        print(json.dumps(results, indent=1))
        return EXIT_OK if all(r["ok"] for r in results) else EXIT_REFUSED

    res = check_one(server_argv, server_args_cls, serve_mod, version)
    if opts.json:
        print(json.dumps(res))
    else:
        for w in res["warnings"]:
            print("WARNING: " + w, file=sys.stderr)
        if res["ok"]:
            print("OK: sglang %s parser (%s) accepts the command line" % (version, os.path.basename(sys.executable)))
        else:
            print("REFUSED by sglang %s parser: %s" % (version, res["error"]), file=sys.stderr)
    return res["rc"]


if __name__ == "__main__":
    sys.exit(main())
