#!/usr/bin/env python3
"""Render the SYNTHESIZED fixtures under tests/fixtures/synth/<scenario>/ from the hwemu model.

    python3 sandbox/hwemu/render_fixtures.py            # all scenarios, into tests/fixtures/synth
    python3 sandbox/hwemu/render_fixtures.py --out DIR  # elsewhere (the unit test renders into a tmp dir)
    python3 sandbox/hwemu/render_fixtures.py healthy cx8_fw_mismatch

Deterministic: fixed timestamp, hostname b300a, hash-based jitter. Re-run after changing model.py/scenarios.py
and commit the result (tests/unit/test_hwemu.py fails when the committed fixtures differ from a fresh render).
"""
import argparse
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model
import scenarios

HERE = os.path.dirname(os.path.abspath(__file__))

REPO = os.path.dirname(os.path.dirname(HERE))
DEFAULT_OUT = os.path.join(REPO, "tests", "fixtures", "synth")

DESCRIPTIONS = {
    "healthy": "8x NVIDIA B300 SXM6 AC, NV18 all-to-all, 8 CX8 data NICs (PIX to their GPU) + CX7 fabric-manager NIC, "
               "DOCA-OFED 25.10-1.2.2, CX8 fw 40.47.1026, CX7 28.47.1026",
    "cx8_fw_mismatch": "exactly one CX8 (mlx5_3) runs firmware 40.44.1036 while the driver is DOCA-OFED 25.10-1.2.2",
    "nvlink_down": "GPU 5 has NVLink links 3 and 11 <inactive>: topo shows NV16 for GPU 5",
    "thermal_throttle": "all GPUs 95-96 C, hw_thermal_slowdown + sw_thermal_slowdown Active, SM clocks reduced",
    "ecc_errors": "GPU 2: volatile DRAM uncorrectable 3, aggregate 5, one remapped row pending",
    "nccl_slow": "single-node all_reduce busbw ~300 GB/s at large sizes (healthy ~870)",
    "nccl_wrong_results": "all_reduce #wrong > 0 at 8-64 MiB, Out of bounds values 248 FAILED, exit code 1",
    "nccl_intermittent_hang": "2nd all_reduce_perf invocation after hwemu-scenario hangs after the header "
                              "(all_reduce.txt = a passing run, all_reduce_hang.txt = what the hung run printed)",
    "pending_fw_reset": "mlx5_3 flashed with 40.47.1026 but still running 40.44.1036 (mlxfwmanager FW (Running) row)",
    "no_nic_columns": "topo -m without NIC columns (as seen on one real HGX B300); sysfs still has the NICs",
    "driver_r610": "driver 610.43.02: plain nvidia-smi banner says KMD Version / CUDA UMD Version",
    "abs_temp_fields": "XML temperature uses absolute gpu_temp_max_threshold/gpu_temp_slow_threshold fields "
                       "instead of the T.Limit-relative ones",
    "cx8_fw_timeouts": "cx8_fw_mismatch plus 14 mlx5 command-timeout kernel lines and local_ack_timeout_err rising on "
                       "mlx5_3 only (triage; kernel log and counters are not in these fixtures)",
    "ib_port_flap": "mlx5_5 went down and up 6 times in the last hour, link_downed 6 (triage overlay only)",
    "ib_port_half_rate": "mlx5_2 port trained at 200 Gb/sec (2X NDR) instead of 400",
    "nic_pcie_x8": "mlx5_6 PCIe link x8 of x16",
    "pcie_aer_nonfatal": "mlx5_1 uncorrectable non-fatal AER errors (triage overlay only)",
    "peermem_missing": "nvidia_peermem not loaded (triage overlay only)",
    "acs_enabled": "ACS redirect on the switch port above mlx5_4 (triage overlay only)",
    "gpu_xid79": "GPU 6 Xid 79 (fallen off the bus) in the kernel log; gpu_recovery_action Node Reboot Required",
    "fabric_degraded": "every GPU's fabric health Limited Capacity / bandwidth Degraded / route unhealthy",
    "gpu_hot_96c": "GPU 3 at 96 C with HW/SW thermal slowdown active and violation counters",
}


