"""Run the modules gpu_topology_facts and rdma_nic_facts (plugins/modules/) the way Ansible does (ad-hoc `ansible localhost -m`)
with fake tools that cat the REAL H200 captures (or SYNTHESIZED outputs), and check the returned JSON."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

import synth

ROOT = pathlib.Path(__file__).resolve().parents[2]
VENV_BIN = ROOT / ".venv" / "bin"


def _ansible_bin(name):
    p = VENV_BIN / name
    return str(p) if p.exists() else name


def run_module(module, args, tmp_path, check=False):
    """ansible localhost -m MODULE -a JSON; returns (rc, result dict)."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="default",
               ANSIBLE_CALLBACK_RESULT_FORMAT="json", ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"),
               ANSIBLE_CACHE_PLUGIN="memory", ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    cmd = [_ansible_bin("ansible"), "localhost", "-i", "localhost,", "-c", "local",
           "-e", "ansible_python_interpreter=%s" % sys.executable, "-m", "b300.rollout." + module, "-a", json.dumps(args)]
    if check:
        cmd.append("--check")
    proc = subprocess.run(cmd, cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=120)
    # ad-hoc output: "localhost | SUCCESS => {json}" (or FAILED!); warnings go to stderr
    start = proc.stdout.find("localhost | ")
    head, sep, body = proc.stdout[max(start, 0):].partition(" => ")
    try:
        result = json.loads(body) if sep else None
    except ValueError:
        result = None
    if not isinstance(result, dict) or not head.startswith("localhost |"):
        pytest.fail("no JSON from ansible (rc %s): %s %s" % (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:]))
    result["_stderr"] = proc.stderr
    result["failed"] = "FAILED!" in head
    return proc.returncode, result


def fake_smi(tmp_path, files, rc=0):
    """A fake nvidia-smi that cats captured outputs per sub-command; logs each call to calls.log."""
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    log = tmp_path / "calls.log"
    script = ["#!/bin/sh", 'echo "$*" >> %s' % log, 'case "$*" in']
    for argv, path in files.items():
        script.append('  "%s") cat "%s" ;;' % (argv, path))
    script += ['  *) echo "unexpected args: $*" >&2; exit 2 ;;', "esac", "exit %d" % rc]
    exe = d / "nvidia-smi"
    exe.write_text("\n".join(script) + "\n")
    exe.chmod(0o755)
    return d, log


def test_gpu_topology_facts_on_real_2xh200(real_fixtures, tmp_path):
    from ansible_collections.b300.rollout.plugins.module_utils.hw.gpu_topology import build_gpu_topology

    m = real_fixtures / "nvidia-h200x2-vm"
    bindir, log = fake_smi(tmp_path, {"-q -x": m / "q.xml", "topo -m": m / "topo.txt", "nvlink -s": m / "nvlink-s.txt"})
    rc, res = run_module("gpu_topology_facts", {"bin_path": [str(bindir)], "sysfs_root": str(tmp_path)}, tmp_path)
    assert rc == 0, res
    facts = res["ansible_facts"]["gpu_topology"]
    expected = build_gpu_topology((m / "q.xml").read_text(), (m / "topo.txt").read_text(),
                                  (m / "nvlink-s.txt").read_text(), sysfs_root=str(tmp_path))
    assert facts == json.loads(json.dumps(expected))
    assert facts["gpu_count"] == 2 and facts["gpus"][1]["nvlink"]["links_up"] == 18
    assert res["changed"] is False
    # each tool ran exactly once, as argv (no shell)
    assert log.read_text().splitlines() == ["-q -x", "topo -m", "nvlink -s"]
    assert set(res["timing_s"]) >= {"nvidia_smi_q_x", "topo_m", "nvlink_s", "parse", "total"}


