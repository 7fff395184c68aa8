"""Unit tests for module_utils/hw/fw_matrix.py (firmware matrix, verdicts, fleet audit).

The rdma_nics dicts below are SYNTHESIZED (shaped like docs/CONTRACTS.md); no real ConnectX-8 capture exists.
"""
import copy
import json
import pathlib

import pytest
import yaml

from ansible_collections.b300.rollout.plugins.module_utils.hw import fw_matrix as fm

ROOT = pathlib.Path(__file__).resolve().parents[2]
MATRIX_FILE = ROOT / "roles" / "nic_firmware_gate" / "vars" / "nic_fw_matrix.yml"


@pytest.fixture(scope="module")
def rows():
    return fm.load_matrix_doc(yaml.safe_load(MATRIX_FILE.read_text()))


def nic(name, model="ConnectX-8", fw="40.47.1026", pci=None, role="data", pending=None, psid="MT_0000001217"):
    idx = int(name.split("_")[1])
    return {"name": name, "pci_address": pci or "0000:%02x:00.0" % (0x1a + idx), "model": model, "fw_ver": fw,
            "psid": psid, "role": role, "fw_pending": pending, "fw_available": None, "usable": role == "data"}


def facts(devices, flavour="doca_ofed", version="25.10-1.2.2"):
    return {"driver": {"flavour": flavour, "version": version, "version_scheme": None, "ofed_info": None},
            "devices": devices, "usable_devices": sorted(d["name"] for d in devices if d["role"] == "data")}


def b300_host(**overrides):
    """8 data CX8 + the fabric-manager CX7, DOCA-OFED 25.10-1.2.2 (SYNTHESIZED)."""
    devs = [nic("mlx5_%d" % i) for i in range(8)]
    devs.append(nic("mlx5_8", model="ConnectX-7", fw="28.39.3560", role="fabric_manager", psid="MT_0000000838"))
    for name, change in overrides.items():
        for d in devs:
            if d["name"] == name:
                d.update(change)
    return devs


def verdict_of(result, name):
    return next(v for v in result["verdicts"] if v["device"] == name)


# ------------------------------------------------------------------ versions
@pytest.mark.parametrize("raw,scheme,yymm,build", [
    ("25.10-1.2.2", "legacy", (25, 10), (1, 2, 2)),
    ("24.10-3.2.5.0", "legacy", (24, 10), (3, 2, 5)),
    ("MLNX_OFED_LINUX-24.10-3.2.5.0:", "legacy", (24, 10), (3, 2, 5)),
    ("OFED-internal-25.10-1.7.1:", "legacy", (25, 10), (1, 7, 1)),
    ("2607.0.100", "yymm", (26, 7), (0, 100)),
])
def test_driver_version_both_schemes(raw, scheme, yymm, build):
    d = fm.parse_driver_version(raw)
    assert (d["scheme"], d["yymm"], d["build"]) == (scheme, yymm, build)


def test_driver_version_kernel_and_garbage():
    assert fm.parse_driver_version("6.11.0-1014-nvidia", "inbox")["scheme"] == "kernel"
    assert fm.parse_driver_version("not-a-version") is None
    assert fm.parse_driver_version("2613.0.1") is None  # month 13


def test_fw_parse_orders_numerically():
    assert fm.parse_fw("40.47.1026 (MT_0000001217)") == (40, 47, 1026)
    assert fm.parse_fw("40.47.0422") < fm.parse_fw("40.47.1026") < fm.parse_fw("40.50.0394")
    assert fm.parse_fw("N/A") is None


# ------------------------------------------------------------------ matrix file
def test_matrix_file_has_every_reference_release(rows):
    ids = {r["id"] for r in rows}
    for rid in ("doca-2.9.0-ofed-24.10-0.7.0", "doca-2.9.3-ofed-24.10-3.2.5", "doca-2.10.0-ofed-25.01-0.6.0",
                "doca-ofed-25.04-0.6.1", "doca-3.0.0", "doca-3.1.0-ofed-25.07-0.9.7", "doca-ofed-25.10-1.0.8",
                "doca-3.2-ofed-25.10-1.2.2", "doca-3.3-ofed-26.01-1.0.0", "doca-ofed-26.04-0.8.6",
                "doca-host-3.4.1-ofed-26.04-1.0.9", "doca-3.5-ofed-26.07", "mlnx-ofed-any"):
        assert rid in ids
    assert all(r["source"].strip() for r in rows)


