"""module_utils/hw/gpu_topology.py on the REAL H200 captures and on SYNTHESIZED B300 outputs (tests/fixtures/facts)."""

import pytest

from ansible_collections.b300.rollout.plugins.module_utils.hw import gpu_topology as gt

import synth  # the SYNTHESIZED fixture builder


def real(real_fixtures, machine, name):
    p = real_fixtures / machine / name
    return p.read_text() if p.exists() else ""


# ----------------------------------------------------------------- real captures
def test_real_1xh200(real_fixtures, tmp_path):
    t = gt.build_gpu_topology(real(real_fixtures, "nvidia-h200-vm", "q.xml"),
                              real(real_fixtures, "nvidia-h200-vm", "topo.txt"), "", sysfs_root=str(tmp_path))
    assert t["driver_version"] == "580.159.04"
    assert t["cuda_version"] == "13.0"
    assert t["gpu_count"] == 1
    g = t["gpus"][0]
    assert g["name"] == "NVIDIA H200"
    assert g["uuid"] == "GPU-7e8db16a-b945-87b2-2d77-854b90829753"
    assert g["pci_bus_id"] == "0000:00:06.0"
    assert g["numa_node"] == 0  # from topo NUMA Affinity; no sysfs under tmp_path
    assert g["memory_total_mib"] == 143771
    assert g["temperature_c"] == 37
    assert g["power_limit_w"] == 700.0
    # gpu_idle is active in the capture but is not a throttle reason
    assert g["clock_event_reasons_active"] == []
    assert g["throttled"] is False
    assert g["ecc"] == {"mode": "Enabled", "volatile_uncorrectable": 0, "aggregate_uncorrectable": 0,
                        "volatile_correctable": 0, "aggregate_correctable": 0}
    assert g["retired_pages"] == {"single_bit": None, "double_bit": None, "pending": None}  # all N/A
    assert g["remapped_rows"] == {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False}
    # the single PCIe-attached H200 reports no fabric (all N/A): None, and not a problem by default
    assert g["fabric"] == {"state": None, "status": None, "clique_id": None, "cluster_uuid": None,
                           "health": {k: None for k in g["fabric"]["health"]}}
    assert "bandwidth" in g["fabric"]["health"]
    # 580 on Hopper prints only T.Limit-relative thresholds: no absolute values invented
    assert (g["temp_slowdown_c"], g["temp_shutdown_c"], g["temp_max_gpu_c"]) == (None, None, None)
    assert g["temp_tlimit_c"] == 50
    # nvlink -s printed nothing on the 1-GPU machine
    assert g["nvlink"] == {"links_total": 0, "links_up": 0, "links_down": 0, "down_links": [], "speed_gbps": None}
    assert t["topology"] == {"nic_columns_present": False, "gpu_gpu": {}, "gpu_nic": {},
                             "cpu_affinity": {"0": "0-15"}, "numa_affinity": {"0": "0"}}
    assert t["problems"] == []


def test_real_2xh200_nvlink_and_topo(real_fixtures):
    t = gt.build_gpu_topology(real(real_fixtures, "nvidia-h200x2-vm", "q.xml"),
                              real(real_fixtures, "nvidia-h200x2-vm", "topo.txt"),
                              real(real_fixtures, "nvidia-h200x2-vm", "nvlink-s.txt"), sysfs_root="/nonexistent")
    assert t["gpu_count"] == 2
    assert [g["pci_bus_id"] for g in t["gpus"]] == ["0000:00:06.0", "0000:00:07.0"]
    for g in t["gpus"]:
        assert g["nvlink"] == {"links_total": 18, "links_up": 18, "links_down": 0, "down_links": [],
                               "speed_gbps": 26.562}
    assert t["topology"]["gpu_gpu"] == {"0": {"1": "NV18"}, "1": {"0": "NV18"}}
    assert t["topology"]["nic_columns_present"] is False
    assert t["topology"]["cpu_affinity"] == {"0": "0-31", "1": "0-31"}
    assert [g["fabric"]["state"] for g in t["gpus"]] == ["Completed", "Completed"]
    assert t["gpus"][1]["fabric"]["cluster_uuid"] == "00000000-0000-0000-0000-000000000000"
    assert t["problems"] == []


def test_real_topo_header_has_escape_codes(real_fixtures):
    raw = real(real_fixtures, "nvidia-h200x2-vm", "topo.txt")
    assert "\x1b[4m" in raw  # the capture really carries them
    parsed = gt.parse_topo(raw)
    assert parsed["gpu_gpu"]["0"] == {"1": "NV18"}
    assert parsed["numa_affinity"] == {"0": "0", "1": "0"}
    assert parsed["gpu_numa_id"] == {"0": None, "1": None}


