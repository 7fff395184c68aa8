"""module_utils/hoststack/host_stack.py (issue 36): parsers on REAL texts (tests/fixtures/real-world/host_stack/SOURCES.md),
the plan and the proof on a SYNTHESIZED B300 host state, and every trap of the issue.

The healthy state below is SYNTHESIZED: its lines copy the real formats of the fixtures (the open-flavour version line
of nixGL #186, the Fabric block of dra-driver-nvidia-gpu #626, the journal lines of nvtrust #128 and the B300 field
report's success lines quoted in ../shared/reference/host-stack-facts.md); Debian revisions (``-0ubuntu0.24.04.1``)
are made up, the upstream versions are the stack's.
"""
import copy
import pathlib

import pytest
import yaml

from ansible_collections.b300.rollout.plugins.module_utils.hoststack import host_stack as hs

ROOT = pathlib.Path(__file__).resolve().parents[2]
REAL = ROOT / "tests" / "fixtures" / "real-world" / "host_stack"
STACKS = yaml.safe_load((ROOT / "roles" / "host_stack" / "vars" / "stacks.yml").read_text())["host_stack_stacks"]
STACK = STACKS["b300-noble-580.173"]
K = "6.8.0-60-generic"
REV = "-0ubuntu0.24.04.1"


def real(name):
    return (REAL / name).read_text()


# ----------------------------------------------------------------------------------------------- parsers, real text
@pytest.mark.parametrize("name,flavour,version", [
    ("proc_version_open_565_ubuntu2404.txt", "open", "565.57.01"),
    ("proc_version_open_525_arch.txt", "open", "525.60.11"),
    ("proc_version_proprietary_elided.txt", "proprietary", None),
])
def test_proc_version_real(name, flavour, version):
    p = hs.parse_proc_version(real(name))
    assert (p["flavour"], p["version"]) == (flavour, version)


def test_proc_version_absent():
    assert hs.parse_proc_version("") is None


def test_fabric_in_progress_real():
    g = hs.parse_smi_q(real("smi_q_fabric_in_progress_580.159.04.txt"))["gpus"]
    assert g == [{"bus_id": None, "persistence": None, "fabric": {
        "state": "In Progress", "status": "N/A", "clique_id": "N/A", "cluster_uuid": "N/A", "health_summary": "N/A"}}]
    f = hs.fabric_check({"gpus": g, "driver_version": None}, nvl5=True)
    assert f["verdict"] == "fail" and "State In Progress" in f["found"] and "802" in f["expected"]


def test_fabric_completed_but_unhealthy_real():
    smi = hs.parse_smi_q(real("smi_q_fabric_completed_unhealthy_grep.txt"))
    assert smi["gpus"][0]["fabric"] == {"state": "Completed", "status": "Success", "clique_id": "2",
                                        "cluster_uuid": "dc6e40c4-d722-4357-9ba6-5291dd461278",
                                        "health_summary": "Unhealthy"}
    f = hs.fabric_check(smi, nvl5=True)
    assert f["verdict"] == "fail" and "Health Summary Unhealthy" in f["found"]


def test_fabric_insufficient_resources_real():
    smi = hs.parse_smi_q(real("smi_q_fabric_insufficient_resources.txt"))
    assert smi["gpus"][0]["fabric"]["status"] == "Insufficient Resources"
    assert hs.fabric_check(smi, nvl5=True)["verdict"] == "fail"


def test_fabric_na_on_single_h200_is_skip_not_pass():
    smi = hs.parse_smi_q(real("smi_q_fabric_na_h200.txt"))
    assert smi["gpus"][0]["fabric"]["state"] == "N/A"
    assert hs.fabric_check(smi, nvl5=False)["verdict"] == "skip"
    assert hs.fabric_check(smi, nvl5=True)["verdict"] == "fail"


def test_whole_h200_q_txt_driver_and_persistence(real_fixtures):
    smi = hs.parse_smi_q((real_fixtures / "nvidia-h200-vm" / "q.txt").read_text())
    assert smi["driver_version"] == "580.159.04"
    assert [g["persistence"] for g in smi["gpus"]] == ["Enabled"]
    assert smi["gpus"][0]["fabric"]["state"] == "N/A"


def test_fm_journal_pre_nvl5_nothing_to_do_real():
    j = hs.parse_fm_journal(real("fm_journal_pre_nvl5_nothing_to_do.txt"))
    assert (j["pre_nvl5"], j["nothing_to_do"], j["failed"], j["success_nvl5"]) == (True, True, True, False)


