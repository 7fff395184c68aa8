"""Tests for module_utils/sglang/sglang_plan.py: instance derivation, argv rendering, validation, RDMA NIC choice.

The B300 facts built by `synth_b300_facts` below are SYNTHESIZED (shape from docs/CONTRACTS.md; values invented):
8 GPUs, 8 ConnectX-8 data NICs mlx5_0..7 (NIC i PIX to GPU i, NODE to GPUs on the same NUMA node, SYS across),
plus a ConnectX-7 fabric-manager NIC mlx5_8 placed PIX to GPU 0 (the nearest of all) so that choosing it would show.
"""
import copy
import json
import pathlib
import re
import shlex

import pytest
import yaml

from ansible_collections.b300.rollout.plugins.module_utils.sglang import sglang_plan as sp

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROFILES = ROOT / "roles" / "sglang" / "files" / "profiles"
SEED_FULL = ROOT.parent / "shared" / "seeds" / "000_41a8a3efb3bcc347.txt"
# the seed's command blocks, kept in the repository so a clone without ../shared runs these tests
SEED_EXTRACT = ROOT / "tests" / "fixtures" / "seed" / "000_41a8a3efb3bcc347-commands.txt"
SEED = SEED_FULL if SEED_FULL.is_file() else SEED_EXTRACT


def load_profile(name):
    return yaml.safe_load((PROFILES / ("%s.yml" % name)).read_text())


def catalogs():
    server = {}
    for f in (ROOT / "roles" / "sglang" / "files" / "options").glob("server-options-*.json"):
        server[f.stem.replace("server-options-", "")] = json.loads(f.read_text())
    router = {}
    for f in (ROOT / "roles" / "sglang" / "files" / "options").glob("router-options-*.json"):
        router[f.stem.replace("router-options-", "")] = json.loads(f.read_text())["options"]
    return {"server": server, "router": router}


def router_flag_sets():
    """The router flag sets every profile uses (roles/sglang/files/router_flag_sets.yml)."""
    return yaml.safe_load((ROOT / "roles" / "sglang" / "files" / "router_flag_sets.yml").read_text())


def known_combinations():
    return yaml.safe_load((ROOT / "roles" / "sglang" / "vars" / "compat.yml").read_text())["sglang_known_combinations"]


def synth_b300_facts(gpu_count=8):
    """SYNTHESIZED gpu_topology + rdma_nics facts of one HGX B300 host."""
    gpus = [{"index": i, "pci_bus_id": "0000:%02x:00.0" % (0x18 + 0x10 * i), "numa_node": 0 if i < 4 else 1}
            for i in range(gpu_count)]
    gpu_nic = {}
    for g in range(gpu_count):
        row = {}
        for n in range(8):
            row["mlx5_%d" % n] = "PIX" if n == g else ("NODE" if (n < 4) == (g < 4) else "SYS")
        row["mlx5_8"] = "PIX" if g == 0 else "SYS"
        gpu_nic[str(g)] = row
    topo = {"gpu_count": gpu_count, "gpus": gpus,
            "topology": {"nic_columns_present": True, "gpu_nic": gpu_nic}}
    devices = [{"name": "mlx5_%d" % n, "model": "ConnectX-8", "role": "data", "usable": True, "numa_node": 0 if n < 4 else 1,
                "pci_address": "0000:%02x:00.0" % (0x1a + 0x10 * n)} for n in range(8)]
    devices.append({"name": "mlx5_8", "model": "ConnectX-7", "role": "fabric_manager", "usable": False, "numa_node": 0,
                    "pci_address": "0000:0a:00.0"})
    rdma = {"devices": devices, "usable_devices": ["mlx5_%d" % n for n in range(8)]}
    return topo, rdma


def hosts(profile, facts=True, overrides=None):
    topo, rdma = synth_b300_facts()
    groups = {
        "b300a": ["gpu_nodes", "sglang_router", "sglang_prefill"],
        "b300b": ["gpu_nodes", "sglang_decode"],
    }
    out = []
    for i, (name, g) in enumerate(sorted(groups.items())):
        out.append({"name": name, "address": "10.89.30.%d" % (11 + i), "groups": g,
                    "gpu_topology": copy.deepcopy(topo) if facts else None,
                    "rdma_nics": copy.deepcopy(rdma) if facts else None,
                    "instance_overrides": (overrides or {}).get(name, {})})
    return out


