#!/usr/bin/env bash
# tools/bench_audit.sh — how long the firmware audit takes over 1, 8 and 32 sandbox hosts, next to
#   floor: one trivial custom module per host (tools/bench/audit_floor.yml), the cheapest possible Ansible run
#   naive: the same data with one command/slurp task per fact (tools/bench/audit_naive.yml, 10 host tasks)
#   audit-no-tools: the audit with hw_bin_path pointing nowhere, so the emulated nvidia-smi/mlxfwmanager are not run
#     (sysfs only): separates Ansible's cost from the emulator's CPU, which the test hosts take from the controller's
#     cores; plus the CPU seconds the emulated tools of one host's audit take (measured in b300a)
# Targets (at 32 hosts): audit <= 1.5x floor, and >= 5x faster than naive. Not a timed test: prints figures.
#
#   tools/bench_audit.sh               # sizes 1 8 32, best of REPEAT=3, then back to the 2-host sandbox
#   SIZES="8" REPEAT=1 tools/bench_audit.sh
#
# Hosts beyond b300a/b300b that this script starts are removed again at the end (KEEP_FLEET=1 keeps them);
# b300a/b300b are left running. Results: artifacts/bench/audit-bench.md (and the raw logs next to it).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
export PATH=$ROOT/.venv/bin:$PATH ANSIBLE_CONFIG=$ROOT/ansible.cfg
export CONTAINERS_CONF=${CONTAINERS_CONF:-$ROOT/sandbox/containers.conf}
SIZES=${SIZES:-1 8 32}
REPEAT=${REPEAT:-3}
OUT=$ROOT/artifacts/bench
mkdir -p "$OUT"
REPORT=$OUT/audit-bench.md
STARTED=()

now() { date +%s.%N; }
host_name() { local i=$1; if [ "$i" -le 26 ]; then printf 'b300%b\n' "\\$(printf '%03o' $((96 + i)))"; else echo "b300h$i"; fi; }

cleanup() {
  if [ "${KEEP_FLEET:-0}" != 1 ] && [ ${#STARTED[@]} -gt 0 ]; then
    echo "bench: removing the hosts this run started: ${STARTED[*]}"
    podman rm -f -t 2 "${STARTED[@]}" >/dev/null 2>&1 || true
  fi
  sandbox/fleet.sh up 2 >/dev/null 2>&1 || echo "bench: WARNING: sandbox/fleet.sh up 2 failed" >&2
}
trap cleanup EXIT

# best wall time of REPEAT runs of a playbook (prints seconds); every run must succeed
best_of() {
  local name=$1 inv=$2 limit=$3 pb=$4 best="" t0 t i
  shift 4
  for i in $(seq 1 "$REPEAT"); do
    t0=$(now)
    if ! ansible-playbook -i "$inv" -l "$limit" "$pb" "$@" >"$OUT/$name.log" 2>&1; then
      echo "bench: $name failed, see $OUT/$name.log" >&2; tail -20 "$OUT/$name.log" >&2; exit 1
    fi
    t=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }')
    best=$(awk -v a="$best" -v b="$t" 'BEGIN { if (a == "" || b < a) print b; else print a }')
  done
  echo "$best"
}

declare -A T
for n in $SIZES; do
  before=$(podman ps --format '{{.Names}}' --filter label=b300.sandbox=1)
  sandbox/fleet.sh up "$n" >"$OUT/fleet-up-$n.log" 2>&1
  for i in $(seq 3 "$n"); do
    c=b300-$(host_name "$i")
    grep -qx "$c" <<<"$before" || STARTED+=("$c")
  done
  if [ "$n" -le 2 ]; then inv=inventory/sandbox; else inv=.cache/sandbox/inventory.yml; fi
  limit=$(for i in $(seq 1 "$n"); do host_name "$i"; done | paste -sd, -)
  # warm the SSH control connections once (not timed): every variant then starts warm
  ansible-playbook -i "$inv" -l "$limit" tools/bench/audit_floor.yml >"$OUT/warmup-$n.log" 2>&1 || true
  T[floor,$n]=$(best_of "floor-$n" "$inv" "$limit" tools/bench/audit_floor.yml)
  T[audit,$n]=$(best_of "audit-$n" "$inv" "$limit" playbooks/firmware_audit.yml -e audit_report_dir="$OUT/reports" -e audit_report_name="bench-$n")
  T[notools,$n]=$(best_of "audit-notools-$n" "$inv" "$limit" playbooks/firmware_audit.yml -e audit_report_dir="$OUT/reports" -e audit_report_name="bench-notools-$n" -e hw_bin_path=/nonexistent-bench)
  if [ "$n" -ge 8 ]; then
    T[naive,$n]=$(best_of "naive-$n" "$inv" "$limit" tools/bench/audit_naive.yml)
  else
    T[naive,$n]=-
  fi
  echo "bench: $n hosts: floor ${T[floor,$n]} s, audit ${T[audit,$n]} s, audit-no-tools ${T[notools,$n]} s, naive ${T[naive,$n]} s"
done
# CPU seconds (user+sys) of the emulated tools one audit runs per host: mlxfwmanager --query, nvidia-smi -q -x, nvlink -s
TOOL_CPU=$(podman exec b300-b300a bash -c 'TIMEFORMAT=%U+%S; { time { for c in "mlxfwmanager --query" "nvidia-smi -q -x" "nvidia-smi nvlink -s"; do /opt/hwemu/bin/$c >/dev/null; done; }; } 2>&1' | awk -F+ '{ printf "%.2f", $1 + $2 }')

{
  echo "# Firmware audit benchmark ($(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, forks $(awk -F' *= *' '/^forks/ {print $2}' ansible.cfg), best of $REPEAT)"
  echo
  echo "Sandbox hosts share the controller's CPUs; other work on the machine adds noise."
  echo
  echo "| hosts | floor (1 no-op module) s | audit s | audit, emulated tools not run s | naive (10 tasks) s | audit / floor | audit-no-tools / floor | naive / audit |"
  echo "|---|---|---|---|---|---|---|---|"
  for n in $SIZES; do
    r1=$(awk -v a="${T[audit,$n]}" -v f="${T[floor,$n]}" 'BEGIN { printf "%.2f", a / f }')
    r2=-
    [ "${T[naive,$n]}" = - ] || r2=$(awk -v a="${T[audit,$n]}" -v b="${T[naive,$n]}" 'BEGIN { printf "%.2f", b / a }')
    r3=$(awk -v a="${T[notools,$n]}" -v f="${T[floor,$n]}" 'BEGIN { printf "%.2f", a / f }')
    echo "| $n | ${T[floor,$n]} | ${T[audit,$n]} | ${T[notools,$n]} | ${T[naive,$n]} | $r1 | $r3 | $r2 |"
  done
  echo
  echo "The emulated tools of ONE host's audit (mlxfwmanager --query, nvidia-smi -q -x, nvidia-smi nvlink -s) take $TOOL_CPU CPU s"
  echo "on this machine: the test hosts share the controller's $(nproc) cores, so N hosts add about N x $TOOL_CPU / $(nproc) s"
  echo "that real hosts would spend on their own CPUs."
  echo
  echo "Targets at 32 hosts: audit/floor <= 1.5, naive/audit >= 5."
} >"$REPORT"
cat "$REPORT"
