#!/usr/bin/env bash
# One lease, every real-GPU check, in ONE device command (10-minute limit), from the repository root:
#   run(kind="nvidia-h200-x2", carry=[".whl", ".src"], timeout_s=600, command="bash tools/device/all_run.sh")
# (kind "nvidia-h200" for one GPU.) Prepare .whl and .src on the controller first: tools/device/README.md.
# Parts, in this order; each runs under `timeout` with the time left of BUDGET_S, and is skipped (a line in
# parts.txt says so) when less than its own minimum is left, so the command ends within BUDGET_S (+ packing):
#   facts         gpu_topology_facts live, raw outputs, timing (gpu_facts_run.sh)                      min 30 s
#   nccl_all      the nccl_validation role over all GPUs, then by hand (nccl_run.sh; builds nccl-tests) min 90 s
#   triage        playbooks/triage.yml (read-only) and its raw inputs (triage_run.sh)                    min 45 s
#   history       health-history sampler: idle, burn, idle, window read back (health_history_run.sh)     HISTORY_S + 15 s
#   thermal       thermal soak of SOAK_S s, query sampler (thermal_run.sh)                               SOAK_S + 45 s
#   nccl_g1       -g 1 on a multi-GPU machine (on one GPU nccl_all is the -g 1 run: skipped)            min 30 s
#   thermal_dmon  thermal soak of DMON_S s, sampled by `nvidia-smi dmon -o DT`; DMON_S=0 skips it        DMON_S + 45 s
# Defaults: BUDGET_S=560, HISTORY_S=60, SOAK_S=90, DMON_S=30 (about 530 s on two GPUs, 490 s on one).
# $OUT gets parts.txt (rc, seconds and the last console lines of each part) and one NAME.tgz per part that ran.
# ALL_RUN_DRY=1 prints the plan (parts and time caps) and runs nothing.
set -u
: "${OUT:?set OUT (the device tool sets it)}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
BUDGET_S=${BUDGET_S:-560}
HISTORY_S=${HISTORY_S:-60}
SOAK_S=${SOAK_S:-90}
DMON_S=${DMON_S:-30}
DRY=${ALL_RUN_DRY:-}
cd "$(dirname "$0")/../.." || exit 2
T=/tmp/all-run
START=$(date +%s)
NGPU=$(nvidia-smi -L | grep -c '^GPU ')
mkdir -p "$OUT"
nvidia-smi -L > "$OUT/parts.txt"
[ -n "$DRY" ] || { rm -rf "$T"; mkdir -p "$T"; }

part() {  # name, minimum seconds, command...
  local name=$1 min=$2 left rc t0
  shift 2
  left=$(( BUDGET_S - ($(date +%s) - START) ))
  if [ "$left" -lt "$min" ]; then
    echo "$name skipped: ${left}s of BUDGET_S=${BUDGET_S}s left, it needs ${min}s" | tee -a "$OUT/parts.txt"
    return
  fi
  if [ -n "$DRY" ]; then
    echo "$name cap=${left}s min=${min}s: $*" | tee -a "$OUT/parts.txt"
    BUDGET_S=$(( BUDGET_S - min ))
    return
  fi
  mkdir -p "$T/$name"
  t0=$(date +%s)
  OUT="$T/$name" timeout --kill-after=10s "${left}s" "$@" > "$T/$name/console.log" 2>&1
  rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t0 ))s (cap ${left}s)" | tee -a "$OUT/parts.txt"
  tail -5 "$T/$name/console.log" | tee -a "$OUT/parts.txt"
  tar -C "$T" -czf "$OUT/$name.tgz" "$name"
}

part facts 30 bash tools/device/gpu_facts_run.sh
part nccl_all 90 bash tools/device/nccl_run.sh
part triage 45 bash tools/device/triage_run.sh
part history $(( HISTORY_S + 15 )) bash tools/device/health_history_run.sh "$HISTORY_S" 2
part thermal $(( SOAK_S + 45 )) bash tools/device/thermal_run.sh "$SOAK_S" 2000
if [ "$NGPU" -gt 1 ]; then
  part nccl_g1 30 env NCCL_RUN_GPUS=1 bash tools/device/nccl_run.sh
else
  echo "nccl_g1 skipped: one GPU, nccl_all was the -g 1 run" | tee -a "$OUT/parts.txt"
fi
if [ "$DMON_S" -gt 0 ]; then
  part thermal_dmon $(( DMON_S + 45 )) bash tools/device/thermal_run.sh "$DMON_S" 2000 dmon
fi
echo "all_run.sh: $NGPU GPU(s), $(( $(date +%s) - START ))s in all" | tee -a "$OUT/parts.txt"
ls -la "$OUT"
