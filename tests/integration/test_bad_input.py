"""Bad inventory / variables are refused before any sandbox host is touched (issue 7; made fast in issue 16).

Two layers:
1. CONTROLLER-SIDE, every case (no sandbox, no lock): the operator's command limited to the read-only gates,
       ansible-playbook -i inventory/sandbox [-i <case inventory>] site.yml --tags preflight -l b300a,b300b -c local \
           -e @<case vars> -e <emulated hardware on the controller>
   The hardware tools are the sandbox's own emulator (sandbox/hwemu/bin, HWEMU_ROOT in a temporary directory) over
   the rendered healthy sysfs tree (tests/fixtures/synth/healthy/sys), so the facts are the ones a sandbox host
   reports. A good input passes the same command (test_good_input_passes_controller_side): a refusal is the input's
   fault, not the harness's. The cases run concurrently (B300_BAD_INPUT_JOBS, default: CPU count).
2. END-TO-END, a few cases (E2E): the real `site.yml -l b300a,b300b` over SSH against the sandbox, with the hosts
   proven untouched: per host a sha256 of `find /etc/systemd/system /etc/sglang /opt/sglang /opt/sglang-router
   -printf '%p %T@ %m %u\\n'` plus the MainPID of every sglang* unit, before == after. Cases that need another
   emulated hardware scenario (per host) run only here; they switch it and switch it back (finally).
Per case: (a) non-zero exit, (b) the message names what is wrong: every fragment is found in the output (whitespace
folded, YAML quote doubling undone), (c) no SGLang install/unit task ran, (d) a case's secret (a refused API key) is
nowhere in the output. Value cases (issue 23: keys, paths, names, addresses, numbers and booleans given as strings)
are refused by the first preflight play (roles/sglang/tasks/inputs.yml, the rules of module_utils/common/input_rules.py)
in seconds; the unit-level table of the same rules is tests/unit/test_input_rules.py.

Times are written to artifacts/bad_input/last-<where>.json (controller, e2e, or both). B300_BAD_INPUT_CASES=id1,id2 runs a subset.
"""
import concurrent.futures
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROUTER_SANDBOX_ARGS = {"--model-path": False, "--tokenizer-path": False}   # as in inventory/sandbox/group_vars/all.yml
SNAPSHOT_CMD = (
    "find /etc/systemd/system /etc/sglang /opt/sglang /opt/sglang-router -printf '%p %T@ %m %u\\n' 2>/dev/null"
    " | sort | sha256sum | cut -c1-64; "
    "for u in $(systemctl list-units 'sglang*' --all --no-legend --plain | awk '{print $1}'); do "
    "echo \"$u $(systemctl show -p MainPID --value $u) $(systemctl show -p ActiveState --value $u)\"; done"
)

pytestmark = [pytest.mark.integration]
HWEMU = ROOT / "sandbox" / "hwemu"
HEALTHY_SYS = ROOT / "tests" / "fixtures" / "synth" / "healthy" / "sys"
# a -c local run's host lock, per host in the run's own directory: never the controller's /run/lock/b300-rollout,
# which the controller lane's other local runs (firmware update, host lock) take beside it (CI of 2026-12-06)
LOCAL_LOCK = "%s/hostlock/{{ inventory_hostname }}.lock"
KEY = "sk-b300-" + "5f0c1e9a7b3d4c2e" * 2     # a legal key: the bad keys below are made from it


def case(cid, vars_, expect, profile="kimi_k3", inventory=None, scenario=None, why="", e2e_only=False, marks=(),
         secret=None):
    """e2e_only: the case cannot be judged by the controller-side preflight (another hardware scenario per host,
    or a check outside the preflight plays); it runs end-to-end only. secret: a string that must appear nowhere in
    the output (the key of a refused API key)."""
    return pytest.param({"id": cid, "vars": dict({"sglang_profile": profile}, **vars_), "expect": expect,
                         "inventory": inventory, "scenario": scenario, "why": why, "secret": secret,
                         "e2e_only": e2e_only or bool(scenario)}, id=cid, marks=marks)


