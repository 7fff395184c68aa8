"""Tests of the emulated B300/CX8 hardware (sandbox/hwemu) and its SYNTHESIZED fixtures (tests/fixtures/synth)."""
import json
import os
import re
import shutil
import subprocess
import time
import xml.etree.ElementTree as ET

import pytest

import model
import render_fixtures
import scenarios

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HWEMU = os.path.join(ROOT, "sandbox", "hwemu")
SYNTH = os.path.join(ROOT, "tests", "fixtures", "synth")


# ----------------------------------------------------------------------------------------- renderer / fixtures
@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth")
    render_fixtures.main(["--out", str(out)])
    return str(out)


def test_render_is_deterministic(fresh, tmp_path):
    render_fixtures.main(["--out", str(tmp_path)])
    assert render_fixtures.tree_listing(str(tmp_path)) == render_fixtures.tree_listing(fresh)


def test_committed_fixtures_equal_fresh_render(fresh):
    committed = render_fixtures.tree_listing(SYNTH)
    new = render_fixtures.tree_listing(fresh)
    missing = sorted(set(new) - set(committed))[:5]
    stale = sorted(k for k in new if k in committed and committed[k] != new[k])[:5]
    extra = sorted(set(committed) - set(new))[:5]
    assert not (missing or stale or extra), (
        "tests/fixtures/synth is out of date: run python3 sandbox/hwemu/render_fixtures.py "
        "(missing %s, changed %s, extra %s)" % (missing, stale, extra))


def test_every_fixture_dir_is_marked_synthesized():
    assert "SYNTHESIZED" in open(os.path.join(SYNTH, "README.md")).read()
    for name in scenarios.SCENARIOS:
        d = os.path.join(SYNTH, name)
        assert "SYNTHESIZED" in open(os.path.join(d, "q.xml")).read()
        assert os.path.isfile(os.path.join(d, "sys", "SYNTHESIZED"))
        assert json.load(open(os.path.join(d, "expect.json")))["synthesized"] is True


def test_xml_serializer_reproduces_real_capture_bytes(real_fixtures):
    for sub in ("nvidia-h200-vm", "nvidia-h200x2-vm"):
        raw = (real_fixtures / sub / "q.xml").read_text()
        root = ET.fromstring(raw)
        hdr = {k: root.findtext(k) for k in ("timestamp", "driver_version", "cuda_version", "attached_gpus")}
        assert model.serialize_smi_xml(hdr, root.findall("gpu")) == raw


def test_q_text_labels_match_real_capture(real_fixtures):
    root = ET.parse(str(real_fixtures / "nvidia-h200x2-vm" / "q.xml")).getroot()
    out = []
    for g in root.findall("gpu"):
        out.append("GPU " + g.get("id"))
        model._qtext(g, 1, out)
        out.append("")
    real = (real_fixtures / "nvidia-h200x2-vm" / "q.txt").read_text().splitlines()
    real = real[real.index("GPU 00000000:00:06.0"):]
    assert [ln.split(":")[0] for ln in out] == [ln.split(":")[0] for ln in real]


def _tag_paths(el, prefix=""):
    seen = []
    for c in el:
        p = prefix + "/" + c.tag
        if p not in seen:
            seen.append(p)
        for q in _tag_paths(c, p):
            if q not in seen:
                seen.append(q)
    return seen


def test_synth_xml_has_real_element_layout(real_fixtures):
    real_gpu = ET.parse(str(real_fixtures / "nvidia-h200x2-vm" / "q.xml")).getroot().find("gpu")
    root = ET.parse(os.path.join(SYNTH, "healthy", "q.xml")).getroot()
    gpus = root.findall("gpu")
    assert len(gpus) == 8 and root.findtext("attached_gpus") == "8"
    assert _tag_paths(gpus[0]) == _tag_paths(real_gpu)
    g = gpus[0]
    assert g.findtext("product_name") == "NVIDIA B300 SXM6 AC"
    assert g.findtext("fb_memory_usage/total") == "275040 MiB"
    assert g.findtext("gpu_power_readings/current_power_limit") == "1100.00 W"
    assert g.findtext("pci/pci_bus_id") == "00000000:18:00.0"
    assert g.findtext("fabric/state") == "Completed" and g.findtext("fabric/status") == "Success"
    assert g.find("numa_node") is None  # the real XML has no NUMA element either


