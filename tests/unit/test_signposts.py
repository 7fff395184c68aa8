"""Signposts that cannot drift (issue 31 part 3): what README.md, docs/*.md, the role READMEs, the collection's README
and CHANGELOG and every role's meta/argument_specs.yml say about variables, functions and entry points is checked
against the code.

- every variable they name (a name with a role's prefix: sglang_, hw_, nccl_validation_, ...) is something the code
  defines: a role default or role var, an inventory variable, a playbook's own variable (set under vars:, read with
  `| default(...)` in playbooks/), a registered result or fact, or another kind of name with that prefix (a module,
  filter, inventory group, role, molecule scenario, file or directory);
- every function they name (`name(...)`, or `path.py` (`name`), or the names after `Python: path.py:`) is defined
  (in that file when one is given);
- every role entry point is a task file and is validated: each `tasks_from:` of the playbooks, roles and molecule
  names an entry point listed in that role's argument_specs, and each listed entry point has its task file;
- no role default is dead: each is read outside its defaults file and argument spec; no default reads a variable
  nothing defines (roles/thermal_soak once read `nccl_tests_bin_dir`);
- docs/CONTRACTS.md lists the steps of site.yml in order, every setting of the home (roles/b300_defaults) and every
  on-call tool; the README says what `make lint` runs and does not claim "no waivers" while waivers exist;
- no text sends the reader to ../shared for what the repository holds (the real captures, the option catalogs).
Paths are tests/unit/test_repo_paths.py's (every path named exists), the README's table test_readme_where.py's, the
modules and the CHANGELOG test_module_docs.py's.
"""
import ast
import pathlib
import re
import subprocess

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
COLL = ROOT / "collections" / "ansible_collections" / "b300" / "rollout"
ROLES = sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "defaults" / "main.yml").exists())
PREFIXES = tuple(sorted({r + "_" for r in ROLES} | {"hw_", "audit_", "triage_", "plan_", "sandbox_"}))
# names in call form that are not ours, and whose they are
EXTERNAL_CALLS = {
    "default": "Jinja's default filter",
    "asdict": "Python's dataclasses.asdict (SGLang's ServerArgs)",
    "int": "Python's int",
    "ServerArgs": "SGLang's server argument class",
    "get_bin_path": "AnsibleModule.get_bin_path",
    "ibv_event_type_str": "rdma-core's libibverbs (enum_strs.c), the text of an async event in NCCL's warning",
    "what": "C++ std::exception::what(), in PyTorch's terminate message",
    "is_available": "PyTorch's torch.cuda.is_available(), the thermal soak's loader choice",
}


def tracked():
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split()
    return [f for f in out if (ROOT / f).is_file()]


FILES = tracked()
DOCS = sorted(f for f in FILES if f.endswith(".md") and (
    f == "README.md" or re.match(r"^docs/[^/]+\.md$", f) or re.match(r"^roles/[^/]+/README[^/]*\.md$", f)
    or f.startswith("collections/ansible_collections/b300/rollout/") and f.count("/") == 4))
SPECS = sorted(f for f in FILES if re.match(r"^roles/[^/]+/meta/argument_specs\.yml$", f))


def inline_code(text):
    """(line number, backticked text) outside fenced code blocks (those hold schemas and captured output)."""
    out, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out += [(n, m.group(1)) for m in re.finditer(r"`([^`\n]+)`", line)]
    return out


def yaml_files(*tops):
    return [ROOT / f for f in FILES if f.endswith((".yml", ".yaml")) and f.startswith(tops)
            and not f.startswith("tests/fixtures/")]


def _keys(data):
    return set(data) if isinstance(data, dict) else set()


def _scalars(node):
    if isinstance(node, dict):
        return [s for v in node.values() for s in _scalars(v)]
    if isinstance(node, list):
        return [s for v in node for s in _scalars(v)]
    return [node] if isinstance(node, str) and re.fullmatch(r"[a-z][a-z0-9_]*", node) else []