# ------------------------------------------------------------------ verdicts
def test_ok_exact_and_fabric_manager_ignored(rows):
    res = fm.check_host(facts(b300_host()), rows)
    assert res["status"] == "ok"
    v = verdict_of(res, "mlx5_0")
    assert (v["verdict"], v["row"], v["rule"], v["expected"]) == ("ok", "doca-3.2-ofed-25.10-1.2.2", "exact", "40.47.1026")
    fmv = verdict_of(res, "mlx5_8")
    assert fmv["verdict"] == "ignored" and "fabric" in fmv["reason"] and fmv["severity"] == "ok"
    assert res["counts"] == {"ok": 8, "ignored": 1}


def test_mismatch_names_device_pci_fw_driver_expected(rows):
    res = fm.check_host(facts(b300_host(mlx5_3={"fw_ver": "40.44.1036"})), rows)
    assert res["status"] == "fail" and res["failing"] == ["mlx5_3"]
    v = verdict_of(res, "mlx5_3")
    assert (v["verdict"], v["rule"], v["expected"]) == ("mismatch", "exact", "40.47.1026")
    msg = fm.host_messages("b300b", res)
    assert len(msg) == 1
    for part in ("b300b", "mlx5_3", "0000:1d:00.0", "ConnectX-8", "40.44.1036", "doca_ofed 25.10-1.2.2", "40.47.1026",
                 "mlxfwmanager -d 0000:1d:00.0", "mlxfwreset -d 0000:1d:00.0 reset", "doca-3.2-ofed-25.10-1.2.2"):
        assert part in msg[0]


def test_newer_than_bundled_is_mismatch_under_exact(rows):
    v = fm.check_device(nic("mlx5_0", fw="40.48.1000"), {"flavour": "doca_ofed", "version": "25.10-1.2.2"}, rows)
    assert v["verdict"] == "mismatch"


def test_new_scheme_maps_yymm_to_minimum_row(rows):
    drv = {"flavour": "doca_ofed", "version": "2607.0.100"}
    ok = fm.check_device(nic("mlx5_0", fw="40.51.0010"), drv, rows)
    assert (ok["verdict"], ok["row"], ok["rule"], ok["expected"]) == ("ok", "doca-3.5-ofed-26.07", "minimum", ">= 40.50.0394")
    old = fm.check_device(nic("mlx5_0", fw="40.49.1014"), drv, rows)
    assert (old["verdict"], old["rule"]) == ("mismatch", "minimum")
    # the legacy spelling of the same year.month lands on the same row
    assert fm.check_device(nic("mlx5_0", fw="40.50.0394"), {"flavour": "doca_ofed", "version": "26.07-0.3.5.0"},
                           rows)["row"] == "doca-3.5-ofed-26.07"


def test_allowed_rule_from_operator_row_wins(rows):
    extra = [{"id": "site-25.10-1.2.2", "source": "site qualification OPS-1",
              "driver": {"flavours": ["doca_ofed"], "versions": ["25.10-1.2.2"]},
              "models": {"ConnectX-8": {"exact": "40.47.1026", "allowed": ["40.47.2682"]}}}]
    merged = fm.merge_rows(rows, extra)
    v = fm.check_device(nic("mlx5_0", fw="40.47.2682"), {"flavour": "doca_ofed", "version": "25.10-1.2.2"}, merged)
    assert (v["verdict"], v["row"], v["rule"]) == ("ok", "site-25.10-1.2.2", "allowed")
    # without the operator row the same firmware is a mismatch
    assert fm.check_device(nic("mlx5_0", fw="40.47.2682"), {"flavour": "doca_ofed", "version": "25.10-1.2.2"},
                           rows)["verdict"] == "mismatch"


def test_operator_row_with_builtin_id_replaces_it(rows):
    extra = [{"id": "doca-3.0.0", "source": "we looked it up: DOCA 3.0.0 ships 25.04-0.6.0",
              "driver": {"flavours": ["doca_ofed"], "versions": ["25.04-0.6.0"]},
              "models": {"ConnectX-8": {"exact": "40.45.1020"}}}]
    merged = fm.merge_rows(rows, extra)
    assert [r["id"] for r in merged].count("doca-3.0.0") == 1
    v = fm.check_device(nic("mlx5_0", fw="40.45.1020"), {"flavour": "doca_ofed", "version": "25.04-0.6.0"}, merged)
    assert (v["verdict"], v["row"]) == ("ok", "doca-3.0.0")