def test_scenario_specific_fixture_content():
    def xml(name):
        return ET.parse(os.path.join(SYNTH, name, "q.xml")).getroot().findall("gpu")

    thr = xml("thermal_throttle")
    assert all(g.findtext("clocks_event_reasons/clocks_event_reason_hw_thermal_slowdown") == "Active" for g in thr)
    assert all(int(g.findtext("temperature/gpu_temp").split()[0]) >= 95 for g in thr)
    ecc = xml("ecc_errors")
    bad = [i for i, g in enumerate(ecc) if int(g.findtext("ecc_errors/volatile/dram_uncorrectable")) > 0]
    assert bad == [2] and ecc[2].findtext("remapped_rows/remapped_row_pending") == "Yes"
    assert int(ecc[2].findtext("ecc_errors/aggregate/dram_uncorrectable")) > 0
    absg = xml("abs_temp_fields")[0]
    assert absg.findtext("temperature/gpu_temp_slow_threshold") == "92 C"
    nv = open(os.path.join(SYNTH, "nvlink_down", "nvlink-s.txt")).read()
    assert nv.count("<inactive>") == 2
    assert "GPU5\tNV16" in open(os.path.join(SYNTH, "nvlink_down", "topo.txt")).read()
    assert "NIC0" not in open(os.path.join(SYNTH, "no_nic_columns", "topo.txt")).read()
    mm = json.load(open(os.path.join(SYNTH, "cx8_fw_mismatch", "expect.json")))
    assert mm["fw_mismatched_nics"] == ["mlx5_3"]
    sysroot = os.path.join(SYNTH, "cx8_fw_mismatch", "sys", "class", "infiniband")
    fws = {d: open(os.path.join(sysroot, d, "fw_ver")).read().strip() for d in os.listdir(sysroot)}
    assert sorted(d for d, v in fws.items() if v not in ("40.47.1026", "28.47.1026")) == ["mlx5_3"]
    assert "KMD Version: 610.43.02" in open(os.path.join(SYNTH, "driver_r610", "smi.txt")).read()


def _busbw_big(path):
    js = json.load(open(path))
    return min(r["out_of_place"]["bus_bw"] for r in js["results"] if r["size"] >= 1 << 30), js


def test_nccl_fixture_figures():
    healthy, _ = _busbw_big(os.path.join(SYNTH, "healthy", "all_reduce.json"))
    slow, _ = _busbw_big(os.path.join(SYNTH, "nccl_slow", "all_reduce.json"))
    two, _ = _busbw_big(os.path.join(SYNTH, "healthy", "all_reduce_2node.json"))
    assert healthy > 800 and slow < 350 and 340 < two < 400
    _, wrong = _busbw_big(os.path.join(SYNTH, "nccl_wrong_results", "all_reduce.json"))
    nwrong = sum(r[p]["nwrong"] for r in wrong["results"] for p in ("out_of_place", "in_place"))
    assert nwrong == wrong["out_of_bounds"]["count"] > 0
    txt = open(os.path.join(SYNTH, "nccl_wrong_results", "all_reduce.txt")).read()
    assert "# Out of bounds values : %d FAILED" % nwrong in txt
    hang = open(os.path.join(SYNTH, "nccl_intermittent_hang", "all_reduce_hang.txt")).read()
    assert hang.rstrip().splitlines()[-1].startswith("#        (B)")


