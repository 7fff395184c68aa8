#!/usr/bin/env bash
# Thermal soak on the lent GPU machine: playbooks/thermal_soak.yml against localhost (-c local) with the torch
# bf16 burner, then samples.csv, summary.json, plot.png (+ status.json, the playbook log, the loader logs) to $OUT.
#   usage: tools/device/thermal_run.sh [DURATION_S (default 180)] [SAMPLE_MS (default 2000)] [SAMPLER (query|dmon)]
# Needs the ansible-core wheels carried in .whl/ (tools/device/wheels.sh, tools/device/README.md). Exit code = the playbook's
# (non-zero when the verdict is not ok); the files are copied either way.
set -uo pipefail
DUR=${1:-180}
SAMPLE_MS=${2:-2000}
SAMPLER=${3:-query}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$ROOT/.device-out}
SITE=/tmp/site
ART=/tmp/thermal-artifacts
WORK=/tmp/thermal-work
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0            # NVLink multicast stays off on these machines
cd "$ROOT" || exit 2

ls .whl/*.whl >/dev/null 2>&1 || { echo "no wheels in .whl/: make them on the controller with tools/device/wheels.sh and carry them (tools/device/README.md)"; exit 2; }
python3 -m pip install -q --no-index --no-deps --target "$SITE" .whl/*.whl || exit 2
export PYTHONPATH=$SITE PATH=$SITE/bin:$PATH ANSIBLE_CONFIG=$ROOT/ansible.cfg ANSIBLE_FORCE_COLOR=0
PY=$(command -v python3)
{ echo "python3: $PY"; "$PY" -c 'import torch, matplotlib; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.device_count(), "matplotlib", matplotlib.__version__)'
  nvidia-smi --query-gpu=index,name,driver_version,temperature.gpu,clocks.current.sm,clocks.max.sm,power.limit,clocks_event_reasons.active --format=csv
} 2>&1 | tee "$OUT/env.txt"

rm -rf "$ART" "$WORK"
ansible-playbook -i localhost, -c local playbooks/thermal_soak.yml \
  -e thermal_soak_hosts=localhost -e ansible_python_interpreter="$PY" \
  -e thermal_soak_duration_s="$DUR" -e thermal_soak_sample_ms="$SAMPLE_MS" -e thermal_soak_loader=torch -e thermal_soak_sampler="$SAMPLER" \
  -e thermal_soak_artifacts_dir="$ART" -e thermal_soak_work_dir="$WORK" 2>&1 | tee "$OUT/playbook.log"
rc=${PIPESTATUS[0]}

for f in samples.csv summary.json plot.png status.json; do
  cp "$ART/localhost/$f" "$OUT/$f" 2>/dev/null || echo "missing: $ART/localhost/$f"
done
cat "$WORK"/run/load-*.log > "$OUT/load.log" 2>/dev/null || true
if pgrep -af 'torch_burn|nvidia-smi .*-lms|thermal_soak_runner'; then echo "LEFTOVER PROCESSES"; else echo "no leftover processes"; fi
python3 - "$OUT/summary.json" <<'PY' || true
import json, sys
s = json.load(open(sys.argv[1]))
print("verdict", s["verdict"], "| max temp", s["temp_max_c"], "C | min SM", s["sm_min_mhz"], "MHz | sampled", s["sampled_s"], "s")
for i, g in s["gpus"].items():
    print("GPU", i, g["verdict"], "temp max/median", g["temp_max_c"], g["temp_median_c"], "| SM min/median/base/tail",
          g["sm_min_mhz"], g["sm_median_mhz"], g["sm_baseline_mhz"], g["sm_tail_mhz"], "| power max", g["power_max_w"],
          "| reasons", g["reason_counts"])
print("load_tflops", s.get("load_tflops"))
PY
exit "$rc"
