"""Each rule in one place (issue 24 part 3): the rolling order, the flag check of the server and the router, the
router's flag sets, the "look in bin_path, then PATH" lookup and the sandbox settings each have ONE definition that
every user reads; a second copy would drift (the flag checks did: the router's lacked the prefix, list and type
rules). tests/unit/test_one_copy.py does the same for the option catalogs and argparse's prefix rule."""
import pathlib
import re
import subprocess
import sys

import pytest
import yaml

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import test_sglang_plan as tsp
from ansible_collections.b300.rollout.plugins.module_utils import sglang_plan as sp

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
    """The order (decode, prefill, worker) is ROLLING_ROLE_ORDER in module_utils/sglang_rollout.py, read by
    rolling_order (filter b300.rollout.sglang_rolling_order, used by 60_rolling_pass.yml): no YAML selects the
    instances of several roles one after the other, and no other Python spells the order."""
    role = re.compile(r"selectattr\('role', 'equalto', '(decode|prefill|worker)'\)")
    where = sorted({f for f in tracked(".yml", ".yaml") if len(set(role.findall((ROOT / f).read_text()))) > 1})
    assert where == [], where
    from ansible_collections.b300.rollout.plugins.module_utils import sglang_rollout as ro
    assert ro.ROLLING_ROLE_ORDER == ("decode", "prefill", "worker")
    spelled = re.compile(r"""["']decode["'],\s*["']prefill["'],\s*["']worker["']""")
    users = sorted(f for f in tracked(".py") if spelled.search((ROOT / f).read_text()) and not f.startswith("tests/"))
    assert users == ["collections/ansible_collections/b300/rollout/plugins/module_utils/sglang_rollout.py"], users
    text = (ROLE / "tasks" / "60_rolling_pass.yml").read_text()
    assert "b300.rollout.sglang_rolling_order" in text


def test_both_rolling_paths_use_it():
    playbook = yaml.safe_load((ROOT / "playbooks" / "rolling_restart.yml").read_text())
    froms = [t["ansible.builtin.include_role"].get("tasks_from") for play in playbook for t in play.get("tasks", [])
             if "ansible.builtin.include_role" in t and t["ansible.builtin.include_role"]["name"] == "sglang"]
    assert "60_rolling_pass" in froms and "61_rolling_one" not in froms, froms
    router = (ROLE / "tasks" / "50_router.yml").read_text()
    assert router.count("file: 60_rolling_pass.yml") == 2
    callers = re.compile(r"(include_tasks|import_tasks|file|tasks_from): *61_rolling_one")
    assert sorted(f for f in tracked(".yml") if callers.search((ROOT / f).read_text())) == [
        "roles/sglang/tasks/60_rolling_pass.yml"]


# --- the flag check -------------------------------------------------------------------------------------------------
def test_one_flag_check_for_server_and_router():
    src = (PLUGINS / "module_utils" / "sglang_plan.py").read_text()
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
    """"bin_path, then PATH" is module_utils/tools.py find_tool; nothing else searches directories itself."""
    pattern = re.compile(r"get_bin_path\(|os\.access\([^)]*X_OK|shutil\.which\(")
    users = sorted(f for f in tracked(".py") if f.startswith("collections/") and pattern.search((ROOT / f).read_text()))
    assert users == ["collections/ansible_collections/b300/rollout/plugins/module_utils/tools.py"], users
    probe = (PLUGINS / "modules" / "thermal_soak_probe.py").read_text()
    assert "find_tool" in probe


def test_find_tool_looks_in_bin_path_then_path(tmp_path, monkeypatch):
    from ansible.module_utils.common.process import get_bin_path
    from ansible_collections.b300.rollout.plugins.module_utils.tools import find_tool

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
