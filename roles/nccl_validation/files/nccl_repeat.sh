#!/bin/sh
# nccl_repeat.sh - run ONE nccl-tests repeat under a hang timeout and record what happened.
# Installed by the nccl_validation role; called with an argv list (no shell quoting games):
#   nccl_repeat.sh OUT_PREFIX TIMEOUT_S KILL_AFTER_S -- COMMAND [ARGS...]
# Writes OUT_PREFIX.out (stdout+stderr merged, so NCCL INFO lines stay interleaved as a terminal shows them)
# and OUT_PREFIX.meta.json ({"rc": N, "timed_out": bool, "duration_s": S}). Always exits 0: the verdict is made
# from the files by the nccl_tests_result module, a failing or hanging run must not stop the play here.
# `timeout` signals the whole process group, so mpirun's local children go with it.
set -u
if [ "$#" -lt 5 ] || [ "$4" != "--" ]; then
  echo "usage: $0 OUT_PREFIX TIMEOUT_S KILL_AFTER_S -- COMMAND [ARGS...]" >&2
  exit 2
fi
prefix=$1; limit=$2; grace=$3
shift 4
start=$(date +%s)
timeout --kill-after="${grace}s" "${limit}s" "$@" >"${prefix}.out" 2>&1
rc=$?
end=$(date +%s)
timed_out=false
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  timed_out=true
fi
printf '{"rc": %d, "timed_out": %s, "duration_s": %d, "timeout_s": %d}\n' \
  "$rc" "$timed_out" "$((end - start))" "$limit" >"${prefix}.meta.json"
exit 0