def test_fm_journal_legacy_success_real():
    j = hs.parse_fm_journal(real("fm_journal_started_pre_nvl5_h20.txt"))
    assert (j["success_legacy"], j["success_nvl5"], j["pre_nvl5"], j["failed"]) == (True, False, True, False)


def test_fm_journal_version_mismatch_real():
    j = hs.parse_fm_journal(real("fm_journal_version_mismatch_akash.txt"))
    assert j["version_mismatch"] == {"fabric_manager": "550.127.05", "driver": "550.120"}


def test_sb_state():
    assert hs.parse_sb_state("SecureBoot enabled\n") is True
    assert hs.parse_sb_state("SecureBoot disabled\n") is False
    assert hs.parse_sb_state("EFI variables are not supported on this system\n") is None


def test_proc_modules_real_h200():
    text = "nvidia_uvm 1830912 - - Live 0xffffffffc080c000 (O)\nnvidia 14299136 - - Live 0xffffffffc0400000 (O)\n"
    assert hs.parse_proc_modules(text) == {"nvidia_uvm", "nvidia"}


def test_upstream_and_match():
    assert hs.upstream("1:580.173.02-0ubuntu1") == "580.173.02"
    assert hs.version_matches("580.173.02-0ubuntu1", "580.173.02")
    assert not hs.version_matches("580.173.020-1", "580.173.02")
    assert hs.version_matches("2025.10.14-1", "2025.10.14-1")
    assert not hs.version_matches(None, "")


# ----------------------------------------------------------------------------------------------- a SYNTHESIZED host
def pkgs_versions(overrides=None):
    out = {}
    for p in hs.stack_packages(STACK, K):
        out[p["name"]] = (p["version"] + REV) if p["version"] and "-" not in p["version"] else (p["version"] or
                                                                                                  "6.8.0-60.63")
    out.update(overrides or {})
    return out


def dpkg_text(versions):
    return "".join("%s\t%s\tii \n" % (n, v) for n, v in versions.items() if v)


def policy_text(versions, extra=None, absent=()):
    """apt-cache policy for the stack's packages: each offered by the Ubuntu archive at the stack's version (the
    format of apt-cache(8) policy: package, Installed, Candidate, Version table with priorities and sources)."""
    extra = extra or {}
    out = []
    for n, v in versions.items():
        out += ["%s:" % n, "  Installed: %s" % ("(none)" if n in absent else v), "  Candidate: %s" % v, "  Version table:"]
        for ev, src in extra.get(n, []):
            out += ["     %s 500" % ev, "        500 %s" % src]
        out += [" *** %s 500" % v, "        500 http://archive.ubuntu.com/ubuntu noble-updates/multiverse amd64 "
                "Packages", "        100 /var/lib/dpkg/status"]
    return "\n".join(out) + "\n"


def fabric_block(n=8, state="Completed", status="Success", clique="0", uuid="7d3c9a52-1f0e-4a6b-9c41-0b2e8f6a7d10",
                 summary="Healthy"):
    out = ["Timestamp                                              : Sun Dec  6 04:00:00 2026",
           "Driver Version                                         : 580.173.02", "CUDA Version          : 13.0", ""]
    for i in range(n):
        out += ["GPU 00000000:%02X:00.0" % (0x18 + i), "    Persistence Mode                   : Enabled",
                "    Fabric", "        State                             : %s" % state,
                "        Status                            : %s" % status,
                "        CliqueId                          : %s" % clique,
                "        ClusterUUID                       : %s" % uuid, "        Health",
                "            Summary                       : %s" % summary,
                "            Bandwidth                     : Full"]
    return "\n".join(out) + "\n"


FM_OK = "\n".join([
    "Dec 06 04:00:01 b300a nvidia-fabricmanager-start.sh[2101]: Detected NVL5 system",
    'Dec 06 04:00:03 b300a nvidia-fabricmanager-start.sh[2101]: Started "Nvidia NVLink Subnet Manager"',
    "Dec 06 04:00:09 b300a nvlsm[2140]: Entering MASTER state",
    "Dec 06 04:00:20 b300a nv-fabricmanager[2160]: Successfully configured all the available GPUs and NVSwitches to "
    "route NVLink traffic",
]) + "\n"


