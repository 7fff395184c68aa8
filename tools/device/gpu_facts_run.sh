#!/usr/bin/env bash
# Real-GPU evidence for the facts modules. Run by the lead on the lent GPU machine, from the repository root:
#
#   run(command="bash tools/device/gpu_facts_run.sh", carry=[".whl"])
#
# needs: .whl/ with ansible-core + resolvelib<2 + cryptography + cffi + pycparser wheels for CPython 3.12
# (bash tools/device/wheels.sh on the controller; tools/device/README.md). Writes to $OUT (see tools/device/gpu_facts.yml);
# copy $OUT to docs/evidence/<machine>/gpu_facts/ (same layout, e.g. docs/evidence/h200x2/gpu_facts/) so
# tests/unit/test_gpu_facts_evidence.py can check that parsing raw/ gives exactly gpu_topology_facts.json.
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
export ANSIBLE_CONFIG="$PWD/ansible.cfg" ANSIBLE_CACHE_PLUGIN=memory ANSIBLE_NOCOLOR=1
{
  echo "# command: bash tools/device/gpu_facts_run.sh   (git $(git rev-parse --short HEAD 2>/dev/null || echo unknown))"
  echo "# date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  host: $(hostname)"
  nvidia-smi -L || true
  ansible --version | head -1
} > "$OUT/README.txt"
ansible-playbook -i localhost, -c local tools/device/gpu_facts.yml 2>&1 | tee "$OUT/playbook.log"
# end-to-end cost of one ad-hoc module call (includes Ansible start-up), 5 runs
python3 - "$OUT" <<'PY'
import json, os, statistics, subprocess, sys, time
out = sys.argv[1]
walls = []
for _ in range(5):
    t = time.monotonic()
    subprocess.run(["ansible", "localhost", "-i", "localhost,", "-c", "local", "-m", "b300.rollout.gpu_topology_facts"],
                   check=True, stdout=subprocess.DEVNULL)
    walls.append(round(time.monotonic() - t, 3))
path = os.path.join(out, "timing.json")
data = json.load(open(path))
data["adhoc_ansible_module_wall_s"] = {"median": statistics.median(walls), "all": sorted(walls)}
json.dump(data, open(path, "w"), indent=1)
print(json.dumps(data, indent=1))
PY
echo "gpu_facts_run: done; files in $OUT"
