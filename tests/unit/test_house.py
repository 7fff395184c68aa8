"""Issue 39's house rules for the Python side, measured by tools/house_metrics.py: thin modules (no module in
plugins/modules over 300 lines), at most three functions of 100 lines or more outside sandbox/ (each saying why in
its docstring), sys.path edited only where a file cannot use the one way in (pytest.ini's pythonpath for the tests,
tools/repo_path.py for the commands), and the one Markdown table writer."""
import ast
import pathlib

import house_metrics as hm
from ansible_collections.b300.rollout.plugins.module_utils.md_table import row, table

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODULES = ROOT / "collections" / "ansible_collections" / "b300" / "rollout" / "plugins" / "modules"
MAX_MODULE_LINES = 300
MAX_LONG_FUNCTIONS = 3
# A function of 100 lines or more says why in its docstring with these words.
REASON = "on purpose"
# The host-stack branch (issue 39, in parallel) splits or explains module_utils/host_stack.py's checks(); this entry
# goes when it is merged.
PENDING_ELSEWHERE = {"checks"}

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
        if name in PENDING_ELSEWHERE:
            continue
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
