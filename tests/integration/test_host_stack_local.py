"""Issue 36 without the fleet: playbooks/host_stack.yml on the controller (connection local, --check, no become).

This controller has none of the declared stack's packages in its apt lists, which is exactly the "not offered by the
declared source" trap on a real host without the mirror: the stage prints its plan, then refuses before touching
anything, naming the host, the package and the fix. With host_stack_enabled false (the sandbox inventory's value) the
stage ends each host in one task. And the on-call audit (playbooks/firmware_audit.yml) on a PRIVATE copy of the
emulated hardware (sandbox/hwemu, SYNTHESIZED, scenario healthy): with the stage on it reads the same proof read-only
and reports each failing check as a finding (exit code 2); off, the report is the NICs' and GPUs' alone. The file: ~50 s.
"""
import json
import shutil
import os
import pathlib
import runpy
import subprocess
import sys

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
VENV_BIN = ROOT / ".venv" / "bin"

pytestmark = [pytest.mark.integration, pytest.mark.controller]


def play(tmp_path, enabled, *extra):
    inv = tmp_path / ("inv-%s.yml" % enabled)
    inv.write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {"hosts": {"b300a": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable, "ansible_become": False,
        "host_stack_enabled": enabled, "host_lock_path": str(tmp_path / "lock" / "host.lock")}}}}}}))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_CACHE_PLUGIN="memory", NO_COLOR="1",
               ANSIBLE_FORCE_COLOR="0", PATH="%s:%s" % (VENV_BIN, os.environ.get("PATH", "")))
    return subprocess.run([str(VENV_BIN / "ansible-playbook"), "-i", str(inv), "playbooks/host_stack.yml", "--check"]
                          + list(extra), cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=180)


def test_plan_printed_then_refused_before_any_change(tmp_path):
    p = play(tmp_path, True)
    out = p.stdout + p.stderr
    assert p.returncode != 0, out[-2000:]
    assert "install (in order): nothing" in out and "reboot: no" in out
    assert "host_stack on b300a: refusing to change the host stack (b300-noble-580.173)" in out
    assert "apt knows no package nvidia-driver-580-server-open" in out and "fix: add that apt source" in out
    # refused in preflight: no install task ran
    assert "Install | the declared packages in order" not in out


def test_stage_off_ends_the_host_in_one_task(tmp_path):
    p = play(tmp_path, False)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-2000:]
    assert "host_stack :" not in out and "b300a" in out


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    t = tmp_path_factory.mktemp("hsaudit")
    shutil.copytree(ROOT / "sandbox" / "hwemu", t / "emu", ignore=shutil.ignore_patterns("__pycache__"))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_CACHE_PLUGIN="memory", NO_COLOR="1",
               ANSIBLE_FORCE_COLOR="0", HWEMU_HOSTNAME="b300b", PATH="%s:%s" % (VENV_BIN, os.environ.get("PATH", "")))
    subprocess.run([str(t / "emu" / "bin" / "hwemu-scenario"), "healthy"], check=True, capture_output=True, env=env)
    return t, env


def audit(emu, enabled):
    t, env = emu
    inv = t / ("inv-%s" % enabled)
    shutil.copytree(ROOT / "inventory" / "sandbox" / "group_vars", inv / "group_vars")
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {"hosts": {"b300b": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}}}))
    with open(inv / "group_vars" / "all.yml", "a") as fh:
        fh.write("\n" + yaml.safe_dump({"hw_bin_path": str(t / "emu" / "bin"), "hw_sysfs_root": str(t / "emu" / "sys"),
                                        "host_stack_enabled": enabled, "audit_become": False}))
    rep = t / ("rep-%s" % enabled)
    p = subprocess.run([str(VENV_BIN / "ansible-playbook"), "-i", str(inv), "playbooks/firmware_audit.yml",
                        "-e", "audit_report_dir=%s" % rep, "-e", "audit_report_name=a"],
                       cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=300)
    assert (rep / "a.json").exists(), (p.stdout + p.stderr)[-3000:]
    return json.loads((rep / "a.json").read_text()), (rep / "a.md").read_text(), (rep / "a.json").parent


def test_audit_reads_the_host_stack_proof_read_only(emu):
    rep, md, _ = audit(emu, True)
    host = rep["hosts"]["b300b"]
    assert host["host_stack"]["failures"], host
    assert any(m.startswith("b300b: host_stack check packages_declared failed") for m in host["messages"])
    assert rep["summary"]["failing"] == ["b300b"] and rep["summary"]["exit_code"] == 2
    assert "host_stack check packages_declared failed" in md
    # the SW_MNG bridge of the emulated host is seen by the proof and left out of the NIC verdicts
    assert not any(m.startswith("b300b: host_stack check sw_mng_bridge") for m in host["messages"])
    assert [r["verdict"] for r in rep["nic_rows"] if r["device"] == "mlx5_8"] == ["ignored"]


