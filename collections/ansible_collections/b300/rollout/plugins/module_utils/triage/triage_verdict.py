# -*- coding: utf-8 -*-
"""The on-call triage's rules: what one host's collection says, device by device, and the most likely cause.

Input: the collection :mod:`triage_collect` returns for a host (kernel-log scan, devlink health, IB ports and counters
read twice, PCIe links/AER/ACS of every data NIC, GPU and the bridges between them, IOMMU, GPUDirect, the rdma_nics and
gpu_topology facts and the GPU fields of ``nvidia-smi -q -x``), optionally the health history (``health_history_read``
module) and the traffic results (``--traffic``). Output: one verdict per device -- ``ok``, ``suspect`` or ``fault`` --
with its findings (check, rule and its source, evidence lines, fix), the host's verdict, and the causes ranked by the
evidence joined on each device; the first is the report's "most likely cause".

Every threshold names its source: ``R<n>`` = ``../shared/reference/oncall-triage-anchors.md`` section 2 (the anchor
tool and line it copies), ``row <n>`` = its comparison table, or ``ours`` (this project's choice, with the reason).
Pure functions, stdlib only; fw_matrix judges the firmware like the gate does.
"""
from __future__ import annotations

import time

from ansible_collections.b300.rollout.plugins.module_utils.hw import fw_matrix
from ansible_collections.b300.rollout.plugins.module_utils.triage.triage_counters import (
    ERROR_COUNTERS, ERROR_COUNTERS_FAULT, ETH_PHY_FAULT, ETH_PHY_PRE_FEC, ETH_PHY_SUSPECT, HW_COUNTERS_FAULT,
    HW_COUNTERS_SUSPECT, deltas, devlink_for_pci)
from ansible_collections.b300.rollout.plugins.module_utils.triage.triage_gpu import THERMAL_COUNTERS, THERMAL_REASONS, \
    counter_deltas
from ansible_collections.b300.rollout.plugins.module_utils.triage.triage_evidence import merge_kernel, read_evidence
from ansible_collections.b300.rollout.plugins.module_utils.triage.triage_pcie import acs_enabled_bits
from ansible_collections.b300.rollout.plugins.module_utils.triage.triage_traffic import perftest_gbps
from ansible_collections.b300.rollout.plugins.module_utils.common.md_table import table

VERDICTS = ("ok", "suspect", "fault")
RANK = {"ok": 0, "suspect": 1, "fault": 2}

# thresholds (each with its source)
FLAP_FAULT = 5                 # R1/row 6: azhpc fails at >= 5 "lost carrier" per IB netdev in 24 h (NHC2005)
GDR_BW_FRACTION = 0.9          # R11: azhpc check_ib_bw_gdr 360 on 400G links = 90 % of line rate
AER_COR_FAULT = 480            # R6: DCGM fails a PCIe test at 480 correctable errors ("32/minute * 15 minutes")
REPLAY_PER_MIN_LANE = {5: 1.92, 6: 3.84}   # R6: DCGM budget 1e-12 x lane rate x 60 s (Gen5 32 GT/s; Gen6 64 GT/s)
TLIMIT_MARGIN_C = 5            # R12: gpud's "5 C margin" example; a GPU closer than this to max operating is suspect
PEERMEM_FAULT = 2              # R1: "invalid context" lines fail "when repeated"
THERMAL_HIST_FAULT_S = 1.0     # ours: any thermal violation time in the history window while hot
NCCL_RELATIVE_SLOW = 0.75      # ours: one NIC's NCCL busbw below 75 % of the median NIC of the same node
# ours: a PCIe link that went down (fatal AER such as Surprise Down, pciehp Link Down, DPC, device inaccessible)
# explains the command timeouts, transport retries, NCCL errors and Xid 79 that follow it, so it outranks them and
# the firmware mismatch (60): its fix (the link) comes first
PCIE_DOWN_SCORE = 62


def _f(device, check, verdict, rule, evidence, fix, summary, score, **extra):
    d = {"device": device, "check": check, "verdict": verdict, "rule": rule,
         "evidence": [e for e in (evidence if isinstance(evidence, list) else [evidence]) if e],
         "fix": fix, "summary": summary, "score": score}
    d.update(extra)
    return d


def _fmt_int(n):
    return "{:,}".format(int(n))


def _short_ts(ts):
    """'2026-11-29T02:10:11+0000' -> '2026-11-29 02:10'; other forms as they are."""
    if not ts:
        return "?"
    t = str(ts)
    if len(t) >= 16 and t[4] == "-" and t[10] in "T ":
        return t[:10] + " " + t[11:16]
    return t


# --------------------------------------------------------------------------- NIC rules
def nic_firmware(dev, driver, rows, policy):
    """The firmware/driver verdict the gate computes (fw_matrix.check_device), as a triage finding."""
    v = fw_matrix.check_device(dev, driver, rows, policy)
    name = dev["name"]
    if v["severity"] == "ok":
        return None, v
    fw = dev.get("fw_ver")
    exp = v.get("expected") or "?"
    older = ""
    pf, pe = fw_matrix.parse_fw(fw), fw_matrix.parse_fw(str(exp).replace(">= ", "").split(" or ", maxsplit=1)[0])
    if pf and pe:
        older = " older than" if pf < pe else " newer than"
    if v["verdict"] == "pending_reset":
        summ = "flashed firmware %s not running yet (running %s)" % (dev.get("fw_pending"), fw)
    elif v["verdict"] == "unsupported":
        summ = "%s not supported by driver %s %s" % (dev.get("model"), v["driver_flavour"], v["driver_version"])
    elif v["verdict"] == "unknown":
        summ = "firmware %s under a driver the matrix does not know (%s %s)" % (fw, v["driver_flavour"], v["driver_version"])
    else:
        summ = "firmware %s%s driver %s expects (%s)" % (fw, older or " does not match what", v["driver_version"], exp)
    verdict = "fault" if v["severity"] == "fail" else "suspect"
    rule = "row 4: firmware matrix row %s, rule %s (the preflight gate's verdict: %s)" % (
        v["row"] or "-", v["rule"], v["verdict"])
    # the seed's root cause (001 6.2): ranked above the symptoms it explains (timeouts, transport retries)
    return _f(name, "firmware", verdict, rule, fw_matrix.device_message("", v).lstrip(": "), v["remediation"], summ,
              60 if verdict == "fault" else 15), v


def nic_kmsg(name, kinds, bdf):
    out = []
    k = kinds.get("mlx5_cmd_timeout")
    if k:
        cmds = ", ".join("%s x%d" % kv for kv in sorted(k["codes"].items(), key=lambda kv: -kv[1])[:3])
        out.append(_f(name, "kernel_log", "fault",
                      "R1: any mlx5 firmware-command timeout on a data NIC in the window fails (driver<->firmware "
                      "handshake; mlx5 cmd.c wait_func / wait_func_handle_exec_timeout)",
                      k["examples"] + ["%d lines, first %s, last %s%s" % (
                          k["count"], _short_ts(k["first"]), _short_ts(k["last"]), (" (" + cmds + ")") if cmds else "")],
                      "compare its firmware with the driver (tools/fw-audit) first; if they match, keep `devlink health "
                      "diagnose pci/%s reporter fw` and `mlxfwmanager --query` for an NVIDIA networking case" % bdf,
                      "%d command timeouts since %s" % (k["count"], _short_ts(k["first"])), 40 + min(k["count"], 20)))
    k = kinds.get("mlx5_health")
    if k:
        out.append(_f(name, "kernel_log", "fault", "R1: mlx5 health lines (Fatal error / health compromised / syndrome / "
                      "recovery) fail (mlx5 health.c poll_health, print_health_info)", k["examples"] +
                      ["%d lines, first %s" % (k["count"], _short_ts(k["first"]))],
                      "drain the node; `devlink health diagnose pci/%s reporter fw_fatal`, keep the dump; firmware vs "
                      "driver (tools/fw-audit); mlxfwreset -d %s reset or reboot if it does not recover" % (bdf, bdf),
                      "firmware health events (%s)" % ", ".join(sorted(k["subs"])), 45))
    k = kinds.get("mlx5_slot_power")
    if k:
        out.append(_f(name, "kernel_log", "fault", "R1: `Detected insufficient power on the PCIe slot` fails (gpud "
                      "N/infiniband/kmsg_matcher.go:15)", k["examples"],
                      "check the slot / riser power of %s with the platform vendor" % bdf,
                      "insufficient PCIe slot power (%s)" % ",".join(k["codes"]), 35))
    k = kinds.get("mlx5_module_temp")
    if k:
        out.append(_f(name, "kernel_log", "fault", "R1: `Port module event ... High Temperature` fails (gpud "
                      "N/infiniband/kmsg_matcher.go:25): hot cage -> link errors", k["examples"],
                      "check airflow at the NIC cages; `mlxlink -d %s -m` shows the module temperature" % bdf,
                      "port module over temperature (%d events)" % k["count"], 30))
    k = kinds.get("mlx5_module_error")
    if k:
        out.append(_f(name, "kernel_log", "fault", "R1 (ours, beside gpud's High Temperature matcher): `Port module "
                      "event[error]` = the cage refused or lost the module (power budget, bad cable): the link goes "
                      "down", k["examples"], "check the module against the adapter's supported-cable list; `mlxlink -d "
                      "%s -m`; swap the cable or transceiver" % bdf,
                      "port module error (%s) x%d" % (", ".join(sorted(x for x in k["subs"] if x)), k["count"]), 30))
    k = kinds.get("mlx5_eq_recover")
    if k:
        out.append(_f(name, "kernel_log", "suspect", "ours: `Recovered N EQEs` = the driver found completions it had no "
                      "interrupt for (mlx5 eq.c mlx5_cmd_eq_recover); with command timeouts R1 already fails, alone it "
                      "warns (lost interrupts: IOMMU interrupt remapping, MSI-X)", k["examples"][:2],
                      "check `dmesg` for DMAR/IOMMU faults and the IRQ affinity of %s" % bdf,
                      "lost interrupts recovered x%d" % k["count"], 10))
    k = kinds.get("mlx5_cmd_error")
    if k:
        cmds = ", ".join(sorted(k["codes"]))
        out.append(_f(name, "kernel_log", "suspect", "ours: a firmware command refused with a syndrome (mlx5 cmd.c "
                      "mlx5_cmd_out_err): the syndrome is for an NVIDIA networking case; ACCESS_REG ones are info (gpud "
                      "kmsg_matcher.go:57)", k["examples"][:2],
                      "keep the syndromes for an NVIDIA networking case; firmware vs driver (tools/fw-audit)",
                      "firmware command %s failed x%d" % (cmds, k["count"]), 10))
    k = kinds.get("netdev_tx_timeout")
    if k:
        out.append(_f(name, "kernel_log", "suspect", "ours: a transmit queue of the NIC's netdev timed out (NETDEV "
                      "WATCHDOG / mlx5e TX timeout): the NIC stopped completing sends", k["examples"][:2],
                      "`ethtool -S` of the netdev; firmware vs driver (tools/fw-audit); the NIC's kernel log",
                      "transmit timeout x%d" % k["count"], 15))
    out += kmsg_pcie(name, kinds, "NIC", bdf)
    flaps = (kinds.get("ib_carrier_lost") or {}).get("count", 0) + \
        ((kinds.get("ib_port_state") or {}).get("subs") or {}).get("down", 0) + \
        ((kinds.get("eth_link") or {}).get("subs") or {}).get("down", 0)
    if flaps:
        ex = (kinds.get("ib_carrier_lost") or {}).get("examples", []) + (kinds.get("ib_port_state") or {}).get("examples", []) \
            + (kinds.get("eth_link") or {}).get("examples", [])
        verdict = "fault" if flaps >= FLAP_FAULT else "suspect"
        out.append(_f(name, "kernel_log", verdict, "row 6: link down / lost carrier %d times in the window; azhpc fails at "
                      ">= %d in 24 h (CT/azure_ib_link_flapping.nhc), fewer is ours: suspect" % (flaps, FLAP_FAULT),
                      ex[:3], "`mlxlink -d %s -m -c` (BER, FEC, module), reseat or swap the cable; keep the node "
                      "drained until link_downed stops growing" % bdf, "port went down %d times" % flaps,
                      30 if verdict == "fault" else 15))
    k = kinds.get("mlx5_access_reg")
    if k:
        out.append(_f(name, "kernel_log", "ok", "R1: ACCESS_REG failures are a restricted-PF artefact (gpud "
                      "kmsg_matcher.go:57): info only", k["examples"][:1], None,
                      "ACCESS_REG failed x%d (info)" % k["count"], 0))
    return out


