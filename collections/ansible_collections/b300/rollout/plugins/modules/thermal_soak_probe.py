#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: find nvidia-smi, validate the sampling query, pick the GPU loader and build the soak plan."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: thermal_soak_probe
short_description: Prepare a GPU thermal soak (sampler fields, GPU list, loader choice, run plan)
description:
  - Finds C(nvidia-smi) (in O(bin_path) first), runs the sampling query once and falls back to the
    C(clocks_throttle_reasons.*) names when the driver rejects C(clocks_event_reasons.*).
  - Picks the loader, a PyTorch bf16 matmul burner when C(torch.cuda.is_available()) is true for one of
    O(python_candidates), else a looped C(all_reduce_perf), else a gpu-burn-like tool.
  - With O(sampler=dmon) the soak samples with C(nvidia-smi dmon -s <dmon_groups> -o DT -d <seconds>) instead of the
    query CSV; the probe then also runs C(nvidia-smi dmon -c 1) once to check that dmon prints GPU rows.
  - Returns the plan that C(thermal_soak_runner.py) executes. Reads only; safe in check mode.
version_added: "1.0.0"
extends_documentation_fragment: [ansible.builtin.action_common_attributes, b300.rollout.common]
attributes:
  check_mode:
    support: full
    details: Only reads the host (tools found, GPUs, loader candidates); it starts nothing.
