"""Scenario definitions for the emulated HGX B300 host (SYNTHESIZED hardware, see README.md).

Every scenario is a small override of ``healthy``: a function that takes the state built by
``model.base_state()`` and changes it in place. Keep them small: the model renders every tool's output
from the state, so one change here shows up consistently in nvidia-smi, topo, sysfs, ibstat, ...
"""

CX8_OLD_FW = "40.44.1036"      # bundled with DOCA-OFED 25.01-0.6.0 (DOCA 2.10): much older than 25.10-1.2.2 expects
CX8_GOOD_FW = "40.47.1026"


def healthy(st):
    return st


def cx8_fw_mismatch(st):
    # Exactly ONE data NIC (mlx5_3) runs old firmware while the driver is DOCA-OFED 25.10-1.2.2.
    nic = st["nics"][3]
    nic["fw"] = CX8_OLD_FW
    nic["fw_release_date"] = "12.2.2025"
    st["nccl"]["note"] = "fw mismatch: link setup may be flaky on mlx5_3 (emulator keeps NCCL healthy)"
    return st


def pending_fw_reset(st):
    # mlx5_3 was flashed with 40.47.1026 but still runs 40.44.1036 until a reset (mlxfwreset / reboot).
    nic = st["nics"][3]
    nic["fw"] = CX8_OLD_FW               # running image (sysfs fw_ver, ibstat, ibv_devinfo show this)
    nic["fw_flashed"] = CX8_GOOD_FW      # image on flash (mlxfwmanager "FW" row, flint "FW Version")
    return st


def nvlink_down(st):
    g = st["gpus"][5]
    g["nvlink_down"] = [3, 11]
    return st


def thermal_throttle(st):
    for i, g in enumerate(st["gpus"]):
        g["temp"] = 96 if i % 2 == 0 else 95
        g["mem_temp"] = 91 + (i % 3)
        g["idle"] = False
        g["util"] = 97
        g["sm_clock"] = 1380 - 15 * i
        g["power"] = 905.0 + 7 * i
        g["reasons"] = {"hw_thermal_slowdown", "sw_thermal_slowdown"}
        g["reason_counters"] = {"sw_therm_slowdown": 912345678 + i * 1000, "hw_therm_slowdown": 45678901 + i * 100}
    st["thermal"]["load_temp"] = 99        # under gpu_burn temperatures rise further
    st["thermal"]["throttle_at"] = 0       # always throttling in this scenario
    st["nccl"]["peak_1node"] = 610.0       # throttled clocks cost some bandwidth
    return st


def ecc_errors(st):
    g = st["gpus"][2]
    g["ecc"]["volatile"]["dram_uncorrectable"] = 3
    g["ecc"]["aggregate"]["dram_uncorrectable"] = 5
    g["ecc"]["volatile"]["dram_correctable"] = 12
    g["ecc"]["aggregate"]["dram_correctable"] = 57
    g["remap"]["unc"] = 2
    g["remap"]["pending"] = True
    g["remap"]["hist_high"] = 1
    g["remap"]["hist_max"] = 3071
    g["recovery_action"] = "GPU Reset"
    return st


def nccl_slow(st):
    st["nccl"]["peak_1node"] = 300.0
    st["nccl"]["peak_2node_ring"] = 118.0
    st["nccl"]["peak_2node_tree"] = 140.0
    return st


def nccl_wrong_results(st):
    # #wrong > 0 at 8 MiB..64 MiB (out-of-place) and 32 MiB (in-place)
    st["nccl"]["wrong"] = {
        ("out", 8388608): 17, ("out", 16777216): 33, ("out", 33554432): 65, ("out", 67108864): 129,
        ("in", 33554432): 4,
    }
    return st


def nccl_intermittent_hang(st):
    st["nccl"]["hang_on_call"] = 2
    return st


def no_nic_columns(st):
    st["topo_nic_columns"] = False
    return st


def driver_r610(st):
    st["driver_version"] = "610.43.02"
    st["cuda_version"] = "13.2"
    st["banner"] = "r610"
    return st