def test_sysfs_tree_relative_links_and_pix_pairs():
    tree = os.path.join(SYNTH, "healthy", "sys")
    for dp, dns, fns in os.walk(tree):
        for n in dns + fns:
            p = os.path.join(dp, n)
            if os.path.islink(p):
                assert not os.path.isabs(os.readlink(p)), p
                assert os.path.realpath(p).startswith(os.path.realpath(tree)), p
    assert open(os.path.join(tree, "module", "mlx5_core", "version")).read().strip() == "25.10-1.2.2"
    gpus = sorted(os.path.basename(os.path.realpath(os.path.join(tree, "bus", "pci", "drivers", "nvidia", a)))
                  for a in os.listdir(os.path.join(tree, "bus", "pci", "drivers", "nvidia")) if a.startswith("0000"))
    assert len(gpus) == 8
    for i in range(8):
        nic = os.path.realpath(os.path.join(tree, "class", "infiniband", "mlx5_%d" % i, "device"))
        gpu = os.path.realpath(os.path.join(tree, "bus", "pci", "devices", gpus[i]))
        # GPU and its CX8 share the switch upstream port: the common ancestor is 2 levels above each
        assert os.path.dirname(os.path.dirname(nic)) == os.path.dirname(os.path.dirname(gpu))
        assert open(os.path.join(nic, "vendor")).read().strip() == "0x15b3"
        assert open(os.path.join(nic, "device")).read().strip() == "0x1023"
        assert open(os.path.join(nic, "numa_node")).read().strip() == ("0" if i < 4 else "1")
    fm = os.path.join(tree, "class", "infiniband", "mlx5_8")
    assert open(os.path.join(fm, "ports", "1", "link_layer")).read().strip() == "Ethernet"
    assert open(os.path.join(fm, "device", "device")).read().strip() == "0x1021"
    assert open(os.path.join(tree, "devices", "system", "node", "node1", "cpulist")).read().strip() == "56-111,168-223"


# ----------------------------------------------------------------------------------------- tools on a copy
@pytest.fixture()
def emu(tmp_path):
    dst = tmp_path / "hwemu"
    shutil.copytree(HWEMU, str(dst), ignore=shutil.ignore_patterns("trees", "state", "sys", "scenario", "__pycache__"))
    env = dict(os.environ, HWEMU_HOSTNAME="b300a")
    env.pop("HWEMU_ROOT", None)
    env.pop("NCCL_TESTS_MIN_BW", None)

    def run(*args, scenario=None, timeout=30, extra_env=None, check=True):
        if scenario:
            subprocess.run([str(dst / "bin" / "hwemu-scenario"), scenario], env=env, check=True,
                           capture_output=True, text=True, timeout=30)
        e = dict(env, **(extra_env or {}))
        p = subprocess.run([str(dst / "bin" / args[0])] + list(args[1:]), env=e, capture_output=True, text=True,
                           timeout=timeout, cwd=str(tmp_path))
        if check:
            assert p.returncode == 0, (args, p.returncode, p.stderr)
        return p
    run.dir = dst
    run.env = env
    return run


