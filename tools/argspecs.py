#!/usr/bin/env python3
"""Generate (or check) a role's meta/argument_specs.yml from its defaults/main.yml, and its README.md from that spec.

    tools/argspecs.py ROLE [ROLE ...]           print what would change (exit 1 when a spec or README is out of date)
    tools/argspecs.py --write ROLE [ROLE ...]   rewrite meta/argument_specs.yml and README.md
    tools/argspecs.py --all [--write]           every role under roles/

The defaults file is the single source: every variable's description is the comment block right above it (a
variable without one is an error: "its own name" is not a description). A commented-out example of the form
`# name: value` (name with the role's prefix, not defined in the file) after a comment block declares an optional
variable without default (documented, not set); every other comment line, whatever it reads like, is description.
Keys the generator cannot infer are kept from the existing spec: `choices`, `elements`, `required`, `no_log`.
Entry points: one `# entry point NAME: what it does` line each at the top of the defaults, `main` included (its text
is each entry point's short_description; a role without one is an error: "<role> role" says nothing). Every entry
point takes the same options (YAML alias of `main`'s), since the defaults are role-wide. The role's description is
the defaults' head comment: the comment lines from the top down to the first blank line (a lone `#` starts a new
paragraph).
The README (README.md in the role) is rendered from the written spec (render_readme): the galaxy description of
meta/main.yml when the role has one, the description, the entry points and every variable with its type, default
(a computed default shows its expression, from the defaults file) and description.
tests/unit/test_role_specs.py runs the check for every role, spec and README.
"""
import argparse
import pathlib
import re
import sys

import repo_path  # noqa: F401  tools/repo_path.py, the one bootstrap: puts collections/ on sys.path
import yaml
from ansible_collections.b300.rollout.plugins.module_utils.common.md_table import table

ROOT = pathlib.Path(__file__).resolve().parent.parent
KEEP = ("choices", "elements", "required", "no_log")
VAR_RE = re.compile(r"^([a-z][a-z0-9_]*):(?:\s|$)")
EXAMPLE_RE = re.compile(r"^#\s*([a-z][a-z0-9_]*):\s*(\S.*)$")
EP_RE = re.compile(r"^#\s*entry point\s+([A-Za-z0-9_]+):\s*(\S.*)$")
OLD_EP_RE = re.compile(r"^#\s*entry points:", re.M)


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
            if re.match(r"^-{3,}|^entry points?\b", body) or re.match(r"^-+ .* -+$", body):
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
    """{name: what it does} from the `# entry point NAME: text` lines of the defaults, `main` first."""
    found = {}
    for line in text.splitlines():
        m = EP_RE.match(line)
        if m:
            found.setdefault(m.group(1), " ".join(m.group(2).split()))
    return dict(sorted(found.items(), key=lambda kv: kv[0] != "main"))


def head_comment(text):
    """The role's description: the defaults' comment lines from the top down to the first line that is not a comment,
    without the entry point lines, as paragraphs (a lone `#` separates two)."""
    paras, cur = [], []
    for line in text.splitlines():
        if line.startswith("---") and not paras and not cur:
            continue
        if not line.startswith("#"):
            break
        if EP_RE.match(line):
            continue
        body = line.lstrip("#").strip()
        if not body:
            paras, cur = paras + [" ".join(cur)] if cur else paras, []
            continue
        cur.append(body)
    if cur:
        paras.append(" ".join(cur))
    return [re.sub(r"\s+", " ", p).strip() for p in paras]


def generate(role_dir):
    role_dir = pathlib.Path(role_dir)
    text = (role_dir / "defaults" / "main.yml").read_text()
    values = yaml.safe_load(text) or {}
    spec_path = role_dir / "meta" / "argument_specs.yml"
    old = {}
    if spec_path.exists():
        old_main = ((yaml.safe_load(spec_path.read_text()) or {}).get("argument_specs", {}) or {}).get("main", {})
        old = old_main.get("options", {}) or {}
    prefixes = (role_dir.name + "_", role_dir.name.split("_")[0] + "_", "hw_")
    errors, options = [], {}
    if OLD_EP_RE.search(text):
        errors.append("%s: defaults/main.yml lists entry points in a '# entry points:' line: write one '# entry point "
                      "NAME: what it does' line per entry point instead (main included)" % role_dir.name)
    eps = entry_points(text)
    if "main" not in eps:
        errors.append("%s: defaults/main.yml has no '# entry point main: what it does' line at its top (the role's "
                      "short description: what a play that lists the role gets)" % role_dir.name)
    description = head_comment(text)
    if not description:
        errors.append("%s: defaults/main.yml has no head comment (what the role does, why, tags) above its first blank "
                      "line" % role_dir.name)
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
    return {"entry_points": eps, "description": description, "options": options}


