"""Lint everything, waive nothing silently (issue 24 item 4).

`make lint` runs ruff over every Python file of the repository (ruff.toml). A lint waiver is allowed only where a
rule truly cannot be followed, and then it says why where it stands:
- a `# noqa` (ruff in Python, ansible-lint in YAML) names its rule(s) and has a reason after them; a bare `# noqa`
  (every rule off) is refused. ruff's RUF100 (selected in ruff.toml) separately fails a noqa no finding needs;
- `# pylint: disable` only inside the collection, the one place pylint runs (ansible-test sanity, `make sanity`), and
  with a reason; anywhere else it is dead text;
- ruff.toml: every ignored rule, globally or per file, has a comment saying why; no file-level `# ruff: noqa`.
"""
import fnmatch
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
COLLECTION = "collections/ansible_collections/b300/rollout/"
# captured command outputs and rendered trees: text from elsewhere, not code
DATA_PREFIXES = ("tests/fixtures/", "sandbox/hwemu/real/", "docs/evidence/")
# this file quotes waivers as examples of what the rules refuse
SELF = "tests/unit/test_lint_waivers.py"
SOURCE_SUFFIXES = (".py", ".yml", ".yaml", ".cfg", ".toml", ".ini", ".sh")

NOQA = re.compile(r"#\s*noqa\b(?P<rest>.*)$", re.IGNORECASE)
# ruff / flake8 codes (E402, B904, RUF100) or ansible-lint rule names (no-handler, risky-shell-pipe[...])
NOQA_CODES = re.compile(r"^:\s*(?P<codes>(?:[A-Z]+[0-9]+|[a-z][a-z0-9-]*(?:\[[a-z0-9-]+\])?)"
                        r"(?:\s*,\s*(?:[A-Z]+[0-9]+|[a-z][a-z0-9-]*(?:\[[a-z0-9-]+\])?))*)(?P<reason>.*)$")
# pylint honours its pragma anywhere in a comment, also after a noqa code and its reason, so search all of it
PYLINT = re.compile(r"#.*?\bpylint:\s*disable(?:-next)?\s*=\s*(?P<checks>[\w-]+(?:\s*,\s*[\w-]+)*)(?P<reason>.*)$")
RUFF_FILE_NOQA = re.compile(r"#\s*(?:ruff|flake8)\s*:\s*noqa", re.IGNORECASE)


def _reason_ok(text):
    """A reason is words a reader can act on: at least two words after the codes (separators like '-' or '(' do not
    count)."""
    words = re.findall(r"[A-Za-z][A-Za-z0-9_'./-]*", text)
    return len(words) >= 2


def noqa_problem(line):
    """None when the line has no noqa or a justified one; else what is wrong with it."""
    m = NOQA.search(line)
    if not m:
        return None
    rest = m.group("rest")
    c = NOQA_CODES.match(rest)
    if not c:
        return "bare noqa (no rule named): name the rule it waives, then why"
    if not _reason_ok(c.group("reason")):
        return "noqa: %s without a reason: say why the rule cannot be followed here" % c.group("codes")
    return None


def pylint_problem(path, line):
    m = PYLINT.search(line)
    if not m:
        return None
    if not path.startswith(COLLECTION):
        return ("pylint: disable=%s outside the collection: pylint runs only on the collection (make sanity), so "
                "this is dead text; remove it (keep the reason as a plain comment)" % m.group("checks"))
    if not _reason_ok(m.group("reason")):
        return "pylint: disable=%s without a reason" % m.group("checks")
    return None


def _tracked_sources():
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split("\0")
    out = []
    for f in files:
        if not f or f == SELF or f.startswith(DATA_PREFIXES):
            continue
        p = ROOT / f
        if p.is_symlink() or not p.is_file():
            continue
        if not f.endswith(SOURCE_SUFFIXES):
            with open(p, "rb") as fh:   # extensionless scripts: python by their shebang (a log's first line may name a python path)
                first = fh.readline()
                if not (first.startswith(b"#!") and b"python" in first):
                    continue
        try:
            out.append((f, p.read_text()))
        except UnicodeDecodeError:
            continue
    return out


def test_every_noqa_and_pylint_disable_is_justified():
    sources = _tracked_sources()
    assert any(f == "tools/fw-audit" for f, _ in sources), "extensionless Python scripts must be scanned too"
    problems = []
    for f, text in sources:
        for n, line in enumerate(text.splitlines(), 1):
            for why in (noqa_problem(line), pylint_problem(f, line)):
                if why:
                    problems.append("%s:%d: %s\n    %s" % (f, n, why, line.strip()))
            if RUFF_FILE_NOQA.search(line):
                problems.append("%s:%d: file-level noqa waives every rule for the whole file\n    %s" % (
                    f, n, line.strip()))
    assert not problems, "unjustified lint waivers:\n" + "\n".join(problems)


def _ruff_config():
    return (ROOT / "ruff.toml").read_text()