def _walk(node, found):
    """Names a play or task list defines: vars: keys, set_fact keys, register: values, loop_var."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "vars" or k.endswith("set_fact"):
                found |= _keys(v)
            elif k == "register" and isinstance(v, str):
                found.add(v)
            elif k == "loop_control" and isinstance(v, dict) and "loop_var" in v:
                found.add(v["loop_var"])
            _walk(v, found)
    elif isinstance(node, list):
        for v in node:
            _walk(v, found)


def known_names():
    """Every name with a role-like prefix the code defines, by where it is defined."""
    names = set()
    for f in yaml_files("roles/", "inventory/", "molecule/"):
        parts = f.relative_to(ROOT).parts
        data = yaml.safe_load(f.read_text())
        if "defaults" in parts or "vars" in parts or "group_vars" in parts or "host_vars" in parts:
            names |= _keys(data)
        if "defaults" in parts:   # names a default's value lists (clock-event reasons, ...): the role READMEs show them
            names |= set(_scalars(data))
        _walk(data, names)
    for f in yaml_files("playbooks/", "site.yml"):
        text = f.read_text()
        _walk(yaml.safe_load(text), names)
        names |= set(re.findall(r"\b([a-z][a-z0-9_]*)\s*\|\s*default\(", text))   # a playbook's own -e variables
    for f in FILES:   # modules, filters, module_utils, roles, scenarios, task files, files and directories
        p = pathlib.PurePosixPath(f)
        names |= {part.split(".")[0] for part in p.parts}
    inv = yaml.safe_load((ROOT / "inventory" / "sandbox" / "hosts.yml").read_text())
    names |= set(inv["all"]["children"])
    src = (COLL / "plugins" / "filter" / "sglang_plan.py").read_text()
    names |= set(re.findall(r"[\"'](\w+)[\"']\s*:", src))
    return names


KNOWN = None   # set below, once the Python definitions are read


def variable_like(token):
    """Names in a backticked token that look like role variables (the name before =, : or | counts too)."""
    return [n for n in re.findall(r"(?<![\w./<-])([a-z][a-z0-9]*(?:_[a-z0-9]+)+)(?![\w/-]|\.(?:py|yml|sh|md|j2)\b)",
                                  token) if n.startswith(PREFIXES)]


@pytest.mark.parametrize("doc", DOCS)
def test_every_variable_a_doc_names_is_defined(doc):
    bad = ["%s:%d: %s" % (doc, n, name) for n, tok in inline_code((ROOT / doc).read_text())
           for name in variable_like(tok) if name not in KNOWN]
    assert not bad, "names no defaults file, inventory, playbook or code defines:\n" + "\n".join(bad)


@pytest.mark.parametrize("spec", SPECS)
def test_every_variable_an_argument_spec_names_is_defined(spec):
    """Descriptions in meta/argument_specs.yml (generated from the defaults' comments) name variables without
    backticks: every word with a role's prefix is checked."""
    data = yaml.safe_load((ROOT / spec).read_text())["argument_specs"]
    words = set()
    for ep in data.values():
        for text in [" ".join(ep.get("description") or [])] + [
                " ".join(o["description"]) if isinstance(o["description"], list) else o["description"]
                for o in ep["options"].values()]:
            words |= {n for n in re.findall(r"(?<![\w./<-])([a-z][a-z0-9]*(?:_[a-z0-9]+)+)(?![\w/-])", text)
                      if n.startswith(PREFIXES)}
    assert not words - KNOWN, (spec, sorted(words - KNOWN))


def test_the_variable_check_can_fail():
    assert variable_like("sglang_rolling_version") == ["sglang_rolling_version"]
    assert "sglang_rolling_version" not in KNOWN
    assert variable_like("-e sglang_profile=glm52_pd") == ["sglang_profile"]
    assert variable_like("roles/sglang/files/sglang_launch.py") == []
    assert {"hw_bin_path", "sglang_plan", "sglang_prefill", "triage_since", "nccl_validation_when_serving"} <= KNOWN


# --- functions -----------------------------------------------------------------------------------------------------
def defined_in(path):
    """Functions, classes and module-level names of one Python file."""
    tree = ast.parse(path.read_text())
    out = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))}
    for n in tree.body:
        if isinstance(n, ast.Assign):
            out |= {t.id for t in n.targets if isinstance(t, ast.Name)}
    return out


def python_files():
    return [ROOT / f for f in FILES if f.endswith(".py") or (f.startswith("tools/") and "." not in f.rsplit("/", 1)[-1]
                                                             and (ROOT / f).read_text(errors="replace").startswith("#!/usr/bin/env python"))]