def settings(**kw):
    base = {"model_root": "/models", "known_combinations": known_combinations(), "timeouts": {"health": 1800},
            "router_flag_sets": router_flag_sets()}
    base.update(kw)
    return base


def plan(name, profile_overrides=None, host_list=None, **kw):
    prof = sp.merge_overrides(load_profile(name), profile_overrides or {})
    return sp.build_plan(prof, host_list if host_list is not None else hosts(name), settings(**kw), catalogs())


def by_name(p):
    return {(i["host"], i["name"]): i for i in p["instances"]}


def flag_value(argv, flag):
    idx = argv.index(flag)
    return argv[idx + 1]


# ---------- seed parsing: what the two recipes say, read from the seed text itself ----------

def seed_blocks():
    text = SEED.read_text(encoding="utf-8")
    blocks = {}
    for key, marker in (("prefill", "# Prefill："), ("decode", "# Decode："), ("pd_router", "Router（Prefill"),
                        ("kimi_worker", "Worker（两台"), ("kimi_router", "Router（Round")):
        start = text.index(marker)
        rest = text[start:]
        end = rest.index("--enable-cache-report") + len("--enable-cache-report") if "worker" in key or key in ("prefill", "decode") else None
        if end is None:
            end = rest.index("--disable-retries") + len("--disable-retries") if key == "pd_router" else rest.index("--cb-window-duration-secs 120") + 30
        blocks[key] = rest[:end]
    return blocks


def test_seed_extract_is_the_seeds_command_blocks():
    """The in-repository extract holds exactly the blocks seed_blocks() cuts from the full seed (where it exists)."""
    if not SEED_FULL.is_file():
        pytest.skip("the full seed (../shared/seeds) is not next to this checkout: nothing to compare the extract with")
    blocks = seed_blocks()
    assert SEED_EXTRACT.read_text(encoding="utf-8") == "\n\n".join(blocks.values()) + "\n"


def seed_flags(block):
    """{flag: [values]} and env var names from one seed command block."""
    flags, env = {}, set()
    current = None
    for raw in block.splitlines():
        line = raw.strip().rstrip("\\").strip()
        m = re.match(r"^([A-Z][A-Z0-9_]+)=", line)
        if m:
            env.add(m.group(1))
            continue
        for tok in line.split():
            if tok.startswith("--"):
                current = tok
                flags.setdefault(current, [])
            elif current and not tok.startswith("#"):
                flags[current].append(tok)
    return flags, env


LONG = {"--tp": "--tp-size", "--dp": "--dp-size"}


@pytest.mark.parametrize("profile,role,block", [
    ("glm52_pd", "prefill", "prefill"), ("glm52_pd", "decode", "decode"), ("kimi_k3", "worker", "kimi_worker")])
def test_every_seed_server_flag_and_env_is_in_the_rendered_argv(profile, role, block):
    flags, env = seed_flags(seed_blocks()[block])
    assert len(flags) > 25
    p = plan(profile)
    assert p["errors"] == []
    inst = [i for i in p["instances"] if i["role"] == role][0]
    argv = inst["argv"]
    for flag, values in flags.items():
        name = LONG.get(flag, flag)
        assert name in argv, "%s (seed %s) missing from %s argv" % (name, flag, role)
        if values and "<" not in values[0]:  # placeholders such as <P0: 30001 | P1: 30002> are checked elsewhere
            got = flag_value(argv, name)
            if values[0].startswith("/models/"):
                assert got == values[0]
            else:
                try:
                    assert float(got) == float(values[0]), (name, got, values)
                except ValueError:
                    assert got == values[0], (name, got, values)
    for var in env - {"CUDA_VISIBLE_DEVICES"}:
        assert var in inst["env"], var
    assert "--tp" not in argv and "--dp" not in argv


@pytest.mark.parametrize("profile,block", [("glm52_pd", "pd_router"), ("kimi_k3", "kimi_router")])
def test_every_seed_router_flag_is_in_the_router_argv(profile, block):
    flags, _env = seed_flags(seed_blocks()[block])
    p = plan(profile)
    argv = p["router"]["argv"]
    for flag, values in flags.items():
        assert flag in argv, flag
        if values and "<" not in " ".join(values) and not values[0].startswith("http") and flag not in ("--model-path", "--tokenizer-path"):
            assert flag_value(argv, flag) == values[0], flag


