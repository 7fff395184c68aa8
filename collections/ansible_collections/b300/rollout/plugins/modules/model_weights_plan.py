#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module (controller): which model directories each host needs, their manifests, and who pulls from where."""
from __future__ import absolute_import, division, print_function
__metaclass__ = type

DOCUMENTATION = r"""
---
module: model_weights_plan
short_description: Plan the weights stage - the model directories per host, their manifests, the fan-out
description:
  - "Runs on the controller (C(delegate_to: localhost), C(run_once)), changes nothing."
  - "O(step=models): from the sglang plan (O(plan): its instances and router) every --model-path and
    --speculative-draft-model-path per host (and the router's tokenizer), each with its manifest read from
    O(manifest_dir)/<path below the model root>.json (SGLang's model_file_verifier format), checked against the
    digest pinned in O(digests) when one is; the inputs checked by module_utils/common/input_rules.py. Every problem is
    named (host, model, file, found, expected, fix) before anything reaches a host."
  - "O(step=fanout): from each host's inspect result (O(states)), the chain that sends each byte out of the source
    once: hosts with a complete copy serve, the first host that needs a model pulls it from a seed or the source,
    each next one from the one before it (module_utils/weights/model_weights.py C(fanout)); for a path source on the
    controller the controller's own address as the hosts reach it (C(ip route get))."
version_added: "1.2.0"
extends_documentation_fragment: [ansible.builtin.action_common_attributes, b300.rollout.common,
                                 b300.rollout.weights_source]
options:
  step:
    description: C(models) or C(fanout).
    type: str
    choices: [models, fanout]
    required: true
  plan:
    description: The sglang plan (the registered result of b300.rollout.sglang_plan; C(instances) and C(router)).
    type: dict
    default: {}
  model_root:
    description: sglang_model_root (model directories are <root>/<path>, the same <path> at the source).
    type: str
    default: /models
  hosts:
    description: The hosts of this run (ansible_play_hosts); the others are left alone.
    type: list
    elements: str
    default: []
  manifest_dir:
    description: Directory on the controller holding <path>.json per model directory.
    type: path
  digests:
    description: Pinned manifest digest per model path ({path below the root - sha256}); optional.
    type: dict
    default: {}
  values:
    description: The role's variables for the input rules (secrets left out).
    type: dict
    default: {}
  secrets:
    description: The credentials (model_weights_s3_*, model_weights_http_token / _password), checked like the other
      inputs and never shown.
    type: dict
    default: {}
  models:
    description: step fanout, the C(hosts) result of step models.
    type: dict
    default: {}
  states:
    description: step fanout, per host the inspect result's C(models) (C(rel), C(state)).
    type: dict
    default: {}
  serve_addresses:
    description: step fanout, per host the data-network address its server binds to.
    type: dict
    default: {}
  serve_port:
    description: step fanout, the servers' TCP port.
    type: int
    default: 31990
  controller_address:
    description: step fanout, the controller's address as the hosts reach it; empty - the source address of the
      controller's route to the first host that pulls from it.
    type: str
    default: ""
  fanout:
    description: Hosts pull from each other (true) or each from the source (false).
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Model directories per host and their manifests
  b300.rollout.model_weights_plan:
    step: models
    plan: "{{ sglang_plan }}"
    model_root: "{{ sglang_model_root }}"
    hosts: "{{ ansible_play_hosts }}"
    manifest_dir: "{{ inventory_dir }}/weights-manifests"
    source: {type: http, url: "https://mirror.internal/models"}
  delegate_to: localhost
  run_once: true
  register: models
"""

RETURN = r"""
hosts:
  description: step models - per host the model directories it needs, each C(rel), C(final), C(need), C(files),
    C(digest), C(where), C(for) (the instances that use it).
  returned: step models
  type: dict
notes:
  description: step models - model directories left to roles/sglang's own check (source type none, no manifest).
  returned: step models
  type: list
  elements: str
problems:
  description: Refusals (missing or invalid manifest, a pinned digest that differs, bad inputs, a controller source
    that lacks a file).
  returned: always
  type: list
  elements: str
stage:
  description: step fanout - per host C(stage) (models with C(source) and C(fallback)) and C(serve) (models it serves
    to peers).
  returned: step fanout
  type: dict
controller:
  description: step fanout - models the controller serves (path source on the controller), with C(url), C(address),
    C(port), C(root).
  returned: step fanout
  type: dict
summary:
  description: step fanout - one line per host and model (complete, or what it pulls from where).
  returned: step fanout
  type: list
  elements: str
"""