def ov(**instances):
    return {"sglang_instance_overrides": instances}


CASES = [
    # --- profile, versions, combinations ------------------------------------------------------------------------
    case("unknown_profile", {"sglang_profile": "kimi_k4"},
         ["sglang_profile=kimi_k4 is unknown", "expected one of", "glm52_pd", "kimi_k3"]),
    case("version_not_pinned", {"sglang_version": "0.5"},
         ["b300a: sglang_version: '0.5' is not an exact version", "rule: empty (the pin) or an exact version such as"]),
    case("unknown_router_version", {"sglang_router_version": "0.9.9"},
         ["sglang-router 0.9.9 is unknown", "router-options-0.9.9.json"]),
    case("unknown_sglang_version", {"sglang_version": "0.5.99"},
         ["no option catalog for sglang 0.5.99", "sglang 0.5.99 with sglang-router 0.3.2 is not a known combination"]),
    case("combination_not_known", {"sglang_known_combinations": [{"sglang": "0.5.17", "router": "0.3.2"}]},
         ["sglang 0.5.18 with sglang-router 0.3.2 is not a known combination", "expected one of 0.5.17+0.3.2"]),
    # --- ports --------------------------------------------------------------------------------------------------
    case("port_collision", ov(P1={"port": 30001}),
         ["b300a: b300a/P1 port 30001 collides with b300a/P0 port", "expected a port unique per host"],
         profile="glm52_pd"),
    case("bootstrap_port_collision", ov(P1={"bootstrap_port": 8998}),
         ["b300a/P1 bootstrap_port 8998 collides with b300a/P0 bootstrap_port"], profile="glm52_pd"),
    case("nccl_port_collision", ov(D1={"nccl_port": 34702}),
         ["b300b/D1 nccl_port 34702 collides with b300b/D0 nccl_port"], profile="glm52_pd"),
    case("prometheus_port_is_worker_port", {"sglang_profile_overrides": {"router": {"prometheus_port": 30000}}},
         ["b300a/router prometheus_port 30000 collides with b300a/W0 port"]),
    case("port_out_of_range", ov(W0={"port": 70000}),
         ["b300a: sglang_instance_overrides.W0.port: 70000 is out of range; rule: a TCP port: a number 1-65535"]),
    # --- GPUs -----------------------------------------------------------------------------------------------------
    case("gpu_sets_overlap", ov(P1={"gpus": [2, 3, 4, 5]}),
         ["GPU 2 of b300a/P1 is also used by b300a/P0", "expected disjoint GPU sets"], profile="glm52_pd"),
    case("tp_times_dp_not_gpu_count", ov(W0={"gpus": [0, 1, 2, 3]}),
         ["b300a/W0: 4 GPUs [0, 1, 2, 3] but --tp-size 8 x --dp-size 1 needs 8"]),
    case("gpu_index_beyond_host", ov(P1={"gpus": [6, 7, 8, 9]}),
         ["b300a/P1: GPU(s) [8, 9] do not exist; the host reports 8 GPUs (indices 0-7)"], profile="glm52_pd"),
    # --- RDMA -----------------------------------------------------------------------------------------------------
    case("rdma_device_missing", ov(P0={"ib_devices": ["mlx5_99"]}),
         ["b300a/P0: --disaggregation-ib-device mlx5_99 does not exist on b300a", "expected one of mlx5_0"],
         profile="glm52_pd"),
    case("rdma_device_is_fabric_manager_nic", ov(D0={"ib_devices": ["mlx5_8"]}),
         ["b300b/D0: --disaggregation-ib-device mlx5_8 is the fabric-manager NIC"], profile="glm52_pd"),
    # --- flags ----------------------------------------------------------------------------------------------------
    case("flag_unknown_to_pinned_sglang", {"sglang_server_extra_args": {"--enable-warp-drive": True}},
         ["b300a/W0: flag --enable-warp-drive is not an option of sglang 0.5.18"]),
    case("bad_choice_for_known_flag", {"sglang_server_extra_args": {"--kv-cache-dtype": "fp3_e9m9"}},
         ["flag --kv-cache-dtype of sglang 0.5.18 got 'fp3_e9m9'; expected one of", "fp8_e4m3"]),
    case("router_flag_unknown", {"sglang_router_extra_args": dict(ROUTER_SANDBOX_ARGS, **{"--warp-factor": 9})},
         ["b300a/router: flag --warp-factor is not an option of sglang-router 0.3.2"]),
    # --- timeouts -------------------------------------------------------------------------------------------------
    case("negative_timeout", {"sglang_rolling_drain_timeout_s": -5},
         ["sglang_rolling_drain_timeout_s: -5 is out of range; rule: a whole number of seconds >= 1"]),
    case("zero_timeout", {"sglang_stop_timeout_s": 0},
         ["sglang_stop_timeout_s: 0 is out of range; rule: a whole number of seconds >= 1"]),
    case("zero_router_flag_timeout",
         {"sglang_router_extra_args": dict(ROUTER_SANDBOX_ARGS, **{"--request-timeout-secs": 0})},
         ["b300a/router: router --request-timeout-secs 0 must be a positive number of seconds"]),
    # --- inventory shape ------------------------------------------------------------------------------------------
    case("host_in_no_profile_group", {},
         ["b300c: host is in none of the groups of profile glm52_pd", "expected one of"], profile="glm52_pd",
         inventory={"all": {"children": {"gpu_nodes": {"hosts": {"b300c": {"ansible_host": "10.89.30.13"}}}}}},
         why="b300c is only in gpu_nodes: the PD profile has no role for it"),
    case("pd_profile_without_decode_host",
         {"sglang_profile_overrides": {"roles": {"decode": {"group": "sglang_decode_missing"}}}},
         ["role decode has no host; expected at least one host in group sglang_decode_missing"], profile="glm52_pd"),
    case("empty_model_root", {"sglang_model_root": ""},
         ["b300a: sglang_model_root: empty; rule: an absolute, normalized path", "fix: set it to an absolute path"]),
    # --- firmware / GPU gates -------------------------------------------------------------------------------------
    case("unknown_firmware_policy", {"nic_firmware_gate_unknown_policy": "shrug"},
         ["value of nic_firmware_gate_unknown_policy must be one of: fail, warn, got: shrug",
          "name: nic_firmware_gate"]),
    case("malformed_firmware_matrix_row",
         {"nic_firmware_gate_extra_rows": [{"id": "site-row-no-source",
                                            "driver": {"flavours": ["doca_ofed"], "versions": ["25.10-1.2.2"]},
                                            "models": {"ConnectX-8": {"exact": "40.47.1026"}}}]},
         ["firmware matrix/policy rejected: nic_firmware_gate_extra_rows", "site-row-no-source", "'source' (where the pairing comes from) is required"]),
    case("unknown_gpu_gate_policy", {"gpu_health_gate_policy_ecc": "sometimes"},
         ["value of gpu_health_gate_policy_ecc must be one of: fail, warn, ignore, got: sometimes"]),
    case("cx8_firmware_mismatch_on_b300b", {}, ["NIC firmware gate FAILED on b300b", "mlx5_3"],
         scenario={"b300b": "cx8_fw_mismatch"}),
    # --- values that reach a host (issue 23): secrets, paths, names, addresses, numbers/booleans as strings --------
    # refused by the first preflight play (roles/sglang/tasks/inputs.yml) in seconds, before any hardware is read
    case("api_key_with_newline", {"sglang_api_key": KEY + "\n"},
         ["b300a: sglang_api_key: (secret, value not shown: 41 characters) holds a line break (newline) at character 41",
          "rule: a Bearer token", "fix: generate one with `openssl rand -hex 32`"], secret=KEY),
    case("api_key_only_spaces", {"sglang_api_key": " " * 24},
         ["sglang_api_key: (secret, value not shown: 24 characters) holds a space at character 1"], secret=" " * 24),
    case("api_key_space_inside", {"sglang_api_key": "sk-b300 " + KEY[8:]},
         ["sglang_api_key: (secret, value not shown: 40 characters) holds a space at character 8"], secret=KEY[8:]),
    case("api_key_non_ascii", {"sglang_api_key": "clé-" + KEY},
         ["sglang_api_key: (secret, value not shown: 44 characters) holds a non-ASCII character at character 3"],
         secret=KEY),
    case("model_root_relative", {"sglang_model_root": "models/kimi"},
         ["b300a: sglang_model_root: 'models/kimi' is not an absolute path", "fix: write the full path from /"]),
    case("model_root_trailing_newline", {"sglang_model_root": "/models\n"},
         ["sglang_model_root: '/models\\n' has leading or trailing whitespace"]),
    case("env_dir_with_space", {"sglang_env_dir": "/etc/sglang env"},
         ["sglang_env_dir: '/etc/sglang env' holds a space at character 12", "written into unit files unquoted"]),
    case("unit_prefix_with_specifier", {"sglang_unit_prefix": "sglang%i"},
         ["sglang_unit_prefix: 'sglang%i' is not letters, digits, '_' and '-'"]),
    case("service_user_root", {"sglang_user": "root"}, ["sglang_user: 'root'", "never run as root"]),
    case("bind_host_not_an_address", {"sglang_router_bind_host": "localhost"},
         ["sglang_router_bind_host: 'localhost' is not an IP address", "rule: an IP address literal"]),
    case("advertise_address_loopback", {"sglang_advertise_address": "127.0.0.1"},
         ["b300b: sglang_advertise_address: '127.0.0.1' is a loopback address", "fix: set sglang_advertise_address"]),
    case("timeout_with_unit", {"sglang_health_timeout_s": "3600s"},
         ["sglang_health_timeout_s: string '3600s' is not a whole number", "fix: write digits only"]),
    case("boolean_typo", {"sglang_model_check": "flase"},
         ["sglang_model_check: string 'flase' is not a boolean", "any other text would silently mean false"]),
    case("port_given_as_string", ov(W0={"port": "30001"}),
         ["b300a: sglang_instance_overrides.W0.port: '30001' is a string", "fix: write it without quotes: 30001"]),
    case("env_value_with_newline", {"sglang_server_extra_env": {"NCCL_DEBUG": "WARN\nLD_PRELOAD=/tmp/x.so"}},
         ["sglang_server_extra_env.NCCL_DEBUG: 'WARN\\nLD_PRELOAD=/tmp/x.so' holds a line break (newline)"]),
    case("flag_value_breaks_exec_start", {"sglang_server_extra_args": {"--served-model-name": "Kimi\nExecStartPost=/bin/sh"}},
         ["sglang_server_extra_args[--served-model-name]", "a newline would end the ExecStart= line"]),
    case("wheelhouse_url_with_password", {"sglang_wheelhouse_dir": "", "sglang_wheelhouse_url": "https://ops:pw@wheels.internal/"},
         ["sglang_wheelhouse_url: the URL carries credentials (user:password@, value not shown)"], secret="ops:pw"),
    case("profile_empty", {"sglang_profile": ""}, ["sglang_profile: empty; rule: lower-case letters"]),
    # --- NCCL -----------------------------------------------------------------------------------------------------
    case("nccl_threshold_override_not_a_mapping", {"nccl_validation_thresholds_override": ["B300", 8, 700]},
         ["threshold_override", "list"], e2e_only=True,
         why="validated by playbooks/nccl_validation.yml before it decides to stand aside for a serving fleet"),
]

