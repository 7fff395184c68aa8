"""`make plan` against what a deploy really wrote (issue 24 part 1).

Reuses the fleet as the earlier integration tests left it (test_acceptance deploys both profiles before this file
runs; no deploy here unless nothing is deployed at all, e.g. this file run on its own): reads, over SSH, every
sglang unit and env file on b300a/b300b, takes the profile and SGLang version from the units' own marker line, runs
`tools/plan` for that profile on the controller, and checks:
- no host was touched by the plan (per host: sha256 of the sglang files' paths/mtimes/modes, and every sglang unit's
  MainPID, before == after);
- the plan lists exactly the units on the hosts, and for each its ExecStartPre=/ExecStart=/Environment=/
  EnvironmentFile= lines and its env file's lines (secrets masked on both sides) are the ones on the host, verbatim;
- the preflight of site.yml (controller-side, `--tags preflight -c local` over the sandbox's emulated hardware, as
  tests/integration/test_bad_input.py runs it) prints, per host, exactly that host's part of the plan's text.
"""
import json
import pathlib
import re
import subprocess
import sys
import tempfile

import pytest

from ansible_collections.b300.rollout.plugins.module_utils.sglang import sglang_plan as sp
from test_bad_input import LOCAL_LOCK  # a -c local run's host lock in its own directory

ROOT = pathlib.Path(__file__).resolve().parents[2]
# the sandbox's hardware emulator and its rendered healthy sysfs tree (as tests/integration/test_bad_input.py uses them)
HWEMU = ROOT / "sandbox" / "hwemu"
HEALTHY_SYS = ROOT / "tests" / "fixtures" / "synth" / "healthy" / "sys"
HOSTS = ("b300a", "b300b")
MARKER_RE = re.compile(r"^# X-B300-Managed: sglang (?:worker \(instance \S+, profile (?P<profile>\w+), sglang "
                       r"(?P<version>[\d.]+)\)|router \(profile (?P<rprofile>\w+), )", re.M)
SNAPSHOT = ("find /etc/systemd/system /etc/sglang /opt/sglang /opt/sglang-router -printf '%p %T@ %m %u\\n' "
            "2>/dev/null | sort | sha256sum | cut -c1-64; for u in $(systemctl list-units 'sglang*' --all "
            "--no-legend --plain | awk '{print $1}'); do echo \"$u $(systemctl show -p MainPID --value $u)\"; done")
SEP = "\n=====8<=====\n"

pytestmark = [pytest.mark.integration, pytest.mark.sandbox]


def host_units(sandbox, host):
    """{unit path: (unit text, env file path, env text)} of every sglang unit this project wrote on host."""
    names = sandbox.ssh(host, "grep -l '^# X-B300-Managed: sglang' /etc/systemd/system/sglang*.service || true")
    out = {}
    for path in names.stdout.split():
        unit = sandbox.ssh(host, "cat %s" % path).stdout
        # a worker's or the router's env file; the router front's HAProxy config (its ExecStart= -f FILE)
        m = re.search(r"^EnvironmentFile=(\S+)$", unit, re.M) or re.search(r"^ExecStart=\S*haproxy .*-f (\S+)", unit, re.M)
        out[path] = (unit, m.group(1), sandbox.ssh(host, "cat %s" % m.group(1)).stdout)
    return out


def deployed(sandbox):
    units = {h: host_units(sandbox, h) for h in HOSTS}
    markers = [m for u in units.values() for (text, _, _) in u.values() for m in MARKER_RE.finditer(text)]
    return units, markers