def test_pd_instances_derived_from_inventory():
    p = plan("glm52_pd")
    assert p["errors"] == []
    inst = by_name(p)
    assert sorted(inst) == [("b300a", "P0"), ("b300a", "P1"), ("b300b", "D0"), ("b300b", "D1")]
    p0, p1, d0, d1 = inst[("b300a", "P0")], inst[("b300a", "P1")], inst[("b300b", "D0")], inst[("b300b", "D1")]
    assert (p0["gpus"], p1["gpus"]) == ([0, 1, 2, 3], [4, 5, 6, 7])
    assert (p0["cuda_visible_devices"], d1["cuda_visible_devices"]) == ("0,1,2,3", "4,5,6,7")
    assert (p0["port"], p1["port"], d0["port"], d1["port"]) == (30001, 30002, 33002, 33003)
    assert (p0["nccl_port"], p1["nccl_port"], d0["nccl_port"], d1["nccl_port"]) == (31701, 31702, 34702, 34703)
    assert (p0["bootstrap_port"], p1["bootstrap_port"], d0["bootstrap_port"]) == (8998, 8999, None)
    assert flag_value(p0["argv"], "--disaggregation-bootstrap-port") == "8998"
    assert "--disaggregation-bootstrap-port" not in d0["argv"]
    assert p0["env"]["NCCL_NVLS_ENABLE"] == "0" and "NCCL_NVLS_ENABLE" not in d0["env"]
    assert p0["role"] == "prefill" and d0["role"] == "decode"
    assert p0["unit_name"] == "sglang-glm52_pd-p0.service" and p0["env_file"] == "/etc/sglang/glm52_pd-p0.env"
    assert p0["argv"][:2] == ["/opt/sglang/0.5.17/bin/sglang", "serve"]
    assert flag_value(p0["argv"], "--model-path") == "/models/GLM-5.2-NVFP4"
    assert flag_value(p0["argv"], "--tool-call-parser") == "glm47"


def test_pd_router_argv():
    p = plan("glm52_pd")
    r = p["router"]
    assert r["host"] == "b300a" and r["port"] == 30000
    text = " ".join(r["argv"])
    assert "--prefill http://10.89.30.11:30001 8998 --prefill http://10.89.30.11:30002 8999" in text
    assert "--decode http://10.89.30.12:33002 --decode http://10.89.30.12:33003" in text
    assert flag_value(r["argv"], "--tool-call-parser") == "glm47_moe"  # differs from the server's glm47
    assert flag_value(r["argv"], "--prometheus-host") == "127.0.0.1"
    assert r["argv"][:3] == ["/opt/sglang-router/0.3.2/bin/python", "-m", "sglang_router.launch_router"]
    assert [w["worker_type"] for w in r["workers"]] == ["prefill", "prefill", "decode", "decode"]


def test_kimi_instances_and_router():
    p = plan("kimi_k3")
    assert p["errors"] == []
    inst = p["instances"]
    assert [(i["host"], i["name"], i["port"], i["gpus"]) for i in inst] == [
        ("b300a", "W0", 30000, list(range(8))), ("b300b", "W0", 30000, list(range(8)))]
    w = inst[0]
    assert w["nccl_port"] is None and "--nccl-port" not in w["argv"]
    assert flag_value(w["argv"], "--tp-size") == "8"
    assert w["env"]["SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK"] == "8320"
    assert flag_value(w["argv"], "--speculative-draft-model-path") == "/models/RadixArk/Kimi-K3-DSpark"
    assert w["argv"][0] == "/opt/sglang/0.5.18/bin/sglang"
    r = p["router"]
    i = r["argv"].index("--worker-urls")
    assert r["argv"][i + 1:i + 3] == ["http://10.89.30.11:30000", "http://10.89.30.12:30000"]
    assert (r["port"], r["prometheus_port"]) == (30080, 30081)
    assert flag_value(r["argv"], "--prometheus-port") == "30081"


def test_long_option_names_only():
    for name in ("glm52_pd", "kimi_k3"):
        p = plan(name)
        for inst in p["instances"]:
            assert "--tp-size" in inst["argv"]
            for tok in inst["argv"]:
                assert tok not in ("--tp", "--dp", "--ep", "--dcp"), tok


def test_ib_devices_nearest_cx8_never_cx7():
    p = plan("glm52_pd")
    inst = by_name(p)
    assert inst[("b300a", "P0")]["ib_devices"] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert inst[("b300a", "P1")]["ib_devices"] == ["mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7"]
    assert flag_value(inst[("b300b", "D1")]["argv"], "--disaggregation-ib-device") == "mlx5_4,mlx5_5,mlx5_6,mlx5_7"
    for i in p["instances"]:
        assert "mlx5_8" not in i["ib_devices"]