def test_tools_healthy(emu):
    p = emu("nvidia-smi", "-q", "-x", scenario="healthy")
    root = ET.fromstring(p.stdout)
    assert len(root.findall("gpu")) == 8
    assert (emu.dir / "scenario").read_text().strip() == "healthy"
    assert os.readlink(str(emu.dir / "sys")) == os.path.join("trees", "healthy")
    assert (emu.dir / "sys" / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "rate").read_text().strip() == \
        "400 Gb/sec (4X NDR)"
    one = ET.fromstring(emu("nvidia-smi", "-q", "-x", "-i", "3").stdout).findall("gpu")
    assert [g.get("id") for g in one] == ["00000000:5D:00.0"]
    topo = emu("nvidia-smi", "topo", "-m").stdout
    assert topo.startswith("\t\x1b[4mGPU0") and "NIC8: mlx5_8" in topo
    rows = {ln.split("\t")[0]: ln.split("\t")[1:] for ln in topo.splitlines() if ln.startswith("GPU")}
    assert rows["GPU0"][8] == "PIX" and rows["GPU0"][1] == "NV18" and rows["GPU0"][12] == "SYS"
    nvl = emu("nvidia-smi", "nvlink", "-s", "-i", "0").stdout
    assert nvl.count("53.125 GB/s") == 18
    csv = emu("nvidia-smi", "--query-gpu=index,name,memory.total,power.limit", "--format=csv,noheader,nounits").stdout
    assert csv.splitlines()[7] == "7, NVIDIA B300 SXM6 AC, 275040, 1100.00"
    bad = emu("nvidia-smi", "--query-gpu=bogus", "--format=csv", check=False)
    assert bad.returncode == 2 and "not a valid field" in bad.stderr
    loop = emu("nvidia-smi", "--query-gpu=index,temperature.gpu", "--format=csv", "-lms", "10", "-i", "0",
               extra_env={"HWEMU_MAX_LOOPS": "3"}).stdout.splitlines()
    assert loop[0] == "index, temperature.gpu" and len(loop) == 4
    dm = emu("nvidia-smi", "dmon", "-s", "pucvmet", "-c", "2").stdout.splitlines()
    assert dm[0].startswith("# gpu") and len(dm) == 2 + 16
    assert emu("nvidia-smi", "-L").stdout.count("NVIDIA B300 SXM6 AC") == 8
    assert "Driver Version: 580.159.04" in emu("nvidia-smi").stdout
    ib = emu("ibstat").stdout
    assert ib.count("CA type: MT4131") == 8 and ib.count("CA type: MT4129") == 1 and ib.count("Rate: 400") == 8
    assert emu("ibv_devinfo", "-d", "mlx5_2").stdout.count("vendor_part_id:\t\t\t4131") == 1
    assert emu("ofed_info", "-s").stdout == "OFED-internal-25.10-1.2.2:\n"
    assert emu("modinfo", "-F", "version", "mlx5_core").stdout == "25.10-1.2.2\n"
    assert "mlx_compat" in emu("modinfo", "-F", "depends", "mlx5_core").stdout
    assert "/updates/dkms/" in emu("modinfo", "-F", "filename", "mlx5_core").stdout
    fw = emu("mlxfwmanager", "--query").stdout
    assert fw.count("Status:           Up to date") == 9 and "FW (Running)" not in fw
    assert emu("mlxup", "--query").stdout == fw
    assert "FW Version:            40.47.1026" in emu("flint", "-d", "0000:1a:00.0", "query").stdout


def test_all_reduce_and_mpirun(emu, tmp_path):
    p = emu("all_reduce_perf", "-b", "1G", "-e", "4G", "-f", "2", "-g", "8", "-J", "out.json", scenario="healthy")
    js = json.load(open(str(tmp_path / "out.json")))
    assert [r["size"] for r in js["results"]] == [1 << 30, 2 << 30, 4 << 30]
    assert min(r["out_of_place"]["bus_bw"] for r in js["results"]) > 800
    assert "# Out of bounds values : 0 OK" in p.stdout and p.stdout.startswith("# Writing JSON output to out.json")
    avg = js["average_bus_bandwidth"]["bandwidth"]
    ok = emu("all_reduce_perf", "-b", "1G", "-e", "4G", "-g", "8", "-f", "2",
             extra_env={"NCCL_TESTS_MIN_BW": str(avg / 0.95)})
    assert ok.stdout.splitlines()[-4].endswith(" OK")
    low = emu("all_reduce_perf", "-b", "1G", "-e", "4G", "-g", "8", "-f", "2", check=False,
              extra_env={"NCCL_TESTS_MIN_BW": str(avg / 0.85)})
    assert low.returncode == 1 and low.stdout.splitlines()[-4].endswith(" FAILED")
    defaults = emu("all_reduce_perf").stdout
    assert "nGpus 1 minBytes 33554432 maxBytes 33554432 step: 1048576(bytes)" in defaults
    mp = emu("mpirun", "-np", "16", "-N", "8", "-H", "b300a,b300b", "-x", "NCCL_ALGO=Ring", "-x", "NCCL_DEBUG=INFO",
             "-x", "NCCL_IB_HCA==mlx5_0,mlx5_1", "--allow-run-as-root", "all_reduce_perf", "-b", "1G", "-e", "2G",
             "-f", "2", "-g", "1")
    assert mp.stdout.count("#  Rank") == 16 and " on      b300b device  7 " in mp.stdout
    assert "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [RO]" in mp.stdout
    rows = [ln.split() for ln in mp.stdout.splitlines() if ln and not ln.startswith("#") and "NCCL" not in ln]
    assert all(340 < float(r[7]) < 400 for r in rows)