def run_plan(sandbox, profile, out_dir, *extra):
    env = dict(sandbox.env, B300_PLAN_DIR=str(out_dir))
    r = subprocess.run([str(ROOT / "tools" / "plan"), "-i", sandbox.inventory, profile, *extra], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return r.stdout, json.loads((pathlib.Path(out_dir) / ("%s.json" % profile)).read_text())


@pytest.fixture(scope="module")
def deployment(sandbox):
    units, markers = deployed(sandbox)
    if not markers:
        # this file on its own, on a fleet nothing was deployed to yet: one deploy (in the full run the fleet
        # test_acceptance / test_sglang_deploy deployed is reused)
        sandbox.ansible_playbook("playbooks/sglang_deploy.yml", "-e", "sglang_profile=kimi_k3",
                                 limit="b300a,b300b", timeout=900)
        units, markers = deployed(sandbox)
    profiles = {m.group("profile") or m.group("rprofile") for m in markers}
    versions = {m.group("version") for m in markers if m.group("version")}
    assert len(profiles) == 1 and len(versions) == 1, "units of several profiles/versions on the fleet: %s %s" % (
        profiles, versions)
    # keyed: an ExecStart= through the key launcher (comments of the unit name the launcher either way)
    launcher = any(re.search(r"^ExecStart=\S+ \S+/sglang_launch\.py ", text, re.M)
                   for u in units.values() for (text, _, _) in u.values())
    return {"units": units, "profile": profiles.pop(), "version": versions.pop(), "api_key": launcher}


@pytest.fixture(scope="module")
def planned(sandbox, deployment, tmp_path_factory):
    """tools/plan for the deployed profile and version (a key when the units use the key launcher: it is masked on
    both sides), with the hosts' state taken before and after."""
    extra = ["-e", "sglang_version=%s" % deployment["version"]]
    if deployment["api_key"]:
        extra += ["-e", "sglang_api_key=plan-test-key-masked-anyway"]
    before = {h: sandbox.exec(h, SNAPSHOT, timeout=120).stdout for h in HOSTS}
    text, data = run_plan(sandbox, deployment["profile"], tmp_path_factory.mktemp("plan"), *extra)
    after = {h: sandbox.exec(h, SNAPSHOT, timeout=120).stdout for h in HOSTS}
    return {"text": text, "data": data, "before": before, "after": after, "extra": extra}


def test_plan_touches_no_host(planned):
    assert planned["before"] == planned["after"]
    assert "plan-test-key" not in planned["text"]


def test_plan_lists_exactly_the_deployed_units(deployment, planned):
    planned_units = sorted((v["host"], v["unit_path"]) for v in planned["data"]["units"])
    on_hosts = sorted((h, path) for h, units in deployment["units"].items() for path in units)
    assert planned_units == on_hosts
    assert planned["data"]["profile"] == deployment["profile"]
    assert planned["data"]["version"] == deployment["version"]


def test_plan_lines_are_the_units_lines_verbatim(deployment, planned):
    assert planned["data"]["units"], "the plan has no unit"
    for view in planned["data"]["units"]:
        unit, env_path, env = deployment["units"][view["host"]][view["unit_path"]]
        assert view["env_file"] == env_path
        hint = ("%s: the plan differs from %s on the host: the last deploy used variables other than the "
                "inventory's (e.g. -e sglang_router_flags=seed), or ran from another checkout whose role or "
                "profiles differ from this one's (a shared sandbox)" % (view["id"], view["unit_path"]))
        assert view["unit_lines"] == sp.unit_lines_shown(unit), hint
        assert view["env_lines"] == sp.env_lines_shown(env), hint
        assert [line for line in view["unit_lines"] if line.startswith("ExecStart=")], view["id"]
        # ...and the printed text carries each of those lines as they are, under the unit's heading
        block = "  unit %s\n" % view["unit_path"] + "".join("    %s\n" % line for line in view["unit_lines"])
        assert block in planned["text"], view["id"]
        files = "config" if view["kind"] == "front" else "env file"
        assert "  %s %s\n" % (files, env_path) + "".join("    %s\n" % line for line in view["env_lines"]) in planned["text"]


def test_preflight_prints_the_same_text(sandbox, deployment, planned):
    """site.yml's preflight (controller-side over the emulated hardware; host-side checks off) prints, per host,
    that host's part of the plan's text: the whole plan is those parts one after the other."""
    with tempfile.TemporaryDirectory(prefix="b300-plan-preflight-") as d:
        (pathlib.Path(d) / "scenario").write_text("healthy\n")
        (pathlib.Path(d) / "sys").symlink_to(HEALTHY_SYS)
        hw = {"hw_module_defaults": {"bin_path": [str(HWEMU / "bin")], "sysfs_root": str(pathlib.Path(d) / "sys")},
              "ansible_python_interpreter": sys.executable, "ansible_become": False, "sglang_host_checks": False,
              "sglang_profile": deployment["profile"], "host_lock_path": LOCAL_LOCK % d}
        env = dict(sandbox.env, HWEMU_ROOT=d, ANSIBLE_LOCAL_TEMP=str(pathlib.Path(d) / "tmp"),
                   ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json")
        r = subprocess.run(["ansible-playbook", "-i", sandbox.inventory, "site.yml", "--tags", "preflight",
                            "-l", "b300a,b300b", "-c", "local", "-e", json.dumps(hw)] + planned["extra"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    shown = {}
    for play in json.loads(r.stdout)["plays"]:
        for task in play["tasks"]:
            if "Validate | show the plan" in task["task"]["name"]:   # "sglang : Validate | show the plan (...)"
                for host, res in task["hosts"].items():
                    if not res.get("skipped"):   # shown once per run: skipped in the later plays that plan again
                        shown.setdefault(host, []).append(res["msg"])
    assert {h: len(texts) for h, texts in shown.items()} == {h: 1 for h in HOSTS}, shown
    shown = {h: texts.pop() for h, texts in shown.items()}
    assert sorted(shown) == list(HOSTS)
    views = planned["data"]["units"]
    hosts_in_order = list(dict.fromkeys(v["host"] for v in views))
    body = sp.PLAN_SEPARATOR.join(shown[h] for h in hosts_in_order)
    assert body == sp.plan_text(views)
    assert planned["text"].endswith(body + "\n"), "make plan's text is not the preflight's"