def nic_devlink(name, reporters, diagnose):
    out = []
    for rep, st in sorted((reporters or {}).items()):
        err, rec = st.get("error") or 0, st.get("recover") or 0
        state = st.get("state")
        ev = "devlink health: reporter %s state %s error %s recover %s%s" % (
            rep, state, err, rec, (" last_dump %s %s" % (st.get("last_dump_date"), st.get("last_dump_time")))
            if st.get("last_dump_date") else "")
        if rep == "fw_fatal" and (err or rec or (state and state != "healthy")):
            out.append(_f(name, "devlink", "fault", "R2 (ours, no anchor judges it): fw_fatal error or recover > 0 since "
                          "boot = the firmware crashed and was reset under the driver (hangs, then works after a retry)",
                          ev, "keep `devlink health dump show pci/<bdf> reporter fw_fatal`; firmware vs driver "
                          "(tools/fw-audit); open an NVIDIA networking case with the dump",
                          "firmware fatal error %d, recovered %d" % (err, rec), 40))
        elif rep == "fw" and (err or (state and state != "healthy")):
            out.append(_f(name, "devlink", "suspect", "R2 (ours): fw reporter error > 0 -> warn", ev,
                          "`devlink health diagnose pci/<bdf> reporter fw`", "firmware reporter errors %d" % err, 15))
    for rep, dg in sorted((diagnose or {}).items()):
        syn = dg.get("syndrome")
        if syn:
            out.append(_f(name, "devlink", "fault", "R2: devlink fw diagnose Syndrome != 0 fails",
                          "devlink health diagnose reporter %s: Syndrome %s %s" % (rep, syn, dg.get("description") or ""),
                          "firmware health syndrome: NVIDIA networking case; firmware vs driver (tools/fw-audit)",
                          "firmware health syndrome %s" % syn, 40))
    return out


def nic_port(name, port, expected_gbps):
    out = []
    p = port or {}
    pn = p.get("port", "1")
    if p.get("state") and p["state"] != "ACTIVE":
        out.append(_f(name, "ib_port", "fault", "R3: every data port ACTIVE (NHC lbnl_hw.nhc:332-365)",
                      "port %s state %s (%s), phys_state %s" % (pn, p.get("state"), p.get("state_code"), p.get("phys_state")),
                      "`ibstat %s`; check the cable and the switch port; the subnet manager must be running" % name,
                      "port %s %s" % (pn, p["state"]), 45))
    if p.get("phys_state") and p["phys_state"] != "LinkUp":
        out.append(_f(name, "ib_port", "fault", "R3: phys_state LinkUp expected; Polling = connection lost to the switch "
                      "(gpud N/infiniband/check_thresholds.go:60-107)", "port %s phys_state %s" % (pn, p["phys_state"]),
                      "reseat or replace the cable/transceiver of %s; check the switch port" % name,
                      "physical link %s" % p["phys_state"], 45))
    rate = p.get("rate_gbps")
    if expected_gbps and rate is not None and rate < expected_gbps:
        out.append(_f(name, "ib_port", "fault", "R3: rate == the inventory's expected rate per NIC model "
                      "(nccl_validation_expected_port_gbps; NHC/azhpc demand the exact rate)",
                      "port %s rate %s, expected %s Gb/sec" % (pn, p.get("rate"), expected_gbps),
                      "`mlxlink -d %s -m` (lanes, speed, FEC); reseat or replace the cable or transceiver" % name,
                      "port trained at %s Gb/s, expected %s" % (rate, expected_gbps), 35))
    return out


def nic_counters(name, before, after, window, during):
    """IB error counters and RDMA transport counters: since boot (suspect) and their growth over ``window`` seconds
    (``during``: 'the triage' or 'the traffic test')."""
    out = []
    bc, ac = (before or {}).get("counters") or {}, (after or {}).get("counters") or {}
    bh, ah = (before or {}).get("hw_counters") or {}, (after or {}).get("hw_counters") or {}
    dc, dh = deltas(bc, ac), deltas(bh, ah)
    for c in ERROR_COUNTERS:
        d = dc.get(c, 0)
        if d > 0:
            fault = c in ERROR_COUNTERS_FAULT
            out.append(_f(name, "ib_counters", "fault" if fault else "suspect",
                          "R4: %s growing during %s -> %s (NCCL docs networking_troubleshooting.rst:178-188)"
                          % (c, during, "fail" if fault else "warn"),
                          "%s %s -> %s (+%s in %ss)" % (c, _fmt_int(bc[c]), _fmt_int(ac[c]), _fmt_int(d), window),
                          "`mlxlink -d %s -m -c` (BER, FEC); swap the cable; `perfquery -x` on both ends" % name,
                          "%s +%s during %s" % (c, _fmt_int(d), during), 35 if c == "link_downed" else 25, counter=c))
        elif ac.get(c, bc.get(c, 0)):
            out.append(_f(name, "ib_counters", "suspect", "R4: non-zero since boot -> warn with the value",
                          "%s %s since boot" % (c, _fmt_int(ac.get(c, bc.get(c)))),
                          "watch it grow (re-run the triage); `mlxlink -d %s -m -c`" % name,
                          "%s %s since boot" % (c, _fmt_int(ac.get(c, bc.get(c)))), 5))
    for c in HW_COUNTERS_FAULT + HW_COUNTERS_SUSPECT:
        d = dh.get(c, 0)
        if d > 0:
            fault = c in HW_COUNTERS_FAULT
            out.append(_f(name, "rdma_counters", "fault" if fault else "suspect",
                          "R5: %s increasing while traffic runs (NCCL docs networking_troubleshooting.rst:130-141); "
                          "%s and packet_seq_err -> fail on that NIC, others warn" % (c, HW_COUNTERS_FAULT[0]),
                          "%s %s -> %s (+%s in %ss during %s)" % (
                              c, _fmt_int(bh[c]), _fmt_int(ah[c]), _fmt_int(d), window, during),
                          "each ack timeout is one retry; past NCCL_IB_RETRY_CNT it is IBV_WC_RETRY_EXC_ERR (a hang or "
                          "an abort): firmware vs driver (tools/fw-audit), then the link of %s" % name,
                          "%s %s during %s" % (c, "+" + _fmt_int(d), during), 42 if fault else 10, counter=c))
        elif c in HW_COUNTERS_FAULT and ah.get(c, bh.get(c, 0)):
            out.append(_f(name, "rdma_counters", "suspect", "R5 (ours): %s non-zero since boot -> warn" % c,
                          "%s %s since boot" % (c, _fmt_int(ah.get(c, bh.get(c)))),
                          "re-run with --traffic on a drained node to see whether it grows",
                          "%s %s since boot" % (c, _fmt_int(ah.get(c, bh.get(c)))), 5))
    return out


def kmsg_pcie(device, kinds, label, bdf, is_gpu=False):
    """PCIe AER records and link events of the kernel log on the device or on a port of its PCIe path (R6 read from
    the kernel log, see docs/triage-real-world.md): fatal or link down -> fault, non-fatal -> fault, correctable ->
    suspect (its growth is judged on the sysfs counters read twice; a window with DCGM's 480 fails), a probe-time
    bandwidth limit -> suspect (R6 judges the link as it is now)."""
    out = []
    k = kinds.get("pcie_aer") or {}
    subs = k.get("subs") or {}
    via = k.get("via") or []
    where = (" on %s above it" % ", ".join(via)) if via else ""

    def names(sev):
        # the error names of that severity's records (a record may carry several: "Completion Timeout+Malformed TLP")
        count = {}
        for code, n in ((k.get("sub_codes") or {}).get(sev) or {}).items():
            for name in code.split("+"):
                count[name] = count.get(name, 0) + n
        n = ", ".join(x for x, _c in sorted(count.items(), key=lambda kv: (-kv[1], kv[0]))[:3])
        return (" (%s)" % n) if n else ""

    def since():
        return (" since %s" % _short_ts(k["first"])) if k.get("first") else ""
    if subs.get("fatal"):
        out.append(_f(device, "pcie_aer_log", "fault", "R6 (kernel log): a fatal PCIe AER on the device or a port on "
                      "its path fails: the link is unreliable, the kernel resets it (aer.c)", k["examples"][:3] +
                      ["%d AER records, first %s, last %s" % (k["count"], _short_ts(k["first"]), _short_ts(k["last"]))],
                      "drain the node; reseat %s and check its riser/slot%s; `lspci -vvv -s %s`; if it repeats, RMA "
                      "(platform vendor)" % (bdf, (" and the link of " + ", ".join(via)) if via else "", via[0] if via else bdf),
                      "PCIe fatal AER%s%s x%d%s" % (names("fatal"), where, subs["fatal"], since()),
                      PCIE_DOWN_SCORE, aer_sev="fatal"))
    if subs.get("nonfatal"):
        out.append(_f(device, "pcie_aer_log", "fault", "R6 (kernel log): non-fatal (uncorrectable) PCIe AER on the "
                      "device or a port on its path fails: transactions were lost (aer.c)", k["examples"][:3],
                      "`lspci -vvv -s %s`; reseat the card; if errors keep coming, RMA (platform vendor)" % bdf,
                      "%d PCIe AER non-fatal errors%s%s in the kernel log" % (subs["nonfatal"], names("nonfatal"), where), 40,
                      aer_sev="nonfatal"))
    if subs.get("correctable"):
        n = subs["correctable"]
        fault = n >= AER_COR_FAULT
        out.append(_f(device, "pcie_aer_log", "fault" if fault else "suspect",
                      "R6 (kernel log): correctable AER -> warn; >= %d in the window fails (DCGM Pcie.cpp:113); their "
                      "growth during the triage is judged on the sysfs counters" % AER_COR_FAULT, k["examples"][:2],
                      "`lspci -vvv -s %s`; reseat; watch `aer_dev_correctable` grow" % bdf,
                      "%d correctable PCIe AER errors%s%s in the kernel log" % (n, names("correctable"), where), 20 if fault else 8,
                      aer_sev="correctable"))
    k = kinds.get("pcie_link") or {}
    subs = k.get("subs") or {}
    via = k.get("via") or []
    lost = ("link_down", "card_not_present", "dpc_containment", "inaccessible", "recovery_failed")
    down = {s: n for s, n in subs.items() if s in lost}
    if down:
        what = {"link_down": "PCIe link down", "card_not_present": "card not present", "dpc_containment":
                "DPC contained the port", "inaccessible": "config space inaccessible", "recovery_failed":
                "AER recovery failed"}
        out.append(_f(device, "pcie_link_log", "fault", "R6 (kernel log, ours): the PCIe link of the device or of a port "
                      "on its path went down or the device was lost (pciehp, DPC, AER recovery failed, config space "
                      "inaccessible) fails: every timeout on it follows", k["examples"][:3],
                      "drain the node; reseat %s%s; check the riser/cable; reboot to bring it back; RMA if it "
                      "repeats" % (bdf, (" and the port " + ", ".join(via)) if via else ""),
                      "%s%s" % (" + ".join("%s x%d" % (what[s], down[s]) for s in what if s in down),
                                (" on %s above it" % ", ".join(via)) if via else ""), PCIE_DOWN_SCORE))
    if subs.get("bandwidth_limited") and not via:
        ex = k["examples"][:1]
        codes = sorted(k["codes"])
        speed_only = all(_limit_is_speed_only(e) for e in ex)
        if not (is_gpu and speed_only):
            out.append(_f(device, "pcie_link_log", "suspect", "R6 (kernel log, ours): the kernel found the device's "
                          "PCIe bandwidth limited at probe (pci.c pcie_report_downtraining); the sysfs LnkSta/LnkCap "
                          "check judges the link now", ex, "`lspci -vvv -s %s` (LnkSta vs LnkCap); reseat / check the "
                          "slot and riser" % bdf, "%s PCIe bandwidth limited at probe (%s)" % (label, ", ".join(codes)), 10))
    return out