def test_gpu_topology_facts_check_mode_and_raw(real_fixtures, tmp_path):
    m = real_fixtures / "nvidia-h200-vm"
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    bindir, _ = fake_smi(tmp_path, {"-q -x": m / "q.xml", "topo -m": m / "topo.txt", "nvlink -s": empty})
    rc, res = run_module("gpu_topology_facts", {"nvidia_smi_path": str(bindir / "nvidia-smi"), "return_raw": True},
                         tmp_path, check=True)
    assert rc == 0, res
    assert res["ansible_facts"]["gpu_topology"]["gpus"][0]["name"] == "NVIDIA H200"
    assert res["raw"]["smi_xml"] == (m / "q.xml").read_text()
    assert res["raw"]["nvlink"] == ""


def test_gpu_topology_facts_r610_banner_fallback(tmp_path):
    (tmp_path / "q.xml").write_text(synth.b300_xml(version_tags=None))
    (tmp_path / "topo.txt").write_text(synth.b300_topo())
    (tmp_path / "nvlink.txt").write_text(synth.b300_nvlink())
    (tmp_path / "smi.txt").write_text("| NVIDIA-SMI 610.43.02   KMD Version: 610.43.02     CUDA UMD Version: 13.3 |\n")
    bindir, log = fake_smi(tmp_path, {"-q -x": tmp_path / "q.xml", "topo -m": tmp_path / "topo.txt",
                                      "nvlink -s": tmp_path / "nvlink.txt", "": tmp_path / "smi.txt"})
    rc, res = run_module("gpu_topology_facts", {"bin_path": [str(bindir)]}, tmp_path)
    assert rc == 0, res
    f = res["ansible_facts"]["gpu_topology"]
    assert (f["driver_version"], f["cuda_version"], f["gpu_count"]) == ("610.43.02", "13.3", 8)
    assert len(log.read_text().splitlines()) == 4


def test_gpu_topology_facts_missing_tool_fails_cleanly(tmp_path):
    env_path = os.environ.get("PATH", "")
    if any(os.access(os.path.join(p, "nvidia-smi"), os.X_OK) for p in env_path.split(os.pathsep) if p):
        pytest.skip("a real nvidia-smi is on PATH here, so 'missing' cannot be simulated")
    rc, res = run_module("gpu_topology_facts", {"bin_path": [str(tmp_path / "nowhere")]}, tmp_path)
    assert rc != 0
    assert res["failed"] is True
    assert "nvidia-smi not found on host" in res["msg"]
    assert str(tmp_path / "nowhere") in res["msg"]


def test_gpu_topology_facts_unreadable_output_fails_cleanly(tmp_path):
    (tmp_path / "bad.txt").write_text("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n")
    bindir, _ = fake_smi(tmp_path, {"-q -x": tmp_path / "bad.txt", "topo -m": tmp_path / "bad.txt",
                                    "nvlink -s": tmp_path / "bad.txt"})
    rc, res = run_module("gpu_topology_facts", {"bin_path": [str(bindir)]}, tmp_path)
    assert rc != 0 and res["failed"] is True
    assert "nvidia-smi -q -x output unreadable on host" in res["msg"]


def test_gpu_topology_facts_tool_error_rc(tmp_path):
    (tmp_path / "bad.txt").write_text("No devices were found\n")
    bindir, _ = fake_smi(tmp_path, {"-q -x": tmp_path / "bad.txt"}, rc=6)
    rc, res = run_module("gpu_topology_facts", {"bin_path": [str(bindir)]}, tmp_path)
    assert rc != 0
    assert "nvidia-smi: `" in res["msg"] and "rc=6" in res["msg"] and "failed on host" in res["msg"]


def _fake_tool(d, name, text, rc=0):
    d.mkdir(exist_ok=True)
    (d / (name + ".out")).write_text(text)
    exe = d / name
    exe.write_text('#!/bin/sh\ncat "%s"\nexit %d\n' % (d / (name + ".out"), rc))
    exe.chmod(0o755)


