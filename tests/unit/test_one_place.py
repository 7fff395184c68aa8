"""Each rule in one place (issue 24 part 3): the rolling order, the flag check of the server and the router, the
router's flag sets, the "look in bin_path, then PATH" lookup and the sandbox settings each have ONE definition that
every user reads; a second copy would drift (the flag checks did: the router's lacked the prefix, list and type
rules). tests/unit/test_one_copy.py does the same for the option catalogs and argparse's prefix rule."""
import pathlib
import re
import subprocess

import pytest
import yaml

import test_sglang_plan as tsp
from ansible_collections.b300.rollout.plugins.module_utils.sglang import sglang_plan as sp

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "sglang"
PLUGINS = ROOT / "collections" / "ansible_collections" / "b300" / "rollout" / "plugins"


def tracked(*suffixes):
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split()
    return [f for f in out if f.endswith(suffixes) and (ROOT / f).is_file()
            and not f.startswith(("tests/fixtures/", "docs/rerun-raw/", "docs/evidence/"))]


# --- the rolling order ----------------------------------------------------------------------------------------------
def test_the_rolling_order_is_written_once():
    """The order (decode, prefill, worker) is ROLLING_ROLE_ORDER in module_utils/sglang/sglang_rollout.py, read by
    rolling_order (filter b300.rollout.sglang_rolling_order, used by rolling_pass.yml): no YAML selects the
    instances of several roles one after the other, and no other Python spells the order."""
    role = re.compile(r"selectattr\('role', 'equalto', '(decode|prefill|worker)'\)")
    where = sorted({f for f in tracked(".yml", ".yaml") if len(set(role.findall((ROOT / f).read_text()))) > 1})
    assert where == [], where
    from ansible_collections.b300.rollout.plugins.module_utils.sglang import sglang_rollout as ro
    assert ro.ROLLING_ROLE_ORDER == ("decode", "prefill", "worker")
    spelled = re.compile(r"""["']decode["'],\s*["']prefill["'],\s*["']worker["']""")
    users = sorted(f for f in tracked(".py") if spelled.search((ROOT / f).read_text()) and not f.startswith("tests/"))
    assert users == ["collections/ansible_collections/b300/rollout/plugins/module_utils/sglang/sglang_rollout.py"], users
    for name in ("rolling_pass.yml", "router.yml"):
        text = (ROLE / "tasks" / name).read_text()
        assert "b300.rollout.sglang_rolling_order" in text, name


def test_both_rolling_paths_use_it():
    """playbooks/rolling_restart.yml runs the role's rolling_pass; the router's deploy runs the same per-instance step
    (rolling_one.yml) in the same order, before or after the router restarts; nothing else restarts one instance
    behind the router."""
    playbook = yaml.safe_load((ROOT / "playbooks" / "rolling_restart.yml").read_text())
    froms = [t[k].get("tasks_from") for play in playbook for t in play.get("tasks", [])
             for k in ("ansible.builtin.include_role", "ansible.builtin.import_role") if k in t and t[k]["name"] == "sglang"]
    assert "rolling_pass" in froms and "rolling_one" not in froms, froms
    router = (ROLE / "tasks" / "router.yml").read_text()
    assert router.count("file: rolling_one.yml") == 2
    callers = re.compile(r"(include_tasks|import_tasks|file|tasks_from): *rolling_one")
    assert sorted(f for f in tracked(".yml") if callers.search((ROOT / f).read_text())) == [
        "roles/sglang/tasks/rolling_pass.yml", "roles/sglang/tasks/router.yml"]


