# -*- coding: utf-8 -*-
"""Run the host tools the facts modules read (nvidia-smi, ofed_info, mlxfwmanager, mst) and build the facts.

One command runner for gpu_topology_facts, rdma_nic_facts and nic_firmware_check's gather mode: a tool is looked up
in the given directories (bin_path, the hw_bin_path inventory variable) before PATH, run through
AnsibleModule.run_command, and a non-zero exit becomes a ToolError whose message names the command, the host and
the output. The callers decide whether that fails the module (facts modules) or is reported (the audit).
"""
from __future__ import absolute_import, division, print_function
__metaclass__ = type

import os
import socket
import time

from ansible_collections.b300.rollout.plugins.module_utils.hw.gpu_topology import TopoParseError, build_gpu_topology
from ansible_collections.b300.rollout.plugins.module_utils.hw.rdma_nic import build_rdma_nics
from ansible_collections.b300.rollout.plugins.module_utils.hw.fw_matrix import parse_driver_version


def hw_argument_spec():
    """bin_path / sysfs_root, the options of every module of the action group hw (meta/runtime.yml), documented by
    the doc fragment b300.rollout.hw; a fresh dict per call (AnsibleModule may change it)."""
    return dict(bin_path=dict(type="list", elements="path", default=[]), sysfs_root=dict(type="path", default="/sys"))


class ToolError(Exception):
    """A tool is missing, exited non-zero, or printed something unreadable. rc is the exit status when there was one."""

    def __init__(self, msg, rc=None):
        super(ToolError, self).__init__(msg)
        self.rc = rc


def find_tool(module, name, bin_path=None, explicit=None):
    """Path of `name`: `explicit` when given, else the first hit in bin_path, then PATH; None when not found."""
    if explicit:
        return explicit
    return module.get_bin_path(name, opt_dirs=list(bin_path or []))


def run_tool(module, argv, what=None):
    """Run argv; return (stdout, seconds). Raises ToolError naming the command and host when it exits non-zero."""
    start = time.monotonic()
    rc, out, err = module.run_command(argv)
    elapsed = round(time.monotonic() - start, 4)
    if rc != 0:
        raise ToolError("%s: `%s` failed on host %s (rc=%s, expected 0): %s" % (
            what or os.path.basename(argv[0]), " ".join(argv), socket.gethostname(), rc, (err or out).strip()[:500]), rc=rc)
    return out, elapsed


def gather_gpu_topology(module, bin_path=None, sysfs_root="/sys", smi_path=None, read_topo=True):
    """The gpu_topology fact from nvidia-smi -q -x, topo -m (unless read_topo is false), nvlink -s, and the banner when
    the XML lacks the versions (R610+). Returns (facts, raw outputs, timing in seconds)."""
    host = socket.gethostname()
    t0 = time.monotonic()
    smi = find_tool(module, "nvidia-smi", bin_path, smi_path)
    if not smi:
        raise ToolError("nvidia-smi not found on host %s (searched %s and PATH); expected the NVIDIA driver "
                        "utilities to be installed" % (host, bin_path or "no extra dirs"))
    timing = {}
    raw = {"banner": None}
    raw["smi_xml"], timing["nvidia_smi_q_x"] = run_tool(module, [smi, "-q", "-x"], "nvidia-smi")
    raw["topo"], timing["topo_m"] = run_tool(module, [smi, "topo", "-m"], "nvidia-smi") if read_topo else ("", 0.0)
    raw["nvlink"], timing["nvlink_s"] = run_tool(module, [smi, "nvlink", "-s"], "nvidia-smi")
    p0 = time.monotonic()
    facts = _build_gpu(raw, sysfs_root, smi, host)
    timing["parse"] = round(time.monotonic() - p0, 4)
    if facts["driver_version"] is None or facts["cuda_version"] is None:
        # R610+ drivers: versions may only be in the "KMD Version" / "CUDA UMD Version" banner
        raw["banner"], timing["banner"] = run_tool(module, [smi], "nvidia-smi")
        facts = _build_gpu(raw, sysfs_root, smi, host)
    timing["total"] = round(time.monotonic() - t0, 4)
    return facts, raw, timing