def healthy_state():
    v = pkgs_versions()
    return {
        "running_kernel": K, "next_kernel": K,
        "dpkg": dpkg_text(v), "holds": "\n".join(n for n, p in zip(v, hs.stack_packages(STACK, K)) if p["hold"]),
        "apt_policy": policy_text(v),
        "proc_version": "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.173.02  Release Build  "
                        "(dvs-builder@U16-A24-9-2)  Thu Oct 10 12:15:00 UTC 2024\n",
        "proc_modules": "".join("%s 16384 0 - Live 0x0\n" % m for m in ("nvidia", "mlx5_core", "mlx5_ib", "ib_umad")),
        "smi_q": fabric_block(), "fm_journal": FM_OK, "sb_state": "SecureBoot enabled\n",
        "next_kernel_modules": {m: {"path": "/lib/modules/%s/kernel/%s.ko.zst" % (K, m), "signer": "Canonical Ltd."}
                                for m in ("nvidia", "mlx5_ib", "ib_umad")},
        "kernel_config": "CONFIG_PCI_P2PDMA=y\n",
        "apt_config": 'APT::Periodic::Unattended-Upgrade "1";\n' + "".join(
            'Unattended-Upgrade::Package-Blacklist:: "%s";\n' % p for p in STACK["unattended_upgrades"]["blacklist"]),
        "modules_load": {"b300-host-stack.conf": "mlx5_ib\nib_umad\n"},
        "sw_mng_devices": ["mlx5_8"], "unattended_upgrades_installed": True,
        "nvlink_s": nvlink_s(),
    }


def nvlink_s(n=8, speed="53.125 GB/s", down=()):
    """`nvidia-smi nvlink -s` in the real format of sandbox/hwemu/real/nvidia-h200x2-vm/nvlink-s.txt (tab, Link N)."""
    out = []
    for g in range(n):
        out.append("GPU %d: NVIDIA B300 SXM6 AC (UUID: GPU-00000000-0000-0000-0000-00000000000%d)" % (g, g))
        out += ["\t Link %d: %s" % (i, "<inactive>" if (g, i) in down else speed) for i in range(18)]
    return "\n".join(out) + "\n"


def verdicts(state, stack=STACK):
    return {r["check"]: r for r in hs.checks(stack, state)}


def test_healthy_host_every_check_passes_and_plan_is_empty():
    st = healthy_state()
    v = verdicts(st)
    assert {k: r["verdict"] for k, r in v.items()} == {
        "driver_open_flavour": "pass", "packages_declared": "pass", "driver_fm_same_version": "pass",
        "packages_held": "pass", "unattended_upgrades_away": "pass", "modules_loaded": "pass",
        "modules_at_boot": "pass", "sw_mng_bridge": "pass", "fabric_manager_journal": "pass", "nvlsm_journal": "pass",
        "fabric_state": "pass", "nvlink_speed": "pass", "persistence": "pass", "gdr_path": "pass", "next_kernel_modules": "pass"}
    assert v["fabric_state"]["found"] == ("8 GPUs Completed/Success, ClusterUUID 7d3c9a52-1f0e-4a6b-9c41-0b2e8f6a7d10, "
                                          "CliqueId 0")
    assert v["gdr_path"]["found"].startswith("dma_buf")
    p = hs.plan(STACK, st)
    assert p == {"install": [], "hold": [], "unhold": [], "remove": [], "modprobe": [], "restart": [], "acts": False,
                 "reboot": False, "reboot_reasons": [], "refusals": [], "notes": []}


def test_bare_host_plan_installs_in_order_holds_and_reboots():
    st = healthy_state()
    st.update(dpkg="", holds="", proc_version="", apt_policy=policy_text(pkgs_versions(), absent=set(pkgs_versions())))
    p = hs.plan(STACK, st)
    names = [i.split("=")[0] for i in p["install"]]
    assert names == [x["name"] for x in hs.stack_packages(STACK, K)]
    assert p["install"][2] == "nvidia-driver-580-server-open=580.173.02" + REV
    assert "infiniband-diags" not in p["hold"] and "nvidia-fabricmanager-580" in p["hold"]
    assert p["reboot"] and p["refusals"] == []


# ----------------------------------------------------------------------------------------------- the traps
def test_trap_proprietary_flavour_on_blackwell():
    st = healthy_state()
    st["proc_version"] = real("proc_version_proprietary_elided.txt")
    st["dpkg"] += "nvidia-dkms-580\t580.173.02%s\tii \n" % REV
    f = verdicts(st)["driver_open_flavour"]
    assert f["verdict"] == "fail" and f["found"].startswith("proprietary") and "RmInitAdapter" in f["expected"]
    p = hs.plan(STACK, st)
    assert p["remove"] == ["nvidia-dkms-580"] and p["reboot"]
    msg = hs.failures("b300a", hs.checks(STACK, st))
    assert msg[0].startswith("b300a: host_stack check driver_open_flavour failed: found proprietary")


