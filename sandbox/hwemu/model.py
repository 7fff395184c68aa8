"""Model of an HGX B300 host with ConnectX-8 NICs, rendered into the output of the hardware tools.

Everything produced from ``base_state()`` is SYNTHESIZED (no public full B300/CX8 capture exists): the
layout of each output is copied from the REAL H200 captures in ``real/`` (nvidia-smi -q -x element names
and order, topo -m escape codes and legend, nccl-tests text/JSON layout); the values follow the facts in
the project's reference notes. Scenario ``h200_real`` replays the real 1xH200 captures unchanged.

stdlib only: this file runs on the sandbox hosts (python3, no packages).
"""
import copy
import hashlib
import json
import math
import os
import time
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
REAL_DIR = os.path.join(HERE, "real")
REAL_1X = os.path.join(REAL_DIR, "nvidia-h200-vm")
XML_TEMPLATE = os.path.join(REAL_DIR, "nvidia-h200x2-vm", "q.xml")

SYNTH_NOTE = ("SYNTHESIZED by b300-rollout sandbox/hwemu (scenario {scenario}): emulated HGX B300 + ConnectX-8, "
              "layout copied from real H200 captures, values invented. Not a capture from real hardware.")
FIXED_TIMESTAMP = "Sun Nov 29 16:43:41 2026"

GPU_BUSES = [0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB]
FM_NIC_BUS = 0xE1
NUMA_CPUS = {0: "0-55,112-167", 1: "56-111,168-223"}
KERNEL = "6.8.0-87-generic"

PHYS_STATE_CODES = {"Sleep": 1, "Polling": 2, "Disabled": 3, "PortConfigurationTraining": 4, "LinkUp": 5,
                    "LinkErrorRecovery": 6, "PhyTest": 7}

CLOCK_REASON_BITS = [
    ("gpu_idle", 0x1), ("applications_clocks_setting", 0x2), ("sw_power_cap", 0x4), ("hw_slowdown", 0x8),
    ("sync_boost", 0x10), ("sw_thermal_slowdown", 0x20), ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80), ("display_clocks_setting", 0x100),
]


def _h(*parts, n=32):
    return hashlib.sha256("/".join(str(p) for p in parts).encode()).hexdigest()[:n]


def _uuid(*parts):
    x = _h(*parts)
    return "%s-%s-%s-%s-%s" % (x[:8], x[8:12], x[12:16], x[16:20], x[20:32])


def _guid(*parts):
    # Mellanox OUI-style prefix b8:3f:d2
    return "b83fd203" + _h(*parts, n=8)


def pci_addr(bus, dev=0, fn=0):
    return "0000:%02x:%02x.%x" % (bus, dev, fn)


# --------------------------------------------------------------------------------------------- state
def base_state(hostname="b300a"):
    gpus = []
    for i, bus in enumerate(GPU_BUSES):
        numa = 0 if i < 4 else 1
        gpus.append({
            "index": i, "bus": bus, "numa": numa, "module_id": i + 1,
            "uuid": "GPU-" + _uuid(hostname, "gpu", i),
            "serial": str(1655024100000 + int(_h(hostname, "sn", i, n=6), 16) % 99999),
            "pdi": "0x" + _h(hostname, "pdi", i, n=16),
            "temp": 33 + (i * 3) % 5, "mem_temp": 35 + (i * 2) % 4,
            "power": 141.0 + (i * 7) % 19 + 0.37 * i, "idle": True, "util": 0,
            "sm_clock": 120, "mem_clock": 3996, "video_clock": 862,
            "reasons": set(), "reason_counters": {},
            "ecc": {"volatile": {"sram_correctable": 0, "sram_uncorrectable_parity": 0,
                                 "sram_uncorrectable_secded": 0, "dram_correctable": 0, "dram_uncorrectable": 0},
                    "aggregate": {"sram_correctable": 0, "sram_uncorrectable_parity": 0,
                                  "sram_uncorrectable_secded": 0, "dram_correctable": 0, "dram_uncorrectable": 0}},
            "remap": {"corr": 0, "unc": 0, "pending": False, "failure": False, "hist_max": 3072, "hist_high": 0},
            "recovery_action": "None",
            "nvlink_down": [],
        })
    nics = []
    for i, gbus in enumerate(GPU_BUSES):
        bus = gbus + 2
        nics.append({
            "name": "mlx5_%d" % i, "bus": bus, "pci": pci_addr(bus), "numa": 0 if i < 4 else 1,
            "model": "ConnectX-8", "device_id": "1023", "part_id": 4131, "hca_type": "MT4131",
            "fw": "40.47.1026", "fw_flashed": None, "fw_release_date": "10.11.2025",
            "psid": "MT_0000001217", "part_number": "900-9X81Q-00CN-ST0",
            "description": "NVIDIA ConnectX-8 SuperNIC; 800GbE/XDR IB (default mode) single-port OSFP; PCIe 6.0 x16",
            "device_type": "ConnectX8", "guid": _guid(hostname, "nic", i),
            "netdev": "ibp%ds0" % bus, "link_layer": "InfiniBand", "rate": "400 Gb/sec (4X NDR)", "rate_n": 400,
            "state": "ACTIVE", "phys_state": "LinkUp", "lid": 11 + i * 2 + (0 if hostname == "b300a" else 40),
            "sm_lid": 1, "role": "data", "gpu": i, "class": "0x020700",
            "pcie_width": 16,
        })
    nics.append({
        "name": "mlx5_8", "bus": FM_NIC_BUS, "pci": pci_addr(FM_NIC_BUS), "numa": 1,
        "model": "ConnectX-7", "device_id": "1021", "part_id": 4129, "hca_type": "MT4129",
        "fw": "28.47.1026", "fw_flashed": None, "fw_release_date": "10.11.2025",
        "psid": "MT_0000000838", "part_number": "MCX75310AAS-NEAT",
        "description": "NVIDIA ConnectX-7 HHHL adapter card; NVLink management / fabric manager port",
        "device_type": "ConnectX7", "guid": _guid(hostname, "nic", 8),
        "netdev": "enp%ds0np0" % FM_NIC_BUS, "link_layer": "Ethernet", "rate": "25 Gb/sec (1X EDR)", "rate_n": 25,
        "state": "ACTIVE", "phys_state": "LinkUp", "lid": 0, "sm_lid": 0, "role": "fabric_manager", "gpu": None,
        "class": "0x020000", "pcie_width": 16,
    })
    return {
        "scenario": "healthy", "hostname": hostname, "synthesized": True,
        "driver_version": "580.159.04", "cuda_version": "13.0", "banner": "580",
        "gpu_name": "NVIDIA B300 SXM6 AC", "architecture": "Blackwell", "compute_cap": "10.3",
        "pci_device_id": "3182", "vbios": "97.10.4B.00.02",
        "mem_total": 275040, "mem_reserved": 1146, "bar1_total": 524288,
        "power_limit": 1100.0, "power_min": 200.0,
        "max_sm_clock": 2032, "max_mem_clock": 3996, "max_video_clock": 1965,
        "temp_style": "tlimit",
        # absolute thresholds (C): tlimit 0 == max operating; slowdown at -2, shutdown at -8 (same offsets as H200)
        "thermal": {"max_op": 90, "slowdown": 92, "shutdown": 98, "mem_max": 95,
                    "load_temp": 74, "tau_s": 40.0, "throttle_at": 92},
        "clique_id": str(int(_h(hostname, "clique", n=4), 16) % 32768),
        "cluster_uuid": _uuid(hostname, "cluster"),
        "topo_nic_columns": True,
        "numa_cpus": dict(NUMA_CPUS),
        "ofed_version": "25.10-1.2.2", "ofed_info": "OFED-internal-25.10-1.2.2:", "kernel": KERNEL,
        "nvlink_speed": "53.125", "nvlink_count": 18,
        "gpus": gpus, "nics": nics,
        "nccl": {"peak_1node": 872.0, "lat_1node_us": 21.0, "peak_2node_ring": 371.0, "peak_2node_tree": 478.0,
                 "lat_2node_us": 38.0, "local_copy": 2650.0, "wrong": {}, "hang_on_call": None, "note": ""},
        # --- what the on-call triage reads (rendered by add_triage_tree / the kmsg, devlink, lspci stand-ins) ---
        # per device overrides; absent = healthy (zero counters, full links, no ACS, healthy reporters)
        "triage": {"counters": {}, "hw_counters": {}, "aer": {}, "devlink": {}, "acs": {}, "kmsg": [],
                   "peermem": True, "cmdline": "BOOT_IMAGE=/vmlinuz-%s root=/dev/md0 ro iommu=pt" % KERNEL,
                   "traffic": {}},
    }


def build_state(scenario="healthy", hostname="b300a"):
    from scenarios import SCENARIOS  # local import: scenarios.py lives next to this file
    if scenario not in SCENARIOS:
        raise KeyError("unknown scenario %r (known: %s)" % (scenario, ", ".join(SCENARIOS)))
    st = base_state(hostname)
    SCENARIOS[scenario](st)
    st["scenario"] = scenario
    return st


# --------------------------------------------------------------------------------------------- runtime load
def apply_load(st, load, now):
    """Adjust temperatures/clocks/power for a running gpu_burn stand-in.

    load: {"start": epoch, "duration": s, "gpus": [idx...]} or None. Temperatures follow a first-order rise
    toward thermal.load_temp; throttle reasons appear once a GPU passes thermal.throttle_at.
    """
    if not load:
        return st
    elapsed = now - load["start"]
    if elapsed < 0 or elapsed > load["duration"]:
        return st
    th = st["thermal"]
    for g in st["gpus"]:
        if load.get("gpus") and g["index"] not in load["gpus"]:
            continue
        frac = 1.0 - math.exp(-elapsed / th["tau_s"])
        target = th["load_temp"] + (g["index"] % 3) - 1
        g["temp"] = int(round(g["temp"] + (target - g["temp"]) * frac)) if target > g["temp"] else g["temp"] + int(3 * frac)
        g["mem_temp"] = g["temp"] + 3
        g["idle"] = False
        g["util"] = 100
        g["power"] = round(1010.0 + 9 * g["index"] + 20 * frac, 2)
        if g["temp"] >= th["throttle_at"]:
            g["reasons"] = set(g["reasons"]) | {"hw_thermal_slowdown", "sw_thermal_slowdown"}
            base = g["sm_clock"] if g["sm_clock"] > 500 else st["max_sm_clock"]
            g["sm_clock"] = max(780, int(base - 40 * max(0, g["temp"] - th["slowdown"]) - 150 * frac))
            g["reason_counters"] = dict(g["reason_counters"])
            g["reason_counters"]["sw_therm_slowdown"] = g["reason_counters"].get("sw_therm_slowdown", 0) + int(elapsed * 1e6)
        else:
            g["sm_clock"] = st["max_sm_clock"] - 15 * (g["index"] % 3)
            g["reasons"] = set(g["reasons"]) - {"gpu_idle"}
    return st


# --------------------------------------------------------------------------------------------- XML
def _template_gpu():
    root = ET.parse(XML_TEMPLATE).getroot()
    return root.find("gpu")


def _set(el, path, value):
    node = el.find(path)
    if node is None:
        raise KeyError(path)
    node.text = str(value)


def _reasons(g):
    active = set(g["reasons"])
    if g["idle"]:
        active.add("gpu_idle")
    return active


def reasons_mask(g):
    act = _reasons(g)
    return sum(bit for name, bit in CLOCK_REASON_BITS if name in act)


