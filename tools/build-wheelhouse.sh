#!/usr/bin/env bash
# Build .cache/wheelhouse/ with the controller's own pip: the wheels the sandbox installs offline.
#
#   tools/build-wheelhouse.sh [WHEELHOUSE_DIR]          (default: .cache/wheelhouse)
#
# Contents (CPython 3.11, manylinux x86_64, binary wheels only):
#   - sglang-router==0.3.2 WITH its dependencies (the router venv is complete and runs on CPU)
#   - sglang==0.5.17 and sglang==0.5.18, --no-deps (the sandbox's versioned-venv install; the sandbox runs the stub,
#     so the large GPU dependency set is not needed there)
#   - mooncake-transfer-engine-cuda13==$MOONCAKE_VERSION, --no-deps (the PD profile's transfer backend, the CUDA 13
#     build that fits sglang 0.5.17/0.5.18; the plain mooncake-transfer-engine wheel links libcudart.so.12)
# Idempotent: pip download skips files already present; a re-run only checks the index. Prints the size.
#
# Padding (tests of the copy's cost at real size, docs/rerun-profile.md): WHEELHOUSE_PAD_MB=N adds N MiB of random
# bytes as files b300-padding-NNN.bin of WHEELHOUSE_PAD_FILE_MB MiB each (default 512; the real closure's largest
# wheels are of that order), so that the directory weighs what the real sglang + CUDA 13 torch closure does. pip
# ignores them (not wheels); the role copies them like any file. Existing padding files of the right size are kept.
# Pad a directory of its own, never the shared .cache/wheelhouse the other sandbox runs use:
#   WHEELHOUSE_PAD_MB=7000 tools/build-wheelhouse.sh /tmp/wheelhouse-padded
# A REAL GPU host needs the full dependency set (torch, flashinfer, sglang-kernel, cuda-tile ...): see the
# operator notes in the project README ("Offline wheelhouse for a GPU host", incl. the cuda-tile trap).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
WH=${1:-$ROOT/.cache/wheelhouse}
PIP=${PIP:-$ROOT/.venv/bin/pip}
ROUTER_VERSION=${ROUTER_VERSION:-0.3.2}
SGLANG_VERSIONS=${SGLANG_VERSIONS:-"0.5.17 0.5.18"}
MOONCAKE_VERSION=${MOONCAKE_VERSION:-0.3.13.post1}
PYVER=${PYVER:-311}

mkdir -p "$WH"
PLAT=(--platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform linux_x86_64)
COMMON=(download --disable-pip-version-check --progress-bar off -d "$WH" --python-version "$PYVER"
        --implementation cp --abi "cp$PYVER" --abi abi3 --abi none "${PLAT[@]}" --only-binary=:all:)

# pip's "Location ... is ignored" warnings about this machine's local index mirrors are noise.
quiet() { "$@" 2>&1 | grep -v -E "^WARNING: Location '.*' is ignored" | grep -v -E '^(Collecting|  (Using cached|File was already downloaded|Downloading|Saved))' || true; return "${PIPESTATUS[0]}"; }

t0=$(date +%s)
echo "== sglang-router==$ROUTER_VERSION and its dependencies"
quiet "$PIP" "${COMMON[@]}" "sglang-router==$ROUTER_VERSION"
for v in $SGLANG_VERSIONS; do
  echo "== sglang==$v (no deps)"
  quiet "$PIP" "${COMMON[@]}" --no-deps "sglang==$v"
done
MOONCAKE_PACKAGE=${MOONCAKE_PACKAGE:-mooncake-transfer-engine-cuda13}
echo "== $MOONCAKE_PACKAGE==$MOONCAKE_VERSION (no deps)"
quiet "$PIP" "${COMMON[@]}" --no-deps "$MOONCAKE_PACKAGE==$MOONCAKE_VERSION"

PAD_MB=${WHEELHOUSE_PAD_MB:-0}
PAD_FILE_MB=${WHEELHOUSE_PAD_FILE_MB:-512}
if [ "$PAD_MB" -gt 0 ]; then
  echo "== padding: $PAD_MB MiB in files of $PAD_FILE_MB MiB"
  i=0 left=$PAD_MB
  while [ "$left" -gt 0 ]; do
    mb=$(( left < PAD_FILE_MB ? left : PAD_FILE_MB ))
    f=$(printf '%s/b300-padding-%03d.bin' "$WH" "$i")
    if [ "$(stat -c %s "$f" 2>/dev/null || echo 0)" != "$(( mb * 1048576 ))" ]; then
      head -c "$(( mb * 1048576 ))" /dev/urandom >"$f.tmp" && mv "$f.tmp" "$f"
    fi
    i=$((i + 1)) left=$((left - mb))
  done
  # padding of an earlier, larger run
  for f in "$WH"/b300-padding-*.bin; do
    [ -e "$f" ] || continue
    n=${f##*/b300-padding-}; n=${n%.bin}
    [ "$((10#$n))" -lt "$i" ] || rm -f "$f"
  done
fi

# A manifest the sandbox role can read without pip: name, version, file, sha256.
(
  cd "$WH"
  for f in *.whl; do
    printf '%s  %s\n' "$(sha256sum "$f" | cut -d' ' -f1)" "$f"
  done
) > "$WH/SHA256SUMS"
n=$(ls "$WH"/*.whl | wc -l)
echo "wheelhouse $WH: $n wheels, $(du -sh "$WH" | cut -f1) ($(( $(date +%s) - t0 )) s)"
