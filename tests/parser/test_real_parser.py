"""Command lines checked by the REAL `sglang serve` parser of 0.5.17 and 0.5.18 (CPU venvs, no GPU).

Run as its own step:  pytest -m real_parser tests/parser   (first run builds .cache/sglang-argcheck/<ver>/venv,
about 2 min each from a cold pip cache; later runs reuse them). A venv that cannot be built FAILS the module (no skip).

Checks: the seed's server command lines exactly as written (with `--tp 4 --dp 1` abbreviations) and in long-name
rendering, unknown flag / bad choice / bad type refused, the stub's catalog-based verdict equals the real parser's on
a set of argvs (accept/refuse parity and the same error line), the catalog dumper reproduces the reference catalog,
and every instance argv that module_utils/sglang/sglang_plan.py renders for the two profiles.
"""
import copy
import json
import pathlib
import subprocess
import sys
import time

import pytest

import check_argv
import seed_commands
import sglang_stub

import forkserver

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOOLS = ROOT / "tools" / "sglang_argcheck"
STUB_DIR = ROOT / "sandbox" / "sglang_stub"
VERSIONS = ("0.5.17", "0.5.18")
REFERENCE = ROOT.parent / "shared" / "reference" / "sglang"

pytestmark = pytest.mark.real_parser
TIMINGS = {}


@pytest.fixture(scope="session")
def venvs():
    """Build or reuse the CPU venv of each version; a failed build is a test FAILURE, never a skip."""
    out = {}
    for ver in VERSIONS:
        t0 = time.monotonic()
        proc = subprocess.run([str(TOOLS / "build_venv.sh"), ver], capture_output=True, text=True, timeout=1800)
        TIMINGS["venv_%s_s" % ver] = round(time.monotonic() - t0, 1)
        if proc.returncode != 0:
            pytest.fail("building the sglang %s CPU venv failed (rc %d):\n%s" % (ver, proc.returncode,
                                                                                proc.stderr[-3000:]))
        out[ver] = proc.stdout.strip().splitlines()[-1]
    return out


def real_server(version):
    """The fork server of the version's CPU venv (tests/parser/forkserver.py): sglang's parser imported once."""
    return forkserver.sglang(check_argv.venv_python(version, build=False))


def real_check(version, argvs, tmp_path):
    """Run the real parser once over many argvs; list of result dicts (see sglang_argv_check.check_one)."""
    batch = tmp_path / ("batch-%s-%d.json" % (version, len(argvs)))
    batch.write_text(json.dumps(argvs))
    t0 = time.monotonic()
    if forkserver.enabled():
        # what check_argv.py --sglang-version VER re-executes in the venv, run in the venv's fork server
        rc, stdout, stderr = real_server(version).run(
            [TOOLS / "check_argv.py", "--expect-version", version, "--batch", batch], cwd=ROOT)
    else:
        proc = subprocess.run([sys.executable, str(TOOLS / "check_argv.py"), "--sglang-version", version, "--batch",
                               str(batch)], capture_output=True, text=True, timeout=600)
        rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    elapsed = time.monotonic() - t0
    TIMINGS.setdefault("batch_runs", []).append({"version": version, "argvs": len(argvs), "s": round(elapsed, 2)})
    assert rc in (0, 2), "checker crashed (rc %d): %s" % (rc, stderr[-3000:])
    results = json.loads(stdout)
    assert len(results) == len(argvs)
    for r in results:
        assert r["version"] == version
    return results


def seeds():
    return seed_commands.load(str(ROOT))


def catalog(version):
    return json.loads((ROOT / "roles" / "sglang" / "files" / "options" / ("server-options-%s.json" % version)).read_text())


