#!/usr/bin/env python3
"""Generate (or check) a role's meta/argument_specs.yml from its defaults/main.yml.

    tools/argspecs.py ROLE [ROLE ...]           print what would change (exit 1 when a spec is out of date)
    tools/argspecs.py --write ROLE [ROLE ...]   rewrite meta/argument_specs.yml
    tools/argspecs.py --all [--write]           every role under roles/

The defaults file is the single source: every variable's description is the comment block right above it (a
variable without one is an error: "its own name" is not a description). A commented-out example of the form
`# name: value` (name with the role's prefix, not defined in the file) after a comment block declares an optional
variable without default (documented, not set); every other comment line, whatever it reads like, is description.
Keys the generator cannot infer are kept from the existing spec: `choices`, `elements`, `required`, `no_log`.
Entry points: `main` always; a role lists more in a `# entry points: a, b, c` line at the top of its defaults. Every
entry point takes the same options (YAML alias of `main`'s), since the defaults are role-wide.
tests/unit/test_role_specs.py runs the check for every role.
"""
import argparse
import pathlib
import re
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
KEEP = ("choices", "elements", "required", "no_log")
VAR_RE = re.compile(r"^([a-z][a-z0-9_]*):(?:\s|$)")
EXAMPLE_RE = re.compile(r"^#\s*([a-z][a-z0-9_]*):\s*(\S.*)$")


class SpecError(Exception):
    pass


def _type_of(value):
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "dict"
    return "str"


def _templated(value):
    return isinstance(value, str) and "{{" in value


def parse_defaults(text, prefixes):
    """[(name, description, has_default)]: the variables in file order, then the optional ones (declared by a
    commented-out example), each with the comment block right above it as its description.

    A block is the run of comment lines directly above a variable: a blank line, any other line, a section header
    (`# --- name ---`) or the `# entry points:` line ends it. Every line of the block is part of the description,
    including lines that happen to read like `word: text` (`# build: sglang 0.5.17 ...`). Only a line `# <name>: value`
    whose name has the role's prefix, is not defined in the file and follows a comment block declares an optional
    variable: the block above it is that variable's description, and the block after it starts afresh.
    """
    lines = text.splitlines()
    defined = {m.group(1) for m in map(VAR_RE.match, lines) if m}
    out, optional, block = [], [], []
    for line in lines:
        if line.startswith("---"):
            continue
        if line.startswith("#"):
            m = EXAMPLE_RE.match(line)
            if m and block and m.group(1).startswith(prefixes) and m.group(1) not in defined:
                if m.group(1) not in {n for n, _, _ in optional}:
                    optional.append((m.group(1), _describe(block), False))
                block = []
                continue
            body = line.lstrip("#").strip()
            if re.match(r"^-{3,}|^entry points:", body) or re.match(r"^-+ .* -+$", body):
                block = []
                continue
            block.append(line)
            continue
        if not line.strip():
            block = []
            continue
        m = VAR_RE.match(line)
        if m:
            out.append((m.group(1), _describe(block), True))
        if not line.startswith(" "):
            block = []
    return out + optional


def _describe(block):
    """The comment lines' text, joined with single spaces (nothing dropped)."""
    text = " ".join(line.lstrip("#").strip() for line in block)
    return re.sub(r"\s+", " ", text).strip()


def entry_points(text):
    m = re.search(r"^#\s*entry points:\s*(.+)$", text, re.M)
    names = ["main"] + ([n.strip() for n in m.group(1).split(",")] if m else [])
    return list(dict.fromkeys(names))


def generate(role_dir):
    role_dir = pathlib.Path(role_dir)
    text = (role_dir / "defaults" / "main.yml").read_text()
    values = yaml.safe_load(text) or {}
    spec_path = role_dir / "meta" / "argument_specs.yml"
    old = {}
    head = {"short_description": "%s role" % role_dir.name}
    if spec_path.exists():
        old_main = ((yaml.safe_load(spec_path.read_text()) or {}).get("argument_specs", {}) or {}).get("main", {})
        old = old_main.get("options", {}) or {}
        head = {k: old_main[k] for k in ("short_description", "description", "author") if k in old_main} or head
    prefixes = (role_dir.name + "_", role_dir.name.split("_")[0] + "_", "hw_")
    errors, options = [], {}
    for name, desc, has_default in parse_defaults(text, prefixes):
        if not desc or desc == name:
            errors.append("%s: %s has no comment above it in defaults/main.yml (write what it does, its unit and "
                          "its effect)" % (role_dir.name, name))
        value = values.get(name) if has_default else None
        opt = {"type": _type_of(value) if has_default else "str", "description": desc}
        if has_default and _templated(value):
            opt["type"] = (old.get(name) or {}).get("type", "str")
        elif has_default:
            opt["default"] = value
        for k in KEEP:
            if k in (old.get(name) or {}):
                opt[k] = old[name][k]
        if opt["type"] == "list" and "elements" not in opt and isinstance(value, list) and value:
            opt["elements"] = _type_of(value[0])
        options[name] = opt
    missing = set(values) - set(options)
    if missing:
        errors.append("%s: defaults without a spec: %s" % (role_dir.name, sorted(missing)))
    if errors:
        raise SpecError("\n".join(errors))
    return {"head": head, "entry_points": entry_points(text), "options": options}


def render(spec):
    head = ("---\n# GENERATED from defaults/main.yml by tools/argspecs.py --write (descriptions are the comments there);\n"
            "# tests/unit/test_role_specs.py fails when the two drift apart. Edit defaults/main.yml, not this file.\n")
    body = {"argument_specs": {}}
    for ep in spec["entry_points"]:
        ep_head = dict(spec["head"])
        if ep != "main":
            ep_head["short_description"] = "%s (entry point %s)" % (ep_head["short_description"], ep)
        body["argument_specs"][ep] = dict(ep_head, options=spec["options"])

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data):  # alias only the shared options mapping
            return data is not spec["options"]

        def increase_indent(self, flow=False, indentless=False):  # lists indented under their key (yamllint)
            return super().increase_indent(flow, False)

    return head + yaml.dump(body, Dumper=Dumper, sort_keys=False, width=120, allow_unicode=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("roles", nargs="*")
    ap.add_argument("--all", action="store_true")
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args(argv)
    roles = sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "defaults" / "main.yml").exists()) \
        if a.all else a.roles
    rc = 0
    for r in roles:
        d = ROOT / "roles" / r
        try:
            new = render(generate(d))
        except SpecError as e:
            print(e, file=sys.stderr)
            rc = 1
            continue
        path = d / "meta" / "argument_specs.yml"
        if a.write:
            path.write_text(new)
        elif not path.exists() or path.read_text() != new:
            print("%s: meta/argument_specs.yml is out of date: run tools/argspecs.py --write %s" % (r, r))
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
