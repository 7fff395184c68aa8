#!/usr/bin/env bash
# `make test`: the test parts in two lanes, and every part's time at the end (also in artifacts/test-times.txt, for
# CI's closing note).
# B300_TEST_TIMES=FILE writes that table elsewhere (the unit test of this script).
#   tools/test-parts.sh [--beside PART] PART...
# --beside PART (make test: integration-fleet, the tests that use the sandbox fleet) runs `make PART` in the
# background from the start, its output in artifacts/test-PART.log (printed when it ends); the other PARTs run one
# after the other in the foreground and stop at the first failure. The fleet lane is latency-bound (SSH round trips
# to the two sandbox hosts, ~0.25 s per task) and leaves a core mostly idle: lint, sanity, unit, parser, the
# integration tests that need no fleet and molecule (its own containers and network) run there meanwhile.
# A failure in either lane fails `make test`; a foreground failure stops the fleet lane too.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
rows=() failed="" t0=$SECONDS
# CPU seconds (user+sys) of this script's finished children: what a part really costs on a shared 2-core machine,
# where wall time depends on what runs beside it
TICKS=$(getconf CLK_TCK)
cpu_s() { local f; read -ra f < /proc/$$/stat; echo $(( (f[15] + f[16]) / TICKS )); }
# CPU seconds the whole machine was busy (/proc/stat: user nice system irq softirq steal), the hosts' and molecule's
# containers included: busy / cores is the floor no scheduling of the parts can beat (issue 40: the CI time's bound)
busy_s() { local f; read -ra f < /proc/stat; echo $(( (f[1] + f[2] + f[3] + f[6] + f[7] + f[8]) / TICKS )); }
# CPU seconds used by the sandbox hosts since their containers last started (cgroup v1 cpuacct or v2 cpu.stat; a
# test that restarts a host starts its count again, so this is a lower bound)
hosts_cpu_s() {
  local h id f total=0 v
  for h in b300a b300b; do
    id=$(podman inspect -f '{{.Id}}' "b300-$h" 2>/dev/null) || continue
    for f in /sys/fs/cgroup/cpuacct/libpod_parent/libpod-$id/cpuacct.usage \
             /sys/fs/cgroup/libpod_parent/libpod-$id/cpu.stat /sys/fs/cgroup/machine.slice/libpod-$id.scope/cpu.stat; do
      [[ -r $f ]] || continue
      if [[ $f == *cpuacct.usage ]]; then v=$(( $(cat "$f") / 1000000000 )); else
        v=$(( $(awk '$1 == "usage_usec" {print $2}' "$f") / 1000000 )); fi
      total=$((total + v)); break
    done
  done
  echo "$total"
}
busy0=$(busy_s) fg_done=""
beside="" beside_pid="" beside_t0=0
if [[ ${1:-} == --beside ]]; then beside=$2; shift 2; fi
mkdir -p artifacts

# What both lanes need first (the image and the wheelhouse: molecule and the fleet; idempotent, cached), then the
# fleet lane. Its acceptance tests need the bench_serving client venv: built first in that lane (downloads).
if [[ -n $beside ]]; then
  echo "=== make image wheelhouse (both lanes need them)"
  t=$SECONDS
  if ! make --no-print-directory image wheelhouse; then
    rows+=("$(printf '%-24s %6d s  FAILED' "image+wheelhouse" $((SECONDS - t)))")
    failed="image+wheelhouse"
  else
    rows+=("$(printf '%-24s %6d s  passed' "image+wheelhouse" $((SECONDS - t)))")
    echo "=== make $beside (beside the other parts; output: artifacts/test-$beside.log)"
    beside_t0=$SECONDS
    setsid bash -c 'tools/acceptance/client_venv.sh && exec make --no-print-directory "$1"' lane "$beside" \
      > "artifacts/test-$beside.log" 2>&1 < /dev/null &
    beside_pid=$!
  fi
fi