def _ignore_entries(text):
    """(where, code, comment) for each rule in `ignore = [...]` and each per-file-ignores entry of ruff.toml."""
    entries = []
    lines = text.splitlines()
    in_ignore = False
    in_per_file = False
    pending_comment = ""
    for n, line in enumerate(lines, 1):
        s = line.strip()
        if s.startswith("["):
            in_per_file = s == "[lint.per-file-ignores]"
            in_ignore = False
        if re.match(r"^(extend-)?ignore\s*=\s*\[", s):
            in_ignore = True
            continue
        if in_ignore:
            if s.startswith("]"):
                in_ignore = False
                continue
            m = re.match(r'^"([A-Z]+[0-9]*)"\s*,?\s*(#.*)?$', s)
            if m:
                entries.append(("ignore line %d" % n, m.group(1), (m.group(2) or "").lstrip("# ")))
            continue
        if in_per_file:
            if s.startswith("#"):
                pending_comment += " " + s.lstrip("# ")
                continue
            m = re.match(r'^"([^"]+)"\s*=\s*\[([^\]]*)\]\s*(#.*)?$', s)
            if m:
                comment = (pending_comment + " " + (m.group(3) or "").lstrip("# ")).strip()
                for code in re.findall(r'"([A-Z]+[0-9]*)"', m.group(2)):
                    entries.append(("per-file %s" % m.group(1), code, comment))
            if not s:
                pending_comment = ""
    return entries


def test_ruff_config_waives_nothing_silently():
    text = _ruff_config()
    assert re.search(r'^select\s*=\s*\[[^\]]*"E"[^\]]*"W"[^\]]*"F"[^\]]*"B"', text, re.M), \
        "ruff.toml must select at least E, W, F and B"
    assert '"RUF100"' in text, "ruff.toml must select RUF100 so that a noqa no finding needs fails the lint"
    entries = _ignore_entries(text)
    assert entries, "no ignore entry parsed from ruff.toml: the parser above no longer matches its layout"
    unexplained = ["%s: %s" % (where, code) for where, code, why in entries if not _reason_ok(why)]
    assert not unexplained, "ruff.toml ignores without a reason comment: %s" % unexplained
    blanket = [code for _, code, _ in entries if not re.search(r"[0-9]", code)]
    assert not blanket, "ruff.toml ignores whole rule families (blanket waivers): %s" % blanket
    for path in re.findall(r'^"([^"]+)"\s*=\s*\[', text, re.M):
        assert list(ROOT.glob(path)), "ruff.toml per-file-ignores names %s, which matches no file" % path


def test_ruff_sees_the_python_scripts_without_a_py_suffix():
    """ruff picks *.py itself; a Python script without the suffix is linted only when extend-include names it."""
    include = re.search(r"^extend-include\s*=\s*\[([^\]]*)\]", _ruff_config(), re.M)
    globs = re.findall(r'"([^"]+)"', include.group(1)) if include else []
    scripts = [f for f, _ in _tracked_sources() if not f.endswith(SOURCE_SUFFIXES)]
    assert "tools/fw-audit" in scripts and "sandbox/hwemu/bin/nvidia-smi" in scripts, scripts
    missed = [f for f in scripts if not any(fnmatch.fnmatch(f, g) for g in globs)]
    assert not missed, "Python scripts ruff does not lint: add them to extend-include in ruff.toml: %s" % missed


def test_make_lint_runs_ruff_over_the_repository():
    mk = (ROOT / "Makefile").read_text()
    body = re.search(r"^lint:.*\n((?:\t.*\n)+)", mk, re.M)
    assert body and re.search(r"^\truff check \.$", body.group(1), re.M), "make lint must run `ruff check .`"
    assert re.search(r"^ruff==", (ROOT / "requirements.txt").read_text(), re.M), "ruff must be pinned"


@pytest.mark.parametrize("line, problem", [
    ("import x  # noqa", "bare noqa"),
    ("import x  # noqa: E402", "without a reason"),
    ("import x  # noqa: E402  -", "without a reason"),
    ("import x  # noqa: E402,F401", "without a reason"),
    ("import x  # NOQA:E402 (x)", "without a reason"),
    ("- name: Reload  # noqa: no-handler", "without a reason"),
    ("import x  # noqa: E402  found only after the search above", None),
    ("- name: Reload  # noqa: no-handler - the restart must happen now", None),
    ("x = 1  # no noqa here", None),
])
def test_the_noqa_rule_itself(line, problem):
    got = noqa_problem(line)
    if problem is None:
        assert got is None, got
    else:
        assert got is not None and problem in got, (line, got)


@pytest.mark.parametrize("path, line, problem", [
    ("tools/argspecs.py", "import y  # pylint: disable=import-error", "outside the collection"),
    ("tools/argspecs.py", "import y  # pylint: disable=import-error  sibling test module", "outside the collection"),
    ("tools/argspecs.py", "import y  # noqa: E402  pylint: disable=wrong-import-position", "outside the collection"),
    ("tools/argspecs.py", "import y  # pylint: disable-next=import-error  sibling test module", "outside the collection"),
    (COLLECTION + "plugins/modules/m.py", "import y  # pylint: disable=import-error", "without a reason"),
    (COLLECTION + "plugins/modules/m.py", "import y  # pylint: disable=import-error  only on the controller", None),
])
def test_the_pylint_rule_itself(path, line, problem):
    got = pylint_problem(path, line)
    if problem is None:
        assert got is None, got
    else:
        assert got is not None and problem in got, (line, got)


def test_the_ruff_config_parser_finds_unexplained_ignores():
    text = ('[lint]\nselect = ["E", "W", "F", "B"]\nignore = [\n  "B905",  # zip(strict=) needs Python 3.10\n'
            '  "E501",\n]\n\n[lint.per-file-ignores]\n# modules: docs come before the imports\n'
            '"a/*.py" = ["E402"]\n\n"b/*.py" = ["E731"]\n')
    got = {(where, code): why for where, code, why in _ignore_entries(text)}
    assert _reason_ok(got[("ignore line 4", "B905")])
    assert not _reason_ok(got[("ignore line 5", "E501")])
    assert _reason_ok(got[("per-file a/*.py", "E402")])
    assert not _reason_ok(got[("per-file b/*.py", "E731")])
