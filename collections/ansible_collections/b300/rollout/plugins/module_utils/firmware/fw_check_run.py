# -*- coding: utf-8 -*-
"""The ConnectX firmware check's engine (moved out of plugins/modules/nic_firmware_check.py by issue 39, which is now
its shell): gather mode reads the facts with the facts modules' own code (tools.py); judge mode loads the firmware
matrix and policy and judges one host or the fleet with fw_matrix.py. Each returns the module's result, or raises
Refused with the failure's message and result (the module passes both to fail_json)."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.b300.rollout.plugins.module_utils.hw.fw_matrix import (MatrixError, audit_fleet, check_host, device_message,
                                                                                host_messages, load_matrix_doc, merge_rows,
                                                                                normalise_policy)
from ansible_collections.b300.rollout.plugins.module_utils.hw.tools import gather_gpu_topology, gather_rdma_nics, ToolError

try:
    import yaml
    HAS_YAML = True
except ImportError:  # pragma: no cover - hosts without PyYAML can still pass matrix rows inline
    HAS_YAML = False


class Refused(Exception):
    """The check failed or its input was refused: msg and the rest of the module's failure result."""

    def __init__(self, msg, **result):
        Exception.__init__(self, msg)
        self.msg, self.result = msg, result


def gather(module, p):
    """Gather mode: the facts named in p["gather"], each read by the facts modules' own code; a source that cannot be
    read is null with the reason in gather_errors."""
    readers = {
        "rdma_nics": lambda: gather_rdma_nics(module, p["bin_path"], p["sysfs_root"], ofed_info=p["ofed_info"],
                                              fabric_manager_devices=p["fabric_manager_devices"])[0],
        "gpu_topology": lambda: dict(gather_gpu_topology(module, p["bin_path"], p["sysfs_root"], read_topo=p["read_topo"])[0],
                                     topology_read=bool(p["read_topo"])),
    }
    facts, errors = {}, {}
    for source in ("rdma_nics", "gpu_topology"):
        if source not in p["gather"]:
            continue
        try:
            facts[source] = readers[source]()
        except (ToolError, OSError, IOError) as e:
            facts[source] = None
            errors[source] = str(e)
    if p["as_facts"]:
        return dict(changed=False, ansible_facts=facts, gather_errors=errors)
    return dict(changed=False, gathered=facts, gather_errors=errors)


def matrix_rows(p):
    """The matrix rows (inline or from matrix_file, plus extra_rows) and the normalised policy."""
    if p["rdma_nics"] is None and p["hosts"] is None:
        raise Refused("nic_firmware_check: one of rdma_nics, hosts or gather is required")
    if not p["matrix"] and not p["matrix_file"]:
        raise Refused("nic_firmware_check: matrix (nic_firmware_gate_matrix_rows) or matrix_file is required")
    try:
        if p["matrix_file"]:
            if not HAS_YAML:
                raise Refused("nic_firmware_check: matrix_file needs PyYAML where the module runs; pass matrix instead")
            with open(p["matrix_file"]) as f:
                base = load_matrix_doc(yaml.safe_load(f))
        else:
            base = p["matrix"]
        return merge_rows(base, p["extra_rows"]), normalise_policy(p["policy"])
    except (MatrixError, ValueError, IOError, OSError) as e:
        raise Refused("nic_firmware_check: firmware matrix/policy rejected: %s" % e) from None


def judge(p):
    """Judge mode: (the module's result, the warnings to print) for one host (rdma_nics) or the fleet (hosts)."""
    rows, policy = matrix_rows(p)
    if p["rdma_nics"] is None:
        report = audit_fleet(p["hosts"], rows, policy)
        msgs = [m for e in report["hosts"].values() for m in e.get("messages", [])]
        return dict(changed=False, report=report, exit_code=report["summary"]["exit_code"], messages=msgs), []
    res = check_host(p["rdma_nics"], rows, policy)
    msgs = host_messages(p["host"], res)
    out = dict(changed=False, status=res["status"], verdicts=res["verdicts"], counts=res["counts"],
               messages=msgs, rows_used=len(rows))
    warnings = ["NIC firmware gate (policy warn): " + device_message(p["host"], v) for v in res["verdicts"]
                if v["severity"] == "warn"]
    if p["enforce"] and res["status"] == "fail":
        out["verdicts"] = [v for v in res["verdicts"] if v["severity"] != "ok"]
        raise Refused("NIC firmware gate FAILED on %s (the gate never flashes; the fix: tools/fw-update):\n%s"
                      % (p["host"], "\n".join(msgs)), warnings=warnings, **out)
    return out, warnings