def test_trap_nvlsm_missing():
    v = pkgs_versions()
    v.pop("nvlsm")
    st = healthy_state()
    st["dpkg"] = dpkg_text(v)
    st["fm_journal"] = "Dec 06 04:00:01 b300a nvidia-fabricmanager-start.sh[2101]: /opt/nvidia/nvlsm/sbin/nvlsm does " \
                       "not exist\n"
    st["smi_q"] = fabric_block(state="In Progress", status="N/A", clique="N/A", uuid="N/A", summary="N/A")
    r = verdicts(st)
    assert r["packages_declared"]["verdict"] == "fail" and "nvlsm absent" in r["packages_declared"]["found"]
    assert r["fabric_manager_journal"]["fix"].startswith("install nvlsm")
    assert r["nvlsm_journal"]["verdict"] == "fail" and r["fabric_state"]["verdict"] == "fail"
    assert hs.plan(STACK, st)["install"] == ["nvlsm=2025.10.14-1"]


def test_trap_ib_umad_not_loaded_fm_on_legacy_path():
    st = healthy_state()
    st["proc_modules"] = st["proc_modules"].replace("ib_umad 16384 0 - Live 0x0\n", "")
    st["modules_load"] = {}
    st["fm_journal"] = real("fm_journal_pre_nvl5_nothing_to_do.txt")
    r = verdicts(st)
    assert r["modules_loaded"]["found"] == "not loaded: ib_umad" and "modprobe ib_umad" in r["modules_loaded"]["fix"]
    assert r["modules_at_boot"]["verdict"] == "fail"
    assert "pre-NVL5" in r["fabric_manager_journal"]["found"]
    assert hs.plan(STACK, st)["modprobe"] == ["ib_umad"]


@pytest.mark.parametrize("held", [True, False])
def test_trap_fm_one_version_off(held):
    """FM one build ahead of the driver: by hand (held) or by an unattended upgrade that moved it alone (not held)."""
    st = healthy_state()
    st["dpkg"] = dpkg_text(pkgs_versions({"nvidia-fabricmanager-580": "580.178.04" + REV}))
    if not held:
        st["holds"] = st["holds"].replace("nvidia-fabricmanager-580\n", "")
    st["fm_journal"] = ("Dec 06 04:00:02 b300a nv-fabricmanager[2160]: fabric manager NVIDIA GPU driver interface "
                        "version 580.178.04 don't match with driver version 580.173.02. Please update with matching "
                        "NVIDIA driver package.\n")
    r = verdicts(st)
    assert r["driver_fm_same_version"]["verdict"] == "fail"
    assert r["driver_fm_same_version"]["found"] == "driver-group versions installed: 580.173.02, 580.178.04"
    assert r["fabric_manager_journal"]["found"] == "fabric manager 580.178.04 refuses driver 580.173.02"
    assert r["packages_held"]["verdict"] == ("pass" if held else "fail")
    p = hs.plan(STACK, st)
    assert p["install"] == ["nvidia-fabricmanager-580=580.173.02" + REV]
    assert p["unhold"] == (["nvidia-fabricmanager-580"] if held else [])
    assert p["hold"] == ["nvidia-fabricmanager-580"] and not p["reboot"]


def test_trap_unattended_upgrades_without_blacklist():
    st = healthy_state()
    st["apt_config"] = 'APT::Periodic::Unattended-Upgrade "1";\n'
    f = verdicts(st)["unattended_upgrades_away"]
    assert f["verdict"] == "fail" and "nvidia-fabricmanager-580" in f["found"]


def test_trap_second_source_offers_newer_driver_pins_exact():
    st = healthy_state()
    v = pkgs_versions()
    v.pop("nvidia-driver-580-server-open")
    st["dpkg"] = dpkg_text(v)
    newer = [("580.178.04-1", "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64  Packages")]
    st["apt_policy"] = policy_text(pkgs_versions(), {"nvidia-driver-580-server-open": newer}).replace(
        "Candidate: 580.173.02" + REV + "\n  Version table:\n     580.178.04-1",
        "Candidate: 580.178.04-1\n  Version table:\n     580.178.04-1")
    p = hs.plan(STACK, st)
    assert p["install"] == ["nvidia-driver-580-server-open=580.173.02" + REV]
    assert p["notes"] == ["nvidia-driver-580-server-open: a source offers newer 580.178.04-1; the stack installs "
                          "580.173.02%s exactly and pins it (apt preferences), held" % REV]