def test_minimum_with_exact_accepts_newer(rows):
    rule = {"exact": "40.47.1026", "minimum": "40.47.1026"}
    assert fm.judge_fw(rule, "40.47.1026") == ("ok", "exact")
    assert fm.judge_fw(rule, "40.48.1000") == ("ok", "minimum")
    assert fm.judge_fw(rule, "40.46.1006") == ("mismatch", "minimum")


@pytest.mark.parametrize("flavour,version,row", [
    ("mlnx_ofed", "24.10-3.2.5.0", "doca-2.9.3-ofed-24.10-3.2.5"),
    ("doca_ofed", "24.10-0.7.0", "doca-2.9.0-ofed-24.10-0.7.0"),
    ("mlnx_ofed", "23.10-1.1.9.0", "mlnx-ofed-any"),
    ("doca_ofed", "24.04-0.6.6", "doca-ofed-before-25.01"),
])
def test_cx8_unsupported_under_mlnx_ofed_and_doca_2_9(rows, flavour, version, row):
    res = fm.check_host(facts(b300_host(), flavour=flavour, version=version), rows)
    v = verdict_of(res, "mlx5_0")
    assert (v["verdict"], v["row"], v["rule"]) == ("unsupported", row, "unsupported")
    assert "DOCA-OFED >= 25.01" in v["remediation"]
    assert res["status"] == "fail"


def test_cx7_still_judged_under_doca_2_9(rows):
    v = fm.check_device(nic("mlx5_0", model="ConnectX-7", fw="28.43.3608"),
                        {"flavour": "mlnx_ofed", "version": "24.10-3.2.5.0"}, rows)
    assert (v["verdict"], v["rule"]) == ("ok", "exact")


def test_unknown_driver_policy_fail_and_warn(rows):
    f = facts(b300_host(), version="25.10-1.7.1")          # not in the matrix
    res = fm.check_host(f, rows)
    v = verdict_of(res, "mlx5_0")
    assert (v["verdict"], v["row"], v["rule"], v["severity"]) == ("unknown", None, "no_row", "fail")
    assert res["status"] == "fail"
    warn = fm.check_host(f, rows, {"unknown": "warn"})
    assert warn["status"] == "warn" and verdict_of(warn, "mlx5_0")["severity"] == "warn"
    assert "nic_firmware_gate_extra_rows" in verdict_of(warn, "mlx5_0")["remediation"]


def test_inbox_driver_unknown_and_model_not_in_row(rows):
    v = fm.check_device(nic("mlx5_0"), {"flavour": "inbox", "version": "6.11.0-1014-nvidia"}, rows)
    assert v["verdict"] == "unknown" and v["rule"] == "no_row"
    cx7 = fm.check_device(nic("mlx5_0", model="ConnectX-7", fw="28.49.1118"),
                          {"flavour": "doca_ofed", "version": "26.04-1.0.9"}, rows)
    assert (cx7["verdict"], cx7["row"], cx7["rule"]) == ("unknown", "doca-host-3.4.1-ofed-26.04-1.0.9", "model_not_in_row")


def test_pending_reset_and_policy(rows):
    f = facts(b300_host(mlx5_3={"fw_ver": "40.44.1036", "fw_pending": "40.47.1026"}))
    res = fm.check_host(f, rows)
    v = verdict_of(res, "mlx5_3")
    assert v["verdict"] == "pending_reset" and v["row"] == "doca-3.2-ofed-25.10-1.2.2"
    assert v["pending_image_verdict"] == "ok" and v["expected"] == "40.47.1026"
    assert "mlxfwreset -d 0000:1d:00.0 reset" in v["remediation"]
    assert res["status"] == "fail"
    assert fm.check_host(f, rows, {"pending_reset": "warn"})["status"] == "warn"


def test_fabric_manager_ignored_even_under_mlnx_ofed(rows):
    res = fm.check_host(facts([nic("mlx5_8", model="ConnectX-7", fw="1.0.0", role="fabric_manager")],
                              flavour="mlnx_ofed", version="5.8-1.0.1.1"), rows)
    assert res["status"] == "ok" and res["verdicts"][0]["verdict"] == "ignored"