ALL_DEFINED = set().union(*(defined_in(p) for p in python_files()))
KNOWN = known_names() | ALL_DEFINED


def resolve(path):
    for cand in (ROOT / path, COLL / path, COLL / "plugins" / path):
        if cand.is_file():
            return cand
    return None


def function_references(text):
    """(line, name, file or None): call-form names in backticks; `path.py` (`name`); and on a `Python: path.py`
    line, every backticked identifier after the path."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        for m in re.finditer(r"`([^`\n]+)`", line):
            call = re.match(r"^(?:[\w.]+\.)?([A-Za-z_]\w*)\((?!\d\))", m.group(1))   # not a man page: flock(2)
            if call:
                out.append((n, call.group(1), None))
        for m in re.finditer(r"`([\w./-]+\.py)`\s*\(`([A-Za-z_]\w*)(?:\([^`]*\))?`", line):
            out.append((n, m.group(2), m.group(1)))
        py = re.search(r"Python:\s*`([\w./-]+\.py)`", line)
        if py:
            for m in re.finditer(r"`([A-Za-z_]\w*)(?:\([^`]*\))?`", line[py.end():]):
                out.append((n, m.group(1), py.group(1)))
    return out


@pytest.mark.parametrize("doc", DOCS)
def test_every_function_a_doc_names_exists(doc):
    bad = []
    for n, name, path in function_references((ROOT / doc).read_text()):
        if path:
            where = resolve(path)
            if where is None or name not in defined_in(where):
                bad.append("%s:%d: %s is not defined in %s" % (doc, n, name, path))
        elif name not in ALL_DEFINED and name not in EXTERNAL_CALLS:
            bad.append("%s:%d: %s() is defined nowhere in the repository" % (doc, n, name))
    assert not bad, "\n".join(bad)


def test_the_function_check_can_fail():
    refs = function_references("see `module_utils/hw/fw_matrix.py` (`judge_gone`) and `no_such_function(x)`, `flock(2)`; "
                               "Python: `plugins/module_utils/hw/rdma_nic.py`: `build_rdma_nics(...)`, `parse_nothing`")
    assert [(name, path) for _, name, path in refs] == [
        ("no_such_function", None), ("build_rdma_nics", None), ("judge_gone", "module_utils/hw/fw_matrix.py"),
        ("build_rdma_nics", "plugins/module_utils/hw/rdma_nic.py"), ("parse_nothing", "plugins/module_utils/hw/rdma_nic.py")]
    assert "judge_fw" in defined_in(resolve("module_utils/hw/fw_matrix.py"))
    assert "parse_nothing" not in defined_in(resolve("plugins/module_utils/hw/rdma_nic.py"))


# --- entry points --------------------------------------------------------------------------------------------------
def entry_points(role):
    spec = ROOT / "roles" / role / "meta" / "argument_specs.yml"
    return set(yaml.safe_load(spec.read_text())["argument_specs"]) if spec.exists() else set()


# tasks_from entries whose argument spec is deliberately not checked there, and why
UNVALIDATED = {
    ("sglang", "inputs"): "the input rules (module_utils/common/input_rules.py) judge these values first, each "
                                       "refusal naming the rule and the fix; a spec would refuse first with a bare "
                                       "type error (tests/integration/test_bad_input.py expects the rules' words)",
    ("nccl_validation", "inputs"): "it validates the role's spec itself, after the shape check of the threshold "
                                   "override whose message names the option and the fix (test_bad_input.py)",
}


@pytest.mark.parametrize("role", ROLES)
def test_every_listed_entry_point_is_a_task_file(role):
    """(a role of defaults only, roles/b300_defaults, has the entry point main and no tasks)"""
    tasks = ROOT / "roles" / role / "tasks"
    missing = [ep for ep in entry_points(role) if not (tasks / ("%s.yml" % ep)).exists()
               and not (ep == "main" and not tasks.exists())]
    assert not missing, (role, missing)


def _includes(node, out, where):
    if isinstance(node, dict):
        for k, v in node.items():
            if k.endswith(("include_role", "import_role")) and isinstance(v, dict):
                out.append((where, v.get("name"), v.get("tasks_from", "main")))
            _includes(v, out, where)
    elif isinstance(node, list):
        for v in node:
            _includes(v, out, where)


def role_includes():
    out = []
    for f in yaml_files("playbooks/", "roles/", "molecule/", "site.yml"):
        _includes(yaml.safe_load(f.read_text()), out, str(f.relative_to(ROOT)))
    return out


def test_every_tasks_from_is_an_entry_point_that_is_validated():
    """A role entered through a task file its argument spec does not list runs with its inputs unchecked."""
    seen, bad = 0, []
    for where, role, tasks_from in role_includes():
        if role not in ROLES:
            bad.append("%s: role %s does not exist" % (where, role))
            continue
        seen += 1
        if not (ROOT / "roles" / role / "tasks" / ("%s.yml" % tasks_from)).exists():
            bad.append("%s: roles/%s/tasks/%s.yml does not exist" % (where, role, tasks_from))
        elif tasks_from not in entry_points(role) and (role, tasks_from) not in UNVALIDATED:
            bad.append("%s: %s tasks_from %s is not an entry point of its argument_specs (add a '# entry point "
                       "%s: what it does' line to roles/%s/defaults/main.yml)" % (where, role, tasks_from, tasks_from, role))
    assert seen > 10 and not bad, "\n".join(bad)


# --- dead defaults -------------------------------------------------------------------------------------------------
def test_no_role_default_is_dead():
    """A default nobody reads is a knob that does nothing: every one is read by a task, template, file, module or
    tool, or by another default (comments and the argument specs do not count)."""
    code = {}
    for f in FILES:
        if f.startswith(("roles/", "playbooks/", "collections/", "tools/", "sandbox/", "molecule/")) \
                and f.endswith((".yml", ".j2", ".py", ".sh", "")) and "argument_specs" not in f \
                and "/files/options/" not in f:
            try:
                text = (ROOT / f).read_text()
            except UnicodeDecodeError:
                continue
            code[f] = "\n".join(re.sub(r"(^|\s)#.*$", "", line) for line in text.splitlines())
    files_of, count_in = {}, {}
    for f, t in code.items():
        words = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", t)
        for w in set(words):
            files_of.setdefault(w, set()).add(f)
        if f.endswith("/defaults/main.yml"):
            for w in words:
                count_in[(f, w)] = count_in.get((f, w), 0) + 1
    dead = []
    for role in ROLES:
        path = "roles/%s/defaults/main.yml" % role
        for var in yaml.safe_load((ROOT / path).read_text()) or {}:
            if not files_of.get(var, set()) - {path} and count_in.get((path, var), 0) < 2:
                dead.append("%s: %s" % (path, var))
    assert not dead, "defaults nothing reads (remove them, or read them):\n" + "\n".join(dead)


# --- a playbook's own variables --------------------------------------------------------------------------------------
def own_variables(text):
    """Variables a playbook reads with `name | default(...)` (not attributes: x.name | default)."""
    body = "\n".join(re.sub(r"(^|\s)#.*$", "", line) for line in text.splitlines())
    return {m.group(1) for m in re.finditer(r"(?<![.\w\]])([a-z][a-z0-9_]*)\s*\|\s*default\(", body)
            if not body[:m.start()].rstrip().endswith("|")}   # `x | first | default(..)`: first is a filter


MAGIC = {"inventory_dir", "groups", "hostvars", "ansible_host"}


def with_task_files(path, seen=None):
    """The playbook and every task file it includes or imports, transitively (paths relative to the includer)."""
    seen = seen if seen is not None else []
    if path in seen or not path.is_file():
        return seen
    seen.append(path)
    for inc in re.findall(r"(?:include|import)_tasks:\s*([\w./-]+\.yml)", path.read_text()):
        with_task_files(path.parent / inc, seen)
    return seen


@pytest.mark.parametrize("path", sorted((ROOT / "playbooks").glob("*.yml")), ids=lambda p: p.name)
def test_a_playbook_documents_its_own_variables_in_its_head(path):
    """A playbook's own knobs (-e or inventory; not role defaults: tests/unit/test_one_place.py refuses those) are
    documented in its head comment, also those its task files (playbooks/tasks/) read."""
    files = with_task_files(path)
    text = "\n".join(f.read_text() for f in files)
    head = "\n".join(line for line in path.read_text().splitlines() if line.startswith("#"))
    registered = set()
    for f in files:
        _walk(yaml.safe_load(f.read_text()), registered)
    undocumented = sorted(v for v in own_variables(text) - registered - MAGIC if not re.search(r"\b%s\b" % v, head))
    assert not undocumented, "%s: document these in the playbook's head comment: %s" % (path.name, undocumented)


def test_task_files_are_followed():
    names = [p.name for p in with_task_files(ROOT / "playbooks" / "triage.yml")]
    assert {"triage_read.yml", "triage_history.yml", "triage_judge.yml"} <= set(names), names


def test_the_readme_layout_names_every_role_and_no_other():
    readme = (ROOT / "README.md").read_text()
    layout = readme.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    roles_part = layout.split("`roles/` (", 1)[1].split(") ·", 1)[0]
    named = set(re.findall(r"`([a-z0-9_]+)`", roles_part))
    assert named == set(ROLES), {"not in the README": sorted(set(ROLES) - named), "gone": sorted(named - set(ROLES))}


# --- a default reads only what something defines -------------------------------------------------------------------
# Ansible's own names (special variables, facts, lookups) a default may read
ANSIBLE_NAMES = {"playbook_dir", "inventory_dir", "inventory_hostname", "inventory_hostname_short", "groups",
                 "group_names", "hostvars", "ansible_facts", "ansible_play_hosts", "ansible_play_hosts_all",
                 "ansible_play_batch", "ansible_check_mode", "ansible_run_tags", "ansible_skip_tags", "ansible_host",
                 "ansible_user", "ansible_hostname", "ansible_date_time", "play_hosts", "role_path", "omit", "lookup",
                 "query", "q", "now", "range", "dict", "lipsum", "undef", "item"}


def jinja_reads(value):
    """The variables a templated value reads (top-level names; loop variables of the template excluded)."""
    import jinja2
    import jinja2.meta
    class Any(dict):   # Ansible's filters and tests: any name is one
        def __contains__(self, key):
            return True

        def get(self, key, default=None):
            return super().get(key) or (lambda *a, **k: None)
    env = jinja2.Environment()
    env.filters, env.tests = Any(env.filters), Any(env.tests)
    out = set()
    for s in _strings(value):
        if "{{" in s or "{%" in s:
            out |= jinja2.meta.find_undeclared_variables(env.parse(s))
    return out


def _strings(node):
    if isinstance(node, dict):
        return [s for k, v in node.items() for s in _strings(k) + _strings(v)]
    if isinstance(node, list):
        return [s for v in node for s in _strings(v)]
    return [node] if isinstance(node, str) else []


@pytest.mark.parametrize("role", ROLES)
def test_every_variable_a_default_reads_is_defined(role):
    """A default that reads a name nothing defines is always its fallback, silently: roles/thermal_soak once read
    `nccl_tests_bin_dir` (the home's name is nccl_validation_tests_bin_dir), so a preinstalled all_reduce_perf set
    for the NCCL role was never the soak's loader."""
    data = yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text()) or {}
    bad = ["%s: %s" % (name, sorted(jinja_reads(value) - KNOWN - ANSIBLE_NAMES)) for name, value in data.items()
           if jinja_reads(value) - KNOWN - ANSIBLE_NAMES]
    assert not bad, "roles/%s/defaults/main.yml reads variables nothing defines:\n%s" % (role, "\n".join(bad))