def fold_aer(findings):
    """The kernel log and sysfs count the same AER errors: a kernel-log AER finding (non-fatal or correctable) on a
    device whose sysfs AER check already reports that severity is folded into the sysfs finding as evidence, not a
    second finding; a fatal one stays (it is the stronger, it says what went down)."""
    sysfs = {(f["device"], f.get("aer_sev")): f for f in findings if f["check"] == "aer" and f.get("aer_sev")}
    out = []
    for f in findings:
        g = sysfs.get((f["device"], f.get("aer_sev"))) if f["check"] == "pcie_aer_log" else None
        if g is not None and f["aer_sev"] != "fatal":
            g["evidence"] = g["evidence"] + ["kernel log: " + f["summary"]] + f["evidence"][:2]
            continue
        out.append(f)
    return out


def _limit_is_speed_only(raw):
    import re as _re
    m = _re.search(r"limited by [\d.]+ GT/s PCIe x(\d+) link .*? with [\d.]+ GT/s PCIe x(\d+) link", raw or "")
    return bool(m) and m.group(1) == m.group(2)


def nic_phy_counters(name, before, after, window, during):
    """ethtool -S PHY counters of the NIC's netdev (Ethernet and IPoIB both carry them): growth of a fault counter
    during the triage or the traffic fails like link_downed / symbol_error (R4), a suspect counter warns; non-zero since
    boot warns with the value; FEC-corrected bits and per-lane errors are reported only (docs/triage-real-world.md)."""
    out = []
    b, a = before or {}, after or {}
    d = deltas(b, a)
    for c in ETH_PHY_FAULT + ETH_PHY_SUSPECT:
        inc = d.get(c, 0)
        if inc > 0:
            fault = c in ETH_PHY_FAULT
            out.append(_f(name, "phy_counters", "fault" if fault else "suspect",
                          "R4 over ethtool -S (ours for the mlx5 PHY names): %s growing during %s -> %s" % (
                              c, during, "fail" if fault else "warn"),
                          "%s %s -> %s (+%s in %ss)" % (c, _fmt_int(b[c]), _fmt_int(a[c]), _fmt_int(inc), window),
                          "`mlxlink -d %s -m -c` (BER, FEC, module); reseat or swap the cable/transceiver" % name,
                          "%s +%s during %s" % (c, _fmt_int(inc), during), 30 if fault else 10, counter=c))
        elif c in ETH_PHY_FAULT and a.get(c, b.get(c, 0)):
            v = a.get(c, b.get(c))
            out.append(_f(name, "phy_counters", "suspect", "R4 over ethtool -S: non-zero since boot -> warn with the value",
                          "%s %s since boot" % (c, _fmt_int(v)), "watch it grow (re-run the triage); `mlxlink -d %s -m -c`"
                          % name, "%s %s since boot" % (c, _fmt_int(v)), 5))
    lanes = [(c, d.get(c, 0)) for c in ETH_PHY_PRE_FEC if d.get(c, 0) > 0]
    if lanes:
        corr = d.get("rx_corrected_bits_phy", 0)
        out.append(_f(name, "phy_counters", "suspect",
                      "mlx5 counters.rst: rx_err_lane_N_phy are raw errors before FEC (type Error); increasing means "
                      "high BER on the link, traffic might be lost -> warn, read with rx_corrected_bits_phy",
                      "; ".join("%s %s -> %s (+%s in %ss)" % (c, _fmt_int(b.get(c, 0)), _fmt_int(a.get(c, 0)),
                                                              _fmt_int(n), window) for c, n in lanes)
                      + "; rx_corrected_bits_phy +%s" % _fmt_int(corr),
                      "`mlxlink -d %s -m -c` (raw/effective BER per lane, FEC); reseat or swap the cable/transceiver "
                      "if the raw BER is high" % name,
                      "raw errors before FEC on lane %s +%s during %s" % (
                          "/".join(c.split("_")[3] for c, _n in lanes), _fmt_int(sum(n for _c, n in lanes)), during),
                      10, counter=lanes[0][0]))
    rep = ["%s %s" % (c, _fmt_int(a.get(c, b.get(c)))) for c in ("rx_corrected_bits_phy",) if a.get(c, b.get(c))]
    if rep:
        out.append(_f(name, "phy_counters", "ok", "ethtool -S: FEC-corrected bits are reported, not judged (a healthy "
                      "PAM4 link corrects some)", "; ".join(rep), None, "FEC corrections (info)", 0))
    lane_rep = ["%s %s" % (c, _fmt_int(a.get(c, b.get(c)))) for c in ETH_PHY_PRE_FEC if a.get(c, b.get(c))]
    if lane_rep:
        out.append(_f(name, "phy_counters", "ok", "ethtool -S: per-lane raw errors before FEC since boot are reported "
                      "(a healthy PAM4 link has some); their growth during the triage warns", "; ".join(lane_rep), None,
                      "raw errors before FEC per lane since boot (info)", 0))
    return out


def pcie_link(device, label, link, upstream_link, is_gpu=False):
    """R6: width below min(device max, upstream max) fails; speed below it fails for NICs and bridges, is suspect for
    a GPU (idle GPUs lower their link speed: re-check under load before failing)."""
    out = []
    if not link:
        return out
    mw = min([w for w in (link.get("max_width"), (upstream_link or {}).get("max_width")) if w] or [0]) or None
    ms = min([s for s in (link.get("max_speed"), (upstream_link or {}).get("max_speed")) if s] or [0]) or None
    cw, cs = link.get("current_width"), link.get("current_speed")
    if mw and cw and cw < mw:
        out.append(_f(device, "pcie", "fault", "R6: link width below min(device max, upstream max) fails",
                      "%s %s: LnkSta x%d, LnkCap x%d" % (label, link["bdf"], cw, mw),
                      "reseat the card / check the riser and slot of %s; `lspci -vvv -s %s` (LnkSta/LnkCap)"
                      % (link["bdf"], link["bdf"]), "PCIe link x%d instead of x%d" % (cw, mw), 35))
    if ms and cs and cs < ms:
        out.append(_f(device, "pcie", "suspect" if is_gpu else "fault",
                      "R6: link speed below its capability: %s" % (
                          "suspect for a GPU (idle GPUs downclock the link; re-check under load)" if is_gpu
                          else "fails for a NIC or bridge"),
                      "%s %s: %.1f GT/s, capable of %.1f GT/s" % (label, link["bdf"], cs, ms),
                      "`lspci -vvv -s %s`; BIOS PCIe speed setting; reseat" % link["bdf"],
                      "PCIe link %.0f GT/s instead of %.0f" % (cs, ms), 10 if is_gpu else 30))
    return out


def pcie_aer(device, label, bdf, aer, aer_after, window):
    out = []
    if not aer:
        return out
    for kind in ("fatal", "nonfatal"):
        tot = ((aer.get(kind) or {}).get("total")) or 0
        if tot:
            names = ", ".join("%s %d" % (k, v) for k, v in sorted((aer.get(kind) or {}).items()) if v and k != "total")
            out.append(_f(device, "aer", "fault", "R6: AER %s errors > 0 since boot fail" % kind,
                          "%s %s aer_dev_%s TOTAL %d (%s)" % (label, bdf, kind, tot, names),
                          "`lspci -vvv -s %s`; reseat the card; if errors keep coming, RMA (platform vendor)" % bdf,
                          "%d PCIe AER %s errors" % (tot, kind), 30, aer_sev=kind))
    cor_b = ((aer.get("correctable") or {}).get("total")) or 0
    cor_a = (((aer_after or {}).get("correctable") or {}).get("total")) if aer_after else None
    if cor_a is not None and cor_a > cor_b:
        d = cor_a - cor_b
        fault = d >= AER_COR_FAULT
        out.append(_f(device, "aer", "fault" if fault else "suspect",
                      "R6: correctable AER errors growing during the triage -> warn, >= %d (DCGM Pcie.cpp:113) -> fail"
                      % AER_COR_FAULT, "%s %s correctable %d -> %d in %ss" % (label, bdf, cor_b, cor_a, window),
                      "`lspci -vvv -s %s`; reseat" % bdf, "correctable PCIe errors +%d" % d, 20 if fault else 8,
                      aer_sev="correctable"))
    return out


# --------------------------------------------------------------------------- GPU rules
def gpu_rules(gi, facts, extra, extra_after, kinds, window, nic):
    """One GPU's findings: its state (recovery action, fabric, NVLink, ECC, row remapping), the kernel log's Xids and
    PCIe events, thermal, and PCIe/persistence as nvidia-smi sees them."""
    dev = "GPU %d" % gi
    x = extra or {}
    f = facts or {}
    out = _gpu_state(dev, gi, x, f)
    out += _gpu_xids(dev, gi, kinds)
    gbdf = ((f.get("pci_bus_id") or "")[-12:]).lower() or dev
    out += kmsg_pcie(dev, kinds or {}, "GPU", gbdf, is_gpu=True)
    out += _gpu_thermal(dev, gi, x, extra_after, window)
    out += _gpu_pcie_persistence(dev, gi, x, extra_after, window)
    return out