def render(spec):
    head = ("---\n# GENERATED from defaults/main.yml by tools/argspecs.py --write (descriptions are the comments there);\n"
            "# tests/unit/test_role_specs.py fails when the two drift apart. Edit defaults/main.yml, not this file.\n")
    body = {"argument_specs": {}}
    for ep, short in spec["entry_points"].items():
        body["argument_specs"][ep] = {"short_description": short, "description": spec["description"],
                                      "options": spec["options"]}

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data):  # alias only the shared description and options
            return data is not spec["options"] and data is not spec["description"]

        def increase_indent(self, flow=False, indentless=False):  # lists indented under their key (yamllint)
            return super().increase_indent(flow, False)

    return head + yaml.dump(body, Dumper=Dumper, sort_keys=False, width=120, allow_unicode=True)


# --- README.md -------------------------------------------------------------------------------------------------------
def _md(text):
    """Prose for a Markdown table cell or paragraph: code spans kept as they are; outside them `<`, `*` and `_` at a
    word's edge escaped (no HTML tag, no emphasis); `|` escaped everywhere (a table cell ends at a bare one)."""
    parts = re.split(r"(`[^`]*`)", " ".join(str(text).split()))
    out = []
    for i, part in enumerate(parts):
        if i % 2 == 0:
            part = re.sub(r"([<*])", r"\\\1", part)
            part = re.sub(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])", r"\\_", part)
        out.append(part.replace("|", "\\|"))
    return "".join(out)


def _code(text):
    text = " ".join(text.split()).replace("|", "\\|")
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return "%s%s%s%s%s" % (fence, pad, text, pad, fence)


def _default_md(name, opt, values):
    if opt.get("required"):
        return "required"
    if name not in values:
        return "none (optional)"
    value = values[name]
    if _templated(value):
        return "computed: %s" % _code(value)
    if isinstance(value, str):
        return _code(value) if value.strip() else '`""`'
    return _code(yaml.safe_dump(value, default_flow_style=True, width=10 ** 9, allow_unicode=True).strip()
                 .removesuffix("...").strip())


def render_readme(role_dir):
    """README.md of a role, from its written meta/argument_specs.yml (and meta/main.yml's galaxy description; the
    expression of a computed default, which the spec does not hold, from defaults/main.yml)."""
    role_dir = pathlib.Path(role_dir)
    role = role_dir.name
    specs = yaml.safe_load((role_dir / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    values = yaml.safe_load((role_dir / "defaults" / "main.yml").read_text()) or {}
    meta = role_dir / "meta" / "main.yml"
    galaxy = ((yaml.safe_load(meta.read_text()) or {}).get("galaxy_info") or {}).get("description") \
        if meta.exists() else None
    main = specs["main"]
    out = ["# roles/%s" % role, "",
           "<!-- GENERATED from meta/argument_specs.yml (itself generated from defaults/main.yml) by tools/argspecs.py "
           "--write; tests/unit/test_role_specs.py fails when it drifts. Edit defaults/main.yml, not this file. -->", ""]
    if galaxy:
        out += ["**%s**" % _md(galaxy), ""]
    for para in main.get("description") or []:
        out += [_md(para), ""]
    out += ["## Entry points", "",
            "`main` is what a play's `roles:` or an `include_role` / `import_role` without `tasks_from` runs; another "
            "entry point is called with `tasks_from: NAME`. Each validates the variables below (its "
            "`meta/argument_specs.yml`).", ""]
    out += table(("entry point", "what it does"), [("`%s`" % ep, _md(spec["short_description"]))
                                                   for ep, spec in specs.items()])
    out += ["", "## Variables", ""]
    opts = main.get("options") or {}
    if not opts:
        out += ["None.", ""]
        return "\n".join(out)
    rows = []
    for name, opt in opts.items():
        typ = opt["type"] + (" of %s" % opt["elements"] if opt.get("elements") else "")
        desc = opt["description"]
        desc = " ".join(desc) if isinstance(desc, list) else desc
        if opt.get("choices"):
            desc += " Choices: %s." % ", ".join(_code(str(c)) for c in opt["choices"])
        rows.append(("`%s`" % name, typ, _default_md(name, opt, values), _md(desc)))
    out += table(("variable", "type", "default", "description"), rows)
    return "\n".join(out) + "\n"


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
        path, readme = d / "meta" / "argument_specs.yml", d / "README.md"
        if a.write:
            path.parent.mkdir(exist_ok=True)
            path.write_text(new)
            readme.write_text(render_readme(d))
            continue
        if not path.exists() or path.read_text() != new:
            print("%s: meta/argument_specs.yml is out of date: run tools/argspecs.py --write %s" % (r, r))
            rc = 1
        elif not readme.exists() or readme.read_text() != render_readme(d):
            print("%s: README.md is out of date: run tools/argspecs.py --write %s" % (r, r))
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
