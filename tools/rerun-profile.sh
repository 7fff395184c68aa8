#!/usr/bin/env bash
# Profile a first converge and the no-change re-run of site.yml on the sandbox (issue 24: re-run <= 35% of the first).
#
#   flock /tmp/b300-integration.lock tools/rerun-profile.sh PROFILE OUTDIR [--clean] [-- EXTRA ansible-playbook ARGS]
#
# Runs `sandbox/fleet.sh up 2`; with --clean first removes from both sandbox hosts what a deploy leaves (the SGLang and
# router venvs, the wheelhouse, units, env files, state and cache dirs, the launcher, the journald and module-load
# drop-ins, the fabric wait script, the service user, the nccl-tests build and results; the staged model directories
# go back to root, readable, as fleet.sh provisions them), so the
# first run is a first converge from hosts without /opt/sglang, like hosts that `fleet.sh up` has just created.
# Then `ansible-playbook site.yml -l b300a,b300b -e sglang_profile=PROFILE` twice, each with Ansible's
# ansible.posix.profile_tasks callback (every task, slowest first) and a fact cache of its own (jsonfile, as
# ansible.cfg configures; emptied before the first run). Writes OUTDIR/first.log, OUTDIR/rerun.log (full output),
# OUTDIR/times.txt (wall seconds of both, the ratio), and fails when the re-run changed anything.
# Sandbox only: it refuses any inventory but inventory/sandbox.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PROFILE=${1:?usage: tools/rerun-profile.sh PROFILE OUTDIR [--clean] [-- EXTRA]}
OUT=${2:?usage: tools/rerun-profile.sh PROFILE OUTDIR [--clean] [-- EXTRA]}
shift 2
CLEAN=0
if [ "${1:-}" = "--clean" ]; then CLEAN=1; shift; fi
[ "${1:-}" = "--" ] && shift
EXTRA=("$@")
mkdir -p "$OUT"
export PATH="$ROOT/.venv/bin:$PATH" ANSIBLE_CONFIG="$ROOT/ansible.cfg" CONTAINERS_CONF="$ROOT/sandbox/containers.conf"
export ANSIBLE_FORCE_COLOR=0 NO_COLOR=1
export ANSIBLE_CALLBACKS_ENABLED=ansible.posix.profile_tasks PROFILE_TASKS_TASK_OUTPUT_LIMIT=all
export PROFILE_TASKS_SORT_ORDER=descending
FACTS=$(mktemp -d /tmp/rerun-profile-facts.XXXXXX)
trap 'rm -rf "$FACTS"' EXIT
export ANSIBLE_CACHE_PLUGIN=jsonfile ANSIBLE_CACHE_PLUGIN_CONNECTION=$FACTS

sandbox/fleet.sh up 2 >/dev/null
if [ "$CLEAN" = 1 ]; then
  for h in b300a b300b; do
    podman exec "b300-$h" sh -c '
      units=$(systemctl list-units --all --plain --no-legend "sglang*.service" | awk "{print \$1}")
      [ -z "$units" ] || systemctl stop $units
      rm -f /etc/systemd/system/sglang*.service
      systemctl daemon-reload
      systemctl reset-failed "sglang*" 2>/dev/null || true
      rm -rf /opt/sglang /opt/sglang-router /opt/sglang-wheelhouse /etc/sglang /var/lib/sglang /var/cache/sglang \
             /var/lib/sglang-router /var/cache/sglang-router /usr/local/lib/sglang-launch /opt/nccl-tests \
             /var/lib/nccl-validation /etc/systemd/journald.conf.d/60-sglang.conf /etc/modules-load.d/nvidia-uvm.conf \
             /usr/local/libexec/sglang-wait-fabric
      # the weights stage (roles/model_weights) leaves the model directories root:sglang 0750: give them back to root
      # and readable, as fleet.sh provisions them, before the group goes (an orphaned gid fails the next preflight)
      find /opt/sglang-stub/models -nogroup -exec chgrp root {} + 2>/dev/null || true
      if getent group sglang >/dev/null; then find /opt/sglang-stub/models -group sglang -exec chgrp root {} +; fi
      chmod -R a+rX /opt/sglang-stub/models 2>/dev/null || true
      if id sglang >/dev/null 2>&1; then userdel sglang; fi
      if getent group sglang >/dev/null; then groupdel sglang; fi'
  done
  echo "cleaned b300a, b300b"
fi

# the load of the machine beside each figure (issue 40: the ratio depends on it more than on the code): the 1-minute
# load average from /proc/loadavg before and after each run, and the CPU count
load() { cut -d' ' -f1 /proc/loadavg; }
run() {
  local name=$1 t0 rc=0
  load >"$OUT/$name.load0"
  t0=$(date +%s.%N)
  ansible-playbook -i inventory/sandbox site.yml -l b300a,b300b -e sglang_profile="$PROFILE" "${EXTRA[@]}" \
    >"$OUT/$name.log" 2>&1 || rc=$?
  awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f\n", b - a }' >"$OUT/$name.wall"
  load >"$OUT/$name.load1"
  [ "$rc" = 0 ] || { tail -40 "$OUT/$name.log"; echo "$name run failed (rc $rc): $OUT/$name.log" >&2; exit 1; }
}
run first
run rerun
first=$(cat "$OUT/first.wall") rerun=$(cat "$OUT/rerun.wall")
{
  echo "profile $PROFILE, extra args: ${EXTRA[*]:-none}"
  echo "cpus: $(nproc)"
  echo "first converge: $first s (load $(cat "$OUT/first.load0") before, $(cat "$OUT/first.load1") after)"
  echo "no-change re-run: $rerun s (load $(cat "$OUT/rerun.load0") before, $(cat "$OUT/rerun.load1") after)"
  awk -v a="$first" -v b="$rerun" 'BEGIN { printf "re-run / first: %.0f%%\n", 100 * b / a }'
} | tee "$OUT/times.txt"
rm -f "$OUT"/*.wall "$OUT"/*.load0 "$OUT"/*.load1
if grep -E '^(b300a|b300b) .*changed=[1-9]' "$OUT/rerun.log"; then
  echo "the re-run changed something: $OUT/rerun.log" >&2
  exit 1
fi
