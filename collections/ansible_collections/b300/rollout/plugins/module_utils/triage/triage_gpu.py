# -*- coding: utf-8 -*-
"""GPU-side fields of ``nvidia-smi -q -x`` that the triage judges and the gpu_topology facts do not keep (stdlib only).

``../shared/reference/oncall-triage-anchors.md`` R6 (PCIe link gen/width, replay counter), R9 (gpu_recovery_action,
fabric health), R12 (clock-event reasons and their cumulative counters, GPU / memory temperature, T.Limit headroom),
row 28 (persistence mode). The parse reuses gpu_topology's helpers; one entry per ``<gpu>`` in document order.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from ansible_collections.b300.rollout.plugins.module_utils.hw.gpu_topology import _clock_reasons, _fabric, _text, \
    normalize_pci_bus_id, to_int

CLOCK_COUNTERS = ("sw_power_cap", "sync_boost", "sw_therm_slowdown", "hw_therm_slowdown", "hw_power_brake")
# reasons that mean the GPU is slowed by heat or by the platform (gpud hw-slowdown; project thermal.py:53); never
# sw_power_cap (azhpc CT/azure_gpu_clock_throttling.nhc:48: normal on a loaded GPU)
THERMAL_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown")
THERMAL_COUNTERS = ("sw_therm_slowdown", "hw_therm_slowdown", "hw_power_brake")


def _us(text):
    m = re.match(r"^\s*(\d+)\s*us", text or "")
    return int(m.group(1)) if m else None


def _width(text):
    m = re.match(r"^\s*(\d+)x", text or "")
    return int(m.group(1)) if m else None


def parse_gpu_extras(xml_text):
    """[{index, pci_bus_id, persistence_mode, pcie: {gen, max_gen, width, max_width, replay, replay_rollover},
    clock_reasons_active, clock_counters_us: {name: us}, temp_c, mem_temp_c, tlimit_c, max_operating_c,
    mem_max_c, recovery_action, fabric}] from ``nvidia-smi -q -x``. Raises ValueError on text that is not its XML."""
    try:
        root = ET.fromstring((xml_text or "").strip())
    except ET.ParseError as exc:
        raise ValueError("nvidia-smi -q -x not XML: %s" % exc) from exc
    if root.tag != "nvidia_smi_log":
        raise ValueError("unexpected root <%s>" % root.tag)
    out = []
    for i, g in enumerate(root.findall("gpu")):
        t = g.find("temperature")
        temp = to_int(_text(t, "gpu_temp"))
        tlimit = to_int(_text(t, "gpu_temp_tlimit"))
        max_op = to_int(_text(t, "gpu_temp_max_gpu_threshold"))
        if max_op is None and tlimit is not None and temp is not None:
            max_op = temp + tlimit          # T.Limit-relative drivers: headroom to max operating
        mem_max = to_int(_text(t, "gpu_temp_max_mem_threshold"))
        mem_tl = to_int(_text(t, "gpu_temp_max_mem_tlimit_threshold"))
        counters = {}
        cc = g.find("clocks_event_reasons_counters")
        for c in (list(cc) if cc is not None else []):
            name = c.tag.replace("clocks_event_reasons_counters_", "")
            v = _us(c.text)
            if v is not None:
                counters[name] = v
        out.append({
            "index": i,
            "pci_bus_id": normalize_pci_bus_id(_text(g, "pci/pci_bus_id") or g.get("id")),
            "persistence_mode": _text(g, "persistence_mode"),
            "pcie": {"gen": to_int(_text(g, "pci/pci_gpu_link_info/pcie_gen/current_link_gen")),
                     "max_gen": to_int(_text(g, "pci/pci_gpu_link_info/pcie_gen/max_link_gen")),
                     "width": _width(_text(g, "pci/pci_gpu_link_info/link_widths/current_link_width")),
                     "max_width": _width(_text(g, "pci/pci_gpu_link_info/link_widths/max_link_width")),
                     "replay": to_int(_text(g, "pci/replay_counter")),
                     "replay_rollover": to_int(_text(g, "pci/replay_rollover_counter"))},
            "clock_reasons_active": _clock_reasons(g),
            "clock_counters_us": counters,
            "temp_c": temp, "mem_temp_c": to_int(_text(t, "memory_temp")), "tlimit_c": tlimit,
            "max_operating_c": max_op, "mem_max_c": mem_max, "mem_tlimit_max_c": mem_tl,
            "recovery_action": _text(g, "gpu_recovery_action"),
            "fabric": _fabric(g),
        })
    return out


def counter_deltas(before, after):
    """Per GPU index {counter: after - before} of the cumulative clock-event counters (µs)."""
    b = {g["index"]: g.get("clock_counters_us") or {} for g in before or []}
    out = {}
    for g in after or []:
        prev = b.get(g["index"], {})
        out[g["index"]] = {k: v - prev[k] for k, v in (g.get("clock_counters_us") or {}).items()
                           if k in prev and v >= prev[k]}
    return out