def test_one_take_out_and_one_put_back():
    """Taking one instance out of the router and putting it back are the sglang role's entry points take_out and
    put_back (issue 39): the rolling step and roles/nic_firmware_update call them; no other task file removes a worker
    from the router, and only put_back and the rollback (every planned worker at once) add one."""
    module = re.compile(r"b300\.rollout\.sglang_router_members:\n((?:\s{4,}.*\n)+)")
    states = {}
    for f in tracked(".yml"):
        for m in module.finditer((ROOT / f).read_text()):
            state = re.search(r"state: *(\w+)", m.group(1))
            states.setdefault(state.group(1) if state else "?", []).append(f)
    assert states.get("absent") == ["roles/sglang/tasks/take_out.yml"], states
    assert sorted(states.get("present", [])) == ["roles/sglang/tasks/put_back.yml", "roles/sglang/tasks/rollback.yml"], states
    froms = re.compile(r"tasks_from: *(take_out|drain|restart|start_and_wait|put_back)\b")
    nic = "".join((ROOT / f).read_text() for f in tracked(".yml") if f.startswith("roles/nic_firmware_update/"))
    assert sorted(set(froms.findall(nic))) == ["drain", "put_back", "restart", "start_and_wait", "take_out"]


# --- the flag check -------------------------------------------------------------------------------------------------
def test_one_flag_check_for_server_and_router():
    src = (PLUGINS / "module_utils" / "sglang" / "sglang_plan.py").read_text()
    assert len(re.findall(r"^def check_\w*args\(", src, re.M)) == 1
    calls = re.findall(r"check_args\(.*?\"(sglang(?:-router)?) %s\"", src, re.S)
    assert sorted(calls) == ["sglang", "sglang-router"], calls
    for f in tracked(".py"):
        text = (ROOT / f).read_text()
        assert not re.search(r"check_(server|router)_args\(", text), f


@pytest.mark.parametrize("args, problem", [
    ({"--retry-max": 3}, "argparse would treat it as a prefix of --retry-max-backoff-ms, --retry-max-retries"),
    ({"--policy": ["random", "round_robin"]}, "takes one value, got a list"),
    ({"--policy": True}, "needs a value"),
    ({"--policy": "fastest"}, "got 'fastest'; expected one of"),
    ({"--disable-retries": 1}, "takes no value"),
])
def test_router_and_server_flags_meet_the_same_rules(args, problem):
    catalogs = tsp.catalogs()
    router = sp.check_args(args, catalogs["router"]["0.3.2"], "sglang-router 0.3.2", "b300a/router")
    assert len(router) == 1 and problem in router[0] and "of sglang-router 0.3.2" in router[0], router


# --- the router flag sets -------------------------------------------------------------------------------------------
SHARED = yaml.safe_load((ROLE / "files" / "router_flag_sets.yml").read_text())
PROFILES = {p.stem: yaml.safe_load(p.read_text()) for p in sorted((ROLE / "files" / "profiles").glob("*.yml"))}
# what a profile's own router_flag_sets may add to a shared set, and why (each difference stays explicit)
DIFFERENCES = {
    "kimi_k3": {"resilient": {"--health-check-endpoint": "/health"}},   # its seed checks /model_info
    "glm52_pd": {},                                                       # the router's default is /health already
}


def test_the_resilient_set_is_defined_once():
    assert set(SHARED) == {"seed", "resilient"} and SHARED["seed"] == {}
    assert set(PROFILES) == set(DIFFERENCES)
    for name, prof in PROFILES.items():
        own = prof.get("router_flag_sets")
        assert own == DIFFERENCES[name], (name, own)
        for set_name, flags in own.items():
            assert not set(flags) & set(SHARED.get(set_name) or {}), (name, "repeats a shared flag", flags)


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_both_profiles_render_the_shared_resilient_set(profile):
    """The router's argv of each profile carries every flag of the shared set as the set gives it, plus the
    profile's explicit difference; seed keeps the profile's router.args exactly."""
    res = tsp.plan(profile, router_flag_set="resilient")
    assert res["errors"] == [], res["errors"]
    argv = res["router"]["args"]
    wanted = dict(SHARED["resilient"], **DIFFERENCES[profile].get("resilient", {}))
    for flag, value in wanted.items():
        if value is False:
            assert flag not in argv, flag
        elif value is True:
            assert flag in argv, flag
        else:
            assert tsp.flag_value(argv, flag) == sp._scalar(value), flag
    seed = tsp.plan(profile, router_flag_set="seed")
    assert seed["router"]["args"] == tsp.plan(profile)["router"]["args"]     # no set = seed: router.args alone
    assert sp.router_flag_set(PROFILES[profile], SHARED, "resilient") == wanted


