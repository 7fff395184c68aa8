#!/usr/bin/env bash
# Issue 36's figure "a second host in parallel costs <= 1.2x one" on the sandbox (a benchmark, not a test):
#
#   flock /tmp/b300-integration.lock tools/bench/host_stack_parallel.sh [OUTDIR [-- EXTRA ansible-playbook ARGS]]
#
# `sandbox/fleet.sh up 5`: hosts b300c, b300d and b300e serve nothing and have none of the stack (bare, like b300b
# before tests/integration/test_host_stack_fleet.py). Then the host-stack stage (playbooks/host_stack.yml with
# host_stack_enabled=true and host_stack_reboot=reboot: install, hold, the reboot through the sandbox's
# host_stack_reboot_command, the fabric wait and the proof) on b300c alone, then on b300d and b300e in ONE run.
# EXTRA goes to both runs. Prints and writes OUTDIR/times.txt: the wall time of each run, their ratio, the 1-minute
# load average before and after each, the CPU count; OUTDIR/one.log and OUTDIR/two.log hold the runs' output. Both
# runs must pass. By default the reboots go one host at a time (host_stack_reboot_throttle 1), so the ratio includes a
# second reboot; -- -e host_stack_reboot_throttle=0 reboots both at once.
# Afterwards the fleet is shrunk back to b300a and b300b (`fleet.sh down --keep 2`); they are not touched.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
OUT=${1:-$(mktemp -d /tmp/host-stack-parallel.XXXXXX)}
[ $# -eq 0 ] || shift
[ "${1:-}" != "--" ] || shift
EXTRA=("$@")
mkdir -p "$OUT"
export PATH="$ROOT/.venv/bin:$PATH" ANSIBLE_CONFIG="$ROOT/ansible.cfg" CONTAINERS_CONF="$ROOT/sandbox/containers.conf"
export ANSIBLE_FORCE_COLOR=0 NO_COLOR=1
trap 'sandbox/fleet.sh down --keep 2 >/dev/null 2>&1 || true' EXIT
sandbox/fleet.sh up 5 >/dev/null
INV=$(sandbox/fleet.sh inventory)
for h in b300c b300d b300e; do      # bare: none of the stand-in packages (each carries /usr/share/doc/<name>/STAND-IN)
  if sandbox/fleet.sh ssh "$h" 'ls /usr/share/doc/*/STAND-IN' >/dev/null 2>&1; then
    echo "host_stack_parallel: $h is not bare (a stand-in package is installed): run fleet.sh down --keep 2 first" >&2
    exit 1
  fi
done
load() { cut -d' ' -f1 /proc/loadavg; }
stage() {  # name, limit
  local l0 t0 t1 rc=0
  l0=$(load); t0=$(date +%s.%N)
  ansible-playbook -i "$INV" playbooks/host_stack.yml -l "$2" -e host_stack_enabled=true \
    -e host_stack_reboot=reboot "${EXTRA[@]}" >"$OUT/$1.log" 2>&1 || rc=$?
  t1=$(date +%s.%N)
  if [ "$rc" -ne 0 ]; then tail -40 "$OUT/$1.log" >&2; echo "host_stack_parallel: the $1 run failed (rc $rc)" >&2; exit 1; fi
  grep -E '^b300[cde] +: ok=' "$OUT/$1.log" >&2
  printf '%.1f %s %s\n' "$(echo "$t1 - $t0" | bc)" "$l0" "$(load)" >"$OUT/$1.time"
}
stage one b300c
stage two b300d,b300e
read -r ONE L1 L1b <"$OUT/one.time"
read -r TWO L2 L2b <"$OUT/two.time"
{
  echo "cpus $(nproc); strategy ${ANSIBLE_STRATEGY:-the ansible.cfg default}; extra: ${EXTRA[*]:-none}"
  echo "one host (b300c): ${ONE} s (load ${L1} -> ${L1b})"
  echo "two hosts (b300d, b300e) in one run: ${TWO} s (load ${L2} -> ${L2b})"
  echo "ratio two/one: $(echo "scale=2; $TWO / $ONE" | bc)"
} | tee "$OUT/times.txt"