options:
  bin_path:
    description: Directories searched before PATH for C(nvidia-smi) and the gpu-burn tool (C(hw_bin_path)).
    type: list
    elements: str
    default: []
  fields:
    description: C(--query-gpu) fields to sample (driver >= 550 names).
    type: list
    elements: str
    required: true
  loader:
    description: Loader to use; C(auto) takes the first available of torch, nccl, burn.
    type: str
    choices: [auto, torch, nccl, burn]
    default: auto
  python_candidates:
    description: Interpreters tried for C(import torch); the module's own interpreter is tried first.
    type: list
    elements: str
    default: [python3]
  nccl_bin_dirs:
    description: Directories searched first for C(all_reduce_perf); shell globs allowed (C(/opt/nccl-tests/*/build)).
    type: list
    elements: str
    default: []
  burn_names:
    description: Executable names of the gpu-burn-like fallback loader.
    type: list
    elements: str
    default: [gpu_burn, gpu-burn]
  duration_s:
    description: Soak duration in seconds.
    type: int
    required: true
  sample_ms:
    description: Sampling interval in milliseconds (C(-lms)); dmon rounds it to whole seconds (at least 1).
    type: int
    default: 2000
  sampler:
    description: How the soak samples, C(query) (C(--query-gpu ... -lms), CSV) or C(dmon) (C(nvidia-smi dmon -o DT)).
    type: str
    choices: [query, dmon]
    default: query
  dmon_groups:
    description: C(nvidia-smi dmon -s) metric groups when O(sampler=dmon); C(p) and C(c) are needed, C(u) tells loaded
      samples apart (without it every sample counts as loaded), C(v) adds the thermal/power violation columns.
    type: str
    default: puc
  out_dir:
    description: Directory on the host where the runner writes samples and status.
    type: path
    required: true
  burner_script:
    description: Path on the host of the shipped C(torch_burn.py).
    type: path
  burn_size:
    description: Matrix size of the torch burner.
    type: int
    default: 8192
  nccl_args:
    description: Arguments of C(all_reduce_perf) (C(-g N) is appended).
    type: list
    elements: str
    default: []
  burn_args:
    description: Arguments of the gpu-burn-like tool before the duration.
    type: list
    elements: str
    default: []
  load_env:
    description: Extra environment for every loader process (C(NCCL_NVLS_ENABLE=0) is always set).
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Plan the soak
  thermal_soak_probe:
    bin_path: "{{ [hw_bin_path] if hw_bin_path | default('', true) else [] }}"
    fields: "{{ thermal_soak_query_fields }}"
    duration_s: 600
    out_dir: /var/tmp/thermal_soak/run
    burner_script: /var/tmp/thermal_soak/torch_burn.py
  register: probe
"""

RETURN = r"""
python:
  description: Interpreter running this module on the host (used to run the soak runner).
  returned: always
  type: str
nvidia_smi:
  description: Path of nvidia-smi used.
  returned: success
  type: str
fields:
  description: Validated query fields (legacy clocks_throttle_reasons names when the driver needed them).
  returned: success
  type: list
legacy_fields:
  description: Whether the legacy field names were needed.
  returned: success
  type: bool
gpu_indices:
  description: GPU indices seen by the probe query.
  returned: success
  type: list
loader:
  description: Loader kind chosen (torch, nccl, burn) or null when none is available.
  returned: always
  type: str
loader_path:
  description: Interpreter (torch) or executable (nccl, burn) used.
  returned: success
  type: str
loader_problem:
  description: Why no loader could be chosen, or null.
  returned: always
  type: str
candidates:
  description: What was looked for and found, per loader kind.
  returned: always
  type: dict
sampler:
  description: The sampler of the plan, C(query) or C(dmon).
  returned: success
  type: str
dmon_gpu_indices:
  description: GPU indices seen by the one-shot C(nvidia-smi dmon -c 1) check (only with O(sampler=dmon)).
  returned: when sampler is dmon
  type: list
plan:
  description: The runner plan (sampler kind + argv + header, loads with argv/env/loop, duration, out_dir); null
    without loader.
  returned: always
  type: dict
"""

import glob
import os
import sys

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.b300.rollout.plugins.module_utils.health.thermal import (
    build_plan, choose_loader, dmon_argv, invalid_field, legacy_fields, parse_dmon, parse_samples)
from ansible_collections.b300.rollout.plugins.module_utils.hw.tools import find_tool

TORCH_CHECK = "import torch; raise SystemExit(0 if torch.cuda.is_available() else 1)"


def _find(module, names, dirs):
    """The first of `names` found, each looked up by the collection's one lookup (tools.find_tool: dirs, then PATH)."""
    return next((path for path in (find_tool(module, name, dirs) for name in names) if path), None)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            bin_path=dict(type="list", elements="str", default=[]),
            fields=dict(type="list", elements="str", required=True),
            loader=dict(type="str", default="auto", choices=["auto", "torch", "nccl", "burn"]),
            python_candidates=dict(type="list", elements="str", default=["python3"]),
            nccl_bin_dirs=dict(type="list", elements="str", default=[]),
            burn_names=dict(type="list", elements="str", default=["gpu_burn", "gpu-burn"]),
            duration_s=dict(type="int", required=True),
            sample_ms=dict(type="int", default=2000),
            out_dir=dict(type="path", required=True),
            burner_script=dict(type="path"),
            burn_size=dict(type="int", default=8192),
            nccl_args=dict(type="list", elements="str", default=[]),
            burn_args=dict(type="list", elements="str", default=[]),
            load_env=dict(type="dict", default={}),
            sampler=dict(type="str", default="query", choices=["query", "dmon"]),
            dmon_groups=dict(type="str", default="puc"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    bin_dirs = [d for d in p["bin_path"] if d]
    smi = _find(module, ["nvidia-smi"], bin_dirs)
    if not smi:
        module.fail_json(msg="nvidia-smi not found in bin_path %s or PATH: the thermal soak needs it to sample GPUs"
                         % bin_dirs)

    fields, legacy = list(p["fields"]), False
    rc, out, err = module.run_command([smi, "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"])
    bad = invalid_field(out + err) if rc != 0 else None
    if bad and bad.startswith("clocks_event_reasons."):
        fields, legacy = legacy_fields(fields), True
        rc, out, err = module.run_command([smi, "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"])
        bad = invalid_field(out + err) if rc != 0 else None
    if rc != 0:
        module.fail_json(msg="%s --query-gpu failed (rc %s)%s: expected one CSV line per GPU. %s"
                         % (smi, rc, ", field %s rejected" % bad if bad else "", (err or out).strip()[-400:]),
                         fields=fields)
    parsed = parse_samples(out, fields)
    gpu_indices = sorted({s["index"] for s in parsed["samples"]})
    if not gpu_indices:
        module.fail_json(msg="%s --query-gpu printed no GPU rows: expected one line per GPU" % smi, stdout=out)

    dmon_indices = None
    if p["sampler"] == "dmon":
        if not p["dmon_groups"] or any(c not in "pucvmet" for c in p["dmon_groups"]):
            module.fail_json(msg="dmon_groups %r: expected letters of p,u,c,v,m,e,t" % p["dmon_groups"])
        argv = dmon_argv(smi, p["sample_ms"], p["dmon_groups"])
        argv = argv[:2] + ["-c", "1"] + argv[2:-2]
        drc, dout, derr = module.run_command(argv)
        dparsed = parse_dmon(dout)
        dmon_indices = sorted({s["index"] for s in dparsed["samples"]})
        if drc != 0 or not dmon_indices:
            module.fail_json(msg="%s failed (rc %s) or printed no GPU rows: sampler dmon needs it. %s"
                             % (" ".join(argv), drc, (derr or dout).strip()[-400:]))

    torch_python = None
    tried = []
    for py in [sys.executable] + p["python_candidates"]:
        path = py if os.path.isabs(py) else find_tool(module, py)
        if not path or path in tried:
            continue
        tried.append(path)
        trc, _o, _e = module.run_command(["timeout", "120", path, "-c", TORCH_CHECK])
        if trc == 0:
            torch_python = path
            break
    nccl_dirs = []
    for d in p["nccl_bin_dirs"]:
        nccl_dirs += sorted(glob.glob(d), reverse=True) if any(c in d for c in "*?[") else [d]
    nccl_bin = _find(module, ["all_reduce_perf"], nccl_dirs + bin_dirs)
    burn_bin = _find(module, p["burn_names"], bin_dirs)
    kind, problem = choose_loader(p["loader"], torch_python, nccl_bin, burn_bin)
    candidates = {"torch": {"tried": tried, "found": torch_python},
                  "nccl": {"dirs": nccl_dirs + bin_dirs, "found": nccl_bin},
                  "burn": {"names": p["burn_names"], "dirs": bin_dirs, "found": burn_bin}}
    plan, loader_path = None, None
    if kind:
        loader_path = {"torch": torch_python, "nccl": nccl_bin, "burn": burn_bin}[kind]
        if kind == "torch" and not p["burner_script"]:
            module.fail_json(msg="loader torch chosen but burner_script is not set")
        plan = build_plan(kind, p["duration_s"], p["sample_ms"], smi, fields, gpu_indices, p["out_dir"],
                          loader_path, burner_script=p["burner_script"], burn_size=p["burn_size"],
                          nccl_args=p["nccl_args"], burn_args=p["burn_args"], load_env=p["load_env"],
                          sampler=p["sampler"], dmon_groups=p["dmon_groups"])
    module.exit_json(changed=False, python=sys.executable, nvidia_smi=smi, fields=fields, legacy_fields=legacy, gpu_indices=gpu_indices,
                     loader=kind, loader_path=loader_path, sampler=p["sampler"], dmon_gpu_indices=dmon_indices,
                     loader_problem=problem, candidates=candidates, plan=plan)


if __name__ == "__main__":
    main()