def _build_gpu(raw, sysfs_root, smi, host):
    try:
        return build_gpu_topology(raw["smi_xml"], raw["topo"], raw["nvlink"], sysfs_root=sysfs_root,
                                  banner_text=raw["banner"])
    except TopoParseError as exc:
        raise ToolError("nvidia-smi topo -m output unreadable on host %s (%s): %s" % (host, smi, exc)) from exc
    except ValueError as exc:
        raise ToolError("nvidia-smi -q -x output unreadable on host %s (%s): %s; expected <nvidia_smi_log> XML" % (
            host, smi, exc)) from exc


def _mlx5_version(sysfs_root):
    for rel in (("module", "mlx5_core", "version"), ("bus", "pci", "drivers", "mlx5_core", "module", "version")):
        try:
            with open(os.path.join(sysfs_root, *rel)) as f:
                return f.read().strip()
        except (IOError, OSError):
            continue
    return None


def doca_by_version_alone(sysfs_root):
    """True when the mlx5_core module version alone says DOCA-OFED (25.x or later), so `ofed_info -s` adds nothing."""
    version = _mlx5_version(sysfs_root)
    parsed = parse_driver_version(version) if version else None
    return bool(parsed and (parsed["scheme"] == "yymm" or parsed["yymm"][0] >= 25))


def gather_rdma_nics(module, bin_path=None, sysfs_root="/sys", ofed_info_path=None, mlxfwmanager_path=None,
                     run_mlxfwmanager=None, ofed_info="always", fabric_manager_devices=()):
    """The rdma_nics fact from sysfs, `ofed_info -s` (ofed_info="auto": only when the module version cannot tell),
    `mlxfwmanager --query` when installed (run_mlxfwmanager=True: required; False: skipped) and `mst status -v` when
    mlxfwmanager names /dev/mst devices. Returns (facts, {"ofed_info": path, "mlxfwmanager_ran": bool})."""
    host = socket.gethostname()
    dirs = list(bin_path or [])
    if ofed_info_path and not os.path.exists(ofed_info_path):
        raise ToolError("ofed_info: %s not found on host %s" % (ofed_info_path, host))
    ofed = find_tool(module, "ofed_info", dirs, ofed_info_path)
    if ofed and not ofed_info_path and ofed_info == "auto" and doca_by_version_alone(sysfs_root):
        ofed = None   # DOCA-OFED by version alone (rdma_nic.driver_facts draws the same conclusion)
    ofed_text = run_tool(module, [ofed, "-s"])[0] if ofed else None

    mlxfw_text = None
    if run_mlxfwmanager is not False:
        mlxfw = find_tool(module, "mlxfwmanager", dirs, mlxfwmanager_path)
        if mlxfw and not os.path.exists(mlxfw):
            mlxfw = None
        if mlxfw:
            mlxfw_text = run_tool(module, [mlxfw, "--query"])[0]
        elif run_mlxfwmanager:
            raise ToolError("mlxfwmanager not found on host %s (searched %s and PATH); run_mlxfwmanager=true "
                            "expects NVIDIA MFT to be installed" % (host, dirs or "no extra dirs"))
    mst_text = None
    if mlxfw_text and "/dev/mst/" in mlxfw_text:
        # MST service running: mlxfwmanager names devices /dev/mst/mt4129_pciconf0; mst status -v maps them to PCI
        mst = find_tool(module, "mst", dirs)
        if mst:
            try:
                mst_text = run_tool(module, [mst, "status", "-v"])[0]
            except ToolError:
                mst_text = None  # without it, pending images stay host-level findings
    facts = build_rdma_nics(sysfs_root=sysfs_root, ofed_info_text=ofed_text, mlxfwmanager_text=mlxfw_text,
                            mst_status_text=mst_text, kernel_release=os.uname()[2],
                            fabric_manager_devices=list(fabric_manager_devices or []))
    return facts, {"ofed_info": ofed, "mlxfwmanager_ran": mlxfw_text is not None}