# ------------------------------------------------------------------------------------------------ seed lines
def test_seed_command_lines_accepted_as_written_and_long_names(venvs, tmp_path):
    cmds = seeds()
    assert sorted(c["name"] for c in cmds) == ["GLM-5.2-NVFP4-decode", "GLM-5.2-NVFP4-prefill", "Kimi-K3-null"]
    for ver in VERSIONS:
        mine = [c for c in cmds if c["version"] == ver]
        assert mine, ver
        argvs = [c["argv"] for c in mine] + [seed_commands.long_names(c["argv"], catalog(ver)) for c in mine]
        results = real_check(ver, argvs, tmp_path)
        for argv, res in zip(argvs, results):
            assert res["ok"] and res["rc"] == 0, "sglang %s refused %s: %s" % (ver, argv, res["error"])
        as_written, long_form = results[:len(mine)], results[len(mine):]
        for c, res in zip(mine, as_written):
            used = {a["used"]: a["long"] for a in res["abbreviations"]}
            if c["name"].startswith("GLM"):
                assert used == {"--tp": "--tp-size", "--dp": "--dp-size"}, used
            else:
                assert used == {}, used
        for res in long_form:
            assert res["abbreviations"] == [], res


def test_unknown_flag_bad_choice_bad_type_refused(venvs, tmp_path):
    base = ["--model-path", "/models/x"]
    cases = [
        (base + ["--no-such-flag", "1"], "unrecognized arguments: --no-such-flag 1"),
        (base + ["--disaggregation-mode", "both"], "argument --disaggregation-mode: invalid choice: 'both'"),
        (base + ["--port", "thirty"], "argument --port: invalid int value: 'thirty'"),
        (base + ["--tool-call-parser", "glm47_moe"], "argument --tool-call-parser: invalid choice: 'glm47_moe'"),
    ]
    for ver in VERSIONS:
        results = real_check(ver, [c[0] for c in cases], tmp_path)
        for (argv, expected), res in zip(cases, results):
            assert not res["ok"] and res["rc"] == 2, (ver, argv, res)
            assert expected in res["error"], (ver, res["error"])
            assert res["error"].startswith("sglang serve: error: "), res["error"]


# ------------------------------------------------------------------------------------------------ stub parity
PARITY = [
    [],
    ["/models/positional"],
    ["--model-path", "/m", "--tp", "4", "--dp", "1"],
    ["--model-path", "/m", "--tp-size", "8", "--port=30001"],
    ["--model-path", "/m", "--te", "8"],                                  # prefix: --tensor-parallel-size
    ["--model-path", "/m", "--enable-p"],                                 # ambiguous prefix
    ["--model-path", "/m", "--bogus"],
    ["--model-path", "/m", "--disaggregation-mode", "decode", "--disaggregation-bootstrap-port", "x"],
    ["--model-path", "/m", "--context-length", "256k"],
    ["--model-path", "/m", "--context-length", "1.5Ki"],
    ["--model-path", "/m", "--context-length", "12abc"],
    ["--model-path", "/m", "--mem-fraction-static", "0.9x"],
    ["--model-path", "/m", "--dcp-replicate-q-proj", "--no-dcp-replicate-q-proj"],
    ["--model-path", "/m", "--enable-metrics=1"],
    ["--model-path", "/m", "--cuda-graph-bs", "1", "2", "4"],
    ["--model-path", "/m", "--cuda-graph-bs"],
    ["--model-path", "/m", "--cuda-graph-config", '{"decode": {}}'],
    ["--model-path", "/m", "--cuda-graph-config", "[1]"],
    ["--model-path", "/m", "--default-chat-template-kwargs", "{bad json"],
    ["--model-path", "/m", "--default-chat-template-kwargs", '{"thinking": true}'],
    ["--model-path", "/m", "--model-checksum"],
    ["--model-path", "/m", "--quantization-param-path", "None"],
    ["--model-path", "/m", "--lora-paths", "a=/x", "b=/y"],
    ["--model-path", "/m", "--startup-weight-load-mode", "serial"],       # only in 0.5.18
    ["--model-path", "/m", "--torchao-config", "int4wo-128"],            # only in 0.5.17
    ["--model-path", "/m", "--moe-runner-backend", "megamoe"],           # choice only in 0.5.18
    ["--model-path", "/m", "--reasoning-parser", "muse"],                # choice only in 0.5.18
    ["--model-path", "/m", "--model-type", "llm", "--tp-size", "2"],
    ["--model-path", "/m", "--model-type", "bogus"],
    ["--model-path", "/m", "--speculative-algorithm", "NOT-CHECKED-AT-PARSE-TIME"],
    ["--model-path", "/m", "--enable-metrics", "extra-positional"],
]