def test_ib_device_when_cx7_is_the_only_pix_nic_and_cx8_is_broken():
    hl = hosts("glm52_pd")
    for d in hl[0]["rdma_nics"]["devices"]:
        if d["name"] == "mlx5_0":
            d["usable"] = False
    hl[0]["rdma_nics"]["devices"][8].update({"role": "fabric_manager", "usable": True})  # even if marked usable
    p = plan("glm52_pd", host_list=hl)
    p0 = by_name(p)[("b300a", "P0")]
    assert "mlx5_0" not in p0["ib_devices"] and "mlx5_8" not in p0["ib_devices"]
    assert p0["ib_devices"][:3] == ["mlx5_1", "mlx5_2", "mlx5_3"]


@pytest.fixture
def synth_b300_hosts(tmp_path):
    """Both hosts with facts parsed by the real facts code from the facts helper's SYNTHESIZED B300 fixture
    (tests/fixtures/facts/synth.py: 8 GPUs, CX8 mlx5_0..7, fabric-manager CX7 mlx5_8 under GPU 0's switch)."""
    import synth
    from ansible_collections.b300.rollout.plugins.module_utils.hw.gpu_topology import build_gpu_topology
    from ansible_collections.b300.rollout.plugins.module_utils.hw.rdma_nic import build_rdma_nics

    root = synth.make_sysfs(tmp_path, fm_under_gpu0=True)

    def make(with_nics):
        topo = build_gpu_topology(synth.b300_xml(), synth.b300_topo(with_nics=with_nics), synth.b300_nvlink(), sysfs_root=root)
        rdma = build_rdma_nics(root, "OFED-internal-25.10-1.2.2:", None, "6.8.0")
        hl = hosts("glm52_pd")
        for h in hl:
            h["gpu_topology"], h["rdma_nics"] = copy.deepcopy(topo), copy.deepcopy(rdma)
        return hl, rdma
    return make


@pytest.mark.parametrize("with_nics", [True, False])
def test_ib_devices_on_synthesized_b300_facts(synth_b300_hosts, with_nics):
    hl, rdma = synth_b300_hosts(with_nics)
    fm = [d["name"] for d in rdma["devices"] if d.get("role") == "fabric_manager"]
    assert fm == ["mlx5_8"]
    p = plan("glm52_pd", host_list=hl)
    assert p["errors"] == []
    inst = by_name(p)
    for i in p["instances"]:
        assert i["ib_devices"], i["id"]
        assert "mlx5_8" not in i["ib_devices"]
        assert set(i["ib_devices"]) <= set(sp.candidate_nics(rdma))
    numa = {d["name"]: d["numa_node"] for d in rdma["devices"]}
    gpu_numa = {g["index"]: g["numa_node"] for g in hl[0]["gpu_topology"]["gpus"]}
    p0, p1 = inst[("b300a", "P0")], inst[("b300a", "P1")]
    # every chosen NIC sits on the NUMA node of one of the instance's GPUs, and P0/P1 do not share NICs
    for i in (p0, p1):
        assert {numa[n] for n in i["ib_devices"]} <= {gpu_numa[g] for g in i["gpus"]}
    if with_nics:
        assert not set(p0["ib_devices"]) & set(p1["ib_devices"])
        assert len(p0["ib_devices"]) == 4


def test_ib_device_override_and_validation():
    ov = {"b300a": {"P0": {"ib_devices": ["mlx5_0"]}, "P1": {"ib_devices": ["mlx5_9"]}},
          "b300b": {"D0": {"ib_devices": ["mlx5_8"]}}}
    p = plan("glm52_pd", host_list=hosts("glm52_pd", overrides=ov))
    assert by_name(p)[("b300a", "P0")]["ib_devices"] == ["mlx5_0"]
    errs = "\n".join(p["errors"])
    assert "b300a/P1: --disaggregation-ib-device mlx5_9 does not exist on b300a; expected one of mlx5_0" in errs
    assert "b300b/D0: --disaggregation-ib-device mlx5_8 is the fabric-manager NIC (ConnectX-7)" in errs


