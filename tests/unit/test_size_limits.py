"""YAML only sequences (GUIDE "How we build", issue 31): no file in playbooks/ or roles/sglang/tasks/ over 80 lines,
no Jinja expression over 120 characters (whitespace collapsed: what a reader has to hold in mind at once) in
playbooks/ or roles/. Decisions and report building go into module_utils (unit-tested) or named task files and
variables instead."""
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
MAX_PLAYBOOK_LINES = 80
MAX_EXPRESSION = 120
JINJA = re.compile(r"\{\{(.*?)\}\}|\{%-?(.*?)-?%\}", re.S)


def yaml_files(top):
    return sorted(p for p in (ROOT / top).rglob("*.yml") if "molecule" not in p.parts)


def long_expressions(text, limit=MAX_EXPRESSION):
    """(line, length, start of the expression) of every {{ }} / {% %} longer than limit once whitespace is collapsed."""
    out = []
    for m in JINJA.finditer(text):
        expr = " ".join((m.group(1) or m.group(2) or "").split())
        if len(expr) > limit:
            out.append((text[:m.start()].count("\n") + 1, len(expr), expr[:70]))
    return out


FILES = [p for top in ("playbooks", "roles") for p in yaml_files(top)]


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_long_jinja(path):
    bad = long_expressions(path.read_text())
    assert not bad, "%s: Jinja expressions over %d characters (split them into named vars, or move the decision into "\
        "module_utils): %s" % (path.relative_to(ROOT), MAX_EXPRESSION, bad)


@pytest.mark.parametrize("path", yaml_files("playbooks") + yaml_files("roles/sglang/tasks"),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_no_long_playbook_file(path):
    n = len(path.read_text().splitlines())
    assert n <= MAX_PLAYBOOK_LINES, "%s has %d lines (limit %d): move tasks into playbooks/tasks/ or a role entry "\
        "point" % (path.relative_to(ROOT), n, MAX_PLAYBOOK_LINES)


def test_the_measure_is_metrics_pys():
    """The same expressions the issue's metrics script counts: {{ }} and {% %} blocks, whitespace collapsed."""
    loop = "for i in " + "z" * 130
    text = "x: \"{{ a\n   | b }}\"\ny: >-\n  {%- " + loop + " %}\n"
    assert long_expressions(text) == [(4, len(loop), loop[:70])]
    assert long_expressions("{{ %s }}" % ("q" * 120)) == []
    assert FILES and any(str(p).startswith(str(ROOT / "roles" / "sglang")) for p in FILES)
