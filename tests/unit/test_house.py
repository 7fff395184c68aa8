"""Issue 39's house rules for the Python side, measured by tools/house_metrics.py: thin modules (no module in
plugins/modules over 300 lines), at most three functions of 100 lines or more outside sandbox/ (each saying why in
its docstring), sys.path edited only where a file cannot use the one way in (pytest.ini's pythonpath for the tests,
tools/repo_path.py for the commands), and the one Markdown table writer."""
import ast
import pathlib

import house_metrics as hm
from ansible_collections.b300.rollout.plugins.module_utils.common.md_table import row, table

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODULES = ROOT / "collections" / "ansible_collections" / "b300" / "rollout" / "plugins" / "modules"
MAX_MODULE_LINES = 300
MAX_LONG_FUNCTIONS = 3
# A function of 100 lines or more says why in its docstring with these words.
REASON = "on purpose"

# Every file that may still edit sys.path, and why (one line each): it runs where neither pytest.ini nor
# tools/repo_path.py is there to do it.
SYS_PATH_ALLOWED = {
    "tools/repo_path.py": "the one bootstrap of the commands",
    "tools/bench/weights_bench.py": "run by path from tools/bench/ (the lent machine, the docs), where repo_path is not beside it",
    "tools/device/host_stack_run.py": "run by path on the lent GPU machine from tools/device/",
    "tools/sglang_argcheck/seed_commands.py": "run by path inside the real SGLang venvs from tools/sglang_argcheck/",
    "tools/sglang_argcheck/check_argv.py": "runs inside the real SGLang venvs: puts the role's checker and the stand-ins there",
    "tools/sglang_argcheck/dump_options.py": "runs inside the real SGLang venvs: puts the stand-ins there",
    "tests/parser/real_contract_probe.py": "runs inside the real SGLang venvs (a subprocess): the stand-ins",
    "tests/parser/roles_contract_probe.py": "runs inside the real SGLang venvs (a subprocess): the stand-ins",
    "tests/parser/forkserver.py": "the edit is in the text of the server it starts inside the real SGLang venvs (the stand-ins)",
    "tests/unit/test_fw_update.py": "the edit is in the text of a child process's script, not in the test",
    "roles/acceptance/files/acceptance_client.py": "runs on the client host: sglang_metrics.py is beside it there",
    "roles/health_history/files/sampler.py": "runs on the target host: its module_utils files are beside it there",
    "roles/sglang/files/sglang_launch.py": "runs on the target host: its sibling scripts are beside it",
    "sandbox/hwemu/hwemu_cli.py": "the emulated tools run it in the sandbox hosts",
    "sandbox/hwemu/render_fixtures.py": "a sandbox script run by path",
    "sandbox/sglang_stub/sglang_stub.py": "the stub runs in the sandbox hosts' venvs",
    "sandbox/client_standins/torchvision/__init__.py": "a stand-in package, imported in the client venv",
}