def test_missing_facts_need_explicit_ib_devices():
    p = plan("glm52_pd", host_list=hosts("glm52_pd", facts=False))
    assert any("b300a/P0: cannot choose --disaggregation-ib-device" in e and "sglang_instance_overrides.P0.ib_devices" in e
               for e in p["errors"])
    # Kimi does not use RDMA: no facts needed
    assert plan("kimi_k3", host_list=hosts("kimi_k3", facts=False))["errors"] == []


# ---------- validation errors ----------

def errors_of(name, **kw):
    return "\n".join(plan(name, **kw)["errors"])


def test_unknown_profile():
    p = sp.build_plan({"name": "nope"}, hosts("kimi_k3"), settings(), catalogs())
    assert p["errors"] and "profile 'nope' is unknown" in p["errors"][0]


def test_version_not_pinned_and_unknown_combination():
    e = errors_of("glm52_pd", sglang_version="0.5")
    assert "sglang version '0.5' is not pinned; expected an exact X.Y.Z such as 0.5.17" in e
    e = errors_of("glm52_pd", sglang_version="0.5.23")
    assert "no option catalog for sglang 0.5.23" in e
    assert "sglang 0.5.23 with sglang-router 0.3.2 is not a known combination; expected one of 0.5.17+0.3.2, 0.5.18+0.3.2" in e
    e = errors_of("kimi_k3", router_version="0.3.9")
    assert "sglang-router 0.3.9 is unknown" in e
    assert "not a known combination" in e
    e = errors_of("kimi_k3", router_version=">=0.3")
    assert "sglang-router version '>=0.3' is not pinned" in e


def test_version_switch_back_changes_executable_and_catalog():
    p = plan("glm52_pd", sglang_version="0.5.18")
    assert p["errors"] == []
    assert p["instances"][0]["argv"][0] == "/opt/sglang/0.5.18/bin/sglang"


def test_port_collisions():
    e = errors_of("glm52_pd", host_list=hosts("glm52_pd", overrides={"b300a": {"P1": {"port": 30001}}}))
    assert "b300a: b300a/P1 port 30001 collides with b300a/P0 port on b300a; expected a port unique per host" in e
    e = errors_of("glm52_pd", host_list=hosts("glm52_pd", overrides={"b300a": {"P1": {"nccl_port": 8998}}}))
    assert "b300a/P1 nccl_port 8998 collides with b300a/P0 bootstrap_port" in e
    # router vs worker: PD router port 30000 == a prefill port moved to 30000
    e = errors_of("glm52_pd", host_list=hosts("glm52_pd", overrides={"b300a": {"P0": {"port": 30000}}}))
    assert "b300a/router port 30000 collides with b300a/P0 port" in e
    # prometheus vs worker
    e = errors_of("kimi_k3", profile_overrides={"router": {"prometheus_port": 30000}})
    assert "b300a/router prometheus_port 30000 collides with b300a/W0 port" in e
    e = errors_of("kimi_k3", profile_overrides={"router": {"port": 70000}})
    assert "b300a/router: port 70000 is not a TCP port; expected an integer 1-65535" in e


def test_gpu_sets_and_sizes():
    e = errors_of("glm52_pd", host_list=hosts("glm52_pd", overrides={"b300a": {"P1": {"gpus": [3, 4, 5, 6]}}}))
    assert "b300a: GPU 3 of b300a/P1 is also used by b300a/P0; expected disjoint GPU sets per host" in e
    e = errors_of("glm52_pd", host_list=hosts("glm52_pd", overrides={"b300b": {"D0": {"gpus": [0, 1]}}}))
    assert "b300b/D0: 2 GPUs [0, 1] but --tp-size 4 x --dp-size 1 needs 4" in e
    hl = hosts("kimi_k3")
    hl[1]["gpu_topology"]["gpu_count"] = 4
    e = errors_of("kimi_k3", host_list=hl)
    assert "b300b/W0: GPU(s) [4, 5, 6, 7] do not exist; the host reports 4 GPUs (indices 0-3)" in e


def test_timeouts():
    e = errors_of("kimi_k3", profile_overrides={"router": {"args": {"--request-timeout-secs": 0}}})
    assert "b300a/router: router --request-timeout-secs 0 must be a positive number of seconds" in e
    e = errors_of("kimi_k3", timeouts={"sglang_health_timeout_s": -5})
    assert "setting sglang_health_timeout_s: timeout -5 must be a positive number of seconds" in e