def test_real_text_banner(real_fixtures):
    assert gt.parse_banner(real(real_fixtures, "nvidia-h200x2-vm", "smi.txt")) == {
        "driver_version": "580.159.04", "cuda_version": "13.0"}
    assert gt.parse_banner(real(real_fixtures, "nvidia-h200x2-vm", "q.txt")) == {
        "driver_version": "580.159.04", "cuda_version": "13.0"}


# ----------------------------------------------------------------- helpers
@pytest.mark.parametrize("raw,expected", [
    ("00000000:18:00.0", "0000:18:00.0"),
    ("00000000:AB:00.0", "0000:ab:00.0"),
    ("0000:1A:00.1", "0000:1a:00.1"),
    ("18:00.0", "0000:18:00.0"),
    ("00000001:18:00.0", "0001:18:00.0"),
])
def test_normalize_pci_bus_id(raw, expected):
    assert gt.normalize_pci_bus_id(raw) == expected


@pytest.mark.parametrize("text,driver,cuda", [
    ("| NVIDIA-SMI 610.43.02              KMD Version: 610.43.02     CUDA UMD Version: 13.3     |", "610.43.02", "13.3"),
    ("| NVIDIA-SMI 580.159.04             Driver Version: 580.159.04     CUDA Version: 13.0     |", "580.159.04", "13.0"),
    ("KMD Version                                            : 610.43.02\nCUDA UMD Version                    : 13.3",
     "610.43.02", "13.3"),
    ("no banner here", None, None),
])
def test_banner_variants(text, driver, cuda):
    assert gt.parse_banner(text) == {"driver_version": driver, "cuda_version": cuda}


# ----------------------------------------------------------------- synthesized B300
def test_synth_b300_healthy():
    t = gt.build_gpu_topology(synth.b300_xml(), synth.b300_topo(), synth.b300_nvlink(), sysfs_root="/nonexistent")
    assert t["gpu_count"] == 8
    assert {g["name"] for g in t["gpus"]} == {"NVIDIA B300 SXM6 AC"}
    assert t["gpus"][0]["pci_bus_id"] == synth.gpu_pci(0)
    assert [g["numa_node"] for g in t["gpus"]] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert all(g["nvlink"]["links_up"] == 18 and g["nvlink"]["speed_gbps"] == 53.125 for g in t["gpus"])
    assert t["topology"]["nic_columns_present"] is True
    assert t["topology"]["gpu_nic"]["3"]["mlx5_3"] == "PIX"
    assert t["topology"]["gpu_nic"]["3"]["mlx5_8"] == "NODE"
    assert t["topology"]["gpu_nic"]["5"]["mlx5_1"] == "SYS"
    assert t["topology"]["gpu_gpu"]["0"]["7"] == "NV18"
    assert t["topology"]["cpu_affinity"]["4"] == "56-111,168-223"
    assert t["gpus"][0]["fabric"]["clique_id"] == "32766"
    assert t["gpus"][0]["power_limit_w"] == 1100.0
    assert t["gpus"][0]["memory_total_mib"] == 275040
    assert t["problems"] == []


def test_r610_driver_without_driver_version_element_uses_banner():
    xml = synth.b300_xml(version_tags=None)
    banner = "| NVIDIA-SMI 610.43.02              KMD Version: 610.43.02     CUDA UMD Version: 13.3     |"
    t = gt.build_gpu_topology(xml, synth.b300_topo(), synth.b300_nvlink(), banner_text=banner)
    assert (t["driver_version"], t["cuda_version"]) == ("610.43.02", "13.3")
    # without a banner the versions stay unknown instead of being guessed
    t = gt.build_gpu_topology(xml, "", "")
    assert (t["driver_version"], t["cuda_version"]) == (None, None)


@pytest.mark.parametrize("tags", [("kmd_version", "cuda_umd_version"), ("driver_version", "cuda_version")])
def test_version_element_names(tags):
    smi = gt.parse_smi_xml(synth.b300_xml(driver_version="610.43.02", cuda_version="13.3", version_tags=tags))
    assert (smi["driver_version"], smi["cuda_version"]) == ("610.43.02", "13.3")


def test_absolute_temperature_thresholds():
    g = gt.parse_smi_xml(synth.b300_xml(n=1, absolute_temps=True))["gpus"][0]
    assert (g["temp_slowdown_c"], g["temp_shutdown_c"], g["temp_max_gpu_c"]) == (87, 92, 85)
    assert g["temp_tlimit_c"] is None