# End-to-end over SSH with the hosts proven untouched: the cases only the real run can judge, plus one refusal from
# each kind of gate (inputs plan, inventory shape) so the operator's exact command is proven to stop before changes.
E2E = ["port_collision", "host_in_no_profile_group", "cx8_firmware_mismatch_on_b300b",
       "nccl_threshold_override_not_a_mapping"]
SELECTED = [c for c in os.environ.get("B300_BAD_INPUT_CASES", "").split(",") if c]
TIMES = {}
BY_ID = {c.values[0]["id"]: c.values[0] for c in CASES}
CONTROLLER = [c for c in CASES if not c.values[0]["e2e_only"]]
E2E_CASES = [c for c in CASES if c.values[0]["id"] in E2E]


def snapshot(sandbox):
    return {h: sandbox.exec(h, SNAPSHOT_CMD, timeout=120).stdout for h in ("b300a", "b300b")}


def fold(text):
    return re.sub(r"\s+", " ", text.replace("''", "'").replace('\\"', '"'))


def write_inputs(spec, d):
    d = pathlib.Path(d)
    varsfile = d / ("%s.yml" % spec["id"])
    varsfile.write_text(yaml.safe_dump(spec["vars"], sort_keys=False))
    inv = []
    if spec["inventory"]:
        extra = d / "extra-inventory.yml"
        extra.write_text(yaml.safe_dump(spec["inventory"]))
        inv = ["-i", str(extra)]
    return inv, ["-e", "@%s" % varsfile]