def _gpu_state(dev, gi, x, f):
    """Recovery action, fabric, NVLink links down, uncorrectable ECC, row remapping (R9, rows 20 and 29)."""
    out = []
    ra = x.get("recovery_action")
    if ra and ra not in ("None", "N/A"):
        out.append(_f(dev, "gpu_recovery_action", "fault", "R9: gpu_recovery_action != None fails (aws Xid 154 action "
                      "text: REBOOT / RESET)", "gpu_recovery_action: %s" % ra,
                      "drain the node; %s" % ("reboot it" if "Reboot" in ra else "nvidia-smi -r -i %d (GPU reset) or reboot" % gi),
                      "recovery action '%s' pending" % ra, 45))
    fab = x.get("fabric") or f.get("fabric") or {}
    h = fab.get("health") or {}
    bad = []
    if fab.get("state") and fab["state"] != "Completed":
        bad.append("state %s" % fab["state"])
    if fab.get("status") and fab["status"] not in ("Success", "N/A"):
        bad.append("status %s" % fab["status"])
    if h.get("summary") in ("Unhealthy", "Limited Capacity"):
        bad.append("health summary %s" % h["summary"])
    if h.get("bandwidth") == "Degraded":
        bad.append("bandwidth Degraded")
    for k in ("route_recovery_in_progress", "route_unhealthy", "access_timeout_recovery"):
        if str(h.get(k)).lower() == "true":
            bad.append("%s True" % k)
    if bad:
        out.append(_f(dev, "fabric", "fault", "R9: fabric state != Completed, status != Success, summary Unhealthy/"
                      "Limited Capacity, bandwidth degraded, route recovery/unhealthy, access-timeout recovery fail "
                      "(gpud pkg/nvidia/nvml/device/fabric_state.go:115-176)", "fabric: " + ", ".join(bad),
                      "`systemctl status nvidia-fabricmanager`, `nvidia-smi -q -d FABRIC`; restart the fabric manager "
                      "or reboot; NVLink cabling/trays with the platform vendor",
                      "NVLink fabric %s" % ", ".join(bad), 40))
    nv = f.get("nvlink") or {}
    if nv.get("links_down"):
        out.append(_f(dev, "nvlink", "fault", "row 20: NVLink links down fail", "NVLink links down: %s of %s %s" % (
            nv["links_down"], nv.get("links_total"), nv.get("down_links") or ""), "`nvidia-smi nvlink -s -i %d`; "
            "reset the GPU or reboot; NVLink tray/cable with the platform vendor" % gi,
            "%d NVLink links down" % nv["links_down"], 40))
    ecc = f.get("ecc") or {}
    if (ecc.get("volatile_uncorrectable") or 0) > 0:
        out.append(_f(dev, "ecc", "fault", "row 29: volatile uncorrectable ECC > 0 fails",
                      "ECC volatile uncorrectable %s (aggregate %s)" % (
                          ecc.get("volatile_uncorrectable"), ecc.get("aggregate_uncorrectable")),
                      "drain; GPU reset / reboot to retire the rows; RMA if it repeats", "uncorrectable ECC errors", 35))
    rr = f.get("remapped_rows") or {}
    if rr.get("failure"):
        out.append(_f(dev, "remapped_rows", "fault", "row 29: remap failure -> RMA (gpud N/remapped-rows)",
                      "remapped_row_failure Yes", "RMA the GPU", "row remapping failed", 45))
    elif rr.get("pending"):
        out.append(_f(dev, "remapped_rows", "fault", "row 29: remap pending -> reset (gpud N/remapped-rows)",
                      "remapped_row_pending Yes", "drain; GPU reset (nvidia-smi -r -i %d) or reboot" % gi,
                      "row remap pending a reset", 35))
    return out


def _gpu_xids(dev, gi, kinds):
    """R1: the NVRM Xids (and a GPU fallen off the bus) in the kernel log."""
    out = []
    for kind in ("xid", "gpu_fallen_off_bus"):
        k = (kinds or {}).get(kind)
        if not k or (kind == "gpu_fallen_off_bus" and "79" in ((kinds or {}).get("xid") or {}).get("codes", {})):
            continue   # the "fallen off the bus" line that follows an Xid 79 is the same event
        codes = sorted(k["codes"].items(), key=lambda kv: -kv[1])
        fatal = [c for c, _n in codes if int(c) in _xid_fatal()]
        from ansible_collections.b300.rollout.plugins.module_utils.triage.triage_kmsg import xid_meaning
        meanings = ["Xid %s x%d: %s (%s)" % (c, n, xid_meaning(int(c))[0], xid_meaning(int(c))[1]) for c, n in codes]
        out.append(_f(dev, "xid", "fault" if fatal or kind == "gpu_fallen_off_bus" else "suspect",
                      "R1: NVRM Xid in the window; azhpc fails on 48 56 57 58 62 63 64 65 68 69 73 74 79 80 81 92 119 "
                      "120 (CT/azure_gpu_xid.nhc), aws grades the rest (0-nvidia-smi-check.sh:142-254)",
                      k["examples"][:2] + meanings, _xid_fix(codes, gi),
                      "; ".join("Xid %s (%s) x%d since %s" % (c, xid_meaning(int(c))[0], n, _short_ts(k["first"]))
                                for c, n in codes[:2]), 60 if "79" in dict(codes) else (50 if fatal else 10)))
    return out


def _gpu_thermal(dev, gi, x, extra_after, window):
    """R12: thermal slowdown active or its counters growing, T.Limit headroom, HBM temperature, since-boot context."""
    out = []
    # thermal (R12)
    reasons = [r for r in (x.get("clock_reasons_active") or []) if r in THERMAL_REASONS]
    temp, maxop = x.get("temp_c"), x.get("max_operating_c")
    d_thermal = {}
    if extra_after:
        d_thermal = counter_deltas([x], [extra_after]).get(x.get("index"), {})
    d_th = sum(v for k, v in d_thermal.items() if k in THERMAL_COUNTERS)
    if reasons or d_th > 0:
        ev = ["GPU %d at %s C (max operating %s C, T.Limit %s C), memory %s C" % (
            gi, temp, maxop, x.get("tlimit_c"), x.get("mem_temp_c"))]
        if reasons:
            ev.append("clock event reasons active: %s" % ", ".join(reasons))
        if d_th > 0:
            ev.append("thermal violation counters +%.1f s in %ss (%s)" % (
                d_th / 1e6, window, ", ".join("%s +%d us" % kv for kv in sorted(d_thermal.items()) if kv[1])))
        out.append(_f(dev, "thermal", "fault", "R12: HW slowdown / HW thermal / power brake / SW thermal active, or "
                      "their counters growing, fail (DCGM DcgmRecorder.cpp:503-523 fails on any thermal violation; "
                      "gpud hw-slowdown); sw_power_cap never counts (azhpc)", ev,
                      "check the airflow/cooling of GPU %d (the seed's fix was the cold-aisle air path: 96 C -> 82 C); "
                      "keep the load off until it runs below %s C" % (gi, maxop or "its max operating temperature"),
                      "%s C with thermal slowdown" % temp, 35))
    elif temp is not None and maxop is not None and temp >= maxop - TLIMIT_MARGIN_C:
        out.append(_f(dev, "thermal", "suspect", "R12: T.Limit headroom <= %d C -> warn (gpud margin)" % TLIMIT_MARGIN_C,
                      "GPU %d at %s C, max operating %s C" % (gi, temp, maxop), "check the airflow of GPU %d" % gi,
                      "%s C, %s C below max operating" % (temp, maxop - temp), 15))
    mt, mm = x.get("mem_temp_c"), x.get("mem_max_c")
    if mt is not None and mm is not None and mt > mm:
        out.append(_f(dev, "thermal", "suspect", "R12: HBM above its max -> degraded (gpud N/temperature)",
                      "memory %s C > max %s C" % (mt, mm), "check cooling", "HBM %s C" % mt, 15))
    since_boot = sum(v for k, v in (x.get("clock_counters_us") or {}).items() if k in THERMAL_COUNTERS)
    if since_boot and not reasons and d_th == 0:
        out.append(_f(dev, "thermal", "ok", "R12: cumulative thermal counters since the driver loaded: context only",
                      "thermal slowdown %.1f s since the driver loaded" % (since_boot / 1e6), None,
                      "throttled %.0f s since boot" % (since_boot / 1e6), 0))
    return out


def _gpu_pcie_persistence(dev, gi, x, extra_after, window):
    """R6: the GPU's PCIe link width and replays during the triage as nvidia-smi sees them; row 28: persistence."""
    out = []
    pc = x.get("pcie") or {}
    if pc.get("width") and pc.get("max_width") and pc["width"] < pc["max_width"]:
        out.append(_f(dev, "pcie", "fault", "R6: GPU link width below its max fails", "nvidia-smi: PCIe x%d of x%d" % (
            pc["width"], pc["max_width"]), "reseat / check the GPU baseboard; platform vendor",
            "GPU PCIe x%d instead of x%d" % (pc["width"], pc["max_width"]), 30))
    if extra_after:
        r0, r1 = pc.get("replay"), (extra_after.get("pcie") or {}).get("replay")
        if r0 is not None and r1 is not None and r1 > r0:
            gen, width = pc.get("gen") or 5, pc.get("width") or 16
            budget = REPLAY_PER_MIN_LANE.get(gen, 1.92) * width * max(window, 1) / 60.0
            fault = (r1 - r0) > budget
            out.append(_f(dev, "pcie", "fault" if fault else "suspect",
                          "R6: replays during the triage above DCGM's budget (1e-12 x lane rate x 60 s per lane per "
                          "minute, DcgmHealthWatch.cpp:1556-1580) fail, below it warn",
                          "replay_counter %d -> %d in %ss (budget %.1f)" % (r0, r1, window, budget),
                          "reseat; check the PCIe path of GPU %d" % gi, "PCIe replays +%d" % (r1 - r0), 25 if fault else 8))
    pm = x.get("persistence_mode")
    if pm and pm.lower() == "disabled":
        out.append(_f(dev, "persistence", "suspect", "row 28: persistence mode supported but off -> unhealthy (gpud), "
                      "warn (DCGM)", "persistence mode Disabled", "systemctl enable --now nvidia-persistenced",
                      "persistence mode off", 8))
    return out


def _xid_fatal():
    from ansible_collections.b300.rollout.plugins.module_utils.triage.triage_kmsg import XID_FATAL
    return XID_FATAL


def _xid_fix(codes, gi):
    cs = {int(c) for c, _n in codes}
    if 79 in cs:
        return "drain the node and reboot; if GPU %d falls off the bus again, reseat it / RMA (platform vendor)" % gi
    if cs & {74, 144, 145, 146, 147, 148, 149, 150}:
        return "NVLink error: `nvidia-smi nvlink -e -i %d`; GPU reset or reboot; NVLink tray with the vendor" % gi
    if cs & {48, 63, 64, 92, 94, 95, 140}:
        return "memory error: check row remapping (`nvidia-smi -q -d ROW_REMAPPER -i %d`); reset; RMA if it repeats" % gi
    return "see NVIDIA's Xid catalog for code(s) %s; GPU reset or reboot for the fatal ones" % ",".join(str(c) for c in sorted(cs))


# --------------------------------------------------------------------------- host rules
def host_rules(col):
    out = []
    g = col.get("gdr") or {}
    if g:
        if g.get("mode") == "none":
            out.append(_f("host", "gpudirect", "fault", "R7: neither nvidia_peermem nor DMA-BUF: NCCL falls back to "
                          "staging through host memory (gdr.cc:14-68)", g.get("evidence"),
                          "modprobe nvidia_peermem (and list it in /etc/modules-load.d)",
                          "no GPUDirect RDMA path (no peermem, no DMA-BUF)", 35))
        elif not g.get("peermem"):
            out.append(_f("host", "gpudirect", "suspect", "R7: nvidia_peermem not loaded, GPUDirect only through DMA-BUF; "
                          "the CUDA 13 Mooncake transfer engine then warns that DMA-BUF corrupts transfers above 4 GiB "
                          "on kernels without a specific fix (day-one-facts.md)", g.get("evidence"),
                          "modprobe nvidia_peermem; add it to /etc/modules-load.d so it survives a reboot",
                          "nvidia_peermem not loaded (GPUDirect via DMA-BUF only)", 25))
    io = col.get("iommu") or {}
    if io.get("mode") == "translated":
        out.append(_f("host", "iommu", "suspect", "R8: IOMMU translating (not passthrough) -> warn: P2P/GDR traffic is "
                      "remapped (NCCL docs gpu_troubleshooting.rst:90-131)", io.get("evidence"),
                      "boot with iommu=pt (intel_iommu=on iommu=pt / amd_iommu=on iommu=pt) as the platform vendor "
                      "recommends", "IOMMU in translated mode", 15))
    kl = col.get("kernel_log") or {}
    if kl.get("error"):
        out.append(_f("host", "kernel_log", "suspect", "ours: the kernel log could not be read, its checks did not run",
                      kl["error"], "run the triage with become (root), or read `journalctl -k` by hand", "kernel log "
                      "not read", 3))
    dl = col.get("devlink") or {}
    if dl.get("error"):
        out.append(_f("host", "devlink", "ok", "R2: devlink health not readable: its check did not run (info)",
                      dl["error"], "install iproute2's devlink", "devlink not read", 0))
    return out