def test_host_in_no_group_and_router_count():
    hl = hosts("glm52_pd")
    hl.append({"name": "b300c", "address": "10.89.30.13", "groups": ["gpu_nodes"]})
    e = errors_of("glm52_pd", host_list=hl)
    assert "b300c: host is in none of the groups of profile glm52_pd; expected one of sglang_decode, sglang_prefill, sglang_router" in e
    hl = hosts("kimi_k3")
    hl[1]["groups"].append("sglang_router")
    assert "expected exactly one host in group sglang_router for the router, found 2 (b300a, b300b)" in errors_of("kimi_k3", host_list=hl)
    hl = hosts("glm52_pd")
    hl[1]["groups"] = ["gpu_nodes"]
    assert "role decode has no host; expected at least one host in group sglang_decode" in errors_of("glm52_pd", host_list=hl)


def test_unknown_flag_type_and_choice():
    e = errors_of("glm52_pd", profile_overrides={"roles": {"prefill": {"args": {"--tp": 4}}}})
    assert "b300a/P0: flag --tp is not an option of sglang 0.5.17 (argparse would treat it as a prefix of --tp-size" in e
    e = errors_of("glm52_pd", profile_overrides={"roles": {"decode": {"args": {"--mem-fraction-static": "lots"}}}})
    assert "b300b/D0: flag --mem-fraction-static of sglang 0.5.17 expects type float, got 'lots'" in e
    e = errors_of("glm52_pd", profile_overrides={"roles": {"decode": {"args": {"--kv-cache-dtype": "fp7"}}}})
    assert "b300b/D0: flag --kv-cache-dtype of sglang 0.5.17 got 'fp7'; expected one of" in e
    e = errors_of("glm52_pd", profile_overrides={"roles": {"decode": {"args": {"--enable-metrics": "yes"}}}})
    assert "flag --enable-metrics of sglang 0.5.17 takes no value" in e
    e = errors_of("glm52_pd", profile_overrides={"router": {"args": {"--tool-call-parser": "glm47"}}})
    assert "b300a/router: flag --tool-call-parser of sglang-router 0.3.2 got 'glm47'; expected one of" in e
    e = errors_of("kimi_k3", profile_overrides={"router": {"args": {"--no-such-thing": 1}}})
    assert "b300a/router: flag --no-such-thing is not an option of sglang-router 0.3.2" in e


def test_router_flags_get_the_same_checks_as_the_server_flags():
    """One flag check (sglang_plan.check_args) for both programs: the rules the router's own copy lacked before it
    was merged (argparse prefixes named, a list for a one-value flag, a bare flag that needs a value)."""
    e = errors_of("kimi_k3", profile_overrides={"router": {"args": {"--retry-max": 3}}})
    assert ("b300a/router: flag --retry-max is not an option of sglang-router 0.3.2 (argparse would treat it as a "
            "prefix of --retry-max-backoff-ms, --retry-max-retries") in e
    e = errors_of("kimi_k3", profile_overrides={"router": {"args": {"--policy": ["round_robin", "random"]}}})
    assert "b300a/router: flag --policy of sglang-router 0.3.2 takes one value, got a list ['round_robin', 'random']" in e
    e = errors_of("kimi_k3", profile_overrides={"router": {"args": {"--policy": True}}})
    assert "b300a/router: flag --policy of sglang-router 0.3.2 needs a value" in e
    e = errors_of("kimi_k3", profile_overrides={"router": {"args": {"--disable-retries": "yes"}}})
    assert "b300a/router: flag --disable-retries of sglang-router 0.3.2 takes no value; expected true" in e
    assert sp.check_args({"--tp": 4}, {"--tp-size": {"nargs": None}}, "sglang 0.5.17", "x") == [
        "x: flag --tp is not an option of sglang 0.5.17 (argparse would treat it as a prefix of --tp-size; write the long name)"]
    assert not hasattr(sp, "check_server_args") and not hasattr(sp, "check_router_args")


def test_flag_known_in_one_version_only():
    cat = catalogs()["server"]
    only18 = sorted(set(cat["0.5.18"]) - set(cat["0.5.17"]))
    assert only18, "catalogs should differ"
    flag = only18[0]
    spec = cat["0.5.18"][flag]
    value = True if str(spec["nargs"]) == "0" else (spec["choices"][0] if spec["choices"] else "1")
    ov = {"roles": {"prefill": {"args": {flag: value}}}}
    assert "flag %s is not an option of sglang 0.5.17" % flag in errors_of("glm52_pd", profile_overrides=ov)
    assert errors_of("glm52_pd", profile_overrides=ov, sglang_version="0.5.18") == ""