def test_no_module_over_300_lines():
    big = {p.name: n for p in MODULES.glob("*.py") if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not big, "modules over %d lines (move the engine into module_utils, keep the module a shell: arguments, "\
        "one call, results): %s" % (MAX_MODULE_LINES, big)


def test_at_most_three_long_functions_each_saying_why():
    long = hm.long_functions(100)
    assert len(long) <= MAX_LONG_FUNCTIONS, "functions of 100 lines or more outside sandbox/ (at most %d; split "\
        "them by meaning): %s" % (MAX_LONG_FUNCTIONS, long)
    for path, name, n in long:
        tree = ast.parse((ROOT / path).read_text())
        fn = next(f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and f.name == name.split(".")[-1])
        assert REASON in (ast.get_docstring(fn) or ""), "%s %s (%d lines): its docstring must say why it is long "\
            "(the words %r), or split it" % (path, name, n, REASON)


def test_the_long_function_count_reads_nested_and_methods(tmp_path):
    body = "\n".join("    x = %d" % i for i in range(100))
    (tmp_path / "a.py").write_text("class C:\n    def m(self):\n%s\n\ndef f():\n    pass\n" % body.replace("    ", "        "))
    (tmp_path / "sandbox").mkdir()
    (tmp_path / "sandbox" / "b.py").write_text("def g():\n%s\n" % body)
    assert hm.long_functions(100, root=tmp_path) == [("a.py", "C.m", 101)]


def test_sys_path_is_edited_only_where_the_one_way_in_cannot_reach():
    files = {path for path, _line, _text in hm.sys_path_edits()}
    extra = sorted(files - set(SYS_PATH_ALLOWED))
    assert not extra, "sys.path edited in %s: tests get their paths from pytest.ini (pythonpath), the commands in "\
        "tools/ from `import repo_path` (tools/repo_path.py); a file that runs elsewhere goes into SYS_PATH_ALLOWED "\
        "with its reason" % extra
    gone = sorted(set(SYS_PATH_ALLOWED) - files)
    assert not gone, "no longer edits sys.path, remove from SYS_PATH_ALLOWED: %s" % gone


def test_the_sys_path_scan_finds_each_form(tmp_path):
    edit = "sys" + ".path"   # not written whole here: this file would match its own scan
    (tmp_path / "a.py").write_text("import sys\n%s.insert(0, 'x')\n%s.append('y')\n%s[:0] = ['z']\n"
                                   "# %s.insert(0, 'comment')\n" % (edit, edit, edit, edit))
    assert [i for _p, i, _t in hm.sys_path_edits(root=tmp_path)] == [2, 3, 4]


def test_markdown_table():
    assert table(("a", "b"), [(1, "x|y"), ("", 2.5)]) == ["| a | b |", "|---|---|", "| 1 | x|y |", "| | 2.5 |"]
    assert row(("x|y", "z"), escape=True) == "| x\\|y | z |"
    assert table(("only",)) == ["| only |", "|---|"]


# ------------------------------------------------------------------ module_utils in wings (tools/module_utils_wings.py)
def _wing_imports():
    """{(wing, file): {(wing, file) it imports}} over plugins/module_utils/<wing>/*.py."""
    mu = MODULES.parent / "module_utils"
    pkg = "ansible_collections.b300.rollout.plugins.module_utils"
    graph = {}
    for path in sorted(mu.glob("*/*.py")):
        if path.name == "__init__.py":
            continue
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(pkg + "."):
                parts = node.module[len(pkg) + 1:].split(".")
                deps |= {(parts[0], parts[1])} if len(parts) > 1 else {(parts[0], a.name) for a in node.names}
            elif isinstance(node, ast.Import):
                deps |= {tuple(a.name[len(pkg) + 1:].split(".")[:2]) for a in node.names if a.name.startswith(pkg + ".")}
        graph[(path.parent.name, path.stem)] = deps
    return graph


def test_module_utils_live_in_wings_each_saying_what_lives_there():
    import module_utils_wings as mw
    mu = MODULES.parent / "module_utils"
    assert not [p.name for p in mu.glob("*.py") if p.name != "__init__.py"], "module_utils files outside a wing: "\
        "run tools/module_utils_wings.py (add a new file to its wing there first)"
    for wing, (names, _doc) in mw.WINGS.items():
        init = mu / wing / "__init__.py"
        assert ast.get_docstring(ast.parse(init.read_text())), "%s: one paragraph saying what lives there" % init
        assert sorted(p.stem for p in (mu / wing).glob("*.py") if p.stem != "__init__") == sorted(names), wing


def _upward(graph, lower):
    return sorted("%s/%s imports %s/%s" % (w, f, dw, df) for (w, f), deps in graph.items() for dw, df in deps
                  if dw not in (w, "common") + tuple(lower[w]))


def test_wings_import_only_downward_and_no_module_cycle():
    import module_utils_wings as mw
    graph = _wing_imports()
    up = _upward(graph, mw.LOWER)
    assert not up, "imports that are not downward (a wing imports itself, common and its LOWER wings only): %s" % up
    state = {}

    def visit(node, trail):
        if state.get(node) == "done":
            return
        assert state.get(node) != "open", "import cycle: %s" % " -> ".join("/".join(n) for n in trail + [node])
        state[node] = "open"
        for dep in sorted(graph.get(node, ())):
            visit(dep, trail + [node])
        state[node] = "done"
    for node in sorted(graph):
        visit(node, [])
    assert len(graph) >= 30 and all(len(k) == 2 for k in graph)


def test_the_import_graph_check_sees_an_upward_import():
    import module_utils_wings as mw
    fake = {("hw", "tools"): {("triage", "triage_kmsg"), ("common", "md_table")}, ("triage", "triage_kmsg"): set()}
    assert _upward(fake, mw.LOWER) == ["hw/tools imports triage/triage_kmsg"]
    graph = _wing_imports()
    assert ("hw", "fw_matrix") in graph[("triage", "triage_verdict")]       # the reader finds cross-wing imports
    assert ("common", "md_table") in graph[("verdicts", "acceptance")]


def test_no_reference_to_a_module_utils_file_outside_its_wing(capsys):
    """The move script, re-run after a merge, would change nothing: every import and path names the wing."""
    import module_utils_wings as mw
    rc = mw.main(["--check"])
    assert rc == 0, capsys.readouterr().out


def test_the_move_script_rewrites_imports_paths_and_keeps_visual_indent():
    import module_utils_wings as mw
    src = ("from ansible_collections.b300.rollout.plugins.module_utils.fw_matrix import (MatrixError, audit,\n"
           "                                                                             merge_rows)\n"
           "from ansible_collections.b300.rollout.plugins.module_utils import nccl_results, rdma_nic, thermal\n"
           "see module_utils/sglang_plan.py and plugins/module_utils/*.py; MU / \"thermal.py\"\n")
    assert mw.rewrite(src) == (
        "from ansible_collections.b300.rollout.plugins.module_utils.hw.fw_matrix import (MatrixError, audit,\n"
        "                                                                                merge_rows)\n"
        "from ansible_collections.b300.rollout.plugins.module_utils.health import nccl_results, thermal\n"
        "from ansible_collections.b300.rollout.plugins.module_utils.hw import rdma_nic\n"
        "see module_utils/sglang/sglang_plan.py and plugins/module_utils/*/*.py; MU / \"health\" / \"thermal.py\"\n")
    assert mw.rewrite(mw.rewrite(src)) == mw.rewrite(src)
