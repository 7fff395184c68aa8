#!/usr/bin/env bash
# `make test`: run the test parts one after the other (make <part>), stop at the first failure, and print every
# part's time at the end (also written to artifacts/test-times.txt, for CI's closing note).
#   tools/test-parts.sh lint unit parser integration molecule
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
rows=() failed="" t0=$SECONDS
for part in "$@"; do
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