# --------------------------------------------------------------------------- history (health_history_read)
def history_rules(hist, gpu_nic, window_label):
    """Judge the health history (the ``health_history_read`` module's result) for "was it hot when it hung?".
    hist: {available, window: {start_epoch, end_epoch}, gpus: {idx: {samples, max_temp_c, max_mem_temp_c,
    min_sm_clock_mhz, thermal_violation_s, power_violation_s, hot, first_hot_epoch}}, nics: {mlx5_N: {counter: delta}}}."""
    out = []
    if not hist or not hist.get("available"):
        return out
    for idx, g in sorted((hist.get("gpus") or {}).items(), key=lambda kv: int(kv[0])):
        tv = float(g.get("thermal_violation_s") or 0)
        if g.get("hot") or tv > 0:
            first = g.get("first_hot_epoch")
            when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(first)) if first else "?"
            verdict = "fault" if g.get("hot") and tv >= THERMAL_HIST_FAULT_S else "suspect"
            out.append(_f("GPU %s" % idx, "history_thermal", verdict,
                          "history (ours): hot in the window with thermal violation time -> fail, hot or violation "
                          "alone -> warn (R12 rules over the sampled history)",
                          "history %s: max %s C (HBM %s C), min SM clock %s MHz, thermal violation %.0f s, power "
                          "violation %.0f s, hot since %s, %s samples" % (
                              window_label, g.get("max_temp_c"), g.get("max_mem_temp_c"), g.get("min_sm_clock_mhz"), tv,
                              float(g.get("power_violation_s") or 0), when, g.get("samples")),
                          "check cooling of GPU %s; the plot in the report shows the window" % idx,
                          "it was hot in the window: max %s C, %.0f s thermal violation" % (g.get("max_temp_c"), tv),
                          30 if verdict == "fault" else 12))
    for nic, cs in sorted((hist.get("nics") or {}).items()):
        for c, d in sorted((cs or {}).items()):
            if not d or d <= 0:
                continue
            if c in HW_COUNTERS_FAULT or c in ERROR_COUNTERS_FAULT:
                out.append(_f(nic, "history_counters", "fault", "R4/R5 over the history window: %s growing fails" % c,
                              "history %s: %s +%s" % (window_label, c, _fmt_int(d)),
                              "see the NIC's other findings; firmware vs driver (tools/fw-audit), then the link",
                              "%s +%s in the last %s" % (c, _fmt_int(d), window_label), 25))
    return out


# --------------------------------------------------------------------------- traffic (--traffic)
def traffic_rules(traffic, expected_by_nic):
    """traffic: {nic: {ib_write_bw: {rc, gbps, parsed, error}, nccl: {verdict, reasons, warns: parse_nccl_warns}}}."""
    out = []
    gated = {n: (t.get("nccl") or {}).get("gated_gbps") for n, t in (traffic or {}).items()}
    vals = sorted(v for v in gated.values() if v)
    median = vals[len(vals) // 2] if vals else None
    for nic, t in sorted((traffic or {}).items()):
        if t.get("refused"):
            continue
        g = gated.get(nic)
        if g and median and len(vals) >= 3 and g < NCCL_RELATIVE_SLOW * median:
            out.append(_f(nic, "nccl_one_nic", "suspect", "ours: NCCL through this NIC below %d%% of the median of the "
                          "other NICs' runs (same node, same test)" % int(NCCL_RELATIVE_SLOW * 100),
                          "busbw %.1f GB/s, median of the NICs %.1f GB/s" % (g, median),
                          "compare its port rate and PCIe link with the others", "NCCL through %s at %.0f%% of the "
                          "other NICs" % (nic, 100.0 * g / median), 15))
        wb = t.get("ib_write_bw")
        exp = expected_by_nic.get(nic)
        if wb:
            if wb.get("skipped"):
                pass
            elif wb.get("rc") not in (0, None) or wb.get("gbps") is None:
                out.append(_f(nic, "gdr_loopback", "fault", "R11a: GPUDirect loopback must run and report a bandwidth",
                              ["ib_write_bw rc %s%s" % (wb.get("rc"), (": " + wb["error"]) if wb.get("error") else "")],
                              "run `ib_write_bw -d %s --use_cuda=<gpu> -s 8388608 --report_gbits` by hand; GPUDirect "
                              "(nvidia_peermem) and the port" % nic, "GPUDirect loopback failed", 40))
            elif exp and wb["gbps"] < GDR_BW_FRACTION * exp:
                out.append(_f(nic, "gdr_loopback", "fault", "R11a: >= %d%% of line rate (azhpc check_ib_bw_gdr 360 on "
                              "400G)" % int(GDR_BW_FRACTION * 100),
                              "ib_write_bw --use_cuda %.1f Gb/s, floor %.0f (%d%% of %s)" % (
                                  wb["gbps"], GDR_BW_FRACTION * exp, int(GDR_BW_FRACTION * 100), exp),
                              "PCIe link and port rate of %s, then GPUDirect" % nic,
                              "GPUDirect loopback %.0f Gb/s of %s" % (wb["gbps"], exp), 35))
        nc = t.get("nccl")
        if nc:
            v = nc.get("verdict")
            if v in ("hang", "intermittent", "error", "wrong_results"):
                out.append(_f(nic, "nccl_one_nic", "fault", "R11b: NCCL through this NIC alone (NCCL_IB_HCA), K repeats "
                              "under the hang timeout: %s fails (nccl_results.classify)" % v,
                              (nc.get("reasons") or [])[:3], "see the WARN lines and this NIC's counters",
                              "NCCL over %s alone: %s" % (nic, v), 40))
            elif v == "slow":
                out.append(_f(nic, "nccl_one_nic", "suspect", "R11b: below the floor -> slow (warn)",
                              (nc.get("reasons") or [])[:2], "compare with the other NICs' figures",
                              "NCCL over %s alone slow" % nic, 15))
            out += nccl_warn_findings(nc.get("warns"), nic)
    return out


# IBV_EVENT_* as ibv_event_type_str() prints them (rdma-core libibverbs/enum_strs.c): which ones say the HCA, the port
# or a queue pair failed; the rest (port active, LID/GID/P_Key/SM change, ...) are information
_ASYNC_DEVICE = ("local catastrophic error",)
_ASYNC_PORT = ("port error",)
_ASYNC_QP = ("work queue", "CQ error", "SRQ catastrophic error", "SRQ error", "path migration request error")


def _ibv_error_hint(verb, error):
    e = (error or "").lower()
    if "cannot allocate memory" in e or (verb == "ibv_create_qp" and not e):
        return ("no memory for the queue pair: the locked-memory limit of the job (`ulimit -l` must be unlimited, in "
                "the container too) or too many QPs (NCCL_IB_QPS_PER_CONNECTION)")
    if "network is unreachable" in e or "no route" in e:
        return ("no route to the peer's GID: RoCE needs an address on the netdev and the right NCCL_IB_GID_INDEX; the "
                "port may be down")
    if "timed out" in e:
        return "the peer did not answer: the link or the peer's port"
    if "invalid argument" in e:
        return "the verbs call was refused (invalid argument): NCCL_IB_GID_INDEX / MTU / the port's state"
    return "see the HCA's kernel log at that time; `ulimit -l`"


def _nccl_async_findings(w, default_dev):
    """NCCL's async events (fatal event, device, port, QP/CQ errors), grouped per HCA and kind."""
    out = []
    groups = {}
    for a in w.get("async_events") or []:
        groups.setdefault((a.get("hca") or default_dev, a.get("kind"), a.get("text")), []).append(a)
    for (dev, kind, text), evs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or "", kv[0][2] or "")):
        t = text or ""
        n = " x%d" % len(evs) if len(evs) > 1 else ""
        if kind == "fatal_event":
            out.append(_f(dev, "nccl_warn", "fault", "R11: NCCL async fatal event on the HCA", [e["raw"] for e in evs[:2]],
                          "see the kernel log of the HCA", "async fatal event on %s%s" % (dev, n), 35))
        elif any(x in t for x in _ASYNC_DEVICE):
            out.append(_f(dev, "nccl_warn", "fault", "ours: NCCL's `Got async event : local catastrophic error` is "
                          "IBV_EVENT_DEVICE_FATAL (libibverbs enum_strs.c): the HCA itself failed, every QP on it is "
                          "lost", [e["raw"] for e in evs[:2]],
                          "drain the node; the HCA's kernel log (mlx5 health / fw_fatal) and `devlink health`; reset "
                          "the HCA (mlxfwreset) or reboot", "HCA catastrophic error (async event)%s" % n, 45))
        elif any(x in t for x in _ASYNC_PORT):
            out.append(_f(dev, "nccl_warn", "fault", "ours: `Got async event : port error` is IBV_EVENT_PORT_ERR: the "
                          "port left ACTIVE under NCCL", [e["raw"] for e in evs[:2]],
                          "the port's state and the kernel log (link down, module); cable", "port error (async event)%s"
                          % n, 30))
        elif any(x in t for x in _ASYNC_QP):
            out.append(_f(dev, "nccl_warn", "fault", "R11 (older NCCL form): an async error event on a queue pair or CQ "
                          "(`Got async event : %s`) takes the connection down like the async fatal event" % t,
                          [e["raw"] for e in evs[:2]], "see the kernel log of the HCA; the completion errors beside it",
                          "async event '%s' on %s%s" % (t, dev, n), 35))
    return out