@pytest.mark.parametrize("old", [False, True])
def test_throttle_active_both_element_names(old):
    t = gt.build_gpu_topology(synth.b300_xml(throttle={2: ["hw_thermal_slowdown", "sw_thermal_slowdown"]},
                                             old_reason_tags=old), synth.b300_topo(), synth.b300_nvlink())
    g = t["gpus"][2]
    assert g["clock_event_reasons_active"] == ["hw_thermal_slowdown", "sw_thermal_slowdown"]
    assert g["throttled"] is True
    assert [x["throttled"] for x in t["gpus"]].count(True) == 1
    assert len(t["problems"]) == 1
    assert t["problems"][0].startswith("GPU 2 (%s): clocks throttled by hw_thermal_slowdown, sw_thermal_slowdown"
                                       % synth.gpu_pci(2))


def test_sync_boost_alone_is_not_throttling():
    g = gt.parse_smi_xml(synth.b300_xml(n=1, throttle={0: ["sync_boost"]}))["gpus"][0]
    assert g["clock_event_reasons_active"] == ["sync_boost"]
    assert g["throttled"] is False


def test_ecc_and_remapped_rows():
    t = gt.build_gpu_topology(synth.b300_xml(ecc_unc={2: (3, 5)}, remap={2: {"unc": 2, "pending": True}}),
                              synth.b300_topo(), synth.b300_nvlink())
    g = t["gpus"][2]
    assert g["ecc"]["volatile_uncorrectable"] == 3
    assert g["ecc"]["aggregate_uncorrectable"] == 5
    assert g["remapped_rows"] == {"correctable": 0, "uncorrectable": 2, "pending": True, "failure": False}
    assert len(t["problems"]) == 2
    assert "uncorrectable ECC errors: volatile 3, aggregate 5; expected 0" in t["problems"][0]
    assert "remap pending" in t["problems"][1]


def test_nvlink_down():
    t = gt.build_gpu_topology(synth.b300_xml(), synth.b300_topo(), synth.b300_nvlink(down={5: [3, 11]}))
    nv = t["gpus"][5]["nvlink"]
    assert nv == {"links_total": 18, "links_up": 16, "links_down": 2, "down_links": [3, 11], "speed_gbps": 53.125}
    assert t["problems"] == ["GPU 5 (%s): 2 NVLink links down (links 3, 11); expected 18 links up, 16 up"
                             % synth.gpu_pci(5)]


def test_nvlink_parse_inactive_and_empty():
    assert gt.parse_nvlink_status("") == {}
    parsed = gt.parse_nvlink_status("GPU 0: X (UUID: GPU-1)\n\t Link 0: 53.125 GB/s\n\t Link 1: <inactive>\n")
    assert parsed == {0: {0: 53.125, 1: None}}


def test_fabric_not_completed():
    t = gt.build_gpu_topology(synth.b300_xml(fabric_state="In Progress"), synth.b300_topo(), synth.b300_nvlink())
    assert len(t["problems"]) == 8
    assert "fabric state In Progress (status N/A), expected Completed" in t["problems"][0]


def test_topo_without_nic_columns_sysfs_numa_fallback(tmp_path):
    root = synth.make_sysfs(tmp_path)
    topo = synth.b300_topo(with_nics=False).replace("\t0\t\tN/A", "\tN/A\t\tN/A").replace("\t1\t\tN/A", "\tN/A\t\tN/A")
    t = gt.build_gpu_topology(synth.b300_xml(), topo, synth.b300_nvlink(), sysfs_root=root)
    assert t["topology"]["nic_columns_present"] is False
    assert t["topology"]["gpu_nic"] == {}
    assert t["topology"]["numa_affinity"]["0"] is None
    assert [g["numa_node"] for g in t["gpus"]] == [0, 0, 0, 0, 1, 1, 1, 1]  # from sysfs
    # no sysfs either: unknown, not guessed
    t = gt.build_gpu_topology(synth.b300_xml(), topo, synth.b300_nvlink(), sysfs_root=str(tmp_path / "none"))
    assert [g["numa_node"] for g in t["gpus"]] == [None] * 8