def test_overrides_change_and_remove_flags_and_env():
    ov = {"roles": {"decode": {"env": {"NCCL_NVLS_ENABLE": "0"}, "args": {"--enable-cache-report": False,
                                                                            "--mem-fraction-static": "0.88"}}}}
    p = plan("glm52_pd", profile_overrides=ov, extra_args={"--log-level": "info"})
    d0 = by_name(p)[("b300b", "D0")]
    assert d0["env"]["NCCL_NVLS_ENABLE"] == "0"
    assert "--enable-cache-report" not in d0["argv"]
    assert flag_value(d0["argv"], "--mem-fraction-static") == "0.88"
    assert flag_value(d0["argv"], "--log-level") == "info"
    assert p["errors"] == []


def test_api_key_is_a_systemd_variable_not_a_value():
    p = plan("kimi_k3", api_key_enabled=True)
    w = p["instances"][0]
    assert w["argv"][-2:] == ["--api-key", "${SGLANG_API_KEY}"]
    assert p["router"]["argv"][-2:] == ["--api-key", "${SGLANG_API_KEY}"]
    line = sp.exec_start_line(w["argv"])
    assert '"--api-key" "${SGLANG_API_KEY}"' in line


def test_exec_start_quoting_round_trips():
    argv = ["/opt/x/bin/sglang", "serve", "--chat-template", 'a "b" $HOME 100%', "--x", "back\\slash"]
    line = sp.exec_start_line(argv)
    assert "$$HOME" in line and "100%%" in line
    # systemd unescapes $$ -> $ and %% -> %; after that the line is shell-like double quoting
    unescaped = line.replace("$$", "$").replace("%%", "%")
    assert shlex.split(unescaped) == argv


def test_model_root_required():
    assert "sglang_model_root is empty" in errors_of("kimi_k3", model_root="")


# ---------- SGLANG_HOST_IP: the PD bootstrap and Mooncake handshake bind to the advertise address ----------

def test_every_instance_sets_sglang_host_ip_to_its_hosts_advertise_address():
    p = plan("glm52_pd")
    assert p["errors"] == []
    by = by_name(p)
    assert by[("b300a", "P0")]["env"]["SGLANG_HOST_IP"] == "10.89.30.11"
    assert by[("b300b", "D0")]["env"]["SGLANG_HOST_IP"] == "10.89.30.12"
    for inst in p["instances"]:
        # the same address the router's worker URLs use, and never part of the argv
        assert inst["url"].startswith("http://%s:" % inst["env"]["SGLANG_HOST_IP"])
        assert not any("SGLANG_HOST_IP" in a for a in inst["argv"])
    assert p["warnings"] == []


def test_sglang_host_ip_from_an_override_wins_and_a_name_address_warns():
    hl = hosts("glm52_pd", overrides={"b300a": {"P0": {"env": {"SGLANG_HOST_IP": "192.0.2.7"}}}})
    hl[1]["address"] = "b300b.example"
    p = plan("glm52_pd", host_list=hl)
    by = by_name(p)
    assert by[("b300a", "P0")]["env"]["SGLANG_HOST_IP"] == "192.0.2.7"
    assert by[("b300a", "P1")]["env"]["SGLANG_HOST_IP"] == "10.89.30.11"
    assert "SGLANG_HOST_IP" not in by[("b300b", "D0")]["env"]
    assert any("b300b/D0" in w and "b300b.example" in w and "sglang_advertise_address" in w for w in p["warnings"])


def test_bootstrap_port_is_base_plus_instance_number_unless_overridden():
    role = {"bootstrap_port_base": 8998}
    assert sp.instance_port(role, {}, 0, "bootstrap_port") == 8998
    assert sp.instance_port(role, {}, 1, "bootstrap_port") == 8999
    assert sp.instance_port(role, {"bootstrap_port": 9100}, 1, "bootstrap_port") == 9100
    assert sp.instance_port({}, {}, 1, "nccl_port") is None


@pytest.mark.parametrize("name", ["kimi_k3", "glm52_pd"])
def test_router_startup_timeout_must_cover_the_worker_load_budget(name):
    """After a reboot the router registers a worker only within --worker-startup-timeout-secs (0.3.2 default 1800)."""
    assert "startup" not in errors_of(name, timeouts={"sglang_health_timeout_s": 3600})
    e = errors_of(name, timeouts={"sglang_health_timeout_s": 7201})
    assert ("b300a/router: router --worker-startup-timeout-secs 7200 is below sglang_health_timeout_s 7201 (the time a "
            "worker may take to load); expected >= 7201") in e, e
    # the flag dropped: the router's default 1800 counts
    e = errors_of(name, timeouts={"sglang_health_timeout_s": 3600},
                  router_extra_args={"--worker-startup-timeout-secs": False})
    assert "router --worker-startup-timeout-secs 1800 is below sglang_health_timeout_s 3600" in e, e