def test_trap_same_version_from_two_sources_refused():
    st = healthy_state()
    v = pkgs_versions()
    v.pop("nvidia-fabricmanager-580")
    st["dpkg"] = dpkg_text(v)
    other = [("580.173.02-1", "http://mirror.example/ubuntu noble-updates/multiverse amd64 Packages")]
    st["apt_policy"] = policy_text(pkgs_versions(), {"nvidia-fabricmanager-580": other})
    p = hs.plan(STACK, st)
    assert p["install"] == [] and len(p["refusals"]) == 1
    assert "offered in 2 builds" in p["refusals"][0] and "two sources" in p["refusals"][0]


def test_trap_not_offered_by_the_declared_source_refused():
    st = healthy_state()
    st["dpkg"] = dpkg_text({n: x for n, x in pkgs_versions().items() if n != "nvlsm"})
    st["apt_policy"] = policy_text(pkgs_versions(), absent=("nvlsm",))
    stack = copy.deepcopy(STACK)
    stack["apt_source_match"] = ["offline-mirror.local"]
    p = hs.plan(stack, st)
    assert p["refusals"] and "not offered by the declared source (offline-mirror.local)" in p["refusals"][0]


def test_trap_dkms_build_failed_for_next_kernel_refused_before_reboot():
    st = healthy_state()
    st["next_kernel"] = "6.8.0-62-generic"
    st["next_kernel_modules"] = {"nvidia": None, "mlx5_ib": {"path": "/lib/modules/6.8.0-62-generic/x.ko",
                                                            "signer": "Canonical Ltd."}, "ib_umad": {"path": "/y",
                                                                                                     "signer": "C"}}
    r = verdicts(st)
    f = r["next_kernel_modules"]
    assert f["verdict"] == "fail" and f["found"].startswith("kernel 6.8.0-62-generic has no nvidia")
    # the plan refuses to change anything that needs the next boot
    st["proc_version"] = st["proc_version"].replace("580.173.02", "580.159.04")
    p = hs.plan(STACK, st)
    assert p["reboot"] and any(x.startswith("next_kernel_modules: kernel 6.8.0-62-generic") for x in p["refusals"])


def test_trap_secure_boot_unsigned_module_refused_never_enrolled():
    """An unsigned nvidia module on a Secure Boot host: the proof fails naming the manual MOK route. The plan refuses
    while an unsigned DKMS build under updates/ stays (it would win over the signed package's module at the next
    boot); where the module is the one the signed prebuilt package replaces, the stage installs that and proceeds."""
    st = healthy_state()
    st["next_kernel_modules"]["nvidia"] = {"path": "/lib/modules/%s/updates/dkms/nvidia.ko.zst" % K, "signer": None}
    st["dpkg"] = dpkg_text({n: x for n, x in pkgs_versions().items() if "linux-modules-nvidia" not in n})
    st["apt_policy"] = policy_text(pkgs_versions(), absent={"linux-modules-nvidia-580-server-open-%s" % K})
    f = verdicts(st)["secure_boot_signed"]
    assert f["verdict"] == "fail" and "nvidia for kernel" in f["found"] and "never by automation" in f["fix"]
    p = hs.plan(STACK, st)
    assert any(x.startswith("secure_boot_signed:") for x in p["refusals"])
    st["next_kernel_modules"]["nvidia"]["path"] = "/lib/modules/%s/kernel/nvidia-580srv/nvidia.ko" % K
    p = hs.plan(STACK, st)
    assert p["refusals"] == [] and p["install"] == ["linux-modules-nvidia-580-server-open-%s=580.173.02%s" % (K, REV)]
    st["sb_state"] = "SecureBoot disabled\n"
    assert "secure_boot_signed" not in verdicts(st)


def test_fabric_split_cliques_fail():
    st = healthy_state()
    st["smi_q"] = fabric_block(4) + fabric_block(4, clique="1").split("\n", 4)[4]
    assert verdicts(st)["fabric_state"]["found"].startswith("GPUs in 2 cliques")


def test_persistence_off_fails():
    st = healthy_state()
    st["smi_q"] = st["smi_q"].replace("Enabled", "Disabled", 1)
    f = verdicts(st)["persistence"]
    assert f["verdict"] == "fail" and f["found"] == "Persistence Mode not Enabled on 00000000:18:00.0"