def test_nccl_fault_scenarios(emu):
    slow = emu("all_reduce_perf", "-b", "4G", "-e", "4G", "-g", "8", scenario="nccl_slow").stdout
    row = [ln.split() for ln in slow.splitlines() if ln.strip().startswith("4294967296")][0]
    assert float(row[7]) < 350
    wr = emu("all_reduce_perf", "-b", "8M", "-e", "64M", "-f", "2", "-g", "8", scenario="nccl_wrong_results",
             check=False)
    assert wr.returncode == 1 and "# Out of bounds values : 248 FAILED" in wr.stdout
    emu("hwemu-scenario", "nccl_intermittent_hang")
    first = emu("all_reduce_perf", "-b", "1M", "-e", "2M", "-f", "2", "-g", "8")
    assert "Collective test concluded" in first.stdout
    with pytest.raises(subprocess.TimeoutExpired):
        emu("all_reduce_perf", "-b", "1M", "-e", "2M", "-f", "2", "-g", "8", timeout=2)
    third = emu("all_reduce_perf", "-b", "1M", "-e", "2M", "-f", "2", "-g", "8")
    assert "Collective test concluded" in third.stdout
    emu("hwemu-scenario", "nccl_intermittent_hang")  # resets the counter: next call passes again
    assert "Collective test concluded" in emu("all_reduce_perf", "-g", "8").stdout


def test_firmware_scenarios(emu):
    fw = emu("mlxfwmanager", "--query", scenario="cx8_fw_mismatch").stdout
    assert fw.count("Update required") == 1 and "40.44.1036" in fw
    assert (emu.dir / "sys" / "class" / "infiniband" / "mlx5_3" / "fw_ver").read_text().strip() == "40.44.1036"
    assert (emu.dir / "sys" / "class" / "infiniband" / "mlx5_2" / "fw_ver").read_text().strip() == "40.47.1026"
    pend = emu("mlxfwmanager", "--query", scenario="pending_fw_reset").stdout
    assert pend.count("FW (Running)   40.44.1036") == 1
    one = emu("mlxfwmanager", "--query", "-d", "mlx5_3").stdout
    assert "FW             40.47.1026" in one and "FW (Running)" in one and one.count("Device #") == 1
    assert "FW Version(Running):   40.44.1036" in emu("mstflint", "-d", "mlx5_3", "q").stdout
    assert "Firmware version: 40.44.1036" in emu("ibstat", "mlx5_3").stdout


def test_gpu_health_scenarios(emu):
    g5 = emu("nvidia-smi", "nvlink", "-s", "-i", "5", scenario="nvlink_down").stdout
    assert g5.count("<inactive>") == 2 and g5.count("53.125 GB/s") == 16
    q = emu("nvidia-smi", "--query-gpu=index,ecc.errors.uncorrected.volatile.total,remapped_rows.pending",
            "--format=csv,noheader", scenario="ecc_errors").stdout.splitlines()
    assert q[2] == "2, 3, Yes" and q[0] == "0, 0, No"


