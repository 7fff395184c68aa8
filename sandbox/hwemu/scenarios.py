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
}

# Replays the REAL 1xH200 captures from real/nvidia-h200-vm (not synthesized); handled in model.py.
REAL_SCENARIOS = ("h200_real",)

ALL = tuple(SCENARIOS) + REAL_SCENARIOS