def test_audit_without_the_stage_is_the_nics_and_gpus_alone(emu):
    rep, md, _ = audit(emu, False)
    assert "host_stack" not in rep["hosts"]["b300b"] and rep["summary"]["exit_code"] == 0, rep["summary"]


# ----------------------------------------------------------------------------------------------- real apt, stand-ins
def test_plan_resolves_exact_versions_from_real_apt_against_the_stand_in_repositories(tmp_path):
    """sandbox/hoststack_repo/build.py builds the stand-in packages (real names and versions) and a second source
    offering the driver group at 580.178.04; REAL apt (private state, no network: file: repositories) answers
    `apt-cache policy`, and the plan installs the declared builds from the declared source, in order, noting the newer
    one it pins away."""
    if not (shutil.which("dpkg-deb") and shutil.which("apt-get")):
        pytest.skip("needs dpkg-deb and apt-get (Debian/Ubuntu controller)")
    build = runpy.run_path(str(ROOT / "sandbox" / "hoststack_repo" / "build.py"))   # a script, not on sys.path
    from ansible_collections.b300.rollout.plugins.module_utils.hoststack import host_stack as hs
    kernel = "6.1.0-99-amd64"
    build["build"](str(tmp_path / "main"), kernel)
    build["build"](str(tmp_path / "cuda"), kernel, variant="newer")
    (tmp_path / "sources.list").write_text("deb [trusted=yes] file:%s/main ./\ndeb [trusted=yes] file:%s/cuda ./\n" % (
        tmp_path, tmp_path))
    (tmp_path / "status").write_text("")
    opts = []
    for k, v in (("Dir::State", tmp_path / "state"), ("Dir::State::status", tmp_path / "status"),
                 ("Dir::Etc::SourceList", tmp_path / "sources.list"), ("Dir::Etc::SourceParts", tmp_path / "none"),
                 ("Dir::Etc::Preferences", tmp_path / "none.pref"), ("Dir::Etc::PreferencesParts", tmp_path / "none"),
                 ("Dir::Cache", tmp_path / "cache"), ("Debug::NoLocking", "1"), ("APT::Sandbox::User", "root")):
        opts += ["-o", "%s=%s" % (k, v)]
    (tmp_path / "state" / "lists" / "partial").mkdir(parents=True)
    (tmp_path / "cache" / "archives" / "partial").mkdir(parents=True)
    subprocess.run(["apt-get"] + opts + ["update"], check=True, capture_output=True, text=True, timeout=120)
    stack = yaml.safe_load((ROOT / "roles" / "host_stack" / "vars" / "stacks.yml").read_text())[
        "host_stack_stacks"]["b300-noble-580.173"]
    names = [p["name"] for p in hs.stack_packages(stack, kernel)]
    policy = subprocess.run(["apt-cache"] + opts + ["policy"] + names, check=True, capture_output=True, text=True,
                            timeout=120).stdout
    assert "580.178.04" in policy and "580.173.02-0b300standin1" in policy
    stack = dict(stack, apt_source_match=["%s/main" % tmp_path])
    booted = {"running_kernel": kernel, "next_kernel": kernel, "dpkg": "", "apt_policy": policy, "next_kernel_modules": {
        m: {"path": "/lib/modules/%s/%s.ko" % (kernel, m), "signer": None} for m in ("nvidia", "mlx5_ib", "ib_umad")}}
    p = hs.plan(stack, booted)
    assert p["refusals"] == [], p["refusals"]
    assert p["install"] == ["linux-modules-extra-%s=1.0-0b300standin1" % kernel,
                            "linux-modules-nvidia-580-server-open-%s=580.173.02-0b300standin1" % kernel,
                            "nvidia-driver-580-server-open=580.173.02-0b300standin1",
                            "nvidia-fabricmanager-580=580.173.02-0b300standin1",
                            "libnvidia-nscq-580=580.173.02-0b300standin1", "nvlsm=2025.10.14-1",
                            "infiniband-diags=1.0-0b300standin1"]
    assert any(n.startswith("nvidia-fabricmanager-580: a source offers newer 580.178.04-0b300standin1") for n in
               p["notes"])
    # the declared source without the mirror: refused, naming the fix
    p = hs.plan(dict(stack, apt_source_match=["offline-mirror.local"]), booted)
    assert p["install"] == [] and len(p["refusals"]) == 7
    assert all("not offered by the declared source (offline-mirror.local)" in r for r in p["refusals"])