def controller_env(hwroot):
    """Environment of a controller-side run: the sandbox's hardware emulator rooted in hwroot, healthy scenario."""
    hwroot = pathlib.Path(hwroot)
    (hwroot / "scenario").write_text("healthy\n")
    (hwroot / "sys").symlink_to(HEALTHY_SYS)
    return dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_CACHE_PLUGIN="memory",
                ANSIBLE_FORCE_COLOR="0", NO_COLOR="1", HWEMU_ROOT=str(hwroot),
                ANSIBLE_LOCAL_TEMP=str(hwroot / "tmp"),
                PATH="%s:%s" % (ROOT / ".venv" / "bin", os.environ.get("PATH", "")))


def run_controller_side(spec):
    """site.yml --tags preflight -c local on the controller against emulated hardware: (rc, output, seconds)."""
    with tempfile.TemporaryDirectory(prefix="b300-badinput-") as d:
        inv, ev = write_inputs(spec, d)
        hw = {"hw_module_defaults": {"bin_path": [str(HWEMU / "bin")], "sysfs_root": str(pathlib.Path(d) / "sys")},
              "ansible_python_interpreter": sys.executable, "ansible_become": False,
              # the inputs only: the host-side checks (weights, address, ports) need the real hosts (E2E cases)
              "sglang_host_checks": False, "host_lock_path": LOCAL_LOCK % d}
        argv = (["ansible-playbook", "-i", str(ROOT / "inventory" / "sandbox")] + inv
                + ["site.yml", "--tags", "preflight", "-l", "b300a,b300b", "-c", "local"] + ev
                + ["-e", json.dumps(hw)])
        t = time.monotonic()
        r = subprocess.run(argv, cwd=ROOT, env=controller_env(d), capture_output=True, text=True, timeout=600)
        return r.returncode, r.stdout + r.stderr, round(time.monotonic() - t, 1)