def abs_temp_fields(st):
    st["temp_style"] = "absolute"
    return st


# --------------------------------------------------------------------------- on-call triage faults (tools/triage)
# Each names ONE device; what each check should say is in tests/unit/test_triage_scenarios.py. Kernel lines follow the
# real formats of the mlx5 driver (cmd.c / health.c), NVRM Xid and IPoIB (tests/fixtures/real-world/kmsg/).
def _nic(st, name):
    return next(n for n in st["nics"] if n["name"] == name)


def cx8_fw_timeouts(st):
    # the seed's failure (001 6.2): mlx5_3's firmware far older than the driver expects; the firmware misses command
    # deadlines (14 timeout lines over the last ~95 min) and the transport retries (local_ack_timeout_err) rise on
    # mlx5_3 only, more with every NCCL run through it; the 2nd NCCL run through mlx5_3 fails with RETRY_EXC_ERR
    cx8_fw_mismatch(st)
    nic = _nic(st, "mlx5_3")
    pci = nic["pci"]
    cmds = [("INIT2RTR_QP", "0x503"), ("RTR2RTS_QP", "0x504"), ("CREATE_QP", "0x500"), ("INIT2RTR_QP", "0x503"),
            ("MODIFY_CQ", "0x403"), ("2ERR_QP", "0x507"), ("INIT2RTR_QP", "0x503")]
    for i, (cmd, op) in enumerate(cmds):
        ago = 95 - 13 * i
        pid = 41210 + 37 * i
        st["triage"]["kmsg"].append((ago, "mlx5_core %s: wait_func_handle_exec_timeout:1159:(pid %d): cmd[%d]: "
                                          "%s(%s) No done completion" % (pci, pid, i % 32, cmd, op)))
        st["triage"]["kmsg"].append((ago - 0.1, "mlx5_core %s: wait_func:1189:(pid %d): %s(%s) timeout. Will cause a "
                                                "leak of a command resource" % (pci, pid, cmd, op)))
    st["triage"]["hw_counters"]["mlx5_3"] = {"local_ack_timeout_err": 212, "packet_seq_err": 3, "out_of_sequence": 41}
    st["triage"]["traffic"]["mlx5_3"] = {"hw_counters": {"local_ack_timeout_err": 3412, "packet_seq_err": 17},
                                         "nccl_fail_on_call": 2, "wc_status": 12}
    return st


def ib_port_flap(st):
    # mlx5_5's port went down and came back 6 times in the last hour (cable / transceiver); link_downed counts them
    nic = _nic(st, "mlx5_5")
    for i in range(6):
        ago = 58 - 9 * i
        st["triage"]["kmsg"].append((ago, "mlx5_core %s %s: Port: 1 Link DOWN" % (nic["pci"], nic["name"])))
        st["triage"]["kmsg"].append((ago - 0.45, "mlx5_core %s %s: Port: 1 Link ACTIVE" % (nic["pci"], nic["name"])))
    st["triage"]["counters"]["mlx5_5"] = {"link_downed": 6, "link_error_recovery": 11, "symbol_error": 1520,
                                          "port_rcv_errors": 37}
    st["triage"]["traffic"]["mlx5_5"] = {"counters": {"link_downed": 1, "symbol_error": 212, "link_error_recovery": 2}}
    return st


def ib_port_half_rate(st):
    # mlx5_2 trained at 2X NDR (200 Gb/s) instead of 4X: a lane of the cable is bad
    nic = _nic(st, "mlx5_2")
    nic["rate"], nic["rate_n"] = "200 Gb/sec (2X NDR)", 200
    return st


def nic_pcie_x8(st):
    # mlx5_6 trained at PCIe x8 (of x16): card not seated / riser
    _nic(st, "mlx5_6")["pcie_width"] = 8
    return st