def test_no_devices_fails(rows):
    res = fm.check_host(facts([]), rows)
    assert res["status"] == "fail" and "no RDMA devices" in fm.host_messages("h", res)[0]


def test_bad_policy_refused():
    with pytest.raises(ValueError, match="unknown"):
        fm.normalise_policy({"unknown": "ignore"})
    with pytest.raises(ValueError, match="unknown policy key"):
        fm.normalise_policy({"mismatch": "warn"})


# ------------------------------------------------------------------ malformed rows
GOOD = {"id": "r1", "source": "s", "driver": {"flavours": ["doca_ofed"], "versions": ["25.10-1.2.2"]},
        "models": {"ConnectX-8": {"exact": "40.47.1026"}}}


@pytest.mark.parametrize("mutate,needle", [
    (lambda r: r.pop("source"), "source"),
    (lambda r: r.update(id=""), "'id'"),
    (lambda r: r.update(colour="red"), "unknown keys"),
    (lambda r: r["driver"].update(flavours=["ofed"]), "flavours"),
    (lambda r: r["driver"].update(versions=["25.10"]), "driver version '25.10'"),
    (lambda r: r["driver"].update(versions=[]), "driver needs"),
    (lambda r: r["driver"].update(yymm=["26.13"]), "yymm"),
    (lambda r: r.update(models={}), "models"),
    (lambda r: r.update(models={"ConnectX-10": {"exact": "1.2.3"}}), "unknown NIC model"),
    (lambda r: r["models"]["ConnectX-8"].update(exact="40.47"), "exact '40.47'"),
    (lambda r: r["models"]["ConnectX-8"].update(allowed="40.47.1088"), "allowed"),
    (lambda r: r["models"]["ConnectX-8"].update(unsupported="no"), "cannot be combined"),
    (lambda r: r["models"].update({"ConnectX-7": {"note": "x"}}), "needs at least one"),
    (lambda r: r["models"]["ConnectX-8"].update(minimun="40.1.1"), "unknown rule keys"),
])
def test_malformed_rows_refused_naming_the_row(mutate, needle):
    bad = copy.deepcopy(GOOD)
    bad["id"] = "bad-row"
    mutate(bad)
    with pytest.raises(fm.MatrixError) as e:
        fm.validate_rows([copy.deepcopy(GOOD), bad])
    assert "row 1" in str(e.value) and needle in str(e.value)


def test_duplicate_ids_and_bad_extra_rows_refused(rows):
    with pytest.raises(fm.MatrixError, match="duplicate id 'r1'"):
        fm.validate_rows([GOOD, GOOD])
    with pytest.raises(fm.MatrixError, match="nic_firmware_gate_extra_rows matrix row 0"):
        fm.merge_rows(rows, [{"id": "x"}])
    with pytest.raises(fm.MatrixError, match="list of rows"):
        fm.validate_rows({"id": "x"})


# ------------------------------------------------------------------ fleet audit and report
def _gpu(driver="580.159.04", vbios="97.10.4A.00.01", down=0):
    gpus = []
    for i in range(8):
        gpus.append({"index": i, "name": "NVIDIA B300 SXM6 AC", "vbios_version": vbios,
                     "nvlink": {"links_total": 18, "links_up": 18 - (down if i == 2 else 0),
                                "links_down": down if i == 2 else 0, "down_links": list(range(down)) if i == 2 else []}})
    return {"driver_version": driver, "gpu_count": 8, "gpus": gpus, "problems": []}


def render_report(template, report, **extra):
    """Render playbooks/templates/<template> as the firmware audit does (Ansible's template defaults: trim_blocks)."""
    import jinja2
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(ROOT / "playbooks" / "templates")), trim_blocks=True,
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    return env.get_template(template).render(audit_report=json.loads(json.dumps(report)), **extra)


