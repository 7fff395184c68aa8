"""YAML only sequences (GUIDE "How we build", issue 31): no file in playbooks/ over 80 lines, no task file of
roles/sglang/tasks/ over 200, no include chain in a role deeper than three task files (issue 39), no Jinja expression
over 120 characters (whitespace collapsed: what a reader has to hold in mind at once) in playbooks/ or roles/.
Decisions and report building go into module_utils (unit-tested) or named task files and variables instead.

Why a role task file may be longer than a playbook (issue 39): at 80 lines the sglang role had been split into 35
numbered files with include chains five deep, each split serving the limit rather than the reader. A task file is now
one phase or one named entry point (plan.yml, install.yml, router.yml ...) read top to bottom; 200 lines holds the
longest phase (the plan and the host checks) while a file that grows past it is a sign of a second phase in it."""
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
MAX_PLAYBOOK_LINES = 80
MAX_ROLE_TASK_LINES = 200
MAX_INCLUDE_DEPTH = 3
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
    limit = MAX_ROLE_TASK_LINES if "roles" in path.relative_to(ROOT).parts[:1] else MAX_PLAYBOOK_LINES
    n = len(path.read_text().splitlines())
    assert n <= limit, "%s has %d lines (limit %d): move tasks into playbooks/tasks/, a role entry point or (a role's "\
        "task file) a file of its own phase" % (path.relative_to(ROOT), n, limit)


INCLUDE_KEYS = ("ansible.builtin.include_tasks", "ansible.builtin.import_tasks", "include_tasks", "import_tasks")


def included_files(node):
    """The task files a parsed task list includes or imports (file: or the bare form), at any block depth."""
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            if k in INCLUDE_KEYS:
                out.append(v.get("file") if isinstance(v, dict) else v)
            else:
                out.extend(included_files(v))
    elif isinstance(node, list):
        for v in node:
            out.extend(included_files(v))
    return [f for f in out if isinstance(f, str)]


def include_chains(tasks_dir):
    """{file: the longest include chain from it, as a list of file names} for every task file of a role. A file that
    includes itself is a polling loop (roles/model_weights 21_progress.yml, roles/acceptance progress.yml), not a
    deeper chain: the reader is already in it."""
    import yaml
    graph = {p.name: [f for f in included_files(yaml.safe_load(p.read_text()) or [])
                      if (tasks_dir / f).is_file() and f != p.name] for p in tasks_dir.glob("*.yml")}

    def chain(name, seen=()):
        if name in seen:
            return [name, "(cycle)"]
        kids = [chain(k, seen + (name,)) for k in graph.get(name, [])]
        return [name] + max(kids, key=len, default=[])
    return {name: chain(name) for name in graph}


ROLE_TASK_DIRS = sorted(p for p in (ROOT / "roles").glob("*/tasks") if p.is_dir())


@pytest.mark.parametrize("tasks_dir", ROLE_TASK_DIRS, ids=lambda p: p.parent.name)
def test_no_deep_include_chain(tasks_dir):
    deep = {n: c for n, c in include_chains(tasks_dir).items() if len(c) > MAX_INCLUDE_DEPTH}
    assert not deep, "roles/%s/tasks: include chains deeper than %d files (a reader follows each one): %s; fold a "\
        "file that only served a line limit into its caller, or call it from the entry point" % (
            tasks_dir.parent.name, MAX_INCLUDE_DEPTH, deep)


def test_the_depth_check_can_fail(tmp_path):
    for name, text in {"main.yml": "- ansible.builtin.import_tasks: a.yml\n",
                       "a.yml": "- name: x\n  block:\n    - ansible.builtin.include_tasks: {file: b.yml}\n",
                       "b.yml": "- include_tasks: c.yml\n", "c.yml": "- ansible.builtin.debug: {}\n"}.items():
        (tmp_path / name).write_text(text)
    assert include_chains(tmp_path)["main.yml"] == ["main.yml", "a.yml", "b.yml", "c.yml"]
    assert include_chains(ROOT / "roles" / "sglang" / "tasks")["router.yml"][:2] == ["router.yml", "plan.yml"]


def test_the_measure_is_metrics_pys():
    """The same expressions the issue's metrics script counts: {{ }} and {% %} blocks, whitespace collapsed."""
    loop = "for i in " + "z" * 130
    text = "x: \"{{ a\n   | b }}\"\ny: >-\n  {%- " + loop + " %}\n"
    assert long_expressions(text) == [(4, len(loop), loop[:70])]
    assert long_expressions("{{ %s }}" % ("q" * 120)) == []
    assert FILES and any(str(p).startswith(str(ROOT / "roles" / "sglang")) for p in FILES)