def test_missing_elements_and_na_tolerated():
    xml = ('<?xml version="1.0" ?><nvidia_smi_log><driver_version>N/A</driver_version>'
           '<gpu id="00000000:18:00.0"><product_name>NVIDIA B300 SXM6 AC</product_name>'
           '<temperature><gpu_temp>N/A</gpu_temp></temperature><fb_memory_usage><total>N/A</total></fb_memory_usage>'
           '</gpu></nvidia_smi_log>')
    t = gt.build_gpu_topology(xml, "", "")
    g = t["gpus"][0]
    assert t["driver_version"] is None
    assert g["pci_bus_id"] == "0000:18:00.0"  # from the id attribute
    assert g["temperature_c"] is None and g["memory_total_mib"] is None and g["uuid"] is None
    assert g["ecc"]["mode"] is None and g["ecc"]["volatile_uncorrectable"] is None
    assert g["remapped_rows"]["pending"] is None
    assert g["fabric"] == {"state": None, "status": None, "clique_id": None, "cluster_uuid": None, "health": {}}
    assert g["throttled"] is False
    assert t["problems"] == []


@pytest.mark.parametrize("bad", ["", "   ", "NVIDIA-SMI has failed because it couldn't communicate", "<other/>"])
def test_unreadable_xml_raises(bad):
    with pytest.raises(ValueError):
        gt.parse_smi_xml(bad)


def test_topo_space_separated_variant():
    topo = "        GPU0    GPU1    NIC0    CPU Affinity    NUMA Affinity\nGPU0     X      NV18    PIX     0-55    0\n" \
           "GPU1    NV18     X      SYS     56-111  1\n\nNIC Legend:\n\n  NIC0: mlx5_0\n"
    p = gt.parse_topo(topo)
    assert p["nic_columns_present"] is True
    assert p["gpu_nic"] == {"0": {"mlx5_0": "PIX"}, "1": {"mlx5_0": "SYS"}}
    assert p["numa_affinity"] == {"0": "0", "1": "1"}


# ----------------------------------------------------------------- health_problems (gpu_health_gate logic)
B300 = {"gpu_count": 8, "gpu_model": "NVIDIA B300 SXM6 AC", "nvlink_links": 18, "fabric_state": "Completed",
        "fabric_required": True}


def test_health_healthy_b300_has_no_problems():
    t = gt.build_gpu_topology(synth.b300_xml(), synth.b300_topo(), synth.b300_nvlink())
    assert gt.health_problems(t, B300, host="b300a") == []


def test_health_real_h200_against_b300_expectations(real_fixtures):
    t = gt.build_gpu_topology(real(real_fixtures, "nvidia-h200-vm", "q.xml"),
                              real(real_fixtures, "nvidia-h200-vm", "topo.txt"), "")
    probs = gt.health_problems(t, B300, host="h200")
    by = {p["check"]: p for p in probs}
    assert set(by) == {"gpu_count", "gpu_model", "nvlink", "fabric"}
    assert by["gpu_count"]["message"] == "h200: 1 GPUs visible to nvidia-smi, expected 8"
    assert by["gpu_count"]["gpu"] is None and by["gpu_count"]["pci"] is None
    assert by["gpu_model"]["message"] == "h200: GPU 0 (0000:00:06.0): model 'NVIDIA H200', expected 'NVIDIA B300 SXM6 AC'"
    assert by["nvlink"]["message"] == ("h200: GPU 0 (0000:00:06.0): 18 NVLink links down (no inactive links listed; "
                                       "18 links not reported); expected 18 links up, 0 up")
    assert by["fabric"]["message"] == (
        "h200: GPU 0 (0000:00:06.0): fabric state not reported (status N/A), expected Completed; fix: "
        "nvidia-fabricmanager running and done (systemctl status nvidia-fabricmanager; "
        "journalctl -u nvidia-fabricmanager)")
    assert all(p["severity"] == "fail" and p["host"] == "h200" for p in probs)


def test_health_real_2xh200_only_model_and_count(real_fixtures):
    t = gt.build_gpu_topology(real(real_fixtures, "nvidia-h200x2-vm", "q.xml"),
                              real(real_fixtures, "nvidia-h200x2-vm", "topo.txt"),
                              real(real_fixtures, "nvidia-h200x2-vm", "nvlink-s.txt"))
    exp = dict(B300, gpu_count=2, gpu_model="NVIDIA H200")
    assert gt.health_problems(t, exp) == []


def test_health_policies_warn_and_ignore():
    t = gt.build_gpu_topology(synth.b300_xml(n=7, throttle={1: ["hw_slowdown"]}), synth.b300_topo(n=7),
                              synth.b300_nvlink(n=7, down={4: [0]}))
    probs = gt.health_problems(t, B300, policies={"throttle": "warn", "nvlink": "ignore"}, host="b300b")
    assert [(p["check"], p["severity"], p["gpu"]) for p in probs] == [("gpu_count", "fail", None),
                                                                      ("throttle", "warn", 1)]
    assert probs[1]["pci"] == synth.gpu_pci(1)
    assert probs[1]["actual"] == ["hw_slowdown"]