import json
import os
import socket
import subprocess

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.b300.rollout.plugins.module_utils.common import input_rules as ir
from ansible_collections.b300.rollout.plugins.module_utils.weights import model_weights as mw
from ansible_collections.b300.rollout.plugins.module_utils.weights import model_weights_io as mio


def load_manifest(manifest_dir, rel):
    where = os.path.join(manifest_dir, rel + ".json")
    if not os.path.isfile(where):
        raise mw.ManifestError(
            "no manifest for %s: expected %s (SGLang's model_file_verifier format); make it once from a trusted copy: "
            "tools/weights-manifest <copy of %s> -o %s, or python -m sglang.srt.utils.model_file_verifier generate "
            "--model-path <copy> --model-checksum %s" % (rel, where, rel, where, where))
    with open(where, "rb") as fh:
        return mw.parse_manifest(fh.read().decode("utf-8"), where), where


def step_models(p):
    # the source is a b300_defaults variable, not one of the role's values: its rule is run here, on the option
    values = dict(p["values"], model_weights_source=p["source"])
    problems = (ir.check_model_weights_inputs(values, host="controller")
                + ir.check_model_weights_secrets(p["secrets"], host="controller"))
    by_host, errors = mw.models_by_host(p["plan"], p["model_root"])
    problems += errors
    wanted = set(p["hosts"]) if p["hosts"] else set(by_host)
    manifests, out, notes = {}, {}, []
    for host in sorted(by_host, key=lambda h: (p["hosts"].index(h) if h in p["hosts"] else 999, h)):
        if host not in wanted:
            continue
        entries = []
        for final, e in sorted(by_host[host].items(), key=lambda kv: kv[1]["rel"]):
            rel = e["rel"]
            if rel not in manifests:
                try:
                    manifests[rel] = load_manifest(p["manifest_dir"], rel)
                except (mw.ManifestError, OSError) as exc:
                    manifests[rel] = None
                    if (p["source"] or {}).get("type", "none") == "none" and "no manifest for" in str(exc):
                        notes.append("%s: not checked by the weights stage (source type none and %s)" % (rel, exc))
                    else:
                        problems.append(str(exc))
                    continue
                pin = (p["digests"] or {}).get(rel)
                got = mw.manifest_digest(manifests[rel][0])
                if pin and pin != got:
                    problems.append("%s: manifest %s has digest %s; expected %s (model_weights_digests): the manifest "
                                    "is not the pinned one; fix: restore the pinned manifest, or pin the new digest "
                                    "after checking where it came from" % (rel, manifests[rel][1], got, pin))
            if manifests[rel] is None:
                continue
            files = mw.subset(manifests[rel][0], e["need"])
            entries.append({"rel": rel, "final": final, "need": e["need"], "files": files,
                            "digest": mw.manifest_digest(files), "where": manifests[rel][1], "for": e["for"]})
        out[host] = entries
    return {"hosts": out, "problems": problems, "notes": notes}


def route_source(address):
    """The controller's own address on its route to `address` (what the host sees as the peer address)."""
    try:
        ip = socket.getaddrinfo(address, None)[0][4][0]
        res = subprocess.run(["ip", "-o", "route", "get", ip], capture_output=True, text=True, timeout=10, check=False)
        words = res.stdout.split()
        if "src" in words:
            return words[words.index("src") + 1]
    except (OSError, socket.gaierror, subprocess.TimeoutExpired, IndexError):
        pass
    return None