def expectations(st, ar1, ar2):
    big = [r for r in ar1["json"]["results"] if r["size"] >= (1 << 30)]
    big2 = [r for r in ar2["json"]["results"] if r["size"] >= (1 << 30)]
    bundled = {n["name"]: model.bundled_fw(st, n) for n in st["nics"]}
    return {
        "scenario": st["scenario"],
        "synthesized": True,
        "description": DESCRIPTIONS.get(st["scenario"], ""),
        "driver_version": st["driver_version"],
        "gpu_count": len(st["gpus"]),
        "gpu_pci_bus_ids": ["0000:%02x:00.0" % g["bus"] for g in st["gpus"]],
        "nvlink_down": {str(g["index"]): g["nvlink_down"] for g in st["gpus"] if g["nvlink_down"]},
        "throttled_gpus": [g["index"] for g in st["gpus"] if g["reasons"]],
        "ecc_uncorrectable_gpus": [g["index"] for g in st["gpus"]
                                   if g["ecc"]["volatile"]["dram_uncorrectable"] or g["ecc"]["aggregate"]["dram_uncorrectable"]],
        "ofed_version": st["ofed_version"],
        "nics": {n["name"]: {"pci": n["pci"], "model": n["model"], "fw_running": n["fw"],
                             "fw_flashed": model.nic_flashed_fw(n), "fw_bundled_with_driver": bundled[n["name"]],
                             "role": n["role"], "numa_node": n["numa"], "netdev": n["netdev"],
                             "link_layer": n["link_layer"], "nearest_gpu": n["gpu"]} for n in st["nics"]},
        "fw_mismatched_nics": sorted(n["name"] for n in st["nics"] if n["fw"] != bundled[n["name"]]),
        "fw_pending_nics": sorted(n["name"] for n in st["nics"] if n["fw_flashed"] and n["fw_flashed"] != n["fw"]),
        "topo_nic_columns": st["topo_nic_columns"],
        "all_reduce_1node": {"cmd": "all_reduce_perf -b 8 -e 8G -f 2 -g 8 -J all_reduce.json",
                             "min_busbw_ge_1GiB": round(min(r["out_of_place"]["bus_bw"] for r in big), 2),
                             "max_busbw": round(max(r["out_of_place"]["bus_bw"] for r in ar1["json"]["results"]), 2),
                             "out_of_bounds": ar1["json"]["out_of_bounds"]["count"], "rc": ar1["rc"]},
        "all_reduce_2node": {"cmd": "mpirun -np 16 -N 8 -H b300a,b300b -x NCCL_ALGO=Ring all_reduce_perf -b 8 -e 8G "
                                    "-f 2 -g 1 -J all_reduce_2node.json",
                             "min_busbw_ge_1GiB": round(min(r["out_of_place"]["bus_bw"] for r in big2), 2),
                             "out_of_bounds": ar2["json"]["out_of_bounds"]["count"], "rc": ar2["rc"]},
        "nccl_hang_on_invocation": st["nccl"]["hang_on_call"],
    }


def render_scenario(name, out_dir):
    st = model.build_state(name, hostname="b300a")
    d = os.path.join(out_dir, name)
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)

    def w(fn, text):
        with open(os.path.join(d, fn), "w") as fh:
            fh.write(text)

    w("q.xml", model.render_xml(st))
    w("q.txt", model.render_q_text(st))
    w("smi.txt", model.render_smi_table(st))
    w("smi-L.txt", model.render_L(st))
    w("query.csv", model.render_query(
        st, "index,name,uuid,pci.bus_id,driver_version,vbios_version,memory.total,temperature.gpu,clocks.current.sm,"
            "clocks.max.sm,power.draw,power.limit,ecc.errors.uncorrected.volatile.total,clocks_event_reasons.active",
        ["csv"]))
    h1, h2, _ = model.dmon_header("pucvmet")
    w("dmon-s.txt", "\n".join([h1, h2] + model.dmon_rows(st, "pucvmet")) + "\n")
    w("topo.txt", model.render_topo(st))
    w("nvlink-s.txt", model.render_nvlink_status(st))
    w("ibstat.txt", model.render_ibstat(st))
    w("ibv_devinfo.txt", model.render_ibv_devinfo(st))
    w("mlxfwmanager.txt", model.render_mlxfwmanager(st))
    w("ofed_info.txt", model.render_ofed_info(st))
    w("modinfo-mlx5_core.txt", model.render_modinfo(st))
    for nic in ("mlx5_0", "mlx5_3"):
        w("flint-%s.txt" % nic, model.render_flint_query(st, model.find_nic(st, nic)))
    args = ["./build/all_reduce_perf", "-b", "8", "-e", "8G", "-f", "2", "-g", "8", "-J", "all_reduce.json"]
    ar1 = model.all_reduce_run(st, model.default_ar_opts(maxbytes=8 << 30, json_path="all_reduce.json", args=args,
                                                         warmup=1))
    w("all_reduce.txt", "\n".join(ar1["lines"]))
    w("all_reduce.json", model.dump_json(ar1["json"]))
    args2 = ["all_reduce_perf", "-b", "8", "-e", "8G", "-f", "2", "-g", "1", "-J", "all_reduce_2node.json"]
    ar2 = model.all_reduce_run(st, model.default_ar_opts(maxbytes=8 << 30, ngpus=1, json_path="all_reduce_2node.json",
                                                         args=args2, warmup=1),
                               nodes=2, env={"NCCL_ALGO": "Ring"}, hostnames=["b300a", "b300b"])
    w("all_reduce_2node.txt", "\n".join(ar2["lines"]))
    w("all_reduce_2node.json", model.dump_json(ar2["json"]))
    if st["nccl"]["hang_on_call"]:
        hdr = [ln for ln in ar1["lines"] if ln.startswith("#")]
        cut = hdr.index([ln for ln in hdr if ln.startswith("#        (B)")][0]) + 1
        w("all_reduce_hang.txt", "\n".join(hdr[:cut]) + "\n")
    w("expect.json", json.dumps(expectations(st, ar1, ar2), indent=1, sort_keys=True) + "\n")
    model.build_sys_tree(st, os.path.join(d, "sys"))
    # identical sysfs: keep one copy (relative symlink to healthy's, else to the first scenario with the same tree, in
    # the order scenarios.py lists them) instead of ~450 duplicate files per scenario
    for other in ["healthy"] + [n for n in scenarios.SCENARIOS if n != "healthy"]:
        base = os.path.join(out_dir, other, "sys")
        if other == name:
            break
        if os.path.isdir(base) and not os.path.islink(base) and same_tree(base, os.path.join(d, "sys")):
            shutil.rmtree(os.path.join(d, "sys"))
            os.symlink(os.path.join("..", other, "sys"), os.path.join(d, "sys"))
            break
    return d


