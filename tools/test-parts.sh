#!/usr/bin/env bash
# `make test`: run the test parts one after the other (make <part>), stop at the first failure, and print every
# part's time at the end (also written to artifacts/test-times.txt, for CI's closing note).
#   tools/test-parts.sh lint unit parser integration molecule
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
rows=() failed="" t0=$SECONDS
# The real-SGLang CPU venvs (the parser part's, then the acceptance client's) are built in the background while the
# parts before `parser` run: those are single-threaded pytest/lint runs, the venv builds mostly download and unpack
# (about 6 min on a fresh machine), so the second core does them. The builders are idempotent (a .done stamp); the
# parser part waits for them and then builds whatever is still missing itself, so a failed prebuild fails there with
# its own message. Its log: artifacts/prebuild-venvs.log. B300_PREBUILD_VENVS=0 turns this off.
prebuild=""
if [[ " $* " == *" parser "* ]] && [[ ${B300_PREBUILD_VENVS:-1} != 0 ]]; then
  mkdir -p artifacts
  client=""
  [[ " $* " != *" integration "* ]] || client=tools/acceptance/client_venv.sh
  # its own session, so that a run stopped by an earlier part's failure can stop the builders too (kill -- -PID)
  setsid bash -c 'tools/acceptance/contract_venv.sh 0.5.17 && tools/acceptance/contract_venv.sh 0.5.18 && ${1:-true}' \
    prebuild "$client" > artifacts/prebuild-venvs.log 2>&1 < /dev/null &
  prebuild=$!
fi
for part in "$@"; do
  if [[ $part == parser && -n $prebuild ]]; then
    echo "=== waiting for the venv prebuild (artifacts/prebuild-venvs.log)"
    wait "$prebuild" || echo "venv prebuild failed (rc $?): the parser part builds what is missing"
    prebuild=""
  fi
  echo "=== make $part"
  t=$SECONDS
  if make --no-print-directory "$part"; then
    rows+=("$(printf '%-12s %6d s  passed' "$part" $((SECONDS - t)))")
  else
    rows+=("$(printf '%-12s %6d s  FAILED' "$part" $((SECONDS - t)))")
    failed=$part
    break
  fi
done
[[ -z $prebuild ]] || kill -- -"$prebuild" 2>/dev/null   # a part failed before `parser`: stop the builders
for part in "$@"; do
  printf '%s\n' "${rows[@]}" | grep -q "^$part " || rows+=("$(printf '%-12s %6s    not run' "$part" -)")
done
mkdir -p artifacts
{
  echo "=== make test: time per part"
  printf '  %s\n' "${rows[@]}"
  printf '  %-12s %6d s  %s\n' total $((SECONDS - t0)) "${failed:+FAILED in $failed}"
} | tee artifacts/test-times.txt
[ -z "$failed" ]