@pytest.mark.parametrize("version", VERSIONS)
def test_stub_verdict_equals_real_parser(venvs, tmp_path, version):
    argvs = PARITY + [c["argv"] for c in seeds()]
    real = real_check(version, argvs, tmp_path)
    mismatches = []
    for argv, res in zip(argvs, real):
        rc, msg = sglang_stub.check_argv(version, argv)
        stub_err = [ln for ln in msg.splitlines() if ": error: " in ln or ln.startswith("Error:")]
        stub_line = stub_err[-1] if stub_err else (msg.splitlines()[-1] if msg else None)
        real_ok = res["ok"]
        if (rc == 0) != real_ok:
            mismatches.append((argv, "real", res["error"], "stub", rc, stub_line))
        elif not real_ok and rc == 2 and _norm(stub_line) != _norm(res["error"]):
            mismatches.append((argv, "message differs", res["error"], stub_line))
    assert not mismatches, "\n".join(map(repr, mismatches))
    # The version-specific cases really differ between the versions (the parity set is not trivially all-ok).
    verdicts = {tuple(a): r["ok"] for a, r in zip(argvs, real)}
    only18 = ("--model-path", "/m", "--startup-weight-load-mode", "serial")
    only17 = ("--model-path", "/m", "--torchao-config", "int4wo-128")
    assert verdicts[only18] == (version == "0.5.18")
    assert verdicts[only17] == (version == "0.5.17")
    assert sum(1 for ok in verdicts.values() if not ok) >= 10


def _norm(line):
    """argparse lists an ambiguous prefix's matches in the parser's insertion order, which the (sorted) catalog
    does not keep: compare those lists as sets."""
    marker = " could match "
    if line and marker in line:
        head, tail = line.split(marker, 1)
        return head + marker + ", ".join(sorted(tail.split(", ")))
    return line


def test_dump_options_reproduces_reference_catalog(venvs, tmp_path):
    for ver in VERSIONS:
        out = tmp_path / ("dump-%s.json" % ver)
        t0 = time.monotonic()
        argv = [TOOLS / "dump_options.py", "--sglang-version", ver, "-o", out]
        if forkserver.enabled():
            rc, _, err = real_server(ver).run(argv, cwd=ROOT)
            assert rc == 0, err[-3000:]
        else:
            subprocess.run([sys.executable] + [str(a) for a in argv], check=True, capture_output=True, timeout=600)
        TIMINGS["dump_%s_s" % ver] = round(time.monotonic() - t0, 1)
        dumped = json.loads(out.read_text())
        assert dumped == catalog(ver) or _same_but_choice_order(dumped, catalog(ver)), ver
        if REFERENCE.is_dir():
            assert catalog(ver) == json.loads((REFERENCE / ("server-options-%s.json" % ver)).read_text())


def _same_but_choice_order(a, b):
    """Registry-built choice lists may come out in another order; compare them as sets."""
    if set(a) != set(b):
        return False
    for k in a:
        x, y = dict(a[k]), dict(b[k])
        cx, cy = x.pop("choices"), y.pop("choices")
        if x != y or (cx is None) != (cy is None) or (cx is not None and sorted(cx) != sorted(cy)):
            return False
    return True