def tree_listing(root):
    items = {}
    for dp, dns, fns in os.walk(root):
        for n in dns + fns:
            p = os.path.join(dp, n)
            rel = os.path.relpath(p, root)
            if os.path.islink(p):
                items[rel] = ("link", os.readlink(p))
            elif os.path.isfile(p):
                with open(p, "rb") as fh:
                    items[rel] = ("file", fh.read())
            else:
                items[rel] = ("dir", None)
    return items


def same_tree(a, b):
    la, lb = tree_listing(a), tree_listing(b)
    la.pop("SYNTHESIZED", None)
    lb.pop("SYNTHESIZED", None)
    return la == lb


README = """# SYNTHESIZED fixtures (emulated HGX B300 + ConnectX-8)

Everything below this directory is SYNTHESIZED by `sandbox/hwemu` (model: `sandbox/hwemu/model.py`,
scenarios: `sandbox/hwemu/scenarios.py`). It is NOT a capture from real hardware: no public full B300/CX8
capture exists. Regenerate with `python3 sandbox/hwemu/render_fixtures.py` (deterministic); the unit test
`tests/unit/test_hwemu.py` fails when these files differ from a fresh render.

Layouts copied from the REAL H200 captures (`../shared/fixtures/real/`, copies in `sandbox/hwemu/real/`):
`q.xml` (same element names and order as the real `nvidia-smi -q -x`, DTD v13; an XML comment says SYNTHESIZED),
`q.txt`, `smi.txt`, `smi-L.txt`, `query.csv`, `dmon-s.txt`, `topo.txt` (same escape codes, legend), `nvlink-s.txt`,
`all_reduce*.txt` / `all_reduce*.json` (nccl-tests 2.19.6 text and `-J` JSON). RDMA outputs (`ibstat.txt`,
`ibv_devinfo.txt`, `mlxfwmanager.txt`, `ofed_info.txt`, `modinfo-mlx5_core.txt`, `flint-*.txt`) follow the formats in
`../shared/reference/output-formats.md` and `nic-firmware-driver-matrix.md` (no real capture available).
Text formats cannot carry a marker without breaking parsers: this README is the marker for them; `sys/SYNTHESIZED`
marks the sysfs tree.

Per scenario directory:
- `expect.json`: what the scenario was designed to show (fw-mismatched NICs, NVLink links down, busbw of sizes
  >= 1 GiB, #wrong totals, ...). Tests may use it to check parsers against the design.
- `sys/`: sysfs-like tree (relative symlinks; in scenarios whose tree equals healthy's, `sys` is a symlink to
  `../healthy/sys`): `class/infiniband/<dev>/{fw_ver,board_id,hca_type,node_type,node_guid,
  ports/1/{state,rate,link_layer,phys_state,pkeys/*},device}`, `class/net/<netdev>`, `bus/pci/devices/<addr>`,
  `bus/pci/drivers/{mlx5_core,nvidia,pcieport}`, `module/mlx5_core/version`, `devices/pci0000:XX/...` (each GPU and
  its CX8 under the same PCIe switch), `devices/system/node/node{0,1}/cpulist`.
- `all_reduce.*`: one node, `-b 8 -e 8G -f 2 -g 8`; `all_reduce_2node.*`: mpirun stand-in, 16 ranks, NCCL_ALGO=Ring.

Scenarios:
"""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("names", nargs="*")
    a = ap.parse_args(argv)
    names = a.names or list(scenarios.SCENARIOS)
    if "healthy" in names:  # rendered first: the other scenarios link to its sys/ when identical
        names = ["healthy"] + [n for n in names if n != "healthy"]
    os.makedirs(a.out, exist_ok=True)
    for n in names:
        render_scenario(n, a.out)
    if not a.names:
        with open(os.path.join(a.out, "README.md"), "w") as fh:
            fh.write(README + "".join("- `%s`: %s\n" % (n, DESCRIPTIONS.get(n, "")) for n in names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
