#!/usr/bin/env python3
"""Real-GPU evidence for the host stack's read-only checks (issue 36). Run on the lent GPU machine, from the repository
root, without Ansible (stdlib + the collection's module_utils on PYTHONPATH):

    run(command="python3 tools/device/host_stack_run.py")

Reads the host exactly as b300.rollout.host_stack_facts does (module_utils/hoststack/host_stack_io.gather, with subprocess in
place of AnsibleModule.run_command) against the declared B300 stack, and writes to $OUT: state.json (every raw text
read), report.json (plan, checks, summary, failures), timing.json and README.txt. The lent machine is one H100/H200
without NVSwitch, fabric manager or ConnectX: most B300 checks fail there by design; what it shows is what the real
driver reports (flavour, version, persistence, the Fabric fields of a GPU outside an NVLink domain). Copy $OUT to
docs/evidence/<machine>/host_stack/.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "collections"))

import yaml  # noqa: E402  (PyYAML: on the lent machine's python; the stacks file is YAML)

from ansible_collections.b300.rollout.plugins.module_utils.hoststack import host_stack_io  # noqa: E402 - importable only once sys.path has the collection


def run(argv):
    if not argv[0]:
        return ""
    p = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, LC_ALL="C"), timeout=120)
    return p.stdout if p.returncode == 0 else ""


def find(name, extra):
    for d in extra:
        if os.access(os.path.join(d, name), os.X_OK):
            return os.path.join(d, name)
    return shutil.which(name)


def main():
    out = os.environ.get("OUT") or sys.exit("set OUT")
    stacks = yaml.safe_load(open(os.path.join(ROOT, "roles", "host_stack", "vars", "stacks.yml")))["host_stack_stacks"]
    name = sys.argv[1] if len(sys.argv) > 1 else "b300-noble-580.173"
    stack = stacks[name]
    t = time.monotonic()
    state = host_stack_io.gather(run, find, stack)
    gathered = round(time.monotonic() - t, 3)
    rep = host_stack_io.report(stack, state, socket.gethostname())
    judged = round(time.monotonic() - t - gathered, 4)
    json.dump(state, open(os.path.join(out, "state.json"), "w"), indent=1, sort_keys=True)
    json.dump(rep, open(os.path.join(out, "report.json"), "w"), indent=1, sort_keys=True)
    json.dump({"gather_s": gathered, "judge_s": judged}, open(os.path.join(out, "timing.json"), "w"), indent=1)
    with open(os.path.join(out, "README.txt"), "w") as fh:
        fh.write("# command: python3 tools/device/host_stack_run.py %s\n# date: %s  host: %s\n" % (
            name, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), socket.gethostname()))
        fh.write(run([find("nvidia-smi", []), "-L"]))
    print("\n".join(rep["summary"]))
    print(json.dumps({"gather_s": gathered, "judge_s": judged}))


if __name__ == "__main__":
    main()