@pytest.fixture(scope="module")
def controller_results():
    """Every selected controller-side case, run concurrently once: {id: (rc, output, seconds)}."""
    specs = [c.values[0] for c in CONTROLLER if not SELECTED or c.values[0]["id"] in SELECTED]
    jobs = int(os.environ.get("B300_BAD_INPUT_JOBS") or os.cpu_count() or 2)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return dict(zip([s["id"] for s in specs], pool.map(run_controller_side, specs)))


@pytest.fixture(scope="module")
def report():
    yield TIMES
    out = ROOT / "artifacts" / "bad_input"
    out.mkdir(parents=True, exist_ok=True)
    total = round(sum(t["duration_s"] for t in TIMES.values()), 1)
    # make test runs the controller-side cases beside the fleet (-m controller) and the end-to-end ones with it: one
    # file per part that ran, so that neither overwrites the other's
    where = "-".join(sorted({t["where"] for t in TIMES.values()})) or "none"
    (out / ("last-%s.json" % where)).write_text(json.dumps({"cases": TIMES, "total_s": total, "refused": sum(
        1 for t in TIMES.values() if t["refused"])}, indent=1) + "\n")
    print("\nbad-input suite: %d run(s), %d refused as expected, %.0f s of ansible-playbook time" % (
        len(TIMES), sum(1 for t in TIMES.values() if t["refused"]), total))