def test_the_default_read_check_can_fail():
    assert jinja_reads("{{ ([nccl_tests_bin_dir] if x | default('', true) else []) + ['/opt'] }}") == {
        "nccl_tests_bin_dir", "x"}
    assert jinja_reads(["{% for h in groups['gpu_nodes'] %}{{ h }}{% endfor %}", 3]) == {"groups"}
    assert "nccl_tests_bin_dir" not in KNOWN and "nccl_validation_tests_bin_dir" in KNOWN


# --- ../shared: what the repository holds is named where the repository holds it -----------------------------------
# things of the project's shared folder (absent from a fresh clone) the repository holds a copy of
SHARED_COPIES = {"../shared/fixtures/real": "sandbox/hwemu/real",
                 "../shared/reference/sglang/server-options": "roles/sglang/files/options/" + "server-options"}
RECORDED = ("docs/evidence/", "docs/rerun-raw/")


def shared_without_copy(text, where):
    """(line, shared path) where a text sends the reader to ../shared for what the repository holds, without naming
    the copy on that line or the next or previous one (files beside the copy may call it by its short name)."""
    lines, out = text.splitlines(), []
    for i, line in enumerate(lines):
        for shared, copy in SHARED_COPIES.items():
            window = "\n".join(lines[max(0, i - 1):i + 2])
            if shared in line and copy not in window and not where.startswith(copy.rsplit("/", 1)[0] + "/") \
                    and not where.startswith(copy.rsplit("/", 2)[0] + "/"):
                out.append((i + 1, shared))
    return out