def test_rdma_nic_facts_doca_cx8_with_pending_reset(tmp_path):
    root = synth.make_sysfs(tmp_path / "sys")
    bindir = tmp_path / "bin"
    _fake_tool(bindir, "ofed_info", "OFED-internal-25.10-1.2.2:\n")
    _fake_tool(bindir, "mlxfwmanager", synth.mlxfwmanager_query(
        [(synth.nic_pci(i), "ConnectX8", "MT_0000001217", "40.47.1026") for i in range(8)],
        pending={synth.nic_pci(3): "40.44.1036"}))
    rc, res = run_module("rdma_nic_facts", {"bin_path": [str(bindir)], "sysfs_root": root}, tmp_path, check=True)
    assert rc == 0, res
    f = res["ansible_facts"]["rdma_nics"]
    assert f["driver"]["flavour"] == "doca_ofed" and f["driver"]["ofed_info"] == "OFED-internal-25.10-1.2.2"
    assert f["usable_devices"] == ["mlx5_%d" % i for i in range(8)]
    assert f["devices"][8]["role"] == "fabric_manager"
    assert f["devices"][3]["fw_pending"] == "40.47.1026"
    assert res["tools"]["mlxfwmanager_ran"] is True


def test_rdma_nic_facts_inbox_without_tools(tmp_path):
    root = synth.make_sysfs(tmp_path / "sys", module_version=None)
    rc, res = run_module("rdma_nic_facts", {"bin_path": [str(tmp_path / "none")], "sysfs_root": root,
                                            "run_mlxfwmanager": False}, tmp_path)
    assert rc == 0, res
    f = res["ansible_facts"]["rdma_nics"]
    assert f["driver"]["flavour"] == "inbox" and f["driver"]["version_scheme"] == "kernel"
    assert f["driver"]["version"] == os.uname().release


def test_rdma_nic_facts_mlxfwmanager_required_but_missing(tmp_path):
    rc, res = run_module("rdma_nic_facts", {"bin_path": [str(tmp_path / "none")], "sysfs_root": str(tmp_path),
                                            "run_mlxfwmanager": True}, tmp_path)
    assert rc != 0
    assert "mlxfwmanager not found on host" in res["msg"]


