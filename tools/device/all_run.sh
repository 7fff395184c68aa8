#!/usr/bin/env bash
# One lease, every real-GPU check (run by the lead through the device tool, from the repo root):
#   run(kind="nvidia-h200-x2", carry=[".whl", ".src"], timeout_s=600, command="bash tools/device/all_run.sh")
# 1. gpu_topology_facts live + raw outputs + timing (tools/device/gpu_facts_run.sh)
# 2. nccl_validation role over ALL GPUs, then by hand (tools/device/nccl_run.sh)
# 3. the same with -g 1 (NCCL_RUN_GPUS=1)
# 4. thermal soak, SOAK_S seconds (tools/device/thermal_run.sh), sampled with the query CSV
# 5. thermal soak, DMON_S seconds, sampled with `nvidia-smi dmon -o DT` (thermal_soak_sampler=dmon); 0 skips it
# Each part's files are packed into one tarball under $OUT (the tool returns at most 8 files).
set -u
: "${OUT:?}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
SOAK_S=${SOAK_S:-180}
DMON_S=${DMON_S:-60}
T=/tmp/all-run; rm -rf "$T"; mkdir -p "$T"
part() {  # name, command...
  local name=$1; shift
  mkdir -p "$T/$name"; local t0; t0=$(date +%s)
  OUT="$T/$name" "$@" > "$T/$name/console.log" 2>&1; local rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t0 ))s" | tee -a "$OUT/parts.txt"
  tail -5 "$T/$name/console.log"
  tar -C "$T" -czf "$OUT/$name.tgz" "$name"
}
nvidia-smi -L | tee "$OUT/parts.txt"
part facts bash tools/device/gpu_facts_run.sh
part nccl_all bash tools/device/nccl_run.sh
part nccl_g1 env NCCL_RUN_GPUS=1 bash tools/device/nccl_run.sh
part thermal bash tools/device/thermal_run.sh "$SOAK_S" 2000
[ "$DMON_S" -gt 0 ] && part thermal_dmon bash tools/device/thermal_run.sh "$DMON_S" 2000 dmon
cp "$T"/nccl_all/summary.json "$OUT/nccl_all_summary.json" 2>/dev/null
cp "$T"/thermal/plot.png "$OUT/thermal_plot.png" 2>/dev/null
ls -la "$OUT"
