#!/usr/bin/env bash
# Run `molecule test` for the CI scenarios, for every scenario under molecule/ (--all, except _shared), or for the
# scenarios named as arguments, one after the other; print each scenario's time; stop at the first failure.
#   tools/molecule-all.sh                # the CI set (CI_SCENARIOS below; `make molecule`)
#   tools/molecule-all.sh --all          # every scenario
#   tools/molecule-all.sh default nccl   # some
# The CI set keeps what only molecule proves: role-level idempotence over the podman connection of the read-only gate
# (nic_firmware_gate), of one full SGLang deployment (sglang_kimi) and of the host stack from a bare host, reboot included
# (host_stack, one container, 70 s). Left to --all: `default` (the template of new
# scenarios; the shared create/prepare/destroy run in every scenario anyway) and `sglang_pd` (the PD deployment,
# idempotence and restart-nothing are proven over SSH by tests/integration/test_sglang_deploy.py[glm52_pd]).
# Needs the sandbox image (sandbox/fleet.sh image) and the collections (sandbox/collections.sh); `make molecule`
# does both.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
export CONTAINERS_CONF=${CONTAINERS_CONF:-$ROOT/sandbox/containers.conf}
export ANSIBLE_COLLECTIONS_PATH=$ROOT/.cache/collections
export PATH=$ROOT/.venv/bin:$PATH
export ANSIBLE_FORCE_COLOR=${ANSIBLE_FORCE_COLOR:-0}

CI_SCENARIOS=(nic_firmware_gate sglang_kimi host_stack)
if [ $# -gt 0 ] && [ "$1" != --all ]; then
  scenarios=("$@")
elif [ $# -eq 0 ]; then
  scenarios=("${CI_SCENARIOS[@]}")
else
  scenarios=()
  for d in molecule/*/; do
    s=$(basename "$d")
    [ "$s" = _shared ] || [ ! -f "$d/molecule.yml" ] || scenarios+=("$s")
  done
fi
[ ${#scenarios[@]} -gt 0 ] || { echo "molecule-all: no scenarios under molecule/" >&2; exit 1; }

results=()
total=$SECONDS
for s in "${scenarios[@]}"; do
  [ -f "molecule/$s/molecule.yml" ] || { echo "molecule-all: no scenario molecule/$s" >&2; exit 1; }
  echo "=== molecule test -s $s"
  t=$SECONDS
  if ! molecule test -s "$s"; then
    echo "molecule-all: FAILED scenario $s after $((SECONDS - t)) s" >&2
    printf '  %s\n' "${results[@]+"${results[@]}"}" >&2
    exit 1
  fi
  results+=("$s: passed in $((SECONDS - t)) s")
done
echo "=== molecule summary (${#scenarios[@]} scenario(s), $((SECONDS - total)) s)"
printf '  %s\n' "${results[@]}"