def test_sw_power_cap_on_a_loaded_gpu_is_information_not_a_problem():
    # issue 12 item 9: a serving GPU sits at its power cap; hardware slowdown is a real problem
    t = gt.build_gpu_topology(synth.b300_xml(throttle={1: ["sw_power_cap"], 3: ["sw_power_cap", "hw_slowdown"]}),
                              synth.b300_topo(), synth.b300_nvlink())
    probs = gt.health_problems(t, B300, host="b300a")
    assert [(p["check"], p["gpu"], p["actual"]) for p in probs] == [("throttle", 3, ["hw_slowdown"])]
    assert t["gpus"][1]["throttled"] is False and t["gpus"][3]["throttled"] is True
    notes = gt.health_notes(t, B300, host="b300a")
    assert len(notes) == 2 and notes[0].startswith("b300a: GPU 1 (") and "sw_power_cap" in notes[0]
    # the list is data: counting sw_power_cap again makes it a problem
    strict = dict(B300, throttle_reasons=list(gt.DEFAULT_GATE_THROTTLE_REASONS) + ["sw_power_cap"])
    assert [p["gpu"] for p in gt.health_problems(t, strict)] == [1, 3]
    assert gt.health_notes(t, strict) == []


def test_gate_and_thermal_soak_count_the_same_reasons():
    from ansible_collections.b300.rollout.plugins.module_utils.health import thermal
    assert set(gt.DEFAULT_GATE_THROTTLE_REASONS) == set(thermal.DEFAULT_THROTTLE_REASONS)


def test_health_remap_failure_message():
    t = gt.build_gpu_topology(synth.b300_xml(remap={6: {"unc": 512, "failure": True}}), "", synth.b300_nvlink())
    (p,) = gt.health_problems(t, B300, host="b300a")
    assert p["check"] == "remapped_rows" and p["gpu"] == 6
    assert p["message"] == ("b300a: GPU 6 (%s): row remapping: remap failure (512 uncorrectable rows remapped); "
                            "expected no failure and nothing pending" % synth.gpu_pci(6))


# ----------------------------------------------------------------- topo -m vs sysfs affinity
def test_topo_and_sysfs_agree_no_disagreement(tmp_path):
    root = synth.make_sysfs(tmp_path)
    t = gt.build_gpu_topology(synth.b300_xml(), synth.b300_topo(), synth.b300_nvlink(), sysfs_root=root)
    assert t["affinity_disagreements"] == []
    assert t["topology"]["gpu_nic"]["3"]["mlx5_3"] == "PIX"


def test_topo_sysfs_disagreement_reported_and_sysfs_preferred(tmp_path):
    from ansible_collections.b300.rollout.plugins.module_utils.hw import affinity as af
    from ansible_collections.b300.rollout.plugins.module_utils.hw.rdma_nic import build_rdma_nics

    root = synth.make_sysfs(tmp_path)
    # topo -m claims GPU 0 sits under mlx5_1 (e.g. a shifted row); sysfs puts mlx5_0 under GPU 0's switch
    lines = synth.b300_topo().split("\n")
    gpu0 = next(i for i, ln in enumerate(lines) if ln.startswith("GPU0\t"))
    cells = lines[gpu0].split("\t")
    i0, i1 = 9, 10  # GPU0 <label>, 8 GPU cells, then NIC0, NIC1
    assert (cells[i0], cells[i1]) == ("PIX", "NODE")
    cells[i0], cells[i1] = cells[i1], cells[i0]
    lines[gpu0] = "\t".join(cells)
    topo = "\n".join(lines)
    assert gt.parse_topo(topo)["gpu_nic"]["0"]["mlx5_1"] == "PIX"
    t = gt.build_gpu_topology(synth.b300_xml(), topo, synth.b300_nvlink(), sysfs_root=root)
    (d,) = t["affinity_disagreements"]
    assert d["gpu"] == 0 and d["topo_nic"] == ["mlx5_1"] and d["sysfs_nic"] == ["mlx5_0"]
    assert "PCIe path" in d["reason"]
    assert t["topology"]["gpu_nic"]["0"]["mlx5_0"] == "PIX"
    rdma = build_rdma_nics(root)
    assert af.nearest_nics(t, rdma, [0], sysfs_root=root) == ["mlx5_0"]
    # without sysfs there is nothing to compare: topo stands, nothing reported
    t = gt.build_gpu_topology(synth.b300_xml(), topo, synth.b300_nvlink(), sysfs_root=str(tmp_path / "none"))
    assert t["affinity_disagreements"] == [] and t["topology"]["gpu_nic"]["0"]["mlx5_1"] == "PIX"