@pytest.mark.parametrize("module", ["gpu_topology_facts", "rdma_nic_facts", "gpu_health_check"])
def test_ansible_doc(module):
    proc = subprocess.run([_ansible_bin("ansible-doc"), "b300.rollout." + module], cwd=str(ROOT),
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg")))
    assert proc.returncode == 0, proc.stderr
    assert module in proc.stdout and "EXAMPLES" in proc.stdout and "RETURN VALUES" in proc.stdout


def _b300_facts(**kw):
    from ansible_collections.b300.rollout.plugins.module_utils.hw.gpu_topology import build_gpu_topology
    return json.loads(json.dumps(build_gpu_topology(synth.b300_xml(**kw), synth.b300_topo(),
                                                    synth.b300_nvlink(down={5: [3, 11]}))))


GATE_EXPECTED = {"gpu_count": 8, "gpu_model": "NVIDIA B300 SXM6 AC", "nvlink_links": 18}


def test_gpu_health_check_fails_with_one_line_per_problem(tmp_path):
    facts = _b300_facts(ecc_unc={2: (3, 5)})
    rc, res = run_module("gpu_health_check", {"gpu_topology": facts, "host": "b300a", "expected": GATE_EXPECTED},
                         tmp_path)
    assert rc != 0 and res["failed"] is True
    lines = res["msg"].splitlines()
    assert len(lines) == 2 and res["counts"] == {"fail": 2, "warn": 0}
    assert lines[0] == "b300a: GPU 2 (%s): uncorrectable ECC errors: volatile 3, aggregate 5; expected 0" % synth.gpu_pci(2)
    assert lines[1].startswith("b300a: GPU 5 (%s): 2 NVLink links down (links 3, 11)" % synth.gpu_pci(5))


def test_gpu_health_check_warn_policy_passes(tmp_path):
    facts = _b300_facts()
    rc, res = run_module("gpu_health_check", {"gpu_topology": facts, "host": "b300a", "expected": GATE_EXPECTED,
                                              "policies": {"nvlink": "warn"}}, tmp_path, check=True)
    assert rc == 0, res
    assert res["counts"] == {"fail": 0, "warn": 1}
    assert "2 NVLink links down" in res["_stderr"] or any("2 NVLink links down" in w for w in res.get("warnings", []))


# ----------------------------------------------------------------- roles hw_facts + gpu_health_gate on hwemu fixtures
def _hwemu_bin(tmp_path, scenario_dir):
    """Fake nvidia-smi / ofed_info / mlxfwmanager serving one hwemu scenario's SYNTHESIZED outputs."""
    d = tmp_path / "hwbin"
    d.mkdir()
    smi = ['#!/bin/sh', 'D="%s"' % scenario_dir, 'case "$*" in', '  "-q -x") cat "$D/q.xml" ;;',
           '  "topo -m") cat "$D/topo.txt" ;;', '  "nvlink -s") cat "$D/nvlink-s.txt" ;;', '  "") cat "$D/smi.txt" ;;',
           '  *) exit 2 ;;', 'esac']
    (d / "nvidia-smi").write_text("\n".join(smi) + "\n")
    (d / "ofed_info").write_text('#!/bin/sh\ncat "%s/ofed_info.txt"\n' % scenario_dir)
    (d / "mlxfwmanager").write_text('#!/bin/sh\ncat "%s/mlxfwmanager.txt"\n' % scenario_dir)
    for f in d.iterdir():
        f.chmod(0o755)
    return d


def run_roles(tmp_path, scenario, extra_vars=None):
    synth_dir = ROOT / "tests" / "fixtures" / "synth" / scenario
    if not (synth_dir / "q.xml").exists():
        pytest.skip("hwemu fixture %s not rendered (sandbox/hwemu/render_fixtures.py)" % scenario)
    play = tmp_path / "play.yml"
    play.write_text(
        "- hosts: localhost\n  gather_facts: false\n"
        "  roles: [b300_defaults, hw_facts, gpu_health_gate]\n"
        "  post_tasks:\n    - ansible.builtin.copy:\n        content: '{{ ansible_facts.rdma_nics | to_json }}'\n"
        "        dest: %s/rdma.json\n      delegate_to: localhost\n" % tmp_path)
    ev = dict({"hw_module_defaults": {"bin_path": [str(_hwemu_bin(tmp_path, synth_dir))],
                                      "sysfs_root": str(synth_dir / "sys")},
               "ansible_python_interpreter": sys.executable}, **(extra_vars or {}))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_CACHE_PLUGIN="memory",
               ANSIBLE_NOCOLOR="1", ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"), ANSIBLE_ROLES_PATH=str(ROOT / "roles"))
    proc = subprocess.run([_ansible_bin("ansible-playbook"), "-i", "localhost,", "-c", "local", "-e", json.dumps(ev),
                           str(play)], cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=300)
    return proc


def test_roles_pass_on_healthy_b300(tmp_path):
    proc = run_roles(tmp_path, "healthy")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "8 GPUs" in proc.stdout and "usable RDMA NICs mlx5_0,mlx5_1" in proc.stdout
    assert "not for data: mlx5_8 ConnectX-7 (fabric_manager)" in proc.stdout and "FINDING" not in proc.stdout
    rdma = json.loads((tmp_path / "rdma.json").read_text())
    assert rdma["usable_devices"] == ["mlx5_%d" % i for i in range(8)]


def test_gate_fails_on_nvlink_down_naming_host_gpu_pci(tmp_path):
    proc = run_roles(tmp_path, "nvlink_down")
    assert proc.returncode != 0
    assert ("localhost: GPU 5 (0000:ab:00.0): 2 NVLink links down (links 3, 11); expected 18 links up, 16 up"
            in proc.stdout)


def test_gate_warn_policy_lets_throttled_host_pass(tmp_path):
    proc = run_roles(tmp_path, "thermal_throttle", {"gpu_health_gate_policy_throttle": "warn"})
    assert proc.returncode == 0, proc.stdout[-3000:]
    out = proc.stdout + proc.stderr
    assert out.count("clocks throttled by hw_thermal_slowdown, sw_thermal_slowdown") == 8