def test_fleet_audit_report_and_exit_codes(rows, tmp_path):
    hosts = {
        "b300a": {"status": "ok", "rdma_nics": facts(b300_host()), "gpu_topology": _gpu()},
        "b300b": {"status": "ok", "rdma_nics": facts(b300_host(mlx5_3={"fw_ver": "40.44.1036"})), "gpu_topology": _gpu()},
    }
    rep = fm.audit_fleet(hosts, rows)
    bad = [r for r in rep["nic_rows"] if r["verdict"] != "ok" and r["verdict"] != "ignored"]
    assert [(r["host"], r["device"], r["verdict"]) for r in bad] == [("b300b", "mlx5_3", "mismatch")]
    assert rep["summary"]["exit_code"] == 2 and rep["gpu"]["problems"] == []
    md = render_report("firmware_audit.md.j2", rep)
    assert "| host | device | model | PCI | fw | driver | verdict | rule | expected |" in md
    assert "| b300b | mlx5_3 | ConnectX-8 | 0000:1d:00.0 | 40.44.1036 | doca_ofed 25.10-1.2.2 | mismatch |" in md
    prom = render_report("firmware_audit.prom.j2", rep, audit_prom_host="b300b")
    assert 'b300_nic_firmware_ok{host="b300b"} 0' in prom
    assert 'device="mlx5_3",model="ConnectX-8",pci="0000:1d:00.0",fw="40.44.1036",driver="doca_ofed 25.10-1.2.2",' \
           'verdict="mismatch"} 1' in prom
    assert 'b300_nic_firmware_ok{host="b300a"} 1' in render_report("firmware_audit.prom.j2", rep, audit_prom_host="b300a")

    healthy = fm.audit_fleet({"b300a": hosts["b300a"]}, rows)
    assert healthy["summary"]["exit_code"] == 0

    # unreachable (as registered by the audit's facts task) wins over findings: exit 3
    hosts["b300c"] = {"unreachable": True, "msg": "ssh: connect to host 10.89.30.99 port 22: No route to host"}
    rep3 = fm.audit_fleet(hosts, rows)
    assert rep3["hosts"]["b300c"]["status"] == "unreachable" and rep3["summary"]["exit_code"] == 3
    assert "| b300c | - | - | - | - | - | unreachable |" in render_report("firmware_audit.md.j2", rep3)


def test_registered_results_are_understood(rows):
    ok = {"changed": False, "ansible_facts": {"rdma_nics": facts(b300_host()), "gpu_topology": _gpu()},
          "gather_errors": {}}
    failed = {"failed": True, "msg": "MODULE FAILURE: /usr/bin/python3: not found"}
    no_gpu = {"gathered": {"rdma_nics": facts(b300_host()), "gpu_topology": None},
              "gather_errors": {"gpu_topology": "nvidia-smi not found on host b300c"}}
    rep = fm.audit_fleet({"a": ok, "b": failed, "c": no_gpu}, rows)
    assert rep["hosts"]["a"]["status"] == "ok"
    assert rep["hosts"]["b"]["status"] == "failed" and "python3" in rep["hosts"]["b"]["msg"]
    assert any("c: no gpu_topology facts" in p and "nvidia-smi not found" in p for p in rep["gpu"]["problems"])
    assert rep["summary"]["exit_code"] == 3


def test_gpu_driver_vbios_and_nvlink_consistency():
    g = fm.gpu_fleet({"a": _gpu(), "b": _gpu(driver="580.95.05"), "c": _gpu(vbios="97.10.4A.00.02", down=2)})
    joined = "\n".join(g["problems"])
    assert "GPU driver differs across hosts" in joined and "580.95.05 on b" in joined
    assert "VBIOS differs for NVIDIA B300 SXM6 AC" in joined and "97.10.4A.00.02 on c:0" in joined
    assert "c: GPU 2: 2 NVLink links down [0, 1]" in joined
    assert g["hosts"]["c"]["nvlink_links_down"] == 2
    assert fm.gpu_fleet({"a": _gpu(), "b": _gpu()})["problems"] == []


# ------------------------------------------------------------------ end to end on the SYNTHESIZED hwemu fixtures
SCENARIOS = ("healthy", "cx8_fw_mismatch", "pending_fw_reset")


@pytest.fixture(scope="module")
def hwemu_fixtures(tmp_path_factory):
    """tests/fixtures/synth/<scenario>/ when rendered and committed, else a fresh render (both SYNTHESIZED)."""
    committed = ROOT / "tests" / "fixtures" / "synth"
    if all((committed / s / "sys").is_dir() for s in SCENARIOS):
        return committed
    renderer = ROOT / "sandbox" / "hwemu" / "render_fixtures.py"
    if not renderer.exists():
        pytest.skip("hwemu renderer not present")
    import subprocess
    import sys
    out = tmp_path_factory.mktemp("synth")
    subprocess.run([sys.executable, str(renderer), "--out", str(out)] + list(SCENARIOS), check=True,
                   stdout=subprocess.DEVNULL)
    return out


