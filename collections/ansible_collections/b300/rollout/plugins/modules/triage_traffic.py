#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: the triage's active part - traffic through one NIC at a time, counters read around each run."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: triage_traffic
short_description: Run traffic through one RDMA NIC at a time and read its counters around each run (triage --traffic)
description:
  - For each NIC in O(nics), one after the other - read the IB port and RDMA transport counters of every listed NIC;
    run a GPUDirect loopback (C(ib_write_bw -d NIC --use_cuda=GPU), server and client on this host) when the tool is
    present; run C(all_reduce_perf) O(repeats) times under O(timeout_s) with NVLink and shared memory off and
    C(NCCL_IB_HCA==NIC) so every byte crosses that NIC, with C(NCCL_DEBUG=INFO); read the counters again. The
    counter deltas of a run are charged to the NIC that carried it.
  - Each NCCL repeat is classified with C(module_utils/health/nccl_results.py) (as the NCCL validation role does), and its
    WARN lines are parsed (C(IBV_WC_*) status, the HCA named) by C(module_utils/triage/triage_traffic.py).
  - This is the only part of the triage that loads the node; the playbook runs it only with C(--traffic) and never
    on a node with active serving units unless forced. It writes no file on the host (the perftest server, run in a
    thread, and its client exchange data over loopback).
  - Tools looked up in O(bin_path) before C(PATH) - ib_write_bw, all_reduce_perf and timeout.
version_added: "1.1.0"
extends_documentation_fragment: [ansible.builtin.action_common_attributes, b300.rollout.common, b300.rollout.hw]
attributes:
  check_mode:
    support: full
    details: In check mode nothing is run and C(skipped) is returned.