def check_refusal(cid, rc, out):
    text = fold(out)
    missing = [f for f in BY_ID[cid]["expect"] if fold(f) not in text]
    assert rc != 0, "%s: exit 0 - the bad input was NOT refused:\n%s" % (cid, out[-3000:])
    assert not missing, "%s: message lacks %s; output tail:\n%s" % (cid, missing, out[-3000:])
    secret = BY_ID[cid].get("secret")
    assert not secret or secret not in out, "%s: the secret is in the output" % cid
    # refused in the gates: nothing after preflight/NCCL preflight started (no SGLang install/unit task ran)
    assert "TASK [sglang : Install" not in out and "Units | env and unit files" not in out, cid
    return missing


@pytest.mark.controller
def test_case_ids_are_distinct():
    ids = [c.values[0]["id"] for c in CASES]
    assert len(ids) == len(set(ids))
    assert len(CASES) >= 40 and not [c for c in CASES if c.marks]   # every case is refused: no xfail left
    assert set(E2E) <= set(ids)
    assert all(c.values[0]["id"] in E2E for c in CASES if c.values[0]["e2e_only"]), "an e2e-only case must be in E2E"


@pytest.mark.controller
def test_good_input_passes_controller_side():
    """The harness itself: the sandbox's good inputs pass the same controller-side command (both profiles)."""
    for profile in ("kimi_k3", "glm52_pd"):
        spec = {"id": "good_" + profile, "vars": {"sglang_profile": profile}, "inventory": None}
        rc, out, _ = run_controller_side(spec)
        assert rc == 0, "%s: the good input was refused controller-side:\n%s" % (profile, out[-3000:])


@pytest.mark.controller
@pytest.mark.parametrize("spec", CONTROLLER)
def test_bad_input_refused_controller_side(spec, controller_results, report):
    if SELECTED and spec["id"] not in SELECTED:
        pytest.skip("not in B300_BAD_INPUT_CASES")
    rc, out, took = controller_results[spec["id"]]
    report[spec["id"]] = {"where": "controller", "rc": rc, "duration_s": took, "refused": rc != 0}
    check_refusal(spec["id"], rc, out)


@pytest.mark.sandbox
@pytest.mark.parametrize("spec", E2E_CASES)
def test_bad_input_refused_end_to_end_and_hosts_untouched(sandbox, spec, tmp_path, report):
    if SELECTED and spec["id"] not in SELECTED:
        pytest.skip("not in B300_BAD_INPUT_CASES")
    inv, ev = write_inputs(spec, tmp_path)
    argv = ["ansible-playbook", "-i", sandbox.inventory] + inv + ["site.yml", "-l", "b300a,b300b"] + ev
    switched = {}
    try:
        for host, name in (spec["scenario"] or {}).items():
            switched[host] = sandbox.current_scenario(host)
            sandbox.scenario(host, name)
        before = snapshot(sandbox)
        t = time.monotonic()
        r = sandbox.run(argv, check=False, timeout=900)
        took = round(time.monotonic() - t, 1)
        after = snapshot(sandbox)
    finally:
        for host, name in switched.items():
            sandbox.scenario(host, name)
    out = r.stdout + r.stderr
    report["e2e:" + spec["id"]] = {"where": "sandbox", "rc": r.returncode, "duration_s": took,
                                   "refused": r.returncode != 0 and before == after}
    check_refusal(spec["id"], r.returncode, out)
    assert before == after, "%s: the run changed a sandbox host:\nbefore %s\nafter  %s" % (spec["id"], before, after)