def _nccl_ibv_findings(w, default_dev):
    """Failed ibverbs calls NCCL made (misc/ibvwrap), grouped per verb and error."""
    out = []
    fails = {}
    for f in w.get("ibv_failures") or []:
        fails.setdefault((f["verb"], f.get("error")), []).append(f)
    for (verb, error), fs in sorted(fails.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        n = " x%d" % len(fs) if len(fs) > 1 else ""
        if verb == "ibv_get_async_event":
            out.append(_f(default_dev, "nccl_warn", "suspect", "ours: NCCL's async-event thread lost the HCA "
                          "(`ibv_get_async_event` failed): it follows a device failure or the HCA going away",
                          [f["raw"] for f in fs[:2]], "the HCA's kernel log at that time",
                          "NCCL lost the HCA's async events%s" % n, 10))
            continue
        out.append(_f(default_dev, "nccl_warn", "fault", "ours: an ibverbs call NCCL needs failed (misc/ibvwrap: `Call to "
                      "%s failed`): NCCL cannot connect through the HCA; the error text says why" % verb,
                      [f["raw"] for f in fs[:2]] + [_ibv_error_hint(verb, error)], _ibv_error_hint(verb, error),
                      "NCCL %s failed%s%s" % (verb, (" (" + error + ")") if error else "", n), 30))
    return out


def _nccl_gdr_findings(w, default_dev):
    """GPU Direct RDMA disabled per HCA (and why), or between GPU/HCA pairs (PCIe distance)."""
    out = []
    # GPU Direct RDMA: the last word per HCA of the transports that carry traffic (not NET/Socket)
    last = {}
    for e in w.get("gdr_events") or []:
        if e.get("transport") != "Socket":
            last.setdefault(e["hca"], []).append(e)
    nomod = []
    for hca, evs in sorted(last.items()):
        if (w.get("gdr") or {}).get(hca) != "Disabled":
            continue
        dis = [e for e in evs if e["state"] == "Disabled"][-1]
        dmabuf = any(e["state"] == "Enabled" and (e.get("via") or "").upper() == "DMABUF" for e in evs)
        if dis.get("reason") == "no module" and not dmabuf:
            nomod.append((hca, dis))
            continue
        out.append(_f(hca, "nccl_gdr", "fault", "ours (NCCL net_ib getProperties): NCCL will not use GPU Direct RDMA on "
                      "this HCA%s: traffic is staged through host memory" % (
                          " -- the transport that carries it (%s) says Disabled although another says enabled"
                          % dis["transport"] if len(evs) > 1 else ""), [e["raw"] for e in evs[-2:]],
                      "load nvidia_peermem (`modprobe nvidia_peermem`) or enable DMA-BUF (open GPU kernel modules, "
                      "kernel >= 5.12) for %s; check the NCCL net plugin's own GDR support" % hca,
                      "GPU Direct RDMA disabled for %s%s" % (hca, (" (" + dis["reason"] + ")") if dis.get("reason")
                                                             else ""), 30))
    if nomod:
        out.append(_f(default_dev if default_dev == "host" else "host", "nccl_gdr", "fault",
                      "R7 from NCCL's own line: `GPU Direct RDMA Disabled ... (no module)` = /sys/kernel/mm/"
                      "memory_peers/nv_mem/version missing (net_ib ncclIbGdrSupport): nvidia_peermem not loaded and "
                      "no DMA-BUF path printed", [d["raw"] for _h, d in nomod[:3]],
                      "modprobe nvidia_peermem (and list it in /etc/modules-load.d)",
                      "NCCL: GPU Direct RDMA disabled, no peermem module (%s)" % ", ".join(h for h, _d in nomod), 35))
    pairs = {}
    for g in w.get("gdr_gpu") or []:
        pairs[(g["gpu"], g["hca_index"])] = g
    far = [g for g in pairs.values() if g["state"] == "Disabled"]
    if far:
        out.append(_f(default_dev, "nccl_gdr", "suspect", "ours (NCCL graph/paths.cc ncclTopoCheckGdr): NCCL will not "
                      "use GPU Direct RDMA between these GPUs and HCAs: their PCIe distance is above NCCL_NET_GDR_LEVEL",
                      [g["raw"] for g in far[:3]], "check which NIC sits beside each GPU (`nvidia-smi topo -m`); "
                      "NCCL_NET_GDR_LEVEL only if the placement is right",
                      "NCCL GDR off for %s (distance above the GDR level)" % ", ".join(
                          "GPU %s / HCA %d" % (g["gpu"], g["hca_index"]) for g in far[:3]), 10))
    return out


def nccl_warn_findings(warns, default_dev):
    """Findings from NCCL's WARN/INFO lines and PyTorch's watchdog lines (``parse_nccl_warns``). ``default_dev``: the
    device a line without an HCA is charged to (the only NIC of a triage run, or "host" for pasted evidence). Completion
    errors and async fatal events fail on their HCA (R11); the rest is ours, each rule says why."""
    out = []
    w = warns or {}
    for c in (w.get("completions") or [])[:3]:
        hca = c.get("hca") or default_dev
        out.append(_f(hca, "nccl_warn", "fault", "R11: NCCL WARN completion error; NCCL's hint for %s "
                      "(common.h:612-629)" % c["status_name"], [c["raw"], c.get("hint")],
                      "status %s: %s" % (c["status"], c.get("hint") or "see NCCL docs"),
                      "NCCL %s(%d) on %s" % (c["status_name"], c["status"], hca), 35))
    out += _nccl_async_findings(w, default_dev)
    out += _nccl_ibv_findings(w, default_dev)
    ce = w.get("comm_errors") or []
    if ce:
        out.append(_f(default_dev, "nccl_warn", "fault", "ours: NCCL aborted the communicator (`communicator encountered "
                      "a fatal error`): the job failed; its cause is the WARN before it", [c["raw"] for c in ce[:2]],
                      "read the WARN lines before it (completion, async event)", "NCCL communicator fatal error x%d"
                      % len(ce), 15))
    wd = w.get("watchdog") or []
    if wd:
        ops = sorted({"%s SeqNum=%d" % (x["op"], x["seq"]) for x in wd})
        ranks = sorted({x["rank"] for x in wd})
        out.append(_f(default_dev, "nccl_warn", "suspect", "ours: PyTorch's ProcessGroupNCCL watchdog timed a collective "
                      "out (ProcessGroupNCCL.cpp checkTimeout): the hang itself; its cause is in the other findings",
                      [x["raw"] for x in wd[:2]], "find the rank that did not join (the first timeout) and its node's "
                      "kernel log and NIC counters", "PyTorch NCCL watchdog timeout: %s (rank %s, %d ms)" % (
                          ", ".join(ops[:2]), ",".join(str(r) for r in ranks[:8]), max(x["ran_ms"] for x in wd)), 10))
    out += _nccl_gdr_findings(w, default_dev)
    if w.get("ib_no_device") and (w.get("network") or "Socket") == "Socket":
        out.append(_f(default_dev, "nccl_warn", "fault", "ours: `NET/IB : No device found.` then sockets: NCCL found no "
                      "usable IB/RoCE HCA (rdma-core, the port state, NCCL_IB_HCA) and runs over TCP",
                      ["NET/IB : No device found.", "Using network %s" % (w.get("network") or "Socket")],
                      "`ibv_devinfo`; the ports ACTIVE; NCCL_IB_HCA names an existing HCA; the container sees "
                      "/dev/infiniband", "NCCL found no IB device (network Socket)", 35))
    return out


# --------------------------------------------------------------------------- pasted evidence (--evidence)
def evidence_rules(pasted, expected_by_nic):
    """Findings from the pasted files (``triage_evidence.read_evidence``; its kernel-log part is merged into the
    kernel-log rules by the caller). Pasted counters are since their last clear, their growth is unknown: a fault
    counter non-zero is a suspicion with its value (R4's since-boot rule)."""
    out = []
    for path, w in pasted.get("nccl") or []:
        for f in nccl_warn_findings(w, "host"):
            f["evidence"] = f["evidence"] + ["(from %s)" % path]
            out.append(f)
    for path, r in pasted.get("perftest") or []:
        gbps = perftest_gbps(r)
        dev = r.get("device") or "host"
        row = r.get("largest") or {}
        exp = expected_by_nic.get(dev)
        what = "%s on %s: %.1f Gb/s at %s bytes" % (r.get("test") or "perftest", dev, gbps or 0, row.get("bytes"))
        # ours: atomics and messages under 64 KiB do not fill a link, they are reported, not judged
        judged = "atomic" not in (r.get("test") or "").lower() and row.get("bytes", 0) >= 65536
        if exp and gbps is not None and judged and gbps < GDR_BW_FRACTION * exp:
            shown = [what + " (%s)" % path, "unit %s (perftest MB = 2^20 bytes)" % r.get("unit")]
            out.append(_f(dev, "evidence_perftest", "suspect", "R11a over a pasted run: below %d%% of the line rate "
                          "(azhpc check_ib_bw_gdr); a pasted run's options are not known, so it warns"
                          % int(GDR_BW_FRACTION * 100), shown,
                          "re-run the triage with --traffic on a drained node (GPUDirect loopback through %s)" % dev,
                          "pasted %s %.0f Gb/s of %s" % (r.get("test") or "perftest", gbps, exp), 15))
        else:
            out.append(_f(dev, "evidence_perftest", "ok", "a pasted perftest run (reported)", what + " (%s)" % path,
                          None, "pasted %s %.0f Gb/s" % (r.get("test") or "perftest", gbps or 0), 0))
    fabric = []
    for p in pasted.get("ib_ports") or []:
        bad = {c: v for c, v in (p.get("counters") or {}).items() if v and c in ERROR_COUNTERS}
        if not bad:
            continue
        faults = sorted(c for c in bad if c in ERROR_COUNTERS_FAULT)
        line = "%s %s: %s (%s)" % (p["source"], p["where"], ", ".join("%s %s" % (c, _fmt_int(v)) for c, v in
                                                                      sorted(bad.items())), p["path"])
        if p.get("nic"):
            out.append(_f(p["nic"], "evidence_counters", "suspect", "R4 over pasted %s counters (since their last "
                          "clear, growth unknown): non-zero error counters warn" % p["source"], line,
                          "clear and re-read (`perfquery -x -R`), or re-run the triage: it reads them twice; "
                          "`mlxlink -d %s -m -c`" % p["nic"], "pasted %s: %s" % (p["source"], ", ".join(
                              "%s %s" % (c, _fmt_int(bad[c])) for c in (faults or sorted(bad))[:3])),
                          10 if faults else 5))
        else:
            fabric.append((bool(faults), line))
    if fabric:
        fabric.sort(key=lambda x: not x[0])
        lines = [x[1] for x in fabric[:4]]
        out.append(_f("fabric", "evidence_counters", "suspect", "R4 over pasted counters of ports that are not this "
                      "host's (switch ports, other nodes): the fabric's, named for the fabric team", lines,
                      "hand the ports to the fabric team (UFM / `ibqueryerrors` again after a clear); check the "
                      "cables of the ports with link errors", "%d fabric ports with error counters in the pasted "
                      "output" % len(fabric), 5))
    for path, nic, netdev, phy in pasted.get("phy") or []:
        dev = nic or "host"
        for f in nic_phy_counters(dev, phy, phy, 0, "the pasted ethtool -S"):
            f["evidence"] = f["evidence"] + ["ethtool -S %s (%s)" % (netdev or "?", path)]
            if not nic and f.get("fix"):
                f["fix"] = "find the NIC of that netdev (`ethtool -i NETDEV`), then `mlxlink -d <its PCI address> -m -c`"
            out.append(f)
    return out


# --------------------------------------------------------------------------- the host
def _nic_label(name, gpu):
    return "%s (GPU %s's NIC)" % (name, gpu) if gpu is not None else name


def judge_host(col, rows, policy=None, expected_port_gbps=None, history=None, traffic=None, since="?",
               history_label=None, evidence=None):
    """Findings, device verdicts and ranked causes for one host's collection (see the module docstring);
    ``evidence``: pasted files [{path, text}] (``tools/triage --evidence``), judged by the same rules."""
    pasted = read_evidence(col, evidence) if evidence else {}
    rn = col.get("rdma_nics") or {}
    nic_gpu = dict(col.get("nic_gpu") or {})
    gpu_nic = {}
    for n, g in nic_gpu.items():
        if g is not None:
            gpu_nic.setdefault(int(g), n)
    kdev = ((col.get("kernel_log") or {}).get("scan") or {}).get("devices") or {}
    if pasted.get("kernel"):
        kdev = merge_kernel(kdev, pasted["kernel"])
    window = col.get("delta_window_s") or 0
    devices, findings = {}, []
    nics = _nic_findings(col, rows, policy, nic_gpu, kdev, dict(expected_port_gbps or {}), window, devices, findings)
    expected_by_nic = nics["expected_by_nic"]
    findings += _pcie_findings(col, window, devices)
    findings += _gpu_findings(col, gpu_nic, kdev, window, devices)
    findings += _unmapped_kernel_findings(kdev, devices)
    findings += _node_findings(findings, kdev)
    findings += host_rules(col)
    findings += history_rules(history, gpu_nic, history_label or since)
    findings += traffic_rules(traffic, expected_by_nic)
    if pasted:
        findings += evidence_rules(pasted, expected_by_nic)
    findings = _settled_findings(findings, traffic, rn, rows, policy)
    _device_verdicts(devices, findings)
    causes = rank_causes(devices)
    status = max((d["verdict"] for d in devices.values()), key=lambda v: RANK[v], default="ok")
    return {"status": status, "devices": devices, "causes": causes,
            "most_likely_cause": causes[0]["sentence"] if causes else None,
            "counts": {v: sum(1 for d in devices.values() if d["verdict"] == v) for v in VERDICTS},
            "firmware": nics["fw_rows"], "data_nics": sorted(d["name"] for d in nics["data_nics"]),
            "evidence": pasted.get("files") or []}


def _nic_findings(col, rows, policy, nic_gpu, kdev, expected, window, devices, findings):
    """Each NIC into devices; the data NICs' findings (firmware, kernel log, devlink, ports, counters, PHY counters)
    appended to findings. Returns the firmware rows, the expected port speed per NIC and the data NICs."""
    rn = col.get("rdma_nics") or {}
    ports_a = col.get("ports_after") or {}
    expected_by_nic = {}
    fw_rows = []
    data_nics = [d for d in (rn.get("devices") or []) if d.get("role", "data") == "data"]
    for d in sorted(rn.get("devices") or [], key=lambda x: x["name"]):
        name = d["name"]
        devices[name] = {"kind": "nic", "model": d.get("model"), "pci": d.get("pci_address"), "role": d.get("role"),
                         "gpu": nic_gpu.get(name), "fw": d.get("fw_ver"), "label": _nic_label(name, nic_gpu.get(name))}
        f, v = nic_firmware(d, rn.get("driver"), rows, policy)
        fw_rows.append(v)
        if d.get("role", "data") != "data":
            # fabric-manager / frontend NICs: the gate ignores them; only their kernel-log ACCESS_REG info is kept
            continue
        if f:
            findings.append(f)
        bdf = d.get("pci_address") or name
        findings += nic_kmsg(name, kdev.get(name) or {}, bdf)
        findings += nic_devlink(name, devlink_for_pci((col.get("devlink") or {}).get("health"), d.get("pci_address")),
                                ((col.get("devlink") or {}).get("diagnose") or {}).get(d.get("pci_address") or "", {}))
        exp = expected.get(d.get("model"))
        expected_by_nic[name] = exp
        for pn, p in sorted(((col.get("ports") or {}).get(name) or {}).items()):
            findings += nic_port(name, p, exp)
            pa = (ports_a.get(name) or {}).get(pn)
            if pa:
                findings += nic_counters(name, p, pa, window, "the triage (%ss, live traffic)" % window)
            else:
                findings += nic_counters(name, p, p, 0, "the triage")
        phy0 = (col.get("phy_counters") or {}).get(name)
        if phy0 is not None:
            phy1 = (col.get("phy_counters_after") or {}).get(name)
            findings += nic_phy_counters(name, phy0, phy1 if phy1 is not None else phy0, window if phy1 is not None
                                         else 0, "the triage (%ss, live traffic)" % window if phy1 is not None
                                         else "the triage")
    return {"fw_rows": fw_rows, "expected_by_nic": expected_by_nic, "data_nics": data_nics}


def _pcie_findings(col, window, devices):
    """PCIe: NICs, GPUs and the bridges on each GPU<->NIC path (link, AER, ACS); bridges added to devices."""
    findings = []
    pcie = col.get("pcie") or {}
    pcie_after = col.get("pcie_after") or {}
    for bdf, e in sorted(pcie.items()):
        owner = e.get("of")
        role = e.get("role")
        if role == "bridge":
            dev = "bridge %s" % bdf
            devices.setdefault(dev, {"kind": "bridge", "pci": bdf, "between": e.get("between"),
                                     "label": "PCIe bridge %s (between %s)" % (bdf, " and ".join(e.get("between") or []))})
        elif role == "gpu":
            dev = owner
        else:
            dev = owner
        if dev not in devices and role != "bridge":
            continue
        label = {"bridge": "bridge", "gpu": "GPU", "nic": "NIC"}.get(role, role)
        findings += pcie_link(dev, label, e.get("link"), pcie.get(e.get("upstream") or "", {}).get("link"),
                              is_gpu=role == "gpu")
        findings += pcie_aer(dev, label, bdf, e.get("aer"), (pcie_after.get(bdf) or {}).get("aer"), window)
        bits = acs_enabled_bits(e.get("acs"))
        if role == "bridge" and bits:
            findings.append(_f(dev, "acs", "fault", "R8: ACS redirect controls on a bridge between a data NIC and its "
                               "GPU fail on bare metal: P2P goes through the root complex, 'significant performance "
                               "reduction or even a hang' (NCCL docs gpu_troubleshooting.rst:90-131); verify the expected "
                               "setting with the HGX platform vendor",
                               "%s: ACSCtl %s (%s)" % (bdf, " ".join(b + "+" for b in bits), e.get("acs_source") or "lspci"),
                               "disable ACS on the PCIe switch ports (BIOS, or at boot: setpci -s %s ECAP_ACS+0x6.w=0000) "
                               "as the platform vendor documents" % bdf,
                               "ACS %s enabled on the GPU<->NIC path" % "/".join(bits), 30))
    return findings


def _gpu_findings(col, gpu_nic, kdev, window, devices):
    """Each GPU into devices, with gpu_rules' findings."""
    findings = []
    gt = col.get("gpu_topology") or {}
    extras = {x["index"]: x for x in col.get("gpu_extras") or []}
    extras_after = {x["index"]: x for x in col.get("gpu_extras_after") or []}
    for g in gt.get("gpus") or []:
        gi = g["index"]
        name = "GPU %d" % gi
        devices.setdefault(name, {"kind": "gpu", "pci": g.get("pci_bus_id"), "nic": gpu_nic.get(gi),
                                  "label": "%s (NIC %s)" % (name, gpu_nic.get(gi)) if gpu_nic.get(gi) else name})
        findings += gpu_rules(gi, g, extras.get(gi), extras_after.get(gi), kdev.get(name) or {}, window, gpu_nic.get(gi))
    return findings


def _unmapped_kernel_findings(kdev, devices):
    """Kernel-log events on devices we know nothing else of (an NVSwitch, an unmapped PCI function)."""
    findings = []
    for dev, kinds in sorted(kdev.items()):
        if dev in devices or dev == "host":
            continue
        for kind, k in kinds.items():
            if kind == "mlx5_probe_failed":
                findings.append(_f(dev, "kernel_log", "fault", "ours: a ConnectX function the mlx5 driver could not "
                                   "load (mlx5 main.c probe error) is no RDMA device: NCCL and the triage do not see it",
                                   k["examples"][:2], "the lines before the probe error name the failed command; "
                                   "firmware vs driver (tools/fw-audit); `mlxfwmanager --query -d %s`" % dev[4:],
                                   "mlx5 probe failed (error %s)" % ",".join(sorted(k["codes"])), 45))
                devices.setdefault(dev, {"kind": "pci", "label": "%s (ConnectX, not loaded)" % dev})
            elif kind in ("pcie_aer", "pcie_link") and (set(k["subs"]) - {"correctable", "bandwidth_limited"}):
                findings.append(_f(dev, "kernel_log", "suspect", "ours: an uncorrectable AER or a link loss on a PCIe "
                                   "device outside the GPU<->NIC paths: the host's, not NCCL's, unless it is on them",
                                   k["examples"][:2], "`lspci -vvv -s %s`; which device is it (lspci -s)?" % dev[4:],
                                   "PCIe %s on a device outside the GPU<->NIC paths" % "/".join(sorted(
                                       x for x in k["subs"] if x not in ("correctable", "bandwidth_limited"))), 5))
                devices.setdefault(dev, {"kind": "pci", "label": dev})
            if kind in ("sxid",):
                fatal = k["subs"].get("fatal", 0) > 0
                findings.append(_f(dev, "kernel_log", "fault" if fatal else "suspect", "row 18: NVSwitch SXid (gpud "
                                   "N/sxid; aws)", k["examples"], "`nvidia-smi -q` fabric; fabric manager log; reboot "
                                   "for fatal SXids", "SXid %s x%d" % (",".join(k["codes"]), k["count"]),
                                   35 if fatal else 10))
                devices.setdefault(dev, {"kind": "nvswitch", "label": dev})
    return findings


def _node_findings(findings, kdev):
    """Host-level causes: one fabric for the whole node (the same fabric finding on several GPUs is one host-level
    cause), nvidia_peermem's invalid context."""
    out = []
    fab = sorted({f["device"] for f in findings if f["check"] == "fabric"}, key=lambda d: int(d.split()[1]))
    if len(fab) >= 2:
        ev = [f["evidence"][0] for f in findings if f["check"] == "fabric"][:1]
        out.append(_f("host", "fabric", "fault", "R9 over the node: the NVLink fabric is shared by every GPU of the "
                      "host; %d GPUs report it" % len(fab), ev + ["on %s" % ", ".join(fab)],
                      [f["fix"] for f in findings if f["check"] == "fabric"][0],
                      "NVLink fabric degraded on %d GPUs" % len(fab), 45))
    host_k = kdev.get("host") or {}
    pm = host_k.get("peermem_invalid_context")
    if pm:
        out.append(_f("host", "kernel_log", "fault" if pm["count"] >= PEERMEM_FAULT else "suspect",
                      "R1: nvidia_peermem 'invalid context' fails when repeated (gpud N/peermem/kmsg_matcher.go:14)",
                      pm["examples"], "restart the jobs using GPUDirect; reload nvidia_peermem; check the driver "
                      "versions match", "peermem invalid context x%d" % pm["count"], 25))
    return out


def _settled_findings(findings, traffic, rn, rows, policy):
    """The traffic test's counter findings added, AER folded, a since-boot counter dropped where the same counter
    grew during the triage or the traffic, the firmware gate's host findings added."""
    for nic, t in sorted((traffic or {}).items()):
        if t.get("counters_before") and t.get("counters_after"):
            findings += [f for f in nic_counters(nic, t["counters_before"], t["counters_after"], t.get("duration_s") or 0,
                                                 "the traffic test through %s" % nic) if "since boot" not in f["summary"]]
    findings = fold_aer(findings)
    # a counter that grew during the triage or the traffic says more than its since-boot value: keep one of them
    grown = {(f["device"], f.get("counter")) for f in findings if f.get("counter") and f["verdict"] != "ok"}
    findings = [f for f in findings if not (f["summary"].endswith("since boot") and
                                            (f["device"], f["summary"].split()[0]) in grown)]
    # host-level firmware findings (pending images not attributable, mlxfwmanager output not understood)
    hostfw = fw_matrix.check_host(rn, rows, policy)["host_findings"] if rn else []
    for hf in hostfw:
        if hf["severity"] != "ok":
            findings.append(_f("host", "firmware", "fault" if hf["severity"] == "fail" else "suspect",
                               "row 4: the firmware gate's host finding (%s)" % hf["verdict"], hf["reason"],
                               hf["remediation"], hf["reason"][:80], 20))
    return findings


def _device_verdicts(devices, findings):
    """Each device's findings, verdict and score; findings on a device not listed (e.g. an hca named by NCCL that
    sysfs does not show) become devices of kind other."""
    devices.setdefault("host", {"kind": "host", "label": "host"})
    for name, d in devices.items():
        fs = [f for f in findings if f["device"] == name]
        d["findings"] = fs
        d["verdict"] = max((f["verdict"] for f in fs), key=lambda v: RANK[v], default="ok")
        d["score"] = sum(f["score"] * (1.0 if f["verdict"] == "fault" else 0.5 if f["verdict"] == "suspect" else 0)
                         for f in fs)
    # findings on a device not listed (e.g. an hca named by NCCL that sysfs does not show)
    others = {}
    for f in findings:
        if f["device"] not in devices:
            others.setdefault(f["device"], []).append(f)
    for name, fs in others.items():
        devices[name] = {"kind": "other", "label": name, "findings": fs,
                         "verdict": max((f["verdict"] for f in fs), key=lambda v: RANK[v]),
                         "score": sum(f["score"] * (1.0 if f["verdict"] == "fault" else 0.5 if f["verdict"] == "suspect"
                                                    else 0) for f in fs)}


def rank_causes(devices, top=3):
    """Devices with a non-ok verdict, by verdict then evidence score; each with a one-line sentence: device (relation):
    evidence summaries joined with ' + ' -> the fix of its strongest finding."""
    cands = [(name, d) for name, d in devices.items() if d["verdict"] != "ok"]
    cands.sort(key=lambda nd: (-RANK[nd[1]["verdict"]], -nd[1]["score"], nd[0]))
    out = []
    for name, d in cands[:top]:
        fs = sorted([f for f in d["findings"] if f["verdict"] != "ok"],
                    key=lambda f: (-RANK[f["verdict"]], -f["score"]))
        parts = []
        for f in fs:
            if f["summary"] not in parts:
                parts.append(f["summary"])
        fix = fs[0]["fix"] if fs else ""
        sentence = "%s: %s -> %s" % (d.get("label") or name, " + ".join(parts[:4]), fix)
        out.append({"device": name, "verdict": d["verdict"], "score": round(d["score"], 1), "sentence": sentence,
                    "checks": sorted({f["check"] for f in fs})})
    return out


# --------------------------------------------------------------------------- the fleet
def host_state(value):
    """Normalise one host's collect result (a registered task result or a dict with status)."""
    v = value or {}
    if v.get("unreachable"):
        return "unreachable", (str(v.get("msg") or "host unreachable")).strip()
    if v.get("failed") or v.get("skipped"):
        return "failed", (str(v.get("msg") or "collect task failed")).strip()
    if not v.get("collection"):
        return "failed", "no collection returned"
    return "ok", ""


def judge_fleet(hosts, rows, policy=None, expected_port_gbps=None, histories=None, traffic=None, since="?",
                history_label=None, evidence=None):
    """{host: collect result} -> the triage report: hosts (status, devices, causes, message), summary (exit code).
    ``evidence``: {host: [{path, text}]} pasted files judged with the host's collection (a host that could not be
    triaged keeps its files unread: the report says so)."""
    report = {"hosts": {}, "summary": {}, "since": since, "history_window": history_label,
              "generated_epoch": int(time.time())}
    for host in sorted(hosts):
        state, msg = host_state(hosts[host])
        if state != "ok":
            report["hosts"][host] = {"status": state, "msg": msg, "devices": {}, "causes": [],
                                     "most_likely_cause": "could not triage %s: %s" % (host, msg),
                                     "evidence": [{"path": f["path"], "read": ["not judged: the host could not be "
                                                                               "triaged"]}
                                                  for f in (evidence or {}).get(host) or []]}
            continue
        col = hosts[host]["collection"]
        hist = (histories or {}).get(host)
        tr = (traffic or {}).get(host) or {}
        refused = tr.get("refused") if isinstance(tr.get("refused"), str) else None
        if refused:
            tr = {}
        res = judge_host(col, rows, policy, expected_port_gbps, hist, tr, since, history_label,
                         [dict(f, host=host) for f in (evidence or {}).get(host) or []])
        res["msg"] = "; ".join("%s: %s" % kv for kv in sorted((col.get("errors") or {}).items()))
        res["history"] = "available" if hist and hist.get("available") else "no history"
        res["traffic"] = ("refused: " + " ".join(refused.split())) if refused else ("ran" if tr else "not run")
        res["kernel_log_source"] = (col.get("kernel_log") or {}).get("source")
        res["serving_units"] = col.get("serving_units") or []
        report["hosts"][host] = res
    statuses = {h: e["status"] for h, e in report["hosts"].items()}
    unreach = sorted(h for h, s in statuses.items() if s in ("unreachable", "failed"))
    faults = sorted(h for h, s in statuses.items() if s == "fault")
    report["summary"] = {"hosts": len(statuses), "could_not_triage": unreach, "fault": faults,
                         "suspect": sorted(h for h, s in statuses.items() if s == "suspect"),
                         "ok": sorted(h for h, s in statuses.items() if s == "ok"),
                         "exit_code": 3 if unreach else (2 if faults else 0)}
    return report


# --------------------------------------------------------------------------- renderings
def _md(x):
    return ("-" if x is None or x == "" else str(x)).replace("|", "\\|").replace("\n", " ")


def render_markdown(report):
    s = report["summary"]
    out = ["# NCCL triage", "",
           "Hosts: %d; fault: %s; suspect: %s; ok: %s; could not triage: %s; kernel-log window: %s; exit code %d" % (
               s["hosts"], ", ".join(s["fault"]) or "none", ", ".join(s["suspect"]) or "none",
               ", ".join(s["ok"]) or "none", ", ".join(s["could_not_triage"]) or "none", report.get("since"),
               s["exit_code"]), ""]
    for host, h in sorted(report["hosts"].items()):
        out.append("## %s: %s" % (host, h["status"].upper()))
        out.append("")
        if h["status"] in ("unreachable", "failed"):
            out += ["Could not triage %s (%s): %s" % (host, h["status"], h.get("msg")), ""]
            if h.get("evidence"):
                out += ["Evidence not judged: %s" % ", ".join(e["path"] for e in h["evidence"]), ""]
            continue
        out.append("**Most likely cause:** %s" % (h.get("most_likely_cause") or "none: every check passed"))
        out.append("")
        for i, c in enumerate(h.get("causes") or [], 1):
            if i > 1:
                out.append("%d. %s (%s)" % (i, c["sentence"], c["verdict"]))
        if len(h.get("causes") or []) > 1:
            out.append("")
        out.append("History: %s. Traffic: %s. Kernel log: %s.%s" % (
            h.get("history"), h.get("traffic"), h.get("kernel_log_source") or "not read",
            (" Serving units: %s." % ", ".join(h["serving_units"])) if h.get("serving_units") else ""))
        if h.get("evidence"):
            out.append("Evidence: %s." % "; ".join("%s (%s)" % (e["path"], ", ".join(e["read"])) for e in h["evidence"]))
        out.append("")
        devs = sorted(h["devices"].items(), key=lambda kv: (-RANK[kv[1]["verdict"]], kv[0]))
        oks, rows = [], []
        for name, d in devs:
            fs = [f for f in d["findings"] if f["verdict"] != "ok"]
            if not fs:
                oks.append(name)
                continue
            rows += [(_md(d.get("label") or name), f["verdict"], f["check"], _md(f["rule"]),
                      _md("; ".join(f["evidence"][:4]))) for f in fs]
        if not any(d["verdict"] != "ok" for d in h["devices"].values()):
            rows.append(("every device", "ok", "all checks", "-", "-"))
        out += table(("device", "verdict", "check", "rule", "evidence"), rows)
        out += ["", "ok: %s" % (", ".join(_compact(oks)) or "none")]
        fixes = []
        for name, d in devs:
            for f in d["findings"]:
                if f["verdict"] != "ok" and f.get("fix") and (name, f["fix"]) not in fixes:
                    fixes.append((name, f["fix"]))
        if fixes:
            out += ["", "What to do:", ""]
            out += ["- %s: %s" % (n, fx) for n, fx in fixes]
        out.append("")
    return "\n".join(out) + "\n"


def _compact(names):
    """['GPU 0', ..., 'GPU 7', 'bridge 0000:16:00.0', ...] -> ['GPU 0-7', 'mlx5_0-7', '24 PCIe bridges', ...]."""
    groups, other, bridges = {}, [], 0
    for n in names:
        if n.startswith("bridge "):
            bridges += 1
            continue
        m = None
        for prefix in ("GPU ", "mlx5_"):
            if n.startswith(prefix) and n[len(prefix):].isdigit():
                m = prefix
        if m:
            groups.setdefault(m, []).append(int(n[len(m):]))
        else:
            other.append(n)
    out = []
    for prefix, nums in sorted(groups.items()):
        nums = sorted(nums)
        if nums == list(range(nums[0], nums[-1] + 1)) and len(nums) > 2:
            out.append("%s%d-%d" % (prefix, nums[0], nums[-1]))
        else:
            out.append(", ".join("%s%d" % (prefix, x) for x in nums))
    if bridges:
        out.append("%d PCIe bridges on the GPU<->NIC paths" % bridges)
    return out + other


def _lbl(v):
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


def render_textfile(report, host):
    """node_exporter textfile for one host: b300_triage_device{host,device,verdict} 1, b300_triage_host_verdict,
    b300_triage_exit_code, b300_mlx5_cmd_timeouts (lines in the window). The IB counters themselves are not
    re-exported: node_exporter's infiniband collector has them (anchors section 3)."""
    h = report["hosts"].get(host) or {}
    lines = ["# HELP b300_triage_device Triage verdict per device (1 for the verdict it has).",
             "# TYPE b300_triage_device gauge"]
    for name, d in sorted((h.get("devices") or {}).items()):
        lines.append('b300_triage_device{host="%s",device="%s",verdict="%s"} 1' % (_lbl(host), _lbl(name), d["verdict"]))
    lines += ["# HELP b300_triage_host_verdict 0 ok, 1 suspect, 2 fault, 3 could not triage.",
              "# TYPE b300_triage_host_verdict gauge",
              'b300_triage_host_verdict{host="%s"} %d' % (_lbl(host), {"ok": 0, "suspect": 1, "fault": 2}.get(h.get("status"), 3)),
              "# HELP b300_triage_exit_code Exit code of the triage run that wrote this file.",
              "# TYPE b300_triage_exit_code gauge",
              'b300_triage_exit_code{host="%s"} %d' % (_lbl(host), report["summary"]["exit_code"])]
    tmo = []
    for name, d in sorted((h.get("devices") or {}).items()):
        for f in d.get("findings") or []:
            if f["check"] == "kernel_log" and "command timeouts" in f["summary"]:
                tmo.append((name, int(f["summary"].split()[0])))
    lines += ["# HELP b300_mlx5_cmd_timeouts mlx5 firmware-command timeout lines in the triage's kernel-log window.",
              "# TYPE b300_mlx5_cmd_timeouts gauge"]
    for name, n in tmo:
        lines.append('b300_mlx5_cmd_timeouts{host="%s",device="%s"} %d' % (_lbl(host), _lbl(name), n))
    return "\n".join(lines) + "\n"