def test_gdr_without_p2pdma_falls_back_to_peermem_or_fails():
    st = healthy_state()
    st["kernel_config"] = "# CONFIG_PCI_P2PDMA is not set\n"
    assert verdicts(st)["gdr_path"]["verdict"] == "fail"
    st["proc_modules"] += "nvidia_peermem 16384 0 - Live 0x0\n"
    f = verdicts(st)["gdr_path"]
    assert f["verdict"] == "warn" and f["found"].startswith("nvidia_peermem")


def test_missing_sw_mng_bridge_fails_on_nvl5():
    st = healthy_state()
    st["sw_mng_devices"] = []
    assert verdicts(st)["sw_mng_bridge"]["verdict"] == "fail"


# ----------------------------------------------------------------------------------------------- the data
def test_every_stack_is_complete_and_cited():
    for name, s in STACKS.items():
        for key in ("driver", "packages", "apt_source_match", "loaded_modules", "modules_load_at_boot", "boot_modules",
                    "gdr", "doca", "unattended_upgrades", "conflicting_packages", "source", "nvlink"):
            assert key in s, "%s: %s missing" % (name, key)
        assert s["driver"]["flavour"] == "open" and s["driver"]["source"]
        assert all(p.get("source") for p in s["packages"]), name
        assert s["gdr"]["path"] in ("dma_buf", "nvidia_peermem") and s["gdr"]["rule"]
        drv = [p for p in s["packages"] if p["group"] == "driver"]
        assert {p["version"] for p in drv} == {s["driver"]["version"]}, "%s: driver group off the driver" % name
        for p in hs.stack_packages(s, K):
            if p["hold"]:
                assert any(p["name"].startswith(b) for b in s["unattended_upgrades"]["blacklist"]), p["name"]


# ----------------------------------------------------------------------------------------------- the module, end to end
def test_module_reads_a_tree_read_only_in_check_mode(tmp_path):
    """host_stack_facts on this controller with a SYNTHESIZED root (driver version file, modules-load.d), a stand-in
    nvidia-smi printing the fabric block above and a sysfs with the SW_MNG bridge: the checks read what the tree
    says; this machine's dpkg has none of the stack, so the plan refuses (apt knows no such package here)."""
    import os
    import synth
    from test_facts_modules import run_module
    root = tmp_path / "root"
    (root / "proc" / "driver" / "nvidia").mkdir(parents=True)
    (root / "proc" / "driver" / "nvidia" / "version").write_text(healthy_state()["proc_version"])
    (root / "etc" / "modules-load.d").mkdir(parents=True)
    (root / "etc" / "modules-load.d" / "b300-host-stack.conf").write_text("mlx5_ib\nib_umad\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\ncat <<'EOF'\n%sEOF\n" % fabric_block())
    smi.chmod(0o755)
    sysfs = synth.make_sysfs(tmp_path / "sys", nics=1, nic_device_id="1021", sw_mng=(1,))
    rc, res = run_module("host_stack_facts", {"stack": STACK, "host": "b300a", "root": str(root),
                                              "bin_path": [str(bin_dir)], "sysfs_root": sysfs,
                                              "read_files": ["/etc/modules-load.d/b300-host-stack.conf",
                                                             "/etc/apt/preferences.d/b300-host-stack.pref"]},
                         tmp_path, check=True)
    assert rc == 0, res
    f = res["ansible_facts"]["host_stack"]
    v = {c["check"]: c for c in f["checks"]}
    assert v["driver_open_flavour"]["verdict"] == "pass" and v["fabric_state"]["verdict"] == "pass"
    assert f["verdicts"] == {c["check"]: c["verdict"] for c in f["checks"]}
    assert v["modules_at_boot"]["verdict"] == "pass" and f["sw_mng_devices"] == ["mlx5_1"]
    assert v["packages_declared"]["verdict"] == "fail"
    assert f["plan"]["refusals"] and f["plan"]["install"] == []
    assert any(m.startswith("b300a: host_stack check packages_declared failed") for m in f["failures"])
    assert res["changed"] is False
    assert f["files"] == {"/etc/modules-load.d/b300-host-stack.conf": "mlx5_ib\nib_umad\n",
                          "/etc/apt/preferences.d/b300-host-stack.pref": None}
    assert os.listdir(root / "etc" / "modules-load.d") == ["b300-host-stack.conf"]


def test_bare_host_proof_fails_on_versions_and_holds_not_silently_passes():
    st = healthy_state()
    st.update(dpkg="", holds="")
    v = verdicts(st)
    assert v["driver_fm_same_version"]["verdict"] == "fail" and "none" in v["driver_fm_same_version"]["found"]
    assert v["packages_held"]["verdict"] == "fail"