options:
  nics:
    description: The NICs to test, each C({name, gpu}) (C(gpu) the nearest GPU for C(--use_cuda); null runs host memory).
    type: list
    elements: dict
    required: true
  gpus:
    description: GPUs per NCCL run (C(all_reduce_perf -g)).
    type: int
    default: 8
  repeats:
    description: NCCL repeats per NIC (K).
    type: int
    default: 3
  timeout_s:
    description: Hang timeout of one NCCL repeat and of one loopback run (seconds).
    type: int
    default: 120
  min_bytes:
    description: C(all_reduce_perf -b).
    type: str
    default: 8M
  max_bytes:
    description: C(all_reduce_perf -e).
    type: str
    default: 1G
  nccl_env:
    description: Extra environment for the NCCL runs (merged over the triage's own C(NCCL_*) settings).
    type: dict
    default: {}
  all_reduce_perf:
    description: Path of C(all_reduce_perf); default is to search O(bin_path), then PATH.
    type: path
  loopback:
    description: Run the GPUDirect loopback when C(ib_write_bw) is present.
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Traffic through each data NIC
  b300.rollout.triage_traffic:
    nics: [{name: mlx5_3, gpu: 3}]
    bin_path: "{{ [hw_bin_path] if hw_bin_path | default('', true) else [] }}"
    sysfs_root: "{{ hw_sysfs_root | default('/sys', true) }}"
  register: triage_traffic_run
"""

RETURN = r"""
per_nic:
  description: >-
    Per NIC - ib_write_bw (rc, gbps, error, skipped, parsed), nccl (verdict, reasons, gated_gbps,
    per_repeat_status, warns with completions / async_events / gdr), counters_before and counters_after (that NIC's
    port, as read before and after its runs), duration_s.
  returned: always
  type: dict
skipped:
  description: True in check mode (nothing was run).
  returned: always
  type: bool
"""

import threading
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.b300.rollout.plugins.module_utils.health import nccl_results
from ansible_collections.b300.rollout.plugins.module_utils.hw.tools import find_tool, hw_argument_spec
from ansible_collections.b300.rollout.plugins.module_utils.triage.triage_counters import read_ports
from ansible_collections.b300.rollout.plugins.module_utils.triage.triage_traffic import parse_nccl_warns, parse_perftest, \
    perftest_gbps


def loopback(module, ibwb, timeout_cmd, nic, gpu, timeout_s, port):
    base = [ibwb, "-d", nic, "-s", "8388608", "-n", "2000", "-F", "--report_gbits", "-p", str(port)]
    if gpu is not None:
        base.append("--use_cuda=%d" % int(gpu))
    # the server must run while the client connects: both through run_command (argv lists, no shell), the server in a
    # thread, each under its own timeout
    server = {}

    def serve():
        server["rc"], server["out"], server["err"] = module.run_command([timeout_cmd, str(timeout_s)] + base)

    th = threading.Thread(target=serve)
    th.start()
    time.sleep(0.5)
    rc, out, err = module.run_command([timeout_cmd, str(timeout_s)] + base + ["127.0.0.1"])
    th.join(timeout_s + 5)
    parsed = parse_perftest(out)
    gbps = perftest_gbps(parsed)
    error = None
    if rc != 0 or gbps is None:
        error = ((err or "") + (out or "")).strip().splitlines()[-1:] or ["no result row"]
        error = error[0][:300]
    return {"rc": rc, "gbps": gbps, "error": error, "skipped": False, "cuda_device": parsed.get("cuda_device"),
            "server_rc": server.get("rc"), "server_tail": (server.get("out") or "").strip().splitlines()[-1:]}


def nccl_one_nic(module, arp, timeout_cmd, nic, p):
    env = {"NCCL_IB_HCA": "=" + nic, "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_NET_GDR_LEVEL": "5",
           "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET", "NCCL_NVLS_ENABLE": "0"}
    env.update({k: str(v) for k, v in (p["nccl_env"] or {}).items()})
    repeats, outputs = [], []
    for i in range(1, p["repeats"] + 1):
        argv = [timeout_cmd, "--kill-after=10", str(p["timeout_s"]), arp, "-b", p["min_bytes"], "-e", p["max_bytes"],
                "-f", "2", "-g", str(p["gpus"]), "-n", "5", "-w", "2"]
        rc, out, err = module.run_command(argv, environ_update=env)
        text = (out or "") + (err or "")
        outputs.append(text)
        repeats.append(nccl_results.analyze_repeat(i, rc, None, text, None, None, gate_min_bytes=64 << 20))
    verdict = nccl_results.classify(repeats, None, p["gpus"], 1)
    warns = parse_nccl_warns("\n".join(outputs))
    return {"verdict": verdict["status"], "reasons": [verdict["message"]] + [r["detail"] for r in repeats
                                                                             if r["status"] != "ok"][:3],
            "gated_gbps": verdict["gated_gbps"], "per_repeat_status": verdict["per_repeat_status"], "warns": warns,
            "env": env}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            hw_argument_spec(),
            nics=dict(type="list", elements="dict", required=True),
            gpus=dict(type="int", default=8),
            repeats=dict(type="int", default=3),
            timeout_s=dict(type="int", default=120),
            min_bytes=dict(type="str", default="8M"),
            max_bytes=dict(type="str", default="1G"),
            nccl_env=dict(type="dict", default={}),
            all_reduce_perf=dict(type="path"),
            loopback=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if module.check_mode:
        module.exit_json(changed=False, skipped=True, per_nic={})
    timeout_cmd = find_tool(module, "timeout", p["bin_path"])
    if not timeout_cmd:
        module.fail_json(msg="triage_traffic: coreutils `timeout` not found: every run needs a hang timeout")
    ibwb = find_tool(module, "ib_write_bw", p["bin_path"]) if p["loopback"] else None
    arp = find_tool(module, "all_reduce_perf", p["bin_path"], p["all_reduce_perf"])
    names = [n["name"] for n in p["nics"]]
    results = {}
    for k, n in enumerate(p["nics"]):
        t0 = time.time()
        before = read_ports(p["sysfs_root"], names)
        res = {"ib_write_bw": {"skipped": True, "error": "ib_write_bw not installed (perftest)"} if not ibwb else None}
        if ibwb:
            res["ib_write_bw"] = loopback(module, ibwb, timeout_cmd, n["name"], n.get("gpu"), p["timeout_s"], 18515 + k)
        if arp:
            res["nccl"] = nccl_one_nic(module, arp, timeout_cmd, n["name"], p)
        else:
            res["nccl"] = {"verdict": "error", "reasons": ["all_reduce_perf not found (nccl-tests)"], "warns": {}}
        after = read_ports(p["sysfs_root"], names)
        res["counters_before"] = (before.get(n["name"]) or {}).get("1")
        res["counters_after"] = (after.get(n["name"]) or {}).get("1")
        res["duration_s"] = round(time.time() - t0, 1)
        results[n["name"]] = res
    module.exit_json(changed=True, skipped=False, per_nic=results)


if __name__ == "__main__":
    main()