def _facts_from_fixture(base):
    from ansible_collections.b300.rollout.plugins.module_utils.hw.rdma_nic import build_rdma_nics
    return build_rdma_nics(sysfs_root=str(base / "sys"), ofed_info_text=(base / "ofed_info.txt").read_text(),
                           mlxfwmanager_text=(base / "mlxfwmanager.txt").read_text(), kernel_release="6.8.0-1017-nvidia")


@pytest.mark.parametrize("scenario,expected", [
    ("healthy", {}),
    ("cx8_fw_mismatch", {"mlx5_3": ("mismatch", "exact", "40.44.1036")}),
    ("pending_fw_reset", {"mlx5_3": ("pending_reset", None, "40.44.1036")}),
])
def test_hwemu_scenarios_through_rdma_nic_facts(rows, hwemu_fixtures, scenario, expected):
    res = fm.check_host(_facts_from_fixture(hwemu_fixtures / scenario), rows)
    by = {v["device"]: v for v in res["verdicts"]}
    assert by["mlx5_8"]["verdict"] == "ignored"          # the fabric-manager ConnectX-7
    bad = {n: v for n, v in by.items() if v["verdict"] not in ("ok", "ignored")}
    assert sorted(bad) == sorted(expected)
    for name, (verdict, rule, fw) in expected.items():
        v = bad[name]
        assert v["verdict"] == verdict and v["fw"] == fw and v["expected"] == "40.47.1026"
        assert v["row"] == "doca-3.2-ofed-25.10-1.2.2" and v["driver_version"] == "25.10-1.2.2"
        if rule:
            assert v["rule"] == rule
    assert res["status"] == ("ok" if not expected else "fail")


def test_role_defaults_and_argument_specs_in_sync():
    role = ROOT / "roles" / "nic_firmware_gate"
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text())
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    assert set(defaults) <= set(specs)
    for name, value in defaults.items():
        assert specs[name].get("default") == value, name
    assert set(specs) == set(defaults)
    # policy choices in the spec are exactly what the matrix logic accepts
    for name in ("nic_firmware_gate_unknown_policy", "nic_firmware_gate_pending_reset_policy"):
        assert sorted(specs[name]["choices"]) == sorted(fm.POLICY_CHOICES)


def test_fleet_audit_reads_the_host_stack_proof(rows):
    """Issue 36: the audit reads the host stack's proof (roles/host_stack, read-only): a failing check is a finding of
    the host (exit 2), in the Findings section and in its own textfile gauge; the NIC verdicts stay the NICs'."""
    fail = ("b300b: host_stack check modules_loaded failed: found not loaded: ib_umad; expected loaded: mlx5_ib, "
            "ib_umad; fix: modprobe ib_umad")
    hosts = {
        "b300a": {"status": "ok", "rdma_nics": facts(b300_host()), "gpu_topology": _gpu(),
                  "host_stack": {"summary": ["modules_loaded | pass | loaded"], "failures": []}},
        "b300b": {"unreachable": False, "ansible_facts": {"rdma_nics": facts(b300_host()), "gpu_topology": _gpu()},
                  "host_stack": {"summary": ["modules_loaded | fail | not loaded: ib_umad"], "failures": [fail]}},
    }
    rep = fm.audit_fleet(hosts, rows)
    assert rep["summary"]["failing"] == ["b300b"] and rep["summary"]["exit_code"] == 2
    assert rep["hosts"]["b300b"]["messages"] == [fail] and rep["hosts"]["b300b"]["status"] == "ok"
    assert "- " + fail in render_report("firmware_audit.md.j2", rep)
    prom_b = render_report("firmware_audit.prom.j2", rep, audit_prom_host="b300b")
    assert 'b300_host_stack_ok{host="b300b"} 0' in prom_b and 'b300_nic_firmware_ok{host="b300b"} 1' in prom_b
    assert 'b300_host_stack_ok{host="b300a"} 1' in render_report("firmware_audit.prom.j2", rep, audit_prom_host="b300a")
    # a host the audit did not read the stack of (host_stack_enabled false) has no stack gauge and no finding
    del hosts["b300b"]["host_stack"]
    rep = fm.audit_fleet(hosts, rows)
    assert rep["summary"]["exit_code"] == 0
    assert "b300_host_stack_ok" not in render_report("firmware_audit.prom.j2", rep, audit_prom_host="b300b")