# ----------------------------------------------------------------------------------------------- the lent H100
def test_h100_evidence_judged_by_the_same_checks():
    """docs/evidence/h100x1/host_stack/raw (verbatim from the lent H100): the single-GPU view of the same checks,
    expected values read from the raw files (open 580.159.04, persistence Enabled, Fabric N/A, P2PDMA not set)."""
    raw = ROOT / "docs" / "evidence" / "h100x1" / "host_stack" / "raw"
    stack = dict(copy.deepcopy(STACK), nvlink5=False, loaded_modules=["nvidia"],
                 driver=dict(STACK["driver"], version="580.159.04"))
    state = {"proc_version": (raw / "proc_driver_nvidia_version.txt").read_text(),
             "smi_q": (raw / "smi_q.txt").read_text(), "proc_modules": (raw / "proc_modules.txt").read_text(),
             "kernel_config": (raw / "kernel_config_p2p.txt").read_text(),
             "running_kernel": (raw / "uname_r.txt").read_text().strip(), "sb_state": (raw / "sb_state.txt").read_text()}
    v = verdicts(state, stack)
    assert (v["driver_open_flavour"]["verdict"], v["driver_open_flavour"]["found"]) == (
        "pass", "Open Kernel Module 580.159.04")
    assert v["persistence"]["verdict"] == "pass" and v["fabric_state"]["verdict"] == "skip"
    assert v["gdr_path"]["verdict"] == "fail" and "CONFIG_PCI_P2PDMA missing" in v["gdr_path"]["found"]
    assert v["modules_loaded"]["verdict"] == "pass"
    assert hs.parse_smi_q(state["smi_q"])["driver_version"] == "580.159.04"
    assert hs.parse_sb_state(state["sb_state"]) is None   # mokutil absent there: not known, never "disabled"


def test_holds_read_from_dpkg_selection_state_and_no_policy_when_nothing_to_install():
    """``hi`` (hold, installed) in dpkg's status abbreviation is what apt-mark hold sets: no second command; and a
    host with every package at its version needs no apt-cache policy (the no-change run reads no package list)."""
    st = healthy_state()
    st["dpkg"] = st["dpkg"].replace("\tii \n", "\thi \n")
    st["holds"] = ""
    assert verdicts(st)["packages_held"]["verdict"] == "pass"
    assert hs.parse_dpkg_holds("nvlsm\t2025.10.14-1\thi \nfoo\t1\tii \n") == {"nvlsm"}
    assert hs.needs_apt_policy(STACK, st) is False
    st["dpkg"] = dpkg_text(pkgs_versions({"nvidia-fabricmanager-580": "580.178.04" + REV}))
    assert hs.needs_apt_policy(STACK, st) is True


# ----------------------------------------------------------------------------------------------- the role's files
def _render(name, **ctx):
    import jinja2
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(ROOT / "roles" / "host_stack" / "templates")),
                             trim_blocks=True, undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    return env.get_template(name).render(ansible_managed="managed", host_stack_name="b300-noble-580.173",
                                         host_stack_declared=STACK, **ctx)


def test_apt_preferences_pin_every_versioned_package_above_1000():
    """apt_preferences(5): Package / Pin: version <glob> / Pin-Priority; > 1000 installs the pinned version even as a
    downgrade, so a second source's newer build never wins."""
    text = _render("apt-preferences.j2", ansible_facts={"host_stack": {"running_kernel": K}})
    stanzas = [b for b in text.split("\n\n") if b.startswith("Package:")]
    pins = {b.splitlines()[0].split(": ", 1)[1]: b.splitlines()[1] for b in stanzas}
    assert pins["nvidia-fabricmanager-580"] == "Pin: version 580.173.02-*"
    assert pins["nvlsm"] == "Pin: version 2025.10.14-1"
    assert pins["linux-modules-nvidia-580-server-open-%s" % K] == "Pin: version 580.173.02-*"
    assert "linux-modules-extra-%s" % K not in pins   # follows the kernel's own build: not pinned
    assert all(b.splitlines()[2] == "Pin-Priority: 1001" for b in stanzas)


def test_unattended_upgrades_blacklist_renders_and_covers_every_held_package():
    text = _render("unattended-upgrades-blacklist.j2")
    patterns = [ln.strip().strip('";') for ln in text.splitlines() if ln.startswith('    "')]
    assert text.count("Unattended-Upgrade::Package-Blacklist {") == 1 and text.rstrip().endswith("};")
    held = [p["name"] for p in hs.stack_packages(STACK, K) if p["hold"]]
    assert hs._unattended_covered(held, patterns) == []
    assert hs._unattended_covered(["linux-image-6.8.0-62-generic"], patterns) == ["linux-image-6.8.0-62-generic"]


