#!/usr/bin/env python3
"""Issue 39's house measures of the Python side, printed as Markdown: functions of 100 lines or more outside
sandbox/ (the limit tests/unit/test_house.py holds), the collection's module and module_utils line counts, and
every `sys.path` edit in the repository. Usage: tools/house_metrics.py [--min-lines N]"""
import argparse
import ast
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
SKIP = {".venv", ".cache", ".git", "node_modules", "artifacts", "__pycache__"}
COLLECTION = ROOT / "collections" / "ansible_collections" / "b300" / "rollout"
SYS_PATH_EDIT = re.compile(r"sys\.path\.(insert|append|extend)\(|sys\.path\s*(\[[^\]]*\])?\s*[+]?=")


def python_files(root=ROOT):
    """Every *.py in the repository outside virtual environments, caches and build outputs, and the commands in
    tools/ without a suffix (tools/triage, tools/sweep, ...)."""
    files = [p for p in root.rglob("*.py") if not SKIP & set(p.relative_to(root).parts)]
    files += [p for p in (root / "tools").glob("*") if p.is_file() and not p.suffix and _is_python(p)]
    return sorted(files)


def _is_python(path):
    with open(path, "rb") as fh:
        return b"python" in fh.readline()


def long_functions(min_lines=100, root=ROOT, exclude=("sandbox",)):
    """(path, qualified name, lines) of every function or method of min_lines or more, outside `exclude`."""
    out = []
    for path in python_files(root):
        rel = path.relative_to(root)
        if rel.parts[0] in exclude:
            continue
        try:
            tree = ast.parse(path.read_text(), str(path))
        except SyntaxError:
            continue
        out += [(str(rel), name, n) for name, n in _functions(tree) if n >= min_lines]
    return out


def _functions(tree, prefix=""):
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node.end_lineno - node.lineno + 1
            yield from _functions(node, prefix + node.name + ".")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, prefix + node.name + ".")


def sys_path_edits(root=ROOT):
    """(path, line number, line) of every statement that edits sys.path."""
    out = []
    for path in python_files(root):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if SYS_PATH_EDIT.search(line) and not line.lstrip().startswith("#"):
                out.append((str(path.relative_to(root)), i, line.strip()))
    return out


def line_counts(folder):
    return sorted(((p.name, len(p.read_text().splitlines())) for p in folder.rglob("*.py")
                   if p.name != "__init__.py"), key=lambda t: -t[1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--min-lines", type=int, default=100)
    args = ap.parse_args(argv)
    funcs = long_functions(args.min_lines)
    print("## Functions of %d lines or more outside sandbox/: %d\n" % (args.min_lines, len(funcs)))
    for path, name, n in sorted(funcs, key=lambda t: -t[2]):
        print("- %d `%s` %s" % (n, name, path))
    for sub in ("modules", "module_utils"):
        counts = line_counts(COLLECTION / "plugins" / sub)
        print("\n## plugins/%s: %d files, %d lines; largest\n" % (sub, len(counts), sum(n for _, n in counts)))
        for name, n in counts[:8]:
            print("- %d %s" % (n, name))
    edits = sys_path_edits()
    print("\n## sys.path edits: %d\n" % len(edits))
    for path, i, line in edits:
        print("- %s:%d `%s`" % (path, i, line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