def pcie_aer_nonfatal(st):
    # mlx5_1 logged uncorrectable non-fatal AER errors (completion timeouts) and correctable BadTLPs since boot
    nic = _nic(st, "mlx5_1")
    st["triage"]["aer"][nic["pci"]] = {"nonfatal": {"CmpltTO": 3}, "correctable": {"BadTLP": 41, "RxErr": 2}}
    rp = "0000:%02x:01.0" % (st["gpus"][1]["bus"] - 3)
    for ago in (47, 31, 12):
        st["triage"]["kmsg"].append((ago, "pcieport %s: AER: Uncorrected (Non-Fatal) error message received from %s"
                                          % (rp, nic["pci"])))
        st["triage"]["kmsg"].append((ago - 0.01, "mlx5_core %s: PCIe Bus Error: severity=Uncorrected (Non-Fatal), "
                                                 "type=Transaction Layer, (Requester ID)" % nic["pci"]))
    return st


def peermem_missing(st):
    # nvidia_peermem not loaded: GPUDirect RDMA only through DMA-BUF
    st["triage"]["peermem"] = False
    return st


def acs_enabled(st):
    # ACS redirect on the switch downstream port above mlx5_4 (between GPU 4 and mlx5_4)
    dsp = "0000:%02x:01.0" % (st["gpus"][4]["bus"] - 1)
    st["triage"]["acs"][dsp] = ("SrcValid", "ReqRedir", "CmpltRedir", "UpstreamFwd")
    return st


def gpu_xid79(st):
    # GPU 6 fell off the bus 23 minutes ago
    g = st["gpus"][6]
    st["triage"]["kmsg"].append((23, "NVRM: Xid (PCI:0000:%02x:00): 79, pid=0, GPU has fallen off the bus." % g["bus"]))
    st["triage"]["kmsg"].append((22.99, "NVRM: GPU at PCI:0000:%02x:00.0 has fallen off the bus." % g["bus"]))
    g["recovery_action"] = "Node Reboot Required"
    return st


def fabric_degraded(st):
    # the NVLink fabric lost bandwidth (an NVSwitch trunk): every GPU reports Limited Capacity / Degraded
    for g in st["gpus"]:
        g["fabric_health"] = {"summary": "Limited Capacity", "bandwidth": "Degraded", "route_unhealthy": "True"}
    return st


def gpu_hot_96c(st):
    # GPU 3 at 96 C under load, thermal slowdown active, violation counters of ~7 min
    g = st["gpus"][3]
    g.update(temp=96, mem_temp=93, idle=False, util=98, sm_clock=1305, power=912.0,
             reasons={"hw_thermal_slowdown", "sw_thermal_slowdown"},
             reason_counters={"sw_therm_slowdown": 412000000, "hw_therm_slowdown": 31000000})
    return st


SCENARIOS = {
    "healthy": healthy,
    "cx8_fw_mismatch": cx8_fw_mismatch,
    "nvlink_down": nvlink_down,
    "thermal_throttle": thermal_throttle,
    "ecc_errors": ecc_errors,
    "nccl_slow": nccl_slow,
    "nccl_wrong_results": nccl_wrong_results,
    "nccl_intermittent_hang": nccl_intermittent_hang,
    "pending_fw_reset": pending_fw_reset,
    "no_nic_columns": no_nic_columns,
    "driver_r610": driver_r610,
    "abs_temp_fields": abs_temp_fields,
    "cx8_fw_timeouts": cx8_fw_timeouts,
    "ib_port_flap": ib_port_flap,
    "ib_port_half_rate": ib_port_half_rate,
    "nic_pcie_x8": nic_pcie_x8,
    "pcie_aer_nonfatal": pcie_aer_nonfatal,
    "peermem_missing": peermem_missing,
    "acs_enabled": acs_enabled,
    "gpu_xid79": gpu_xid79,
    "fabric_degraded": fabric_degraded,
    "gpu_hot_96c": gpu_hot_96c,
}

# Replays the REAL 1xH200 captures from real/nvidia-h200-vm (not synthesized); handled in model.py.
REAL_SCENARIOS = ("h200_real",)

ALL = tuple(SCENARIOS) + REAL_SCENARIOS