def step_fanout(p):
    problems = []
    states = {h: {m["rel"]: m["state"] for m in (res or [])} for h, res in (p["states"] or {}).items()}
    urls = {h: "http://%s:%d" % ("[%s]" % a if ":" in a else a, p["serve_port"]) for h, a in p["serve_addresses"].items()}
    src = p["source"] or {"type": "none"}
    ctl_url = ""
    ctl = {}
    if src.get("type") == "path" and (src.get("where") or "host") == "controller":
        first = next((h for h in p["models"] for m in p["models"][h] if states.get(h, {}).get(m["rel"]) != "complete"),
                     None)
        addr = p["controller_address"] or (route_source(p["serve_addresses"].get(first, first)) if first else None)
        if first and not addr:
            problems.append("controller: cannot tell the address %s reaches the controller on (no route source for "
                            "%s); fix: set model_weights_controller_address" % (first, p["serve_addresses"].get(first)))
        ctl_url = "http://%s:%d" % ("[%s]" % addr if addr and ":" in addr else addr, p["serve_port"]) if addr else ""
        ctl = {"address": addr, "port": p["serve_port"], "url": ctl_url, "root": src.get("path")}
    plan = mw.stage_plan(p["models"], states, src, ctl_url, urls, p["fanout"])
    for m in plan["controller"]:
        for name, f in sorted(m["files"].items()):
            path = os.path.join(src.get("path") or "", m["rel"], name)
            link = mio.symlink_below(src.get("path") or "", m["rel"] + "/" + name)
            if link:   # the controller's server refuses it too (403): said here, before any host starts
                problems.append("controller: the source %s holds %s/%s through a symlink: %s is a symlink to %s "
                                "(manifest %s); nothing was written; fix: replace the link by the file itself (the "
                                "controller serves regular files under its path only)" % (
                                    src.get("path"), m["rel"], name, link[0], link[1], m["where"]))
                continue
            try:
                size = os.stat(path).st_size
            except OSError:
                problems.append("controller: the source %s lacks %s/%s (found: no such file %s; expected %d bytes, "
                                "sha256 %s, manifest %s); nothing was written; fix: put it there or correct the "
                                "manifest" % (src.get("path"), m["rel"], name, path, f["size"], f["sha256"], m["where"]))
                continue
            if size != int(f["size"]):
                problems.append("controller: the source %s holds %s/%s with %d bytes; expected %d bytes (manifest %s); "
                                "nothing was written; fix: replace it at the source or correct the manifest"
                                % (src.get("path"), m["rel"], name, size, f["size"], m["where"]))
    ctl["models"] = plan["controller"]
    summary = []
    for h, models in p["models"].items():
        for m in models:
            stage = next((s for s in plan["hosts"][h]["stage"] if s["rel"] == m["rel"]), None)
            if stage is None:
                summary.append("%s: %s complete (%d files, %s; marker and one stat per file, no weight byte read)"
                               % (h, m["final"], len(m["files"]), mw.human(mw.total_bytes(m["files"]))))
            else:
                s = stage["source"]
                summary.append("%s: %s needs work, from %s%s" % (
                    h, m["final"], s["type"] if s["type"] != "peer" else "peer %s" % s["host"],
                    (" (fallback %s)" % stage["fallback"]["type"]) if stage.get("fallback") else ""))
    return {"stage": plan["hosts"], "controller": ctl, "problems": problems, "summary": summary}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            step=dict(type="str", required=True, choices=["models", "fanout"]),
            plan=dict(type="dict", default={}),
            model_root=dict(type="str", default="/models"),
            hosts=dict(type="list", elements="str", default=[]),
            manifest_dir=dict(type="path"),
            digests=dict(type="dict", default={}),
            source=mw.SOURCE_SPEC,
            values=dict(type="dict", default={}),
            secrets=dict(type="dict", default={}, no_log=True),
            models=dict(type="dict", default={}),
            states=dict(type="dict", default={}),
            serve_addresses=dict(type="dict", default={}),
            serve_port=dict(type="int", default=31990),
            controller_address=dict(type="str", default=""),
            fanout=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    p = module.params
    out = step_models(p) if p["step"] == "models" else step_fanout(p)
    if out["problems"]:
        module.fail_json(msg=" || ".join(out["problems"]), **out)
    module.exit_json(changed=False, **json.loads(json.dumps(out)))


if __name__ == "__main__":
    main()