# The real-SGLang CPU venvs of the parser part are built in the background while the parts before `parser` run (they
# mostly download and unpack, about 6 min on a fresh machine). The builders are idempotent (a .done stamp); the parser
# part waits for them and then builds whatever is still missing itself, so a failed prebuild fails there with its own
# message. Its log: artifacts/prebuild-venvs.log. B300_PREBUILD_VENVS=0 turns this off.
# The fleet lane is the longest and partly waits (SSH round trips, services starting, reboots): it gets the CPU first
# and the parts here, reniced, fill its waits (on 2 cores both lanes are CPU-bound together otherwise, and the fleet
# lane, the critical path, ran at half speed). B300_FG_NICE=0 turns this off.
fg_nice=""
if [[ -n $beside_pid ]] && [[ ${B300_FG_NICE:-10} != 0 ]]; then fg_nice="nice -n ${B300_FG_NICE:-10}"; fi
prebuild=""
if [[ -z $failed ]] && [[ " $* " == *" parser "* ]] && [[ ${B300_PREBUILD_VENVS:-1} != 0 ]]; then
  # its own session, so that a run stopped by an earlier part's failure can stop the builders too (kill -- -PID)
  setsid $fg_nice bash -c 'tools/acceptance/contract_venv.sh 0.5.17 && tools/acceptance/contract_venv.sh 0.5.18' \
    > artifacts/prebuild-venvs.log 2>&1 < /dev/null &
  prebuild=$!
fi
for part in "$@"; do
  [[ -z $failed ]] || break
  if [[ $part == parser && -n $prebuild ]]; then
    echo "=== waiting for the venv prebuild (artifacts/prebuild-venvs.log)"
    wait "$prebuild" || echo "venv prebuild failed (rc $?): the parser part builds what is missing"
    prebuild=""
  fi
  echo "=== make $part"
  t=$SECONDS c=$(cpu_s)
  if $fg_nice make --no-print-directory "$part"; then
    rows+=("$(printf '%-24s %6d s  cpu %5d s  passed' "$part" $((SECONDS - t)) $(($(cpu_s) - c)))")
  else
    rows+=("$(printf '%-24s %6d s  cpu %5d s  FAILED' "$part" $((SECONDS - t)) $(($(cpu_s) - c)))")
    failed=$part
  fi
done
[[ -z $prebuild ]] || kill -- -"$prebuild" 2>/dev/null   # a part failed before `parser`: stop the builders
fg_done=$((SECONDS - t0))
if [[ -n $beside_pid ]]; then
  if [[ -n $failed ]]; then
    echo "=== $failed failed: stopping $beside"
    kill -- -"$beside_pid" 2>/dev/null
  else
    echo "=== waiting for $beside (artifacts/test-$beside.log)"
  fi
  c=$(cpu_s)
  wait "$beside_pid"; rc=$?
  c=$(($(cpu_s) - c)) hosts_c=$(hosts_cpu_s)
  echo "=== output of make $beside"
  cat "artifacts/test-$beside.log"
  if [[ $rc == 0 ]]; then
    rows+=("$(printf '%-24s %6d s  cpu %5d s  passed (beside the parts above)' "$beside" $((SECONDS - beside_t0)) "$c")")
  else
    rows+=("$(printf '%-24s %6d s  cpu %5d s  FAILED (rc %d)' "$beside" $((SECONDS - beside_t0)) "$c" "$rc")")
    failed=${failed:-$beside}
  fi
fi
for part in "$@"; do
  printf '%s\n' "${rows[@]}" | grep -q "^$part " || rows+=("$(printf '%-24s %6s    not run' "$part" -)")
done
{
  echo "=== make test: time per part"
  printf '  %s\n' "${rows[@]}"
  printf '  %-24s %6d s  cpu %5d s  %s\n' total $((SECONDS - t0)) "$(cpu_s)" "${failed:+FAILED in $failed}"
  echo "  (cpu: user+sys seconds of the part's own processes; NOT the sandbox's or molecule's hosts' (under conmon) nor"
  echo "   daemons it left; $(nproc) cores, load average at the end: $(cut -d' ' -f1-3 /proc/loadavg))"
  busy=$(($(busy_s) - busy0))
  echo "  machine busy $busy CPU-s over $((SECONDS - t0)) s on $(nproc) cores: floor $((busy / $(nproc))) s for this work;" \
       "foreground parts done at ${fg_done:-?} s${hosts_c:+; sandbox hosts used >= $hosts_c CPU-s since their last start}"
} | tee "${B300_TEST_TIMES:-artifacts/test-times.txt}"
[ -z "$failed" ]
