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

# A manifest the sandbox role can read without pip: name, version, file, sha256.
(
  cd "$WH"
  for f in *.whl; do
    printf '%s  %s\n' "$(sha256sum "$f" | cut -d' ' -f1)" "$f"
  done
) > "$WH/SHA256SUMS"
n=$(ls "$WH"/*.whl | wc -l)
echo "wheelhouse $WH: $n wheels, $(du -sh "$WH" | cut -f1) ($(( $(date +%s) - t0 )) s)"