def test_no_text_sends_to_shared_for_what_the_repository_holds():
    bad = []
    for f in FILES:
        if f.startswith(RECORDED) or f == "tests/unit/test_signposts.py":
            continue
        try:
            text = (ROOT / f).read_text()
        except UnicodeDecodeError:
            continue
        bad += ["%s:%d: %s (the repository holds it: %s)" % (f, n, s, SHARED_COPIES[s])
                for n, s in shared_without_copy(text, f)]
    assert not bad, "name the repository's copy (a fresh clone has no ../shared):\n" + "\n".join(bad)
    for copy in SHARED_COPIES.values():
        assert glob_one(copy), copy


def glob_one(prefix):
    return list((ROOT / prefix).parent.glob((ROOT / prefix).name + "*"))


def test_the_shared_check_can_fail():
    assert shared_without_copy("REAL captures (../shared/fixtures/real/x/q.xml)\n", "tests/unit/test_thermal.py") == [
        (1, "../shared/fixtures/real")]
    assert shared_without_copy("copied from ../shared/fixtures/real\ninto sandbox/hwemu/real\n", "tests/unit/test_thermal.py") == []
    assert shared_without_copy("(`real/`, copied from `../shared/fixtures/real/`)", "sandbox/hwemu/README.md") == []


# --- docs/CONTRACTS.md and the README's claims about the code --------------------------------------------------------
CONTRACTS = (ROOT / "docs" / "CONTRACTS.md").read_text()