# --- the router's front (issue 32) ------------------------------------------------------------------------------------
def test_versions_are_chosen_in_the_planner_only():
    """sglang_version (the run's) wins, then the inventory's pin for the profile, then the profile's pin."""
    prof = load_profile("kimi_k3")
    assert sp.resolve_versions(prof, {}) == ("0.5.18", "0.3.2")
    assert sp.resolve_versions(prof, {"sglang_versions": {"kimi_k3": "0.5.17", "glm52_pd": "9.9.9"}})[0] == "0.5.17"
    assert sp.resolve_versions(prof, {"sglang_version": "0.5.16", "sglang_versions": {"kimi_k3": "0.5.17"}})[0] == "0.5.16"
    assert sp.resolve_versions(prof, {"router_version": "0.3.1"})[1] == "0.3.1"
    assert plan("kimi_k3", sglang_versions={"kimi_k3": "0.5.17"})["instances"][0]["version"] == "0.5.17"


def test_without_the_front_the_router_binds_the_public_port():
    r = plan("kimi_k3")["router"]
    assert r["front"] is None and (r["listen_host"], r["listen_port"]) == ("0.0.0.0", 30080)
    assert r["local_url"] == "http://127.0.0.1:30080"
    assert (flag_value(r["argv"], "--host"), flag_value(r["argv"], "--port")) == ("0.0.0.0", "30080")


def test_behind_the_front_the_router_listens_on_loopback_and_the_front_owns_the_port():
    p = plan("kimi_k3", router_front={"enabled": True, "retries": 7}, router_flag_set="resilient")
    assert p["errors"] == []
    r = p["router"]
    assert (flag_value(r["argv"], "--host"), flag_value(r["argv"], "--port")) == ("127.0.0.1", "40080")
    assert r["url"] == "http://10.89.30.11:30080" and r["local_url"] == "http://127.0.0.1:40080"
    f = r["front"]
    assert (f["bind_host"], f["port"], f["backend"], f["retries"]) == ("0.0.0.0", 30080, "127.0.0.1:40080", 7)
    assert f["unit_name"] == "sglang-router-front.service" and f["config"] == "/etc/haproxy/sglang-router-front.cfg"
    # longer than the router keeps a request: resilient set = 5 attempts of --request-timeout-secs 2400 after a
    # --queue-timeout-secs 2400 wait, + 60 s
    assert f["timeout_s"] == 2400 + 5 * 2400 + 60
    # the seed's set retries nothing (--disable-retries): one attempt
    assert plan("kimi_k3", router_front={"enabled": True})["router"]["front"]["timeout_s"] == 2400 + 2400 + 60
    glm = plan("glm52_pd", router_front={"enabled": True})["router"]
    assert glm["front"]["backend"] == "127.0.0.1:40000" and glm["front"]["retries"] == 10
    # the seed set (--disable-retries, no request timeout flag on glm52_pd: router defaults 1800 s / 60 s queue)
    seed = plan("glm52_pd", router_front={"enabled": True}, router_flag_set="seed")["router"]["front"]
    assert seed["timeout_s"] == 60 + 1800 + 60


def test_the_front_backend_port_is_checked_like_every_port():
    e = errors_of("kimi_k3", router_front={"enabled": True}, profile_overrides={"router": {"backend_port": 30081}})
    assert "b300a/router backend_port 30081 collides with b300a/router prometheus_port on b300a" in e
    e = errors_of("kimi_k3", router_front={"enabled": True}, profile_overrides={"router": {"backend_port": None}})
    assert "backend_port (the router's own port behind its front)" in e, e


def test_front_timeout_follows_the_router_flags():
    assert sp.front_timeout_s({}) == 60 + 1800 * 5 + 60
    assert sp.front_timeout_s({"--disable-retries": True, "--request-timeout-secs": 100}) == 60 + 100 + 60
    assert sp.front_timeout_s({"--retry-max-retries": 2, "--queue-timeout-secs": 10, "--request-timeout-secs": 5}) == 80