def test_an_unknown_flag_set_is_refused_with_the_names():
    errors = tsp.plan("kimi_k3", router_flag_set="sturdy")["errors"]
    assert any("sglang_router_flags=sturdy is not a router flag set; expected one of resilient, seed" in e
               for e in errors), errors


# --- the executable lookup ------------------------------------------------------------------------------------------
def test_one_executable_lookup():
    """"bin_path, then PATH" is module_utils/hw/tools.py find_tool; nothing else searches directories itself."""
    pattern = re.compile(r"get_bin_path\(|os\.access\([^)]*X_OK|shutil\.which\(")
    users = sorted(f for f in tracked(".py") if f.startswith("collections/") and pattern.search((ROOT / f).read_text()))
    assert users == ["collections/ansible_collections/b300/rollout/plugins/module_utils/hw/tools.py"], users
    probe = (PLUGINS / "modules" / "thermal_soak_probe.py").read_text()
    assert "find_tool" in probe


def test_find_tool_looks_in_bin_path_then_path(tmp_path, monkeypatch):
    from ansible.module_utils.common.process import get_bin_path
    from ansible_collections.b300.rollout.plugins.module_utils.hw.tools import find_tool

    class Module:  # the one method of AnsibleModule find_tool uses
        @staticmethod
        def get_bin_path(name, required=False, opt_dirs=None):
            del required
            try:
                return get_bin_path(name, opt_dirs=opt_dirs)
            except ValueError:
                return None

    first, second = tmp_path / "emu", tmp_path / "path"
    for d in (first, second):
        d.mkdir()
        (d / "nvidia-smi").write_text("#!/bin/sh\n")
        (d / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", str(second))
    assert find_tool(Module, "nvidia-smi", [str(first)]) == str(first / "nvidia-smi")
    assert find_tool(Module, "nvidia-smi", []) == str(second / "nvidia-smi")
    assert find_tool(Module, "nvidia-smi", [str(first)], explicit="/x/smi") == "/x/smi"
    assert find_tool(Module, "no-such-tool", [str(first)]) is None


# --- the sandbox settings -------------------------------------------------------------------------------------------
def test_one_sandbox_settings_file():
    """The sandbox's role settings live in inventory/sandbox/group_vars/all.yml only (tests and tools pass
    -i inventory/sandbox, molecule links the directory); no second vars file repeats them."""
    assert not (ROOT / "tests" / "integration" / "sglang_sandbox_vars.yml").exists()
    key = re.compile(r"^sglang_server_executable:", re.M)
    files = sorted(f for f in tracked(".yml", ".yaml") if key.search((ROOT / f).read_text()))
    assert files == ["inventory/sandbox/group_vars/all.yml", "roles/sglang/defaults/main.yml"], files
    for f in tracked(".py", ".sh", ".md"):
        assert f == "tests/unit/test_one_place.py" or "sglang_sandbox_vars" not in (ROOT / f).read_text(), f


# --- cross-role settings: one home (issue 31 part 2; docs/CONTRACTS.md "Settings: one home") -----------------------
HOME = "b300_defaults"
JINJA = re.compile(r"\{\{(.*?)\}\}|\{%(.*?)%\}", re.S)
BARE_JINJA_KEYS = {"when", "that", "until", "changed_when", "failed_when", "loop", "with_items", "with_dict"}


def role_defaults():
    """{role: {variable: default}} of every roles/*/defaults/main.yml."""
    return {p.parent.parent.name: yaml.safe_load(p.read_text()) or {}
            for p in sorted((ROOT / "roles").glob("*/defaults/main.yml"))}


def owners():
    out = {}
    for role, values in role_defaults().items():
        for var in values:
            out.setdefault(var, []).append(role)
    return out


def plays(path):
    data = yaml.safe_load(path.read_text()) or []
    return [p for p in data if isinstance(p, dict) and "hosts" in p]


def task_lists(node):
    """Every task of a play or block, blocks and loaded task files included, depth first."""
    for key in ("pre_tasks", "tasks", "post_tasks", "handlers", "block", "rescue", "always", "_included_tasks"):
        for task in node.get(key) or []:
            if isinstance(task, dict):
                yield task
                yield from task_lists(task)


def jinja_reads(node, key=None):
    """The Jinja expressions in the VALUES of node (never its keys: a key under vars: sets a variable)."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from jinja_reads(v, k)
    elif isinstance(node, list):
        for v in node:
            yield from jinja_reads(v, key)
    elif isinstance(node, str):
        if key in BARE_JINJA_KEYS:
            yield node
        for m in JINJA.finditer(node):
            yield m.group(1) or m.group(2)


def roles_in_scope(play):
    """The roles whose defaults a play's own tasks see: its roles: entries and its static import_role's."""
    names = {r["role"] if isinstance(r, dict) else r for r in play.get("roles") or []}
    for task in task_lists(play):
        imp = task.get("ansible.builtin.import_role")
        if imp:
            names.add(imp["name"])
    return names


def role_name(entry):
    return entry["role"] if isinstance(entry, dict) else entry


PLAYBOOKS = sorted((ROOT / "playbooks").glob("*.yml"))
MOLECULE_PLAYS = [p for p in sorted((ROOT / "molecule").glob("*/*.yml")) if p.name in ("converge.yml", "verify.yml")]
# the real-GPU runs' playbooks (tools/device): nccl_local.yml ran the role without the home and failed on the H200
# ('hw_bin_path' is undefined) while every sandbox test passed
DEVICE_PLAYS = sorted((ROOT / "tools" / "device").glob("*.yml"))


def test_each_setting_is_defined_in_exactly_one_defaults_file():
    twice = {var: where for var, where in owners().items() if len(where) > 1}
    assert not twice, "defined in more than one roles/*/defaults/main.yml (keep one, in roles/%s when shared): %s" % (
        HOME, twice)
    assert {"hw_bin_path", "hw_sysfs_root", "hw_module_defaults"} <= set(role_defaults()[HOME])
    assert not (ROOT / "roles" / HOME / "tasks").exists(), "the home has defaults only: every play loads it"


@pytest.mark.parametrize("path", PLAYBOOKS + MOLECULE_PLAYS + DEVICE_PLAYS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_play_loads_the_home_first(path):
    """The shared play preamble: the home is the first role of every play (a molecule or device play that runs no
    project role needs none)."""
    for play in plays(path):
        uses_roles = play.get("roles") or any("ansible.builtin.include_role" in t or "ansible.builtin.import_role" in t
                                               for t in task_lists(play))
        if path in MOLECULE_PLAYS + DEVICE_PLAYS and not uses_roles:
            continue
        first = [role_name(r) for r in play.get("roles") or []][:1]
        assert first == [HOME], "%s, play %r: roles: must start with %s" % (path.name, play.get("name"), HOME)


def test_no_playbook_copies_a_role_default():
    """`x | default(...)` of a role's variable in a playbook would be a second copy of its default, free to drift."""
    names = sorted(owners(), key=len, reverse=True)
    pattern = re.compile(r"\b(%s)\s*\|\s*default\b" % "|".join(map(re.escape, names)))
    files = PLAYBOOKS + sorted((ROOT / "playbooks").rglob("*/*.yml")) + [ROOT / "site.yml"]
    copies = ["%s: %s" % (f.relative_to(ROOT), m.group(0)) for f in files for m in pattern.finditer(f.read_text())]
    assert not copies, "playbooks copy role defaults (read them from the home or the owner's imported entry point):\n" \
        + "\n".join(copies)


def with_included(node, base):
    """node with the task files it includes or imports (include_tasks / import_tasks, relative to base) loaded in
    place, transitively: what the play's tasks read includes what those files read."""
    if isinstance(node, list):
        return [with_included(v, base) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: with_included(v, base) for k, v in node.items()}
    for key in ("ansible.builtin.include_tasks", "ansible.builtin.import_tasks"):
        inc = node.get(key)
        if isinstance(inc, str) and (base / inc).is_file():
            out["_included_tasks"] = with_included(yaml.safe_load((base / inc).read_text()), (base / inc).parent)
    return out


def out_of_scope_reads(play, own, base=ROOT / "playbooks"):
    play = with_included(play, base)
    scope = roles_in_scope(play)
    bad = set()
    for expr in jinja_reads({k: v for k, v in play.items() if k != "name"}):
        for var in set(re.findall(r"\b[a-z][a-z0-9_]*\b", expr)) & set(own):
            if not set(own[var]) & scope:
                bad.add("play %r reads %s (roles/%s) without that role in scope" % (play.get("name"), var, own[var][0]))
    return sorted(bad)


@pytest.mark.parametrize("path", PLAYBOOKS, ids=lambda p: p.name)
def test_a_playbook_reads_a_role_setting_only_where_its_role_is_in_scope(path):
    """Without its owner in the play (the home, a roles: entry or an import_role) a role's variable is undefined."""
    own = owners()
    bad = [b for play in plays(path) for b in out_of_scope_reads(play, own)]
    assert not bad, "%s:\n%s" % (path.name, "\n".join(bad))


def _literal(text):
    """A Jinja literal default ('x', "x", 10, true, [], {...}) as Python, via YAML (Jinja's true/false/none too)."""
    return yaml.safe_load(text.replace("none", "null").replace("None", "null"))


def test_a_role_peeking_at_another_roles_setting_copies_its_default_exactly():
    """A role that may run without the owner of a variable it reads writes `var | default(<the owner's default>)`;
    the home is in every play, so its settings are read as they are."""
    defaults, own = role_defaults(), owners()
    pattern = re.compile(r"\b([a-z][a-z0-9_]*)\s*\|\s*default\(([^()]*)\)")
    bad, seen = [], 0
    for f in sorted((ROOT / "roles").glob("*/*/*")):
        if f.suffix not in (".yml", ".j2") or f.parts[-2] == "meta":
            continue
        role = f.relative_to(ROOT).parts[1]
        for m in pattern.finditer(f.read_text()):
            var, arg = m.group(1), m.group(2).split(",")[0].strip()
            if var not in own or role in own[var]:
                continue
            seen += 1
            owner = own[var][0]
            if owner == HOME:
                bad.append("%s: %s is in %s, which every play loads: drop the default()" % (f.relative_to(ROOT), var, HOME))
            elif _literal(arg) != defaults[owner][var]:
                bad.append("%s: %s | default(%s), but roles/%s has %r" % (f.relative_to(ROOT), var, arg, owner,
                                                                          defaults[owner][var]))
    assert not bad, "\n".join(bad)
    assert seen >= 1, "the check found no copy at all: the pattern is broken"


def test_the_checks_can_fail():
    assert _literal("'/opt/sglang'") == "/opt/sglang" and _literal("true") is True and _literal("[]") == []
    assert "hw_sysfs_root" in next(iter(jinja_reads({"when": "hw_sysfs_root != '/sys'"})))
    assert list(jinja_reads({"vars": {"hw_bin_path": "x"}})) == [], "keys set variables, they do not read them"
    own = owners()
    play = {"name": "p", "hosts": "all", "roles": [HOME], "tasks": [
        {"name": "t", "ansible.builtin.debug": {"msg": "{{ nic_firmware_gate_unknown_policy }} {{ hw_bin_path }}"}}]}
    assert out_of_scope_reads(play, own) == ["play 'p' reads nic_firmware_gate_unknown_policy (roles/nic_firmware_gate)"
                                             " without that role in scope"]
    play["tasks"].append({"name": "i", "ansible.builtin.import_role": {"name": "nic_firmware_gate", "tasks_from": "preflight"}})
    assert out_of_scope_reads(play, own) == []


def hw_modules():
    runtime = yaml.safe_load((PLUGINS.parent / "meta" / "runtime.yml").read_text())
    return set(runtime["action_groups"]["hw"])


def test_every_hardware_module_call_gets_the_home_paths():
    """A module of the action group hw runs under module_defaults group/b300.rollout.hw (its task, a block around it
    or its play) from hw_module_defaults, or is given bin_path itself: it never silently reads the wrong tree."""
    group = hw_modules()
    wanted = 'group/b300.rollout.hw'

    def walk(tasks, covered, where, bad):
        for t in tasks or []:
            if not isinstance(t, dict):
                continue
            md = t.get("module_defaults") or {}
            here = covered or wanted in md
            for k in ("block", "rescue", "always"):
                walk(t.get(k), here, where, bad)
            mods = [k.split(".")[-1] for k in t if k.startswith("b300.rollout.")]
            for mod in mods:
                args = t["b300.rollout." + mod] or {}
                reads = mod != "nic_firmware_check" or "gather" in args   # judging given facts reads no hardware
                if mod in group and reads and not here and "bin_path" not in args:
                    bad.append("%s: task %r runs %s without the hw module_defaults" % (where, t.get("name"), mod))

    bad = []
    for f in sorted((ROOT / "roles").glob("*/tasks/*.yml")):
        walk(yaml.safe_load(f.read_text()), False, f.relative_to(ROOT), bad)
    for f in PLAYBOOKS:
        for play in plays(f):
            covered = wanted in (play.get("module_defaults") or {})
            for key in ("pre_tasks", "tasks", "post_tasks"):
                walk(play.get(key), covered, f.relative_to(ROOT), bad)
    for md in [m for f in PLAYBOOKS for m in re.findall(r"group/b300\.rollout\.hw:.*", f.read_text())]:
        assert "default(" not in md, md
    assert not bad, "\n".join(bad)


# --- the version choice -------------------------------------------------------------------------------------------
def test_the_plan_alone_chooses_the_version():
    prof = {"name": "kimi_k3", "sglang_version": "0.5.18", "router_version": "0.3.2"}
    assert sp.resolve_versions(prof, {}) == ("0.5.18", "0.3.2")
    assert sp.resolve_versions(prof, {"sglang_versions": {"kimi_k3": "0.5.17", "glm52_pd": "0.5.18"}}) == ("0.5.17", "0.3.2")
    assert sp.resolve_versions(prof, {"sglang_versions": {"glm52_pd": "0.5.17"}}) == ("0.5.18", "0.3.2")
    assert sp.resolve_versions(prof, {"sglang_version": "0.5.17", "sglang_versions": {"kimi_k3": "0.5.18"},
                                      "router_version": "0.3.3"}) == ("0.5.17", "0.3.3")
    assert sp.resolve_versions({"name": "x"}, {"sglang_version": ""}) == ("", "")
    res = tsp.plan("kimi_k3", sglang_version="", sglang_versions={"kimi_k3": "0.5.17"})
    assert res["version"] == "0.5.17", res["errors"]


def test_no_second_copy_of_the_versions():
    """The sandbox deploys the profiles' pins; only the production inventory keeps the site's choice."""
    sandbox = yaml.safe_load((ROOT / "inventory" / "sandbox" / "group_vars" / "all.yml").read_text())
    assert "sglang_versions" not in sandbox
    src = (PLUGINS / "module_utils" / "sglang" / "sglang_plan.py").read_text()
    assert src.count('settings.get("sglang_version")') == 1, "the version is chosen in resolve_versions only"