def test_nvlink_link_down_or_slow_fails_real_h200_format(real_fixtures):
    st = healthy_state()
    st["nvlink_s"] = nvlink_s(down={(5, 3), (5, 11)})
    f = verdicts(st)["nvlink_speed"]
    assert f["verdict"] == "fail" and f["found"] == "GPU 5: 16 of 18 links at >= 53.125 GB/s (53.125, inactive)"
    # the real H200 NVLink 4 capture: 18 links at 26.562 GB/s each, below the B300's 53.125
    st["nvlink_s"] = (real_fixtures / "nvidia-h200x2-vm" / "nvlink-s.txt").read_text()
    f = verdicts(st)["nvlink_speed"]
    assert f["verdict"] == "fail" and f["found"].startswith("GPU 0: 0 of 18 links at >= 53.125 GB/s (26.562)")


def test_fm_journal_judges_the_last_start_only():
    """A restart after a fix leaves this boot's failed start above it: the last start (systemd's "Starting ..." line,
    as in nvtrust #128's real journal) decides; a failure after a success fails."""
    start = "Jan 05 14:44:41 b300a systemd[1]: Starting nvidia-fabricmanager.service - NVIDIA fabric manager service...\n"
    failed = start + "Jan 05 14:44:41 b300a nvidia-fabricmanager-start.sh[1]: /opt/nvidia/nvlsm/sbin/nvlsm does not exist\n"
    good = start + "Jan 05 14:50:02 b300a nv-fabricmanager[9]: %s\n" % hs.FM_SUCCESS_NVL5
    assert hs.parse_fm_journal(failed + good)["success_nvl5"] and not hs.parse_fm_journal(failed + good)["nvlsm_missing"]
    assert hs.parse_fm_journal(good + failed)["nvlsm_missing"] and not hs.parse_fm_journal(good + failed)["success_nvl5"]
    assert hs.parse_fm_journal(real("fm_journal_pre_nvl5_nothing_to_do.txt"))["pre_nvl5"]


def test_installed_but_never_rebooted_owes_the_reboot():
    """An earlier run installed and held the stack and stopped before its reboot (host_stack_reboot=stop, or a reboot
    that never came back): nothing to install, but the plan still reboots, saying why; the proof says no driver."""
    st = healthy_state()
    st["proc_version"] = ""
    p = hs.plan(STACK, st)
    assert p["install"] == [] and not p["acts"] and p["reboot"]
    assert p["reboot_reasons"] == ["linux-modules-nvidia-580-server-open-%s, nvidia-driver-580-server-open installed, "
                                   "no driver loaded: the reboot after the install is pending" % K]
    assert verdicts(st)["driver_open_flavour"]["verdict"] == "fail"
    st["dpkg"] = ""
    assert "no driver loaded" not in " ".join(hs.plan(STACK, st)["reboot_reasons"])


def _proc(tmp_path, uptime, pid1_start_ticks):
    (tmp_path / "proc" / "1").mkdir(parents=True)
    (tmp_path / "proc" / "uptime").write_text("%s 7000.00\n" % uptime)
    # /proc/1/stat as systemd writes it; field 22 (starttime, clock ticks after boot) is the 20th after "(comm) "
    fields = ["S", "0", "1", "1", "0", "-1", "4194560", "0", "0", "0", "0", "0", "0", "0", "0", "20", "0", "1", "0",
              str(pid1_start_ticks), "0"]
    (tmp_path / "proc" / "1" / "stat").write_text("1 (systemd) %s\n" % " ".join(fields))


def test_boot_age_is_uptime_less_pid1_start(tmp_path):
    from ansible_collections.b300.rollout.plugins.module_utils.hoststack.host_stack_io import boot_age_s
    hz = __import__("os").sysconf("SC_CLK_TCK")
    _proc(tmp_path, "1000.50", 600 * hz)  # a container started 600 s after its machine booted
    assert abs(boot_age_s(str(tmp_path)) - 400.5) < 0.01
    assert boot_age_s(str(tmp_path / "nowhere")) is None


def test_boot_age_of_this_machine_is_sane():
    from ansible_collections.b300.rollout.plugins.module_utils.hoststack.host_stack_io import boot_age_s
    age = boot_age_s("/")
    assert age is not None and 0 <= age < float(open("/proc/uptime").read().split()[0]) + 1