def nvlink_active(st, g):
    return st["nvlink_count"] - len(g["nvlink_down"])


def _temperature_children(st, g):
    th = st["thermal"]
    if st["temp_style"] == "absolute":
        return [("gpu_temp", "%d C" % g["temp"]), ("gpu_temp_max_threshold", "%d C" % th["shutdown"]),
                ("gpu_temp_slow_threshold", "%d C" % th["slowdown"]),
                ("gpu_temp_max_gpu_threshold", "%d C" % th["max_op"]), ("gpu_target_temperature", "N/A"),
                ("memory_temp", "%d C" % g["mem_temp"]), ("gpu_temp_max_mem_threshold", "%d C" % th["mem_max"])]
    return [("gpu_temp", "%d C" % g["temp"]), ("gpu_temp_tlimit", "%d C" % (th["max_op"] - g["temp"])),
            ("gpu_temp_max_tlimit_threshold", "%d C" % (th["max_op"] - th["shutdown"])),
            ("gpu_temp_slow_tlimit_threshold", "%d C" % (th["max_op"] - th["slowdown"])),
            ("gpu_temp_max_gpu_tlimit_threshold", "0 C"), ("gpu_target_temperature", "N/A"),
            ("memory_temp", "%d C" % g["mem_temp"]), ("gpu_temp_max_mem_tlimit_threshold", "0 C")]