def _sample_while_burning(emu, env, query, done):
    """Start an emulated 600 s burn (time scale 0.05: at most 30 s of wall time), sample `query` every 0.1 s until
    done(row), then stop the burner the way systemd/timeout does (SIGTERM). A 2 s window missed every sample on a
    loaded CI machine (stop 44: the burner and each nvidia-smi start late there), so the window is wide and the wait
    ends as soon as the condition holds. Returns the last row, the burner's exit status and whether its load was
    gone afterwards."""
    burn = subprocess.Popen([str(emu.dir / "bin" / "gpu_burn"), "600"], env=env, stdout=subprocess.PIPE, text=True)
    row = None
    try:
        while burn.poll() is None:
            row = emu("nvidia-smi", "--query-gpu=" + query, "--format=csv,noheader,nounits", "-i", "0").stdout.strip().split(", ")
            if done(row):
                break
            time.sleep(0.1)
    finally:
        burn.terminate()
        burn.communicate(timeout=60)
    load_gone = not (emu.dir / "state" / "load.json").exists()
    return row, burn.returncode, load_gone


def test_thermal_load_stand_in(emu):
    emu("hwemu-scenario", "healthy")
    before = int(emu("nvidia-smi", "--query-gpu=temperature.gpu", "--format=csv,noheader", "-i", "0").stdout)
    env = dict(emu.env, HWEMU_TIME_SCALE="0.05")
    during, rc, load_gone = _sample_while_burning(emu, env, "temperature.gpu,utilization.gpu",
                                                  lambda r: int(r[0]) > before + 15 and r[1] == "100")
    assert int(during[0]) > before + 15 and during[1] == "100", (before, during)
    assert rc == 143 and load_gone, (rc, load_gone)     # a burner stopped early takes its load with it
    after = emu("nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-i", "0").stdout.strip()
    assert after == "0", after
    done = subprocess.run([str(emu.dir / "bin" / "gpu_burn"), "2"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "GPU 7: OK" in done.stdout, done
    emu("hwemu-scenario", "thermal_throttle")
    idle_t = int(emu("nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits", "-i", "0").stdout)
    row, _, _ = _sample_while_burning(emu, env, "temperature.gpu,clocks.sm,clocks_event_reasons.sw_thermal_slowdown",
                                      lambda r: int(r[0]) > 96 and int(r[1]) < idle_t and r[2] == "Active")
    assert int(row[0]) > 96 and int(row[1]) < idle_t and row[2] == "Active", (idle_t, row)


def test_h200_real_replays_captures(emu, real_fixtures):
    emu("hwemu-scenario", "h200_real")
    assert emu("nvidia-smi", "-q", "-x").stdout == (real_fixtures / "nvidia-h200-vm" / "q.xml").read_text()
    assert emu("nvidia-smi", "topo", "-m").stdout == (real_fixtures / "nvidia-h200-vm" / "topo.txt").read_text()
    assert emu("nvidia-smi", "nvlink", "-s").stdout == ""
    assert emu("ibstat", check=False).returncode == 127


# ----------------------------------------------------------------------------------------- triage stand-ins
def test_triage_kernel_log_window_formats_and_passthrough(emu):
    p = emu("journalctl", "-k", "-o", "short-iso", "--since", "-2h", scenario="cx8_fw_timeouts")
    lines = p.stdout.splitlines()
    tmo = [ln for ln in lines if "mlx5_core 0000:5f:00.0" in ln and ("No done completion" in ln or "Will cause a leak" in ln)]
    assert len(tmo) == 14 and all(" b300a kernel: " in ln for ln in tmo)
    assert not any("firmware version" in ln for ln in lines)          # boot lines are older than 2 h
    short = emu("journalctl", "-k", "--since", "-30min").stdout
    assert 2 <= sum("INIT2RTR_QP" in ln or "2ERR_QP" in ln or "MODIFY_CQ" in ln for ln in short.splitlines()) <= 6
    dm = emu("dmesg", "--time-format", "iso").stdout.splitlines()
    assert any("firmware version: 40.44.1036" in ln and "mlx5_core 0000:5f:00.0" in ln for ln in dm)
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d,\d{6}[+-]\d\d:\d\d ", dm[0])
    mono = emu("dmesg").stdout.splitlines()
    assert re.match(r"^\[\s*\d+\.\d{6}\] NVRM: loading", mono[0])
    bad = emu("journalctl", "-k", "--since", "yesterday-ish", check=False)
    assert bad.returncode == 1 and "Failed to parse timestamp" in bad.stderr


def test_triage_devlink_lspci_setpci_lsmod(emu):
    js = json.loads(emu("devlink", "-j", "health", "show", scenario="acs_enabled").stdout)
    assert js["health"]["pci/0000:5f:00.0"][1] == {"reporter": "fw_fatal", "grace_period": 1200000, "auto_recover": True,
                                                   "auto_dump": True, "state": "healthy", "error": 0, "recover": 0}
    txt = emu("devlink", "health", "show").stdout
    assert "pci/0000:1a:00.0:\n  reporter fw\n    state healthy error 0 recover 0 auto_dump true\n" in txt
    assert emu("devlink", "health", "diagnose", "pci/0000:1a:00.0", "reporter", "fw").stdout == " Syndrome: 0\n"
    lsp = emu("lspci", "-vvv", "-s", "0000:99:01.0").stdout
    assert "ACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-" in lsp
    every = emu("lspci", "-vvv").stdout
    assert every.count("ACSCtl:") == 33 and every.count("Kernel driver in use: mlx5_core") == 9
    assert emu("setpci", "-s", "0000:99:01.0", "ECAP_ACS+0x6.w").stdout == "001d\n"
    assert emu("setpci", "-s", "0000:98:00.0", "ECAP_ACS+0x6.w").stdout == "0000\n"
    assert emu("setpci", "-s", "0000:99:01.0", "ECAP_ACS+0x6.w=0000", check=False).returncode == 1
    assert "nvidia_peermem" in emu("lsmod").stdout
    assert "nvidia_peermem" not in emu("lsmod", scenario="peermem_missing").stdout
    tree = emu.dir / "sys"
    assert not (tree / "module" / "nvidia_peermem").exists()
    assert "nvidia_peermem" not in (emu.dir / "proc" / "modules").read_text()
    assert "iommu=pt" in (emu.dir / "proc" / "cmdline").read_text()



def test_triage_ethtool_stats_stand_in(emu, tmp_path):
    nd = "ibp%ds0" % (model.GPU_BUSES[2] + 2)
    txt = emu("ethtool", "-S", nd, scenario="healthy").stdout
    lines = txt.splitlines()
    # ethtool.c do_gstats: "NIC statistics:" then "     name: value" (the real captures' form)
    assert lines[0] == "NIC statistics:" and all(re.match(r"^     [a-z0-9_]+: \d+$", ln) for ln in lines[1:])
    assert "     rx_crc_errors_phy: 0" in lines and "     link_down_events_phy: 0" in lines
    assert "     rx_corrected_bits_phy: 112" in lines
    (emu.dir / "state" / "ethtool.json").write_text(json.dumps({nd: {"rx_symbol_err_phy": 7}}))
    assert "     rx_symbol_err_phy: 7" in emu("ethtool", "-S", nd).stdout.splitlines()
    bad = emu("ethtool", "-S", "nosuch0", check=False)
    assert bad.returncode == 96 and bad.stderr == "Cannot get stats strings information: No such device\n"
    assert emu("ethtool", "-s", nd, "speed", "100", check=False).returncode == 1   # nothing but -S is emulated

def test_triage_sysfs_overlay_counters_links_aer(emu):
    emu("hwemu-scenario", "ib_port_flap")
    tree = emu.dir / "sys"
    port = tree / "class" / "infiniband" / "mlx5_5" / "ports" / "1"
    assert (port / "counters" / "link_downed").read_text() == "6\n"
    assert (port / "hw_counters" / "local_ack_timeout_err").read_text() == "0\n"
    assert (tree / "bus" / "pci" / "devices" / "0000:ad:00.0" / "max_link_width").read_text() == "16\n"
    assert "TOTAL_ERR_NONFATAL 0" in (tree / "bus" / "pci" / "devices" / "0000:ad:00.0" / "aer_dev_nonfatal").read_text()
    assert (tree / "bus" / "pci" / "devices" / "0000:aa:01.0" / "current_link_width").read_text() == "16\n"
    assert os.path.realpath(tree / "bus" / "pci" / "devices" / "0000:ad:00.0" / "iommu_group").endswith("kernel/iommu_groups/173")
    emu("hwemu-scenario", "nic_pcie_x8")
    assert (tree / "bus" / "pci" / "devices" / "0000:bc:00.0" / "current_link_width").read_text() == "8\n"
    emu("hwemu-scenario", "pcie_aer_nonfatal")
    aer = (tree / "bus" / "pci" / "devices" / "0000:2c:00.0" / "aer_dev_nonfatal").read_text()
    assert "CmpltTO 3\n" in aer and "TOTAL_ERR_NONFATAL 3\n" in aer


def test_triage_ib_write_bw_loopback_and_nccl_through_one_nic(emu):
    emu("hwemu-scenario", "cx8_fw_timeouts")
    env = dict(emu.env)
    base = [str(emu.dir / "bin" / "ib_write_bw"), "-d", "mlx5_3", "--use_cuda=3", "-s", "8388608", "--report_gbits",
            "-p", "18600"]
    srv = subprocess.Popen(base, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cli = subprocess.run(base + ["127.0.0.1"], env=env, capture_output=True, text=True, timeout=30)
    sout, _err = srv.communicate(timeout=30)
    assert cli.returncode == 0 and srv.returncode == 0, (cli.stderr, _err)
    assert "* Waiting for client to connect... *" in sout and "Picking device No. 3" in cli.stdout
    row = [ln for ln in cli.stdout.splitlines() if ln.strip().startswith("8388608")]
    assert row and 380 < float(row[0].split()[3]) < 400
    hw = emu.dir / "sys" / "class" / "infiniband" / "mlx5_3" / "ports" / "1" / "hw_counters" / "local_ack_timeout_err"
    assert hw.read_text() == "%d\n" % (212 + 3412)
    nccl = {"NCCL_IB_HCA": "=mlx5_3", "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_DEBUG": "INFO"}
    first = emu("all_reduce_perf", "-b", "8M", "-e", "64M", "-g", "8", extra_env=nccl)
    big = [ln for ln in first.stdout.splitlines() if ln.strip().startswith("67108864")]
    assert big and 30 < float(big[0].split()[7]) < 45            # one 400G NIC carries every byte
    second = emu("all_reduce_perf", "-b", "8M", "-e", "64M", "-g", "8", extra_env=nccl, check=False)
    assert second.returncode != 0
    assert "status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_RDMA_WRITE(1) vendor_err=129 hca mlx5_3" in second.stdout
    assert hw.read_text() == "%d\n" % (212 + 3 * 3412)
    other = emu("all_reduce_perf", "-b", "8M", "-e", "64M", "-g", "8", extra_env=dict(nccl, NCCL_IB_HCA="=mlx5_2"))
    assert "NCCL WARN" not in other.stdout
    hw2 = emu.dir / "sys" / "class" / "infiniband" / "mlx5_2" / "ports" / "1" / "hw_counters" / "local_ack_timeout_err"
    assert hw2.read_text() == "0\n"
    p = emu(*(["ib_write_bw"] + base[1:] + ["127.0.0.1"]), scenario="peermem_missing", check=False)
    assert p.returncode == 1 and "Couldn't allocate MR" in p.stderr