# ------------------------------------------------------------------------------------------------ rendered plans
def _plan_inputs(profile_name):
    """Inputs for module_utils/sglang/sglang_plan.build_plan (SYNTHESIZED facts: 8 GPUs, 8 CX-8 data NICs)."""
    import yaml
    prof = yaml.safe_load((ROOT / "roles" / "sglang" / "files" / "profiles" / ("%s.yml" % profile_name))
                          .read_text())
    server = {}
    for f in (ROOT / "roles" / "sglang" / "files" / "options").glob("server-options-*.json"):
        server[f.stem.replace("server-options-", "")] = json.loads(f.read_text())
    router = {}
    for f in (ROOT / "roles" / "sglang" / "files" / "options").glob("router-options-*.json"):
        data = json.loads(f.read_text())
        router[f.stem.replace("router-options-", "")] = data.get("options", data)
    combos = yaml.safe_load((ROOT / "roles" / "sglang" / "vars" / "compat.yml").read_text())
    gpus = [{"index": i, "pci_bus_id": "0000:%02x:00.0" % (0x18 + 0x10 * i), "numa_node": i // 4} for i in range(8)]
    gpu_nic = {str(g): {"mlx5_%d" % n: ("PIX" if n == g else ("NODE" if n // 4 == g // 4 else "SYS"))
                        for n in range(8)} for g in range(8)}
    topo = {"gpu_count": 8, "gpus": gpus, "topology": {"nic_columns_present": True, "gpu_nic": gpu_nic}}
    devices = [{"name": "mlx5_%d" % n, "model": "ConnectX-8", "role": "data", "usable": True, "numa_node": n // 4,
                "pci_address": "0000:%02x:00.0" % (0x1a + 0x10 * n)} for n in range(8)]
    rdma = {"devices": devices, "usable_devices": ["mlx5_%d" % n for n in range(8)]}
    groups = {"b300a": ["gpu_nodes", "sglang_router", "sglang_prefill"], "b300b": ["gpu_nodes", "sglang_decode"]}
    hosts = [{"name": n, "address": "10.89.30.%d" % (11 + i), "groups": g, "gpu_topology": copy.deepcopy(topo),
              "rdma_nics": copy.deepcopy(rdma), "instance_overrides": {}}
             for i, (n, g) in enumerate(sorted(groups.items()))]
    settings = {"model_root": "/models", "known_combinations": combos["sglang_known_combinations"],
                "timeouts": {"health": 1800}}
    return prof, hosts, settings, {"server": server, "router": router}


@pytest.mark.parametrize("profile_name", ["glm52_pd", "kimi_k3"])
def test_sglang_plan_rendered_argvs_accepted_by_pinned_real_parser(venvs, tmp_path, profile_name):
    """Every instance argv module_utils/sglang/sglang_plan.py renders passes the real parser of the profile's version."""
    from ansible_collections.b300.rollout.plugins.module_utils.sglang import sglang_plan
    prof, hosts, settings, catalogs = _plan_inputs(profile_name)
    plan = sglang_plan.build_plan(prof, hosts, settings, catalogs)
    assert not plan["errors"], plan["errors"]
    instances = plan["instances"]
    assert len(instances) == (4 if profile_name == "glm52_pd" else 2), [i["name"] for i in instances]
    versions = {i["version"] for i in instances}
    assert versions == {prof["sglang_version"]}
    argvs = [i["args"] for i in instances]
    results = real_check(prof["sglang_version"], argvs, tmp_path)
    for inst, res in zip(instances, results):
        assert res["ok"], "%s/%s refused by sglang %s: %s" % (inst["host"], inst["name"], inst["version"],
                                                              res["error"])
        assert res["abbreviations"] == [], "%s renders abbreviations: %s" % (inst["name"], res["abbreviations"])
        # and the stub agrees
        assert sglang_stub.check_argv(inst["version"], inst["args"]) == (0, "")


def test_zz_report_timings(venvs):
    """Prints the measured figures (venv build/reuse, per-batch check times)."""
    print("\nreal-parser timings: %s" % json.dumps(TIMINGS))
    assert all(v >= 0 for k, v in TIMINGS.items() if k.endswith("_s"))