def gpu_element(st, g, tmpl):
    e = copy.deepcopy(tmpl)
    e.set("id", "00000000:%02X:00.0" % g["bus"])
    def s(p, v):
        return _set(e, p, v)

    s("product_name", st["gpu_name"])
    s("product_architecture", st["architecture"])
    s("display_attached", "No")
    s("serial", g["serial"])
    s("uuid", g["uuid"])
    s("pdi", g["pdi"])
    s("minor_number", g["index"])
    s("vbios_version", st["vbios"])
    s("board_id", "0x%x" % (g["bus"] << 8))
    s("board_part_number", "692-2G525-0220-0C1")
    s("gpu_part_number", "%s-886-A1" % st["pci_device_id"])
    s("platformInfo/module_id", g["module_id"])
    s("inforom_version/img_version", "G525.0220.00.04")
    s("inforom_version/ecc_object", "7.20")
    s("gpu_virtualization_mode/virtualization_mode", "None")
    s("gpu_recovery_action", g["recovery_action"])
    s("gsp_firmware_version", st["driver_version"])
    s("pci/pci_bus", "%02X" % g["bus"])
    s("pci/pci_device", "00")
    s("pci/pci_device_id", "%s10DE" % st["pci_device_id"])
    s("pci/pci_bus_id", "00000000:%02X:00.0" % g["bus"])
    s("pci/pci_sub_system_id", "20E810DE")
    for p in ("max_link_gen", "current_link_gen", "device_current_link_gen", "max_device_link_gen"):
        s("pci/pci_gpu_link_info/pcie_gen/" + p, 6)
    s("pci/tx_util", "%d KB/s" % (900 + 37 * g["index"]))
    s("pci/rx_util", "%d KB/s" % (500 + 23 * g["index"]))
    act = _reasons(g)
    for c in e.find("clocks_event_reasons"):
        name = c.tag[len("clocks_event_reason_"):]
        c.text = "Active" if name in act else "Not Active"
    for c in e.find("clocks_event_reasons_counters"):
        name = c.tag[len("clocks_event_reasons_counters_"):]
        c.text = "%d us" % g["reason_counters"].get(name, 0)
    used = 0 if g["idle"] else 262144
    s("fb_memory_usage/total", "%d MiB" % st["mem_total"])
    s("fb_memory_usage/reserved", "%d MiB" % st["mem_reserved"])
    s("fb_memory_usage/used", "%d MiB" % used)
    s("fb_memory_usage/free", "%d MiB" % (st["mem_total"] - st["mem_reserved"] - used))
    s("bar1_memory_usage/total", "%d MiB" % st["bar1_total"])
    s("bar1_memory_usage/free", "%d MiB" % (st["bar1_total"] - 1))
    s("utilization/gpu_util", "%d %%" % g["util"])
    s("utilization/memory_util", "%d %%" % (g["util"] // 2))
    for kind in ("volatile", "aggregate"):
        for k, v in g["ecc"][kind].items():
            s("ecc_errors/%s/%s" % (kind, k), v)
    r = g["remap"]
    s("remapped_rows/remapped_row_corr", r["corr"])
    s("remapped_rows/remapped_row_unc", r["unc"])
    s("remapped_rows/remapped_row_pending", "Yes" if r["pending"] else "No")
    s("remapped_rows/remapped_row_failure", "Yes" if r["failure"] else "No")
    s("remapped_rows/row_remapper_histogram/row_remapper_histogram_max", "%d bank(s)" % r["hist_max"])
    s("remapped_rows/row_remapper_histogram/row_remapper_histogram_high", "%d bank(s)" % r["hist_high"])
    temp = e.find("temperature")
    for c in list(temp):
        temp.remove(c)
    for tag, val in _temperature_children(st, g):
        ET.SubElement(temp, tag).text = val
    pl = "%.2f W" % st["power_limit"]
    s("gpu_power_readings/average_power_draw", "%.2f W" % (g["power"] + 4.1))
    s("gpu_power_readings/instant_power_draw", "%.2f W" % g["power"])
    for p in ("current_power_limit", "requested_power_limit", "default_power_limit", "max_power_limit"):
        s("gpu_power_readings/" + p, pl)
    s("gpu_power_readings/min_power_limit", "%.2f W" % st["power_min"])
    s("gpu_memory_power_readings/average_power_draw", "%.2f W" % (g["power"] * 0.31))
    s("clocks/graphics_clock", "%d MHz" % g["sm_clock"])
    s("clocks/sm_clock", "%d MHz" % g["sm_clock"])
    s("clocks/mem_clock", "%d MHz" % g["mem_clock"])
    s("clocks/video_clock", "%d MHz" % g["video_clock"])
    for p in ("applications_clocks", "default_applications_clocks"):
        s(p + "/graphics_clock", "%d MHz" % st["max_sm_clock"])
        s(p + "/mem_clock", "%d MHz" % st["max_mem_clock"])
    s("max_clocks/graphics_clock", "%d MHz" % st["max_sm_clock"])
    s("max_clocks/sm_clock", "%d MHz" % st["max_sm_clock"])
    s("max_clocks/mem_clock", "%d MHz" % st["max_mem_clock"])
    s("max_clocks/video_clock", "%d MHz" % st["max_video_clock"])
    s("max_customer_boost_clocks/graphics_clock", "%d MHz" % st["max_sm_clock"])
    degraded = bool(g["nvlink_down"])
    fabric_done = st.get("fabric_state", "Completed") == "Completed"
    s("fabric/state", "Completed" if fabric_done else "In Progress")
    s("fabric/status", "Success" if fabric_done else "N/A")
    # a host whose installed stack never let the fabric register (hoststack.py): no clique, no cluster, health N/A,
    # as the real In Progress block of gpu-operator #2511 prints (tests/fixtures/real-world/host_stack)
    unregistered = not fabric_done and st.get("hoststack") is not None
    s("fabric/cliqueId", "N/A" if unregistered else st["clique_id"])
    s("fabric/clusterUuid", "N/A" if unregistered else st["cluster_uuid"])
    health = {"summary": "Limited Capacity" if degraded else "Healthy",
              "bandwidth": "Degraded" if degraded else "Full",
              "route_recovery_in_progress": "False", "route_unhealthy": "False",
              "access_timeout_recovery": "False", "incorrect_configuration": "None", "partition_assigned": "N/A"}
    health.update(g.get("fabric_health") or {})
    if unregistered:
        health["summary"] = "N/A"
    for k, v in health.items():
        s("fabric/health/" + k, v)
    sc = e.find("supported_clocks")
    for c in list(sc):
        sc.remove(c)
    for mem in (st["max_mem_clock"], 2619):
        m = ET.SubElement(sc, "supported_mem_clock")
        ET.SubElement(m, "value").text = "%d MHz" % mem
        for clk in range(st["max_sm_clock"], 119, -16 if st["max_sm_clock"] % 16 == 0 else -15):
            ET.SubElement(m, "supported_graphics_clock").text = "%d MHz" % clk
    return e


def _ser(el, depth, out):
    ind = "\t" * depth
    attrs = "".join(' %s="%s"' % (k, v) for k, v in el.attrib.items())
    kids = list(el)
    if kids:
        out.append("%s<%s%s>" % (ind, el.tag, attrs))
        for c in kids:
            _ser(c, depth + 1, out)
        out.append("%s</%s>" % (ind, el.tag))
    else:
        text = el.text or ""
        if "\n" in text:
            out.append("%s<%s%s>" % (ind, el.tag, attrs))
            if text.strip():
                out.append(ind + "\t" + text.strip())
            out.append("%s</%s>" % (ind, el.tag))
        else:
            t = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            out.append("%s<%s%s>%s</%s>" % (ind, el.tag, attrs, t, el.tag))


def serialize_smi_xml(header, gpus, comment=None):
    """Write nvidia-smi -q -x layout: header dict (timestamp, driver_version, cuda_version, attached_gpus)."""
    out = ['<?xml version="1.0" ?>', '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">', "<nvidia_smi_log>"]
    if comment:
        out.append("\t<!-- %s -->" % comment)
    for k in ("timestamp", "driver_version", "cuda_version", "attached_gpus"):
        out.append("\t<%s>%s</%s>" % (k, header[k], k))
    for g in gpus:
        _ser(g, 1, out)
        out.append("")
    out.append("</nvidia_smi_log>")
    return "\n".join(out) + "\n"


def render_xml(st, timestamp=FIXED_TIMESTAMP, only=None):
    tmpl = _template_gpu()
    gl = [g for g in st["gpus"] if only is None or g["index"] in only]
    els = [gpu_element(st, g, tmpl) for g in gl]
    hdr = {"timestamp": timestamp, "driver_version": st["driver_version"], "cuda_version": st["cuda_version"],
           "attached_gpus": len(st["gpus"])}
    return serialize_smi_xml(hdr, els, SYNTH_NOTE.format(scenario=st["scenario"]))


# --------------------------------------------------------------------------------------------- -q text
_LABELS = {
    "product_name": "Product Name", "product_brand": "Product Brand", "product_architecture": "Product Architecture",
    "display_mode": "Display Mode", "display_attached": "Display Attached", "display_active": "Display Active",
    "persistence_mode": "Persistence Mode", "addressing_mode": "Addressing Mode", "mig_mode": "MIG Mode",
    "current_mig": "Current", "pending_mig": "Pending", "accounting_mode": "Accounting Mode",
    "accounting_mode_buffer_size": "Accounting Mode Buffer Size", "driver_model": "Driver Model",
    "current_dm": "Current", "pending_dm": "Pending", "serial": "Serial Number", "uuid": "GPU UUID",
    "pdi": "GPU PDI", "minor_number": "Minor Number", "vbios_version": "VBIOS Version",
    "multigpu_board": "MultiGPU Board", "board_id": "Board ID", "board_part_number": "Board Part Number",
    "gpu_part_number": "GPU Part Number", "gpu_fru_part_number": "FRU Part Number", "platformInfo": "Platform Info",
    "chassis_serial_number": "Chassis Serial Number", "slot_number": "Slot Number", "tray_index": "Tray Index",
    "host_id": "Host ID", "peer_type": "Peer Type", "module_id": "Module Id", "gpu_fabric_guid": "GPU Fabric GUID",
    "inforom_version": "Inforom Version", "img_version": "Image Version", "oem_object": "OEM Object",
    "ecc_object": "ECC Object", "pwr_object": "Power Management Object",
    "inforom_bbx_flush": "Inforom BBX Object Flush", "latest_timestamp": "Latest Timestamp",
    "latest_duration": "Latest Duration", "gpu_operation_mode": "GPU Operation Mode", "current_gom": "Current",
    "pending_gom": "Pending", "c2c_mode": "GPU C2C Mode", "gpu_virtualization_mode": "GPU Virtualization Mode",
    "virtualization_mode": "Virtualization Mode", "host_vgpu_mode": "Host VGPU Mode",
    "vgpu_heterogeneous_mode": "vGPU Heterogeneous Mode", "gpu_recovery_action": "GPU Recovery Action",
    "gsp_firmware_version": "GSP Firmware Version", "ibmnpu": "IBMNPU", "relaxed_ordering_mode": "Relaxed Ordering Mode",
    "pci": "PCI", "pci_bus": "Bus", "pci_device": "Device", "pci_domain": "Domain", "pci_base_class": "Base Classcode",
    "pci_sub_class": "Sub Classcode", "pci_device_id": "Device Id", "pci_bus_id": "Bus Id",
    "pci_sub_system_id": "Sub System Id", "pci_gpu_link_info": "GPU Link Info", "pcie_gen": "PCIe Generation",
    "max_link_gen": "Max", "current_link_gen": "Current", "device_current_link_gen": "Device Current",
    "max_device_link_gen": "Device Max", "max_host_link_gen": "Host Max", "link_widths": "Link Width",
    "max_link_width": "Max", "current_link_width": "Current", "pci_bridge_chip": "Bridge Chip",
    "bridge_chip_type": "Type", "bridge_chip_fw": "Firmware", "replay_counter": "Replays Since Reset",
    "replay_rollover_counter": "Replay Number Rollovers", "tx_util": "Tx Throughput", "rx_util": "Rx Throughput",
    "atomic_caps_outbound": "Atomic Caps Outbound", "atomic_caps_inbound": "Atomic Caps Inbound",
    "fan_speed": "Fan Speed", "performance_state": "Performance State", "clocks_event_reasons": "Clocks Event Reasons",
    "clocks_event_reason_gpu_idle": "Idle", "clocks_event_reason_applications_clocks_setting": "Applications Clocks Setting",
    "clocks_event_reason_sw_power_cap": "SW Power Cap", "clocks_event_reason_hw_slowdown": "HW Slowdown",
    "clocks_event_reason_hw_thermal_slowdown": "    HW Thermal Slowdown",
    "clocks_event_reason_hw_power_brake_slowdown": "    HW Power Brake Slowdown",
    "clocks_event_reason_sync_boost": "Sync Boost", "clocks_event_reason_sw_thermal_slowdown": "SW Thermal Slowdown",
    "clocks_event_reason_display_clocks_setting": "Display Clock Setting",
    "clocks_event_reasons_counters": "Clocks Event Reasons Counters",
    "clocks_event_reasons_counters_sw_power_cap": "SW Power Capping",
    "clocks_event_reasons_counters_sync_boost": "Sync Boost",
    "clocks_event_reasons_counters_sw_therm_slowdown": "SW Thermal Slowdown",
    "clocks_event_reasons_counters_hw_therm_slowdown": "HW Thermal Slowdown",
    "clocks_event_reasons_counters_hw_power_brake": "HW Power Braking",
    "sparse_operation_mode": "Sparse Operation Mode", "fb_memory_usage": "FB Memory Usage", "total": "Total",
    "reserved": "Reserved", "used": "Used", "free": "Free", "bar1_memory_usage": "BAR1 Memory Usage",
    "cc_protected_memory_usage": "Conf Compute Protected Memory Usage", "compute_mode": "Compute Mode",
    "utilization": "Utilization", "gpu_util": "GPU", "memory_util": "Memory", "encoder_util": "Encoder",
    "decoder_util": "Decoder", "jpeg_util": "JPEG", "ofa_util": "OFA", "encoder_stats": "Encoder Stats",
    "session_count": "Active Sessions", "average_fps": "Average FPS", "average_latency": "Average Latency",
    "fbc_stats": "FBC Stats", "dram_encryption_mode": "DRAM Encryption Mode", "current_dram_encryption": "Current",
    "pending_dram_encryption": "Pending", "ecc_mode": "ECC Mode", "current_ecc": "Current", "pending_ecc": "Pending",
    "ecc_errors": "ECC Errors", "volatile": "Volatile", "aggregate": "Aggregate",
    "sram_correctable": "SRAM Correctable", "sram_uncorrectable_parity": "SRAM Uncorrectable Parity",
    "sram_uncorrectable_secded": "SRAM Uncorrectable SEC-DED", "dram_correctable": "DRAM Correctable",
    "dram_uncorrectable": "DRAM Uncorrectable", "sram_threshold_exceeded": "SRAM Threshold Exceeded",
    "aggregate_uncorrectable_sram_sources": "Aggregate Uncorrectable SRAM Sources", "sram_l2": "SRAM L2",
    "sram_sm": "SRAM SM", "sram_microcontroller": "SRAM Microcontroller", "sram_pcie": "SRAM PCIE",
    "sram_other": "SRAM Other", "channel_repair_pending": "Channel Repair Pending",
    "tpc_repair_pending": "TPC Repair Pending", "unrepairable_memory": "Unrepairable Memory",
    "retired_pages": "Retired Pages", "remapped_rows": "Remapped Rows", "remapped_row_corr": "Correctable Error",
    "remapped_row_corr_inactive": "Inactive Correctable Error", "remapped_row_unc": "Uncorrectable Error",
    "remapped_row_unc_inactive": "Inactive Uncorrectable Error", "remapped_row_pending": "Pending",
    "remapped_row_failure": "Remapping Failure Occurred", "row_remapper_histogram": "Bank Remap Availability Histogram",
    "row_remapper_histogram_max": "Max", "row_remapper_histogram_high": "High",
    "row_remapper_histogram_partial": "Partial", "row_remapper_histogram_low": "Low",
    "row_remapper_histogram_none": "None", "temperature": "Temperature", "gpu_temp": "GPU Current Temp",
    "gpu_temp_tlimit": "GPU T.Limit Temp", "gpu_temp_max_tlimit_threshold": "GPU Shutdown T.Limit Temp",
    "gpu_temp_slow_tlimit_threshold": "GPU Slowdown T.Limit Temp",
    "gpu_temp_max_gpu_tlimit_threshold": "GPU Max Operating T.Limit Temp",
    "gpu_target_temperature": "GPU Target Temperature", "memory_temp": "Memory Current Temp",
    "gpu_temp_max_mem_tlimit_threshold": "Memory Max Operating T.Limit Temp",
    "gpu_temp_max_threshold": "GPU Shutdown Temp", "gpu_temp_slow_threshold": "GPU Slowdown Temp",
    "gpu_temp_max_gpu_threshold": "GPU Max Operating Temp", "gpu_temp_max_mem_threshold": "Memory Max Operating Temp",
    "supported_gpu_target_temp": None, "gpu_power_readings": "GPU Power Readings", "power_state": None,
    "average_power_draw": "Average Power Draw", "instant_power_draw": "Instantaneous Power Draw",
    "current_power_limit": "Current Power Limit", "requested_power_limit": "Requested Power Limit",
    "default_power_limit": "Default Power Limit", "min_power_limit": "Min Power Limit",
    "max_power_limit": "Max Power Limit", "gpu_memory_power_readings": "GPU Memory Power Readings ",
    "module_power_readings": "Module Power Readings", "power_smoothing": "Power Smoothing",
    "power_profiles": "Workload Power Profiles", "power_profile_requested_profiles": "Requested Profiles",
    "power_profile_enforced_profiles": "Enforced Profiles", "clocks": "Clocks", "graphics_clock": "Graphics",
    "sm_clock": "SM", "mem_clock": "Memory", "video_clock": "Video", "applications_clocks": "Applications Clocks",
    "default_applications_clocks": "Default Applications Clocks", "deferred_clocks": "Deferred Clocks",
    "max_clocks": "Max Clocks", "max_customer_boost_clocks": "Max Customer Boost Clocks",
    "clock_policy": "Clock Policy", "auto_boost": "Auto Boost", "auto_boost_default": "Auto Boost Default",
    "fabric": "Fabric", "state": "State", "status": "Status", "cliqueId": "CliqueId", "clusterUuid": "ClusterUUID",
    "health": "Health", "summary": "Summary", "bandwidth": "Bandwidth",
    "route_recovery_in_progress": "Route Recovery in progress", "route_unhealthy": "Route Unhealthy",
    "access_timeout_recovery": "Access Timeout Recovery", "incorrect_configuration": "Incorrect Configuration",
    "partition_assigned": "Partition Assigned", "supported_clocks": None, "processes": "Processes",
    "accounted_processes": None, "capabilities": "Capabilities", "egm": "EGM",
}


_HEX_TEXT = {"pci_bus", "pci_device", "pci_domain", "pci_base_class", "pci_sub_class", "pci_device_id",
             "pci_sub_system_id"}


def _qtext(el, depth, out):
    for c in el:
        label = _LABELS.get(c.tag, c.tag.replace("_", " ").title())
        if label is None:
            continue
        ind = "    " * depth
        if c.tag == "retired_pages":
            out.append(ind + "Retired Pages")
            for sub, lab in (("multiple_single_bit_retirement", "Single Bit ECC"),
                             ("double_bit_retirement", "Double Bit ECC")):
                out.append("%s    %-*s: %s" % (ind, 51 - 4 * depth, lab, c.findtext(sub + "/retired_count")))
            out.append("%s    %-*s: %s" % (ind, 51 - 4 * depth, "Pending Page Blacklist", c.findtext("pending_blacklist")))
            continue
        if c.tag == "processes":
            out.append("%s%-*s: %s" % (ind, 55 - 4 * depth, label, "None"))
            continue
        if c.tag == "mig_devices":
            continue
        if len(c):
            extra = label[: len(label) - len(label.lstrip())]
            out.append(ind + label)
            _qtext(c, depth + 1 + len(extra) // 4, out)
        else:
            width = 55 - 4 * depth
            val = (c.text or "").strip()
            if c.tag in _HEX_TEXT:
                val = "0x" + val
            out.append("%s%-*s: %s" % (ind, width, label, val))


def render_q_text(st, timestamp=FIXED_TIMESTAMP, only=None):
    xml = render_xml(st, timestamp, only)
    root = ET.fromstring(xml)
    out = ["", "==============NVSMI LOG==============", "",
           "%-55s: %s" % ("Timestamp", timestamp)]
    if st["banner"] == "r610":
        out += ["%-55s: %s" % ("KMD Version", st["driver_version"]), "%-55s: %s" % ("CUDA UMD Version", st["cuda_version"])]
    else:
        out += ["%-55s: %s" % ("Driver Version", st["driver_version"]), "%-55s: %s" % ("CUDA Version", st["cuda_version"])]
    out += ["", "%-55s: %d" % ("Attached GPUs", len(st["gpus"]))]
    for g in root.findall("gpu"):
        out.append("GPU " + g.get("id"))
        _qtext(g, 1, out)
        out.append("")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------------- smi table, -L, query
def render_smi_table(st, timestamp=FIXED_TIMESTAMP):
    sep = "+-----------------------------------------+------------------------+----------------------+"
    if st["banner"] == "r610":
        top = "| NVIDIA-SMI %-21s KMD Version: %-12s CUDA UMD Version: %-6s |" % (
            st["driver_version"], st["driver_version"], st["cuda_version"])
    else:
        top = "| NVIDIA-SMI %-22s Driver Version: %-14s CUDA Version: %-8s |" % (
            st["driver_version"], st["driver_version"], st["cuda_version"])
    out = ["%s       " % timestamp, "+" + "-" * 89 + "+", top, sep,
           "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
           "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
           "|                                         |                        |               MIG M. |",
           "|=========================================+========================+======================|"]
    for g in st["gpus"]:
        used = 0 if g["idle"] else 262144
        name = st["gpu_name"]
        out.append("| %3d  %-26s %6s  |   00000000:%02X:00.0 Off | %20d |" % (
            g["index"], name[:26], "On", g["bus"], g["ecc"]["volatile"]["dram_uncorrectable"]))
        out.append("| N/A   %2dC    P0 %15s / %4dW | %22s | %6d%%      Default |" % (
            g["temp"], "%dW" % g["power"], st["power_limit"], "%dMiB / %dMiB" % (used, st["mem_total"]), g["util"]))
        out.append("|                                         |                        |             Disabled |")
        out.append(sep)
    out += ["", "+" + "-" * 89 + "+",
            "| Processes:                                                                              |",
            "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
            "|        ID   ID                                                               Usage      |",
            "|" + "=" * 89 + "|",
            "|  No running processes found                                                             |",
            "+" + "-" * 89 + "+"]
    return "\n".join(out) + "\n"


def render_L(st):
    return "".join("GPU %d: %s (UUID: %s)\n" % (g["index"], st["gpu_name"], g["uuid"]) for g in st["gpus"])


def _qf(st, g):
    """field -> (header unit or None, value, unit suffix)"""
    mask = reasons_mask(g)
    act = _reasons(g)
    used = 0 if g["idle"] else 262144
    ecc = g["ecc"]
    unc_v = ecc["volatile"]["dram_uncorrectable"] + ecc["volatile"]["sram_uncorrectable_parity"] + ecc["volatile"]["sram_uncorrectable_secded"]
    unc_a = ecc["aggregate"]["dram_uncorrectable"] + ecc["aggregate"]["sram_uncorrectable_parity"] + ecc["aggregate"]["sram_uncorrectable_secded"]
    cor_v = ecc["volatile"]["dram_correctable"] + ecc["volatile"]["sram_correctable"]
    cor_a = ecc["aggregate"]["dram_correctable"] + ecc["aggregate"]["sram_correctable"]
    now = time.time()
    f = {
        "timestamp": (None, time.strftime("%Y/%m/%d %H:%M:%S.", time.localtime(now)) + "%03d" % (int(now * 1000) % 1000)),
        "index": (None, g["index"]), "count": (None, len(st["gpus"])), "name": (None, st["gpu_name"]),
        "uuid": (None, g["uuid"]), "serial": (None, g["serial"]), "pci.bus_id": (None, "00000000:%02X:00.0" % g["bus"]),
        "pci.domain": (None, "0x0000"), "pci.bus": (None, "0x%02X" % g["bus"]), "pci.device_id": (None, "0x%s10DE" % st["pci_device_id"]),
        "driver_version": (None, st["driver_version"]), "vbios_version": (None, st["vbios"]),
        "compute_cap": (None, st["compute_cap"]), "persistence_mode": (None, "Enabled"), "pstate": (None, "P0"),
        "memory.total": ("MiB", st["mem_total"]), "memory.used": ("MiB", used),
        "memory.reserved": ("MiB", st["mem_reserved"]),
        "memory.free": ("MiB", st["mem_total"] - st["mem_reserved"] - used),
        "temperature.gpu": (None, g["temp"]), "temperature.memory": (None, g["mem_temp"]),
        "temperature.gpu.tlimit": (None, st["thermal"]["max_op"] - g["temp"]),
        "utilization.gpu": ("%", g["util"]), "utilization.memory": ("%", g["util"] // 2),
        "clocks.current.sm": ("MHz", g["sm_clock"]), "clocks.current.graphics": ("MHz", g["sm_clock"]),
        "clocks.current.memory": ("MHz", g["mem_clock"]), "clocks.current.video": ("MHz", g["video_clock"]),
        "clocks.max.sm": ("MHz", st["max_sm_clock"]), "clocks.max.graphics": ("MHz", st["max_sm_clock"]),
        "clocks.max.memory": ("MHz", st["max_mem_clock"]),
        "power.draw": ("W", "%.2f" % g["power"]), "power.draw.instant": ("W", "%.2f" % g["power"]),
        "power.draw.average": ("W", "%.2f" % (g["power"] + 4.1)),
        "power.limit": ("W", "%.2f" % st["power_limit"]), "enforced.power.limit": ("W", "%.2f" % st["power_limit"]),
        "power.default_limit": ("W", "%.2f" % st["power_limit"]), "power.max_limit": ("W", "%.2f" % st["power_limit"]),
        "power.min_limit": ("W", "%.2f" % st["power_min"]),
        "ecc.mode.current": (None, "Enabled"), "ecc.mode.pending": (None, "Enabled"),
        "ecc.errors.uncorrected.volatile.total": (None, unc_v), "ecc.errors.uncorrected.aggregate.total": (None, unc_a),
        "ecc.errors.corrected.volatile.total": (None, cor_v), "ecc.errors.corrected.aggregate.total": (None, cor_a),
        "ecc.errors.uncorrected.volatile.dram": (None, ecc["volatile"]["dram_uncorrectable"]),
        "ecc.errors.uncorrected.aggregate.dram": (None, ecc["aggregate"]["dram_uncorrectable"]),
        "retired_pages.single_bit_ecc.count": (None, "[N/A]"), "retired_pages.double_bit.count": (None, "[N/A]"),
        "retired_pages.pending": (None, "[N/A]"),
        "remapped_rows.correctable": (None, g["remap"]["corr"]), "remapped_rows.uncorrectable": (None, g["remap"]["unc"]),
        "remapped_rows.pending": (None, "Yes" if g["remap"]["pending"] else "No"),
        "remapped_rows.failure": (None, "Yes" if g["remap"]["failure"] else "No"),
        "pcie.link.gen.current": (None, 6), "pcie.link.gen.max": (None, 6), "pcie.link.gen.gpucurrent": (None, 6),
        "pcie.link.width.current": (None, 16), "pcie.link.width.max": (None, 16),
        "mig.mode.current": (None, "Disabled"), "mig.mode.pending": (None, "Disabled"),
        "compute_mode": (None, "Default"), "fan.speed": ("%", "[N/A]"),
        "fabric.state": (None, st.get("fabric_state", "Completed")),
        "fabric.status": (None, "Success" if st.get("fabric_state", "Completed") == "Completed" else "N/A"),
        "clocks_event_reasons.active": (None, "0x%016x" % mask),
        "clocks_event_reasons.supported": (None, "0x%016x" % 0x1FF),
    }
    for name, _bit in CLOCK_REASON_BITS:
        val = "Active" if name in act else "Not Active"
        f["clocks_event_reasons." + name] = (None, val)
        f["clocks_throttle_reasons." + name] = (None, val)
    f["clocks_throttle_reasons.active"] = f["clocks_event_reasons.active"]
    f["clocks_event_reasons.hw_thermal_slowdown"] = (None, "Active" if "hw_thermal_slowdown" in act else "Not Active")
    aliases = {"gpu_name": "name", "gpu_uuid": "uuid", "gpu_serial": "serial", "gpu_bus_id": "pci.bus_id",
               "clocks.sm": "clocks.current.sm", "clocks.gr": "clocks.current.graphics",
               "clocks.mem": "clocks.current.memory", "clocks.max.gr": "clocks.max.graphics",
               "clocks.max.mem": "clocks.max.memory", "clocks.video": "clocks.current.video",
               "memory.reserved": "memory.reserved", "enforced.power.limit": "enforced.power.limit"}
    for a, b in aliases.items():
        f[a] = f[b]
    return f


class QueryError(Exception):
    pass


def render_query(st, fields, fmt_opts, only=None):
    fmt = set(fmt_opts)
    if "csv" not in fmt:
        raise QueryError('"--format" is required and must include "csv".')
    names = [x.strip() for x in fields.split(",") if x.strip()]
    out = []
    rows = []
    for g in st["gpus"]:
        if only is not None and g["index"] not in only:
            continue
        table = _qf(st, g)
        row = []
        for n in names:
            if n not in table:
                raise QueryError('Field "%s" is not a valid field to query.' % n)
            unit, val = table[n]
            sval = str(val)
            if unit and "nounits" not in fmt and not sval.startswith("["):
                sval = "%s %s" % (sval, unit)
            row.append(sval)
        rows.append(", ".join(row))
    if "noheader" not in fmt:
        hdr = []
        for n in names:
            unit = _qf(st, st["gpus"][0])[n][0]
            hdr.append("%s [%s]" % (n, unit) if unit else n)
        out.append(", ".join(hdr))
    out += rows
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------------- nvlink
def render_nvlink_status(st, only=None):
    out = []
    for g in st["gpus"]:
        if only is not None and g["index"] not in only:
            continue
        out.append("GPU %d: %s (UUID: %s)" % (g["index"], st["gpu_name"], g["uuid"]))
        for link in range(st["nvlink_count"]):
            if link in g["nvlink_down"]:
                out.append("\t Link %d: <inactive>" % link)
            else:
                out.append("\t Link %d: %s GB/s" % (link, st["nvlink_speed"]))
    return "\n".join(out) + ("\n" if out else "")


# --------------------------------------------------------------------------------------------- PCI tree
def pci_layout(st):
    """Return {pci_addr: {"path": devices-relative path, "kind": ...}} for every device and bridge.

    Per GPU/NIC pair one host bridge pci0000:RB -> root port RB:01.0 -> PCIe switch upstream port (RB+1):00.0
    -> downstream ports (RB+2):00.0 (GPU) and (RB+2):01.0 (CX8). The CX7 fabric-manager NIC hangs off its own
    root port pci0000:e0/0000:e0:01.0.
    """
    devs = {}
    for g, n in zip(st["gpus"], [x for x in st["nics"] if x["role"] == "data"]):
        rb = g["bus"] - 3
        hb = "pci0000:%02x" % rb
        rp = pci_addr(rb, 1)
        usp = pci_addr(rb + 1)
        dsp_g = pci_addr(rb + 2, 0)
        dsp_n = pci_addr(rb + 2, 1)
        base = [hb, rp, usp]
        devs[rp] = {"path": base[:2], "kind": "root_port", "numa": g["numa"]}
        devs[usp] = {"path": base, "kind": "switch_up", "numa": g["numa"]}
        devs[dsp_g] = {"path": base + [dsp_g], "kind": "switch_down", "numa": g["numa"]}
        devs[dsp_n] = {"path": base + [dsp_n], "kind": "switch_down", "numa": g["numa"]}
        devs[pci_addr(g["bus"])] = {"path": base + [dsp_g, pci_addr(g["bus"])], "kind": "gpu", "numa": g["numa"], "obj": g}
        devs[n["pci"]] = {"path": base + [dsp_n, n["pci"]], "kind": "nic", "numa": n["numa"], "obj": n}
    for n in st["nics"]:
        if n["role"] != "data":
            hb = "pci0000:%02x" % (n["bus"] - 1)
            rp = pci_addr(n["bus"] - 1, 1)
            devs[rp] = {"path": [hb, rp], "kind": "root_port", "numa": n["numa"]}
            devs[n["pci"]] = {"path": [hb, rp, n["pci"]], "kind": "nic", "numa": n["numa"], "obj": n}
    return devs


def pci_relation(path_a, path_b, numa_a, numa_b):
    """nvidia-smi topo class from two sysfs device paths (lists of components below devices/)."""
    if path_a == path_b:
        return "X"
    if path_a[0] != path_b[0]:
        return "NODE" if numa_a == numa_b else "SYS"
    common = 0
    for x, y in zip(path_a, path_b):
        if x != y:
            break
        common += 1
    if common == 1:
        return "PHB"
    # bridges below the common ancestor on the longer side (the device itself excluded)
    below = max(len(path_a), len(path_b)) - common - 1
    return "PIX" if below <= 1 else "PXB"


def topo_matrix(st):
    devs = pci_layout(st)
    gp = {g["index"]: devs[pci_addr(g["bus"])] for g in st["gpus"]}
    npth = {n["name"]: devs[n["pci"]] for n in st["nics"]}
    gpu_gpu, gpu_nic, nic_nic = {}, {}, {}
    for a in st["gpus"]:
        gpu_gpu[a["index"]] = {}
        for b in st["gpus"]:
            if a is b:
                gpu_gpu[a["index"]][b["index"]] = "X"
            else:
                gpu_gpu[a["index"]][b["index"]] = "NV%d" % min(nvlink_active(st, a), nvlink_active(st, b))
        gpu_nic[a["index"]] = {n["name"]: pci_relation(gp[a["index"]]["path"], npth[n["name"]]["path"],
                                                       a["numa"], n["numa"]) for n in st["nics"]}
    for a in st["nics"]:
        nic_nic[a["name"]] = {b["name"]: pci_relation(npth[a["name"]]["path"], npth[b["name"]]["path"],
                                                      a["numa"], b["numa"]) for b in st["nics"]}
    return gpu_gpu, gpu_nic, nic_nic


def render_topo(st):
    gpu_gpu, gpu_nic, nic_nic = topo_matrix(st)
    nics = st["nics"] if st["topo_nic_columns"] else []
    cols = ["GPU%d" % g["index"] for g in st["gpus"]] + ["NIC%d" % i for i in range(len(nics))]
    def cell(v):
        return " X " if v == "X" else v

    out = ["\t\x1b[4m" + "\t".join(cols + ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]) + "\x1b[0m"]
    for g in st["gpus"]:
        cells = [cell(gpu_gpu[g["index"]][h["index"]]) for h in st["gpus"]]
        cells += [cell(gpu_nic[g["index"]][n["name"]]) for n in nics]
        out.append("GPU%d\t" % g["index"] + "\t".join(cells) + "\t%s\t%d\t\tN/A" % (st["numa_cpus"][g["numa"]], g["numa"]))
    for i, n in enumerate(nics):
        cells = [cell(gpu_nic[g["index"]][n["name"]]) for g in st["gpus"]]
        cells += [cell(nic_nic[n["name"]][m["name"]]) for m in nics]
        out.append("NIC%d\t" % i + "\t".join(cells) + "\t\t\t")
    out += ["", "Legend:", "",
            "  X    = Self",
            "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)",
            "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node",
            "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)",
            "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)",
            "  PIX  = Connection traversing at most a single PCIe bridge",
            "  NV#  = Connection traversing a bonded set of # NVLinks"]
    if nics:
        out += ["", "NIC Legend:", ""] + ["  NIC%d: %s" % (i, n["name"]) for i, n in enumerate(nics)]
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------------- dmon
DMON_GROUPS = {
    "p": [("pwr", "W"), ("gtemp", "C"), ("mtemp", "C")],
    "u": [("sm", "%"), ("mem", "%"), ("enc", "%"), ("dec", "%"), ("jpg", "%"), ("ofa", "%")],
    "c": [("mclk", "MHz"), ("pclk", "MHz")],
    "v": [("pviol", "%"), ("tviol", "bool")],
    "m": [("fb", "MB"), ("bar1", "MB"), ("ccpm", "MB")],
    "e": [("sbecc", "errs"), ("dbecc", "errs"), ("pci", "errs")],
    "t": [("rxpci", "MB/s"), ("txpci", "MB/s")],
}


def dmon_header(groups):
    cols = [c for grp in "pucvmet" if grp in groups for c in DMON_GROUPS[grp]]
    h1 = "# gpu" + "".join(" %6s" % n for n, _ in cols) + " "
    h2 = "# Idx" + "".join(" %6s" % u for _, u in cols) + " "
    return h1, h2, cols


def dmon_rows(st, groups, only=None):
    _h1, _h2, cols = dmon_header(groups)
    rows = []
    for g in st["gpus"]:
        if only is not None and g["index"] not in only:
            continue
        thermal = "hw_thermal_slowdown" in g["reasons"] or "sw_thermal_slowdown" in g["reasons"]
        v = {"pwr": int(g["power"]), "gtemp": g["temp"], "mtemp": g["mem_temp"], "sm": g["util"],
             "mem": g["util"] // 2, "enc": 0, "dec": 0, "jpg": 0, "ofa": 0, "mclk": g["mem_clock"],
             "pclk": g["sm_clock"], "pviol": 0, "tviol": 1 if thermal else 0,
             "fb": 0 if g["idle"] else 262144, "bar1": 1, "ccpm": 0,
             "sbecc": g["ecc"]["volatile"]["dram_correctable"], "dbecc": g["ecc"]["volatile"]["dram_uncorrectable"],
             "pci": 0, "rxpci": 0 if g["idle"] else 1210, "txpci": 0 if g["idle"] else 980}
        rows.append("%5d" % g["index"] + "".join(" %6s" % v[n] for n, _ in cols) + " ")
    return rows


# --------------------------------------------------------------------------------------------- RDMA tools
def nic_running_fw(n):
    return n["fw"]


def nic_flashed_fw(n):
    return n["fw_flashed"] or n["fw"]


def bundled_fw(st, n):
    return "40.47.1026" if n["model"] == "ConnectX-8" else "28.47.1026"


def _guid_fmt(g):
    return ":".join(g[i:i + 4] for i in range(0, 16, 4))


def render_ibstat(st, only=None):
    out = []
    for n in st["nics"]:
        if only and n["name"] not in only:
            continue
        ib = n["link_layer"] == "InfiniBand"
        port_guid = n["guid"] if ib else n["guid"][:6] + "fffe" + n["guid"][10:]
        out += ["CA '%s'" % n["name"], "\tCA type: %s" % n["hca_type"], "\tNumber of ports: 1",
                "\tFirmware version: %s" % nic_running_fw(n), "\tHardware version: 0",
                "\tNode GUID: 0x%s" % n["guid"], "\tSystem image GUID: 0x%s" % n["guid"], "\tPort 1:",
                "\t\tState: %s" % ("Active" if n["state"] == "ACTIVE" else n["state"].title()),
                "\t\tPhysical state: %s" % n["phys_state"], "\t\tRate: %d" % n["rate_n"],
                "\t\tBase lid: %d" % n["lid"], "\t\tLMC: 0", "\t\tSM lid: %d" % n["sm_lid"],
                "\t\tCapability mask: %s" % ("0xa751e848" if ib else "0x00010000"),
                "\t\tPort GUID: 0x%s" % port_guid, "\t\tLink layer: %s" % n["link_layer"]]
    return "\n".join(out) + "\n"


def render_ibv_devinfo(st, only=None):
    out = []
    for n in st["nics"]:
        if only and n["name"] not in only:
            continue
        ib = n["link_layer"] == "InfiniBand"
        out += ["hca_id:\t%s" % n["name"], "\ttransport:\t\t\tInfiniBand (0)",
                "\tfw_ver:\t\t\t\t%s" % nic_running_fw(n), "\tnode_guid:\t\t\t%s" % _guid_fmt(n["guid"]),
                "\tsys_image_guid:\t\t\t%s" % _guid_fmt(n["guid"]), "\tvendor_id:\t\t\t0x02c9",
                "\tvendor_part_id:\t\t\t%d" % n["part_id"], "\thw_ver:\t\t\t\t0x0",
                "\tboard_id:\t\t\t%s" % n["psid"], "\tphys_port_cnt:\t\t\t1", "\t\tport:\t1",
                "\t\t\tstate:\t\t\tPORT_%s (4)" % n["state"], "\t\t\tmax_mtu:\t\t4096 (5)",
                "\t\t\tactive_mtu:\t\t%s" % ("4096 (5)" if ib else "1024 (3)"),
                "\t\t\tsm_lid:\t\t\t%d" % n["sm_lid"], "\t\t\tport_lid:\t\t%d" % n["lid"],
                "\t\t\tport_lmc:\t\t0x00", "\t\t\tlink_layer:\t\t%s" % n["link_layer"], ""]
    return "\n".join(out) + "\n"


def render_mlxfwmanager(st):
    """`mlxfwmanager --query`: the layout of real captures (tests/fixtures/real-world/mlxfwmanager/, SOURCES.md there):
    `Device #N:` / `----------` / blank, two-space keys with the value at column 20, `Base GUID` and `Base MAC` (an
    NDR IB-mode ConnectX-7 on 28.47 prints both: cx7_mlxup_pci_pending.txt; the MAC is the GUID without its middle
    `0300`), the Versions rows, a blank line, `Status:`, a blank line before the next device. The `---------` line
    real tools print only once, before `Found N device(s) requiring firmware update...` of an update run, which the
    emulator does not do (two_cx7_mst_ethernet_same_psid.txt). Values are emulator-made."""
    out = ["Querying Mellanox devices firmware ...", ""]
    for i, n in enumerate(st["nics"], 1):
        avail = bundled_fw(st, n)
        flashed = nic_flashed_fw(n)
        status = "Up to date" if flashed == avail else "Update required"
        out += ["Device #%d:" % i, "----------", "",
                "  Device Type:      %s" % n["device_type"], "  Part Number:      %s" % n["part_number"],
                "  Description:      %s" % n["description"], "  PSID:             %s" % n["psid"],
                "  PCI Device Name:  %s" % n["pci"], "  Base GUID:        %s" % n["guid"],
                "  Base MAC:         %s" % (n["guid"][:6] + n["guid"][10:]),
                "  Versions:         Current        Available     ",
                "     FW             %-14s %-14s" % (flashed, avail)]
        if n["fw_flashed"] and n["fw_flashed"] != n["fw"]:
            out.append("     FW (Running)   %-14s %-14s" % (n["fw"], "N/A"))
        out += ["     PXE            3.8.0100       N/A           ", "     UEFI           14.41.0014     N/A           ",
                "",
                "  Status:           %s" % status, ""]
    return "\n".join(out)


def find_nic(st, dev):
    dev = dev.strip()
    for n in st["nics"]:
        if dev in (n["name"], n["pci"], n["pci"][5:], n["netdev"]):
            return n
        if dev.startswith("/dev/mst/") and dev.endswith("_pciconf%d" % st["nics"].index(n)):
            return n
    return None


def render_flint_query(st, n):
    out = ["Image type:            FS5",
           "FW Version:            %s" % nic_flashed_fw(n)]
    if n["fw_flashed"] and n["fw_flashed"] != n["fw"]:
        out.append("FW Version(Running):   %s" % n["fw"])
    out += ["FW Release Date:       %s" % n["fw_release_date"],
            "Product Version:       %s" % nic_flashed_fw(n),
            # a ConnectX lists UEFI and PXE only (real CX7 `flint q`, SOURCES.md of nic-fw-update: "type=UEFI
            # version=14.36.16 cpu=AMD64,AARCH64" / "type=PXE version=3.7.500 cpu=AMD64"); the Virtio entries are a
            # BlueField's (real BF3 capture). Emulator-made versions.
            "Rom Info:              type=UEFI version=14.41.14 cpu=AMD64,AARCH64",
            "                       type=PXE version=3.8.100 cpu=AMD64",
            "Description:           UID                GuidsNumber",
            "Base GUID:             %s        8" % n["guid"],
            "Base MAC:              %s            8" % (n["guid"][:6] + n["guid"][10:]),
            "Image VSD:             N/A", "Device VSD:            N/A",
            "PSID:                  %s" % n["psid"], "Security Attributes:   secure-fw"]
    return "\n".join(out) + "\n"


def render_ofed_info(st):
    return st["ofed_info"] + "\n"


def modinfo_fields(st):
    return {
        "filename": "/lib/modules/%s/updates/dkms/mlx5_core.ko" % st["kernel"],
        "version": st["ofed_version"], "license": "Dual BSD/GPL",
        "description": "Mellanox 5th generation network adapters (ConnectX series) core driver",
        "author": "Eli Cohen <eli@mellanox.com>", "srcversion": _h("srcversion", st["ofed_version"], n=23).upper(),
        "depends": "mlxdevm,mlx_compat,tls,mlxfw,psample,pci-hyperv-intf",
        "retpoline": "Y", "name": "mlx5_core", "vermagic": "%s SMP preempt mod_unload modversions " % st["kernel"],
    }


def render_modinfo(st):
    f = modinfo_fields(st)
    order = ["filename", "version", "license", "description", "author", "srcversion", "depends", "retpoline",
             "name", "vermagic"]
    return "".join("%-15s %s\n" % (k + ":", f[k]) for k in order)


# --------------------------------------------------------------------------------------------- sysfs tree
def _w(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(text)


# SYNTHESIZED PCI VPD of the NVSwitch management bridge (PCI spec layout: 0x82 identifier, 0x90 VPD-R, 0x78 end):
# what matters is the string SW_MNG, which NVIDIA's driver container greps for in /sys/class/infiniband/*/device/vpd to
# detect NVLink 5 (NVIDIA/gpu-driver-container ubuntu24.04/nvidia-driver:169-191, ../shared/reference/
# host-stack-facts.md). The keyword that carries it on a real board is not public here (V2 is a placeholder).
_VPD_ID = b"NVIDIA ConnectX-7 NVSwitch management (SYNTHESIZED)"
_VPD_R = b"PN\x10MCX750500B-0D00 V2\x06SW_MNGRV\x01\x00"
SW_MNG_VPD = (b"\x82" + len(_VPD_ID).to_bytes(2, "little") + _VPD_ID + b"\x90" + len(_VPD_R).to_bytes(2, "little")
              + _VPD_R + b"\x78")


def _ln(target, link):
    os.makedirs(os.path.dirname(link), exist_ok=True)
    if os.path.lexists(link):
        os.remove(link)
    rel = os.path.relpath(target, os.path.dirname(link))
    os.symlink(rel, link)


def build_sys_tree(st, dest):
    """Write a sysfs-like tree (relative symlinks only) for the state into dest (created)."""
    devs = pci_layout(st)
    D = os.path.join(dest, "devices")
    _w(os.path.join(dest, "SYNTHESIZED"), SYNTH_NOTE.format(scenario=st["scenario"]) + "\n")
    hbs = sorted({d["path"][0] for d in devs.values()})
    for hb in hbs:
        os.makedirs(os.path.join(D, hb), exist_ok=True)
    for addr, d in sorted(devs.items()):
        p = os.path.join(D, *d["path"])
        os.makedirs(p, exist_ok=True)
        _w(os.path.join(p, "numa_node"), "%d\n" % d["numa"])
        _w(os.path.join(p, "local_cpulist"), st["numa_cpus"][d["numa"]] + "\n")
        kind = d["kind"]
        if kind in ("root_port", "switch_up", "switch_down"):
            vend, dev, cls = ("0x8086", "0x352a", "0x060400") if kind == "root_port" else ("0x1000", "0xc030", "0x060400")
            _w(os.path.join(p, "vendor"), vend + "\n")
            _w(os.path.join(p, "device"), dev + "\n")
            _w(os.path.join(p, "class"), cls + "\n")
            _ln(os.path.join(dest, "bus", "pci", "drivers", "pcieport"), os.path.join(p, "driver"))
            _ln(p, os.path.join(dest, "bus", "pci", "drivers", "pcieport", addr))
        elif kind == "gpu":
            g = d["obj"]
            _w(os.path.join(p, "vendor"), "0x10de\n")
            _w(os.path.join(p, "device"), "0x%s\n" % st["pci_device_id"].lower())
            _w(os.path.join(p, "class"), "0x030200\n")
            _w(os.path.join(p, "subsystem_vendor"), "0x10de\n")
            _w(os.path.join(p, "current_link_speed"), "64.0 GT/s PCIe\n")
            _w(os.path.join(p, "current_link_width"), "16\n")
            _ln(os.path.join(dest, "bus", "pci", "drivers", "nvidia"), os.path.join(p, "driver"))
            _ln(p, os.path.join(dest, "bus", "pci", "drivers", "nvidia", addr))
            _ = g
        else:
            n = d["obj"]
            _w(os.path.join(p, "vendor"), "0x15b3\n")
            _w(os.path.join(p, "device"), "0x%s\n" % n["device_id"])
            _w(os.path.join(p, "class"), n["class"] + "\n")
            _w(os.path.join(p, "subsystem_vendor"), "0x15b3\n")
            _w(os.path.join(p, "current_link_speed"), "64.0 GT/s PCIe\n" if n["model"] == "ConnectX-8" else "32.0 GT/s PCIe\n")
            _w(os.path.join(p, "current_link_width"), "%d\n" % n.get("pcie_width", 16))
            if n.get("role") == "fabric_manager":
                with open(os.path.join(p, "vpd"), "wb") as fh:
                    fh.write(SW_MNG_VPD)
            _ln(os.path.join(dest, "bus", "pci", "drivers", "mlx5_core"), os.path.join(p, "driver"))
            _ln(p, os.path.join(dest, "bus", "pci", "drivers", "mlx5_core", addr))
            ibd = os.path.join(p, "infiniband", n["name"])
            _w(os.path.join(ibd, "fw_ver"), nic_running_fw(n) + "\n")
            _w(os.path.join(ibd, "board_id"), n["psid"] + "\n")
            _w(os.path.join(ibd, "hca_type"), n["hca_type"] + "\n")
            _w(os.path.join(ibd, "hw_rev"), "0x0\n")
            _w(os.path.join(ibd, "node_type"), "1: CA\n")
            _w(os.path.join(ibd, "node_guid"), _guid_fmt(n["guid"]) + "\n")
            _w(os.path.join(ibd, "sys_image_guid"), _guid_fmt(n["guid"]) + "\n")
            _ln(p, os.path.join(ibd, "device"))
            pd = os.path.join(ibd, "ports", "1")
            state_code = {"ACTIVE": 4, "DOWN": 1, "INIT": 2, "ARMED": 3}[n["state"]]
            _w(os.path.join(pd, "state"), "%d: %s\n" % (state_code, n["state"]))
            _w(os.path.join(pd, "phys_state"), "%d: %s\n" % (PHYS_STATE_CODES.get(n["phys_state"], 3), n["phys_state"]))
            _w(os.path.join(pd, "rate"), n["rate"] + "\n")
            _w(os.path.join(pd, "link_layer"), n["link_layer"] + "\n")
            _w(os.path.join(pd, "lid"), "0x%x\n" % n["lid"])
            _w(os.path.join(pd, "sm_lid"), "0x%x\n" % n["sm_lid"])
            _w(os.path.join(pd, "lid_mask_count"), "0\n")
            _w(os.path.join(pd, "pkeys", "0"), "0xffff\n")
            if n["link_layer"] == "InfiniBand":
                _w(os.path.join(pd, "pkeys", "1"), "0x8001\n")
            nd = os.path.join(p, "net", n["netdev"])
            _w(os.path.join(nd, "operstate"), "up\n")
            _w(os.path.join(nd, "type"), "32\n" if n["link_layer"] == "InfiniBand" else "1\n")
            _w(os.path.join(nd, "mtu"), "4092\n" if n["link_layer"] == "InfiniBand" else "1500\n")
            _ln(p, os.path.join(nd, "device"))
            _ln(ibd, os.path.join(dest, "class", "infiniband", n["name"]))
            _ln(nd, os.path.join(dest, "class", "net", n["netdev"]))
        _ln(p, os.path.join(dest, "bus", "pci", "devices", addr))
    mod = os.path.join(dest, "module", "mlx5_core")
    _w(os.path.join(mod, "version"), st["ofed_version"] + "\n")
    _w(os.path.join(mod, "srcversion"), modinfo_fields(st)["srcversion"] + "\n")
    _ln(mod, os.path.join(dest, "bus", "pci", "drivers", "mlx5_core", "module"))
    _w(os.path.join(dest, "module", "nvidia", "version"), st["driver_version"] + "\n")
    _ln(os.path.join(dest, "module", "nvidia"), os.path.join(dest, "bus", "pci", "drivers", "nvidia", "module"))
    node = os.path.join(D, "system", "node")
    _w(os.path.join(node, "online"), "0-1\n")
    _w(os.path.join(node, "possible"), "0-1\n")
    for nid, cpus in st["numa_cpus"].items():
        _w(os.path.join(node, "node%d" % nid, "cpulist"), cpus + "\n")
    return dest


# --------------------------------------------------------------------------------------------- nccl-tests
TYPE_SIZES = [("int8", 1), ("uint8", 1), ("int32", 4), ("uint32", 4), ("int64", 8), ("uint64", 8), ("half", 2),
              ("float", 4), ("double", 8), ("bfloat16", 2), ("f8e4m3", 1), ("f8e5m2", 1)]
TYPE_ALIASES = {"char": "int8", "int": "int32", "float16": "half", "float32": "float", "float64": "double",
                "bf16": "bfloat16", "fp16": "half", "fp32": "float", "fp64": "double"}
OPS = ["sum", "prod", "max", "min", "avg"]


def parse_size(s):
    s = str(s).strip()
    mult = 1
    if s and s[-1].upper() in "KMGT":
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[s[-1].upper()]
        s = s[:-1]
    return int(float(s) * mult)


def _fmt_time(t):
    if t >= 100000:
        return "%7.0f" % t
    if t >= 10000:
        return "%7.1f" % t
    return "%7.2f" % t


def _fmt_bw(v):
    if v >= 100000:
        return "%6.0e" % v
    if v >= 10000:
        return "%6.0f" % v
    if v >= 1000:
        return "%6.1f" % v
    return "%6.2f" % v


def nccl_sizes(minb, maxb, factor, stepbytes):
    sizes = []
    s = minb
    while s <= maxb:
        sizes.append(s)
        if factor > 1:
            s *= factor
        else:
            s += stepbytes
        if len(sizes) > 4096:
            break
    return sizes


def all_reduce_run(st, opts, nodes=1, env=None, hostnames=None, pid=4242):
    """Compute an all_reduce_perf run. Returns dict(text_lines, json_obj, rc, avg_busbw).

    opts: dict with minbytes, maxbytes, stepfactor, stepbytes, ngpus, nthreads, iters, warmup, check, dtype,
    op, json_path, args (argv list), blocking, graph, agg. nodes: 1 (plain) or N (mpirun stand-in).
    """
    env = env or {}
    nc = st["nccl"]
    hostnames = hostnames or [st["hostname"]]
    ranks_per_node = opts["ngpus"] * opts["nthreads"] if nodes == 1 else opts["ranks_per_node"]
    nranks = ranks_per_node * nodes
    if nodes > 1:
        tree = env.get("NCCL_ALGO", "").lower() not in ("ring",)
        peak = nc["peak_2node_tree"] if tree else nc["peak_2node_ring"]
        lat = nc["lat_2node_us"]
    else:
        peak, lat = nc["peak_1node"], nc["lat_1node_us"]
        if nranks < 8:  # fewer GPUs still all NVLink-connected: a bit lower ring efficiency
            peak *= 0.92
    factor = 2.0 * (nranks - 1) / nranks if nranks > 1 else 0.0
    types = [t for t in TYPE_SIZES if t[0] in ("int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float",
                                               "double", "bfloat16")] if opts["dtype"] == "all" else \
        [(TYPE_ALIASES.get(opts["dtype"], opts["dtype"]), dict(TYPE_SIZES)[TYPE_ALIASES.get(opts["dtype"], opts["dtype"])])]
    ops = OPS if opts["op"] == "all" else [opts["op"]]
    sizes = nccl_sizes(opts["minbytes"], opts["maxbytes"], opts["stepfactor"], opts["stepbytes"])
    lines = []
    if opts.get("json_path"):
        lines.append("# Writing JSON output to %s" % opts["json_path"])
    lines += ["# nccl-tests version 2.19.6 nccl-headers=22809 nccl-library=22809",
              "# Collective test starting: all_reduce_perf",
              "# nThread %d nGpus %d minBytes %d maxBytes %d step: %s warmup iters: %d iters: %d agg iters: %d "
              "validation: %d graph: %d unalign: 0" % (
                  opts["nthreads"], opts["ngpus"], opts["minbytes"], opts["maxbytes"],
                  ("%d(factor)" % opts["stepfactor"]) if opts["stepfactor"] > 1 else ("%d(bytes)" % opts["stepbytes"]),
                  opts["warmup"], opts["iters"], opts["agg"], opts["check"], opts["graph"]),
              "#", "# Using devices"]
    devices = []
    for r in range(nranks):
        node = r // ranks_per_node
        local = r % ranks_per_node
        g = st["gpus"][local % len(st["gpus"])]
        rpid = pid + (r if nodes > 1 else 0)
        host = hostnames[node % len(hostnames)]
        lines.append("#  Rank %2d Group %2d Pid %6d on %10s device %2d [%04x:%02x:00] %s" % (
            r, 0, rpid, host, local, 0, g["bus"], st["gpu_name"]))
        if r == 0:  # the real capture lists only the first device of the writing process
            devices.append({"rank": r, "group": 0, "pid": rpid, "hostname": host, "device": local,
                            "device_hex": "0000:%02x:00" % g["bus"], "device_info": st["gpu_name"]})
    lines += ["#",
              "#                                                              out-of-place                       in-place          ",
              "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong ",
              "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)         "]
    results = []
    bw_sum, bw_n, errors = 0.0, 0, 0
    for tname, tsize in types:
        for op in ops:
            for size in sizes:
                count = size // tsize
                size_b = count * tsize
                if count == 0:
                    continue
                row = {"size": size_b, "count": count, "type": tname, "redop": op, "root": "    -1"}
                cells = []
                for place in ("out", "in"):
                    jit = 1.0 + (int(_h(st["scenario"], nodes, nranks, tname, op, size_b, place, n=4), 16) / 65535.0 - 0.5) * 0.016
                    if nranks > 1:
                        t = (lat + size_b * factor / (peak * 1e3)) * jit
                    else:
                        t = (6.0 + size_b / (nc["local_copy"] * 1e3)) * jit if place == "out" else 0.5 + 0.5 * jit
                    algbw = size_b / t / 1e3
                    busbw = algbw * factor
                    wrong = nc["wrong"].get((place, size_b), 0) if opts["check"] else 0
                    errors += wrong
                    bw_sum += busbw
                    bw_n += 1
                    cells.append((t, algbw, busbw, wrong))
                    row["out_of_place" if place == "out" else "in_place"] = {
                        "time": round(t, 5), "alg_bw": round(algbw, 6), "bus_bw": round(busbw, 6),
                        "nwrong": float(wrong) if opts["check"] else "N/A"}
                row["actual_iterations"] = opts["iters"]
                row["experiment_name"] = ""
                results.append(row)
                txt = "%12d  %12d  %8s  %6s  %6s" % (size_b, count, tname, op, "-1")
                for t, a, b, w in cells:
                    txt += "  %s  %s  %s  %6s" % (_fmt_time(t), _fmt_bw(a), _fmt_bw(b), w if opts["check"] else "N/A")
                lines.append(txt)
    avg = bw_sum / bw_n if bw_n else 0.0
    min_bw_s = env.get("NCCL_TESTS_MIN_BW")
    check_avg = -1.0
    if min_bw_s is not None:
        try:
            check_avg = float(min_bw_s)
        except ValueError:
            check_avg = 0.0
    bw_fail = check_avg != -1.0 and avg < check_avg * 0.9
    lines.append("# Out of bounds values : %d %s" % (errors, "FAILED" if errors else "OK"))
    lines.append("# Avg bus bandwidth    : %g %s" % (avg, "" if check_avg == -1.0 else ("FAILED" if bw_fail else "OK")))
    lines += ["#", "# Collective test concluded: all_reduce_perf", "#", ""]
    rc = 1 if (errors or bw_fail) else 0
    js = {
        "version": 3, "start_time": "2026-11-29 16:44:20", "args": opts.get("args", []), "nccl_version": 22809,
        "config": {"nthreads": opts["nthreads"], "ngpus": opts["ngpus"], "minimum_bytes": opts["minbytes"],
                   "maximum_bytes": opts["maxbytes"], "step_factor": opts["stepfactor"],
                   "warmup_iters": opts["warmup"], "iterations": opts["iters"], "aggregated_iterations": opts["agg"],
                   "validation": opts["check"], "graph": opts["graph"],
                   "blocking_collectives": "true" if opts["blocking"] else "false", "per_iter_timing": "false",
                   "per_iter_skip": 0, "parallel_init": "false", "devices": devices},
        "results": results,
        "out_of_bounds": {"count": errors, "okay": "false" if errors else "true"},
        "average_bus_bandwidth": {"bandwidth": round(avg, 6),
                                  "okay": "unchecked" if check_avg == -1.0 else ("false" if bw_fail else "true")},
        "errors": [""], "end_time": "2026-11-29 16:44:26",
    }
    return {"lines": lines, "json": js, "rc": rc, "avg_busbw": avg, "nranks": nranks}


def dump_json(js):
    return json.dumps(js, indent=1) + "\n"


def default_ar_opts(**kw):
    o = {"minbytes": 8, "maxbytes": 8 << 30, "stepfactor": 2, "stepbytes": 1 << 20, "ngpus": 8, "nthreads": 1,
         "iters": 20, "warmup": 5, "check": 1, "dtype": "float", "op": "sum", "json_path": None, "args": [],
         "blocking": 0, "graph": 0, "agg": 1, "ranks_per_node": 8}
    o.update(kw)
    return o


# --------------------------------------------------------------------------------------------- on-call triage
# What tools/triage reads beyond the facts: kernel log (journalctl -k / dmesg stand-ins), devlink health, IB port
# error counters and RDMA hw_counters, PCIe max link + bridge links + AER, ACS (lspci/setpci stand-ins), IOMMU,
# nvidia_peermem. Written by add_triage_tree() on a scenario switch (not part of the rendered fixtures, like the
# traffic counters); scenario overrides live in st["triage"].
IB_ERROR_COUNTERS = ("link_downed", "link_error_recovery", "symbol_error", "port_rcv_errors",
                     "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors", "local_link_integrity_errors",
                     "excessive_buffer_overrun_errors", "port_xmit_discards", "port_xmit_constraint_errors",
                     "port_rcv_constraint_errors", "VL15_dropped", "port_xmit_wait", "unicast_rcv_packets",
                     "unicast_xmit_packets", "multicast_rcv_packets", "multicast_xmit_packets")
RDMA_HW_COUNTERS = ("duplicate_request", "implied_nak_seq_err", "lifespan", "local_ack_timeout_err", "out_of_buffer",
                    "out_of_sequence", "packet_seq_err", "req_cqe_error", "req_cqe_flush_error",
                    "req_remote_access_errors", "req_remote_invalid_request", "resp_cqe_error", "resp_cqe_flush_error",
                    "resp_local_length_error", "resp_remote_access_errors", "rnr_nak_retry_err", "rx_atomic_requests",
                    "rx_read_requests", "rx_write_requests")
AER_COR = ("RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout", "NonFatalErr", "CorrIntErr", "HeaderOF")
AER_UNCOR = ("Undefined", "DLP", "SDES", "TLP", "FCP", "CmpltTO", "CmpltAbrt", "UnxCmplt", "RxOF", "MalfTLP", "ECRC",
             "UnsupReq", "ACSViol", "UncorrIntErr", "BlockedTLP", "AtomicOpBlocked", "TLPBlockedErr",
             "PoisonTLPBlocked")


def _aer_text(names, values, total_name):
    vals = values or {}
    lines = ["%s %d" % (n, vals.get(n, 0)) for n in names]
    lines.append("%s %d" % (total_name, sum(vals.get(n, 0) for n in names)))
    return "\n".join(lines) + "\n"


def max_link(kind, n=None):
    """(max speed text, max width) of a PCI function: Gen6 x16 for the B300 GPU, CX8 and the switch ports, Gen5 for
    the CX7 and the host root ports."""
    if kind == "root_port" or (kind == "nic" and n is not None and n["model"] != "ConnectX-8"):
        return "32.0 GT/s PCIe", 16
    return "64.0 GT/s PCIe", 16


def add_triage_tree(st, tree):
    """Write the triage's sysfs files into a rendered tree (see the section comment)."""
    tri = st["triage"]
    devs = pci_layout(st)
    D = os.path.join(tree, "devices")
    for addr, d in sorted(devs.items()):
        p = os.path.join(D, *d["path"])
        kind = d["kind"]
        ms, mw = max_link(kind, d.get("obj"))
        _w(os.path.join(p, "max_link_speed"), ms + "\n")
        _w(os.path.join(p, "max_link_width"), "%d\n" % mw)
        if kind in ("root_port", "switch_up", "switch_down"):
            _w(os.path.join(p, "current_link_speed"), ms + "\n")
            _w(os.path.join(p, "current_link_width"), "%d\n" % tri.get("bridge_width", {}).get(addr, mw))
        aer = tri["aer"].get(addr, {})
        _w(os.path.join(p, "aer_dev_correctable"), _aer_text(AER_COR, aer.get("correctable"), "TOTAL_ERR_COR"))
        _w(os.path.join(p, "aer_dev_nonfatal"), _aer_text(AER_UNCOR, aer.get("nonfatal"), "TOTAL_ERR_NONFATAL"))
        _w(os.path.join(p, "aer_dev_fatal"), _aer_text(AER_UNCOR, aer.get("fatal"), "TOTAL_ERR_FATAL"))
        if kind in ("gpu", "nic"):
            grp = os.path.join(tree, "kernel", "iommu_groups", str(int(addr.split(":")[1], 16)))
            _w(os.path.join(grp, "type"), tri.get("iommu_group_type", "identity") + "\n")
            _ln(grp, os.path.join(p, "iommu_group"))
    for n in st["nics"]:
        if n["link_layer"] != "InfiniBand":
            continue
        pd = os.path.join(tree, "class", "infiniband", n["name"], "ports", "1")
        c = tri["counters"].get(n["name"], {})
        for name in IB_ERROR_COUNTERS:
            _w(os.path.join(pd, "counters", name), "%d\n" % c.get(name, 0))
        h = tri["hw_counters"].get(n["name"], {})
        for name in RDMA_HW_COUNTERS:
            _w(os.path.join(pd, "hw_counters", name), "%d\n" % h.get(name, 10 if name == "lifespan" else 0))
    if tri["peermem"]:
        _w(os.path.join(tree, "module", "nvidia_peermem", "version"), st["driver_version"] + "\n")
    for unit in ("dmar0", "dmar1"):
        os.makedirs(os.path.join(tree, "class", "iommu", unit), exist_ok=True)
    return tree


def proc_files(st):
    """{name: text} of the emulated /proc files the triage reads (cmdline, modules)."""
    mods = [("nvidia_uvm", 4956160, 0, "-"), ("nvidia_drm", 135168, 0, "-"), ("nvidia_modeset", 1568768, 1, "nvidia_drm,"),
            ("nvidia", 109314048, 3, "nvidia_uvm,nvidia_peermem,nvidia_modeset,") if st["triage"]["peermem"]
            else ("nvidia", 109314048, 2, "nvidia_uvm,nvidia_modeset,")]
    if st["triage"]["peermem"]:
        mods.insert(0, ("nvidia_peermem", 16384, 0, "-"))
    mods += [("mlx5_ib", 569344, 0, "-"),
             ("ib_uverbs", 200704, 3 if st["triage"]["peermem"] else 2,
              "nvidia_peermem,rdma_ucm,mlx5_ib," if st["triage"]["peermem"] else "rdma_ucm,mlx5_ib,"),
             ("ib_core", 507904, 8, "rdma_cm,ib_ipoib,iw_cm,ib_umad,rdma_ucm,ib_uverbs,mlx5_ib,ib_cm,"),
             ("mlx5_core", 2859008, 1, "mlx5_ib,")]
    modules = "".join("%s %d %d %s Live 0x0000000000000000 (O)\n" % m for m in mods)
    return {"cmdline": st["triage"]["cmdline"] + "\n", "modules": modules}


def render_lsmod(st):
    out = ["Module                  Size  Used by"]
    for ln in proc_files(st)["modules"].splitlines():
        name, size, used, users = ln.split()[:4]
        users = "" if users == "-" else users.rstrip(",")
        out.append("%-24s%8s  %s %s" % (name, size, used, users))
    return "\n".join(out) + "\n"


def kmsg_events(st, boot_epoch, now):
    """[(epoch, text)] of the emulated kernel ring buffer: boot lines (seconds after boot_epoch) and the scenario's
    lines (minutes before now, st["triage"]["kmsg"] = [(minutes_ago, text)])."""
    ev = [(boot_epoch + 4.1, "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  %s  Release Build" % st["driver_version"])]
    for i, n in enumerate(x for x in st["nics"]):
        ev.append((boot_epoch + 6.0 + 0.01 * i, "mlx5_core %s: firmware version: %s" % (n["pci"], nic_running_fw(n))))
        if n["link_layer"] == "InfiniBand":
            ev.append((boot_epoch + 9.0 + 0.01 * i, "mlx5_core %s %s: Port: 1 Link INIT" % (n["pci"], n["name"])))
            if n["state"] == "ACTIVE":
                ev.append((boot_epoch + 11.0 + 0.01 * i, "mlx5_core %s %s: Port: 1 Link ACTIVE" % (n["pci"], n["name"])))
    if st["triage"]["peermem"]:
        ev.append((boot_epoch + 12.5, "nvidia-peermem: module loaded"))
    for mins, text in st["triage"]["kmsg"]:
        ev.append((now - mins * 60.0, text))
    return sorted(ev, key=lambda e: e[0])


def render_devlink_health(st, as_json=False):
    rep = {}
    for n in st["nics"]:
        dl = st["triage"]["devlink"].get(n["name"], {})
        fw = dl.get("fw", {"state": "healthy", "error": 0, "recover": 0})
        ff = dl.get("fw_fatal", {"state": "healthy", "error": 0, "recover": 0})
        rep["pci/" + n["pci"]] = [
            dict({"reporter": "fw", "auto_dump": True}, **fw),
            dict({"reporter": "fw_fatal", "grace_period": 1200000, "auto_recover": True, "auto_dump": True}, **ff)]
    if as_json:
        return json.dumps({"health": rep}) + "\n"
    out = []
    for dev, reps in rep.items():
        out.append("%s:" % dev)
        for r in reps:
            out.append("  reporter %s" % r["reporter"])
            kv = ["state %s error %d recover %d" % (r["state"], r["error"], r["recover"])]
            if r.get("last_dump_date"):
                kv.append("last_dump_date %s last_dump_time %s" % (r["last_dump_date"], r["last_dump_time"]))
            if "grace_period" in r:
                kv.append("grace_period %d" % r["grace_period"])
            if "auto_recover" in r:
                kv.append("auto_recover %s" % str(r["auto_recover"]).lower())
            kv.append("auto_dump %s" % str(r["auto_dump"]).lower())
            out.append("    " + " ".join(kv))
    return "\n".join(out) + "\n"


def render_devlink_diagnose(st, pci, reporter):
    n = next((x for x in st["nics"] if x["pci"] == pci), None)
    if n is None:
        return None
    dl = st["triage"]["devlink"].get(n["name"], {}).get(reporter, {})
    synd = dl.get("syndrome", 0)
    if reporter == "fw":
        return " Syndrome: %d\n" % synd if not synd else " Syndrome: %d Description: %s\n" % (synd, dl.get("description", ""))
    return " Syndrome: %d\n" % synd


ACS_BITS = ("SrcValid", "TransBlk", "ReqRedir", "CmpltRedir", "UpstreamFwd", "EgressCtrl", "DirectTrans")


def acs_word(bits):
    return sum(1 << i for i, b in enumerate(ACS_BITS) if b in bits)


def render_lspci_vvv(st, bdf):
    """The part of `lspci -vvv -s BDF` the triage reads (link and ACS of bridges), or None for an unknown function."""
    devs = pci_layout(st)
    d = devs.get(bdf)
    if d is None:
        return None
    kind = d["kind"]
    ms, mw = max_link(kind, d.get("obj"))
    if kind in ("root_port", "switch_up", "switch_down"):
        cw = st["triage"].get("bridge_width", {}).get(bdf, mw)
        cs = ms
        title = {"root_port": "PCI bridge: Intel Corporation Device 352a (rev 04) (prog-if 00 [Normal decode])",
                 "switch_up": "PCI bridge: Broadcom / LSI PEX890xx PCIe Gen 6 Switch (rev b0) (prog-if 00 [Normal decode])",
                 "switch_down": "PCI bridge: Broadcom / LSI PEX890xx PCIe Gen 6 Switch (rev b0) (prog-if 00 [Normal decode])"}[kind]
    elif kind == "gpu":
        cw, cs, title = 16, ms, "3D controller: NVIDIA Corporation Device %s (rev a1)" % st["pci_device_id"]
    else:
        n = d["obj"]
        cw, cs = n.get("pcie_width", 16), ms
        title = "Infiniband controller: Mellanox Technologies %s Family [%s]" % (n["device_type"], n["model"])
    def sp(t):
        return t.replace(".0 GT/s PCIe", "GT/s")

    out = ["%s %s" % (bdf[5:], title), "\tCapabilities: [68] Express (v2) %s" % (
        "Downstream Port (Slot+), MSI 00" if kind == "switch_down" else
        "Upstream Port, MSI 00" if kind == "switch_up" else "Root Port (Slot+), MSI 00" if kind == "root_port"
        else "Endpoint, MSI 00"),
        "\t\tLnkCap:\tPort #0, Speed %s, Width x%d, ASPM not supported" % (sp(ms), mw),
        "\t\tLnkSta:\tSpeed %s, Width x%d%s" % (sp(cs), cw, " (downgraded)" if cw < mw else "")]
    if kind in ("switch_up", "switch_down", "root_port"):
        bits = set(st["triage"]["acs"].get(bdf, ()))
        out += ["\tCapabilities: [180 v1] Access Control Services",
                "\t\tACSCap:\t" + " ".join(b + "+" for b in ACS_BITS[:6]) + " DirectTrans-",
                "\t\tACSCtl:\t" + " ".join(b + ("+" if b in bits else "-") for b in ACS_BITS)]
    out.append("\tKernel driver in use: %s" % {"gpu": "nvidia", "nic": "mlx5_core"}.get(kind, "pcieport"))
    return "\n".join(out) + "\n"


def perftest_output(st, dev, gbps, size, iters, use_cuda, server):
    """ib_write_bw output in perftest's layout (--report_gbits)."""
    n = next(x for x in st["nics"] if x["name"] == dev)
    out = []
    if server:
        out += ["", "************************************", "* Waiting for client to connect... *",
                "************************************"]
    if use_cuda is not None:
        g = st["gpus"][use_cuda]
        out += ["initializing CUDA", "Listing all CUDA devices in system:"]
        out += ["CUDA device %d: PCIe address is %02X:00" % (x["index"], x["bus"]) for x in st["gpus"]]
        out += ["", "Picking device No. %d" % use_cuda,
                "[pid = %d, dev = %d] device name = [%s]" % (os.getpid(), use_cuda, st["gpu_name"]),
                "creating CUDA Ctx", "making it the current CUDA Ctx", "cuMemAlloc() of a %d bytes GPU buffer" % (size * 2),
                "allocated GPU buffer address at 00007f3fa4000000 pointer=0x7f3fa4000000"]
        _ = g
    sep = "-" * 87
    out += [sep, "                    RDMA_Write BW Test",
            " Dual-port       : OFF\t\tDevice         : %s" % dev,
            " Number of qps   : 1\t\tTransport type : IB",
            " Connection type : RC\t\tUsing SRQ      : OFF",
            " PCIe relax order: ON", " ibv_wr* API     : ON", " TX depth        : 128", " CQ Moderation   : 1",
            " Mtu             : 4096[B]", " Link type       : IB", " Max inline data : 0[B]",
            " rdma_cm QPs\t : OFF", " Data ex. method : Ethernet", sep,
            " local address: LID %#06x QPN 0x0123 PSN 0x6e2f1a RKey 0x1fff00 VAddr 0x007f3fa4800000" % n["lid"],
            " remote address: LID %#06x QPN 0x0124 PSN 0x2d1c07 RKey 0x1fff01 VAddr 0x007f3fa4000000" % n["lid"], sep,
            " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]",
            " %-10d %-14d %-18.2f %-20.2f %.6f" % (size, iters, gbps * 1.004, gbps, gbps * 1e9 / 8 / size / 1e6), sep]
    return "\n".join(out) + "\n"