def test_contracts_lists_the_steps_of_site_yml_in_order():
    row = next(line for line in CONTRACTS.splitlines() if line.startswith("| `ansible.cfg`, `site.yml` |"))
    named = re.findall(r"`(playbooks/[\w]+\.yml)`", row)
    steps = [p["ansible.builtin.import_playbook"] for p in yaml.safe_load((ROOT / "site.yml").read_text())]
    assert named == steps, "docs/CONTRACTS.md's site.yml row: %s, site.yml: %s" % (named, steps)


def test_contracts_names_every_setting_of_the_home_and_no_other():
    listed = CONTRACTS.split("In the home today:", 1)[1].split("(their names", 1)[0]
    named = set(re.findall(r"`([a-z][a-z0-9_]+)`", listed))
    home = set(yaml.safe_load((ROOT / "roles" / "b300_defaults" / "defaults" / "main.yml").read_text()))
    assert named == home, {"not in docs/CONTRACTS.md": sorted(home - named), "not in the home": sorted(named - home)}


def test_contracts_names_every_on_call_tool():
    row = next(line for line in CONTRACTS.splitlines() if line.startswith("| `tools/` |"))
    named = set(re.findall(r"`(tools/[\w-]+)`", row.split("on-call commands", 1)[1].split(")", 1)[0]))
    tools = {f for f in FILES if re.match(r"^tools/[\w-]+$", f) and "runner_cli.Tool(" in (ROOT / f).read_text()}
    assert tools and named == tools, (sorted(named), sorted(tools))


def test_the_readme_says_what_make_lint_runs_and_waives():
    make = (ROOT / "Makefile").read_text().split("\nlint:", 1)[1].split("\n\n", 1)[0]
    runs = [line.split()[0] for line in make.splitlines()[1:] if line.startswith("\t")]
    claim = next(line for line in (ROOT / "README.md").read_text().split("\n- ") if line.startswith("`make lint`:"))
    assert runs and all(tool in claim for tool in runs), (runs, claim)
    waivers = [f for f in FILES if f.endswith((".py", ".yml")) and not f.startswith("tests/fixtures/")
               and f != "tests/unit/test_lint_waivers.py" and re.search(r"#\s*noqa\b", (ROOT / f).read_text())]
    assert "no waiver" not in claim or not waivers, "the README says no waivers; these files hold some: %s" % waivers
    assert "test_lint_waivers.py" in claim
