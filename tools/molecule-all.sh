#!/usr/bin/env bash
# Run `molecule test` for every scenario under molecule/ (except _shared), or for the scenarios named as arguments,
# one after the other; print each scenario's time; stop at the first failure.
#   tools/molecule-all.sh                # all
#   tools/molecule-all.sh default nccl   # some
# Needs the sandbox image (sandbox/fleet.sh image) and the collections (sandbox/collections.sh); `make molecule`
# does both.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
export CONTAINERS_CONF=${CONTAINERS_CONF:-$ROOT/sandbox/containers.conf}
export ANSIBLE_COLLECTIONS_PATH=$ROOT/.cache/collections
export PATH=$ROOT/.venv/bin:$PATH
export ANSIBLE_FORCE_COLOR=${ANSIBLE_FORCE_COLOR:-0}

if [ $# -gt 0 ]; then
  scenarios=("$@")
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
