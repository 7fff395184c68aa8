#!/usr/bin/env bash
# Health history sampler on the lent GPU machine, without Ansible (lead runs it through the device tool):
#   run(kind="nvidia-h200", timeout_s=420, command="OUT=$OUT bash tools/device/health_history_run.sh 180 2")
# 1. raw `nvidia-smi dmon -s pucv` (5 samples) and `dmon -s pucv -c 1` as the sampler's --once runs it: real text;
# 2. `sampler.py --once --out DIR` (the standalone mode): once.json;
# 3. the sampler as the service runs it (continuous, interval INTERVAL_S) for SECONDS: 15 s idle, the thermal soak's
#    torch bf16 burner on every GPU, 15 s idle; then SIGTERM, and a check that no sampler/dmon process is left;
# 4. the window read back with module_utils/health/health_history.py (what b300.rollout.health_history_read returns):
#    window.json, and the plot (tools/plot_thermal.py --history): window.png; the textfile; the history files.
# No RDMA NIC on the lent VMs: the NIC part samples whatever /sys/class/infiniband has (nothing there) and says so.
# Exit code: 0 when the window holds every GPU with at least SECONDS / INTERVAL_S / 2 samples; 1 otherwise.
set -uo pipefail
SECONDS_RUN=${1:-180}
IV=${2:-2}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$ROOT/.device-out}
T=/tmp/health-history-run; rm -rf "$T"; mkdir -p "$T" "$OUT"
H=$T/history; TF=$T/textfile
S=$ROOT/roles/health_history/files/sampler.py
cd "$ROOT" || exit 2
export NCCL_NVLS_ENABLE=0
PY=$(command -v python3)
{ echo "python3: $PY"; nvidia-smi --query-gpu=index,name,driver_version,temperature.gpu,clocks.current.sm,power.limit --format=csv
  find /sys/class/infiniband -mindepth 1 -maxdepth 1 -printf '%f\n' 2>&1 | sed 's/^/infiniband: /'; } 2>&1 | tee "$OUT/env.txt"

timeout 30 nvidia-smi dmon -s pucv -c 5 > "$OUT/dmon_pucv_c5.txt" 2>&1; echo "dmon -c 5 rc=$?"
timeout 30 nvidia-smi dmon -s pucv -d "$IV" -c 1 > "$OUT/dmon_pucv_c1.txt" 2>&1; echo "dmon -c 1 rc=$?"
"$PY" "$S" --once --out "$T/once" > "$OUT/once.json" 2> "$OUT/once.err"; echo "sampler --once rc=$? ($(wc -c < "$OUT/once.json") bytes)"

"$PY" "$S" --out "$H" --interval "$IV" --textfile-dir "$TF" 2> "$OUT/sampler.log" &
SPID=$!
sleep 15
NG=$(nvidia-smi -L | grep -c '^GPU ')
BURN=$((SECONDS_RUN - 30)); [ "$BURN" -lt 10 ] && BURN=10
pids=()
for i in $(seq 0 $((NG - 1))); do
  CUDA_VISIBLE_DEVICES=$i "$PY" roles/thermal_soak/files/torch_burn.py --seconds "$BURN" --device 0 --gpu-label "$i" \
    > "$T/burn-$i.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || echo "burner $p rc=$?"; done
cat "$T"/burn-*.log > "$OUT/load.log" 2>/dev/null
sleep 15
kill -TERM "$SPID"; wait "$SPID"; echo "sampler rc=$?"
sleep 1
if pgrep -f "nvidia-smi dmon" >/dev/null || kill -0 "$SPID" 2>/dev/null; then echo "LEFTOVER PROCESSES"; pgrep -af "nvidia-smi dmon"
else echo "no leftover processes"; fi

"$PY" - "$H" "$SECONDS_RUN" "$IV" "$OUT/window.json" <<'PY'
import json, sys
sys.path.insert(0, "collections")
from ansible_collections.b300.rollout.plugins.module_utils.health import health_history as hh
d, secs, iv, out = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
res = hh.read_window(d, secs + 30, plot_context_s=0)
json.dump(res, open(out, "w"), indent=1, sort_keys=True)
print("available", res["available"], "samples", res["window"]["samples"], "files", res["files_read"],
      "skipped", res["skipped_lines"], "events", res["events"])
for i, g in res["gpus"].items():
    print("GPU", i, {k: g[k] for k in ("samples", "max_temp_c", "max_mem_temp_c", "min_sm_clock_mhz", "max_power_w",
                                        "thermal_violation_s", "power_violation_s", "hot")})
print("nics", res["nics"] or "none (no RDMA device)")
need = secs / iv / 2
sys.exit(0 if res["gpus"] and all(g["samples"] >= need for g in res["gpus"].values()) else 1)
PY
rc=$?
"$PY" tools/plot_thermal.py --history "$OUT/window.json" --host "$(hostname) (REAL)" --out "$OUT/window.png" || echo "plot rc=$?"
cp "$TF"/*.prom "$OUT/" 2>/dev/null
tar -C "$T" -czf "$OUT/history.tgz" history once
ls -la "$OUT"
exit "$rc"
