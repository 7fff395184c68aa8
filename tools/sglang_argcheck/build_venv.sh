#!/usr/bin/env bash
# Build (or reuse) a CPU-only venv holding the REAL sglang of one version, enough to run its
# command-line parser (ServerArgs.add_cli_args) on a machine without a GPU.
#
#   tools/sglang_argcheck/build_venv.sh 0.5.17        -> .cache/sglang-argcheck/0.5.17/venv
#
# What goes in (see ../shared/reference/sglang-facts.md "Checking a rendered command line without a GPU"):
#   torch==2.13.0 (CPU wheel; these machines hold a local one), sglang==<ver> --no-deps, ~20 light runtime deps,
#   xgrammar / apache-tvm-ffi --no-deps, and import-time stand-ins for triton and torchvision (standins/, put on
#   sys.path by check_argv.py / dump_options.py only: they are never installed into the venv).
# Idempotent: a venv with a matching .done marker is reused. Prints the venv path on the last line.
set -euo pipefail
VER=${1:?usage: build_venv.sh SGLANG_VERSION}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BASE=${SGLANG_ARGCHECK_CACHE:-$ROOT/.cache/sglang-argcheck}
DIR=$BASE/$VER
VENV=$DIR/venv
PY=${SGLANG_ARGCHECK_PYTHON:-python3.11}
TORCH_PIN=${SGLANG_ARGCHECK_TORCH:-torch==2.13.0}

# The light runtime deps that `sglang.srt.server_args` and the modules it imports need at import time.
DEPS=(
  numpy orjson psutil pybase64 requests packaging pillow tqdm pydantic aiohttp msgspec pyzmq
  "transformers==5.12.1" fastapi uvicorn IPython dill "openai==2.6.1" partial_json_parser sentencepiece
)
NODEPS=("sglang==$VER" "xgrammar==0.2.1" "apache-tvm-ffi==0.1.11")

stamp="$VER|$TORCH_PIN|${DEPS[*]}|${NODEPS[*]}"
# One builder per version at a time: make test's venv prebuild and the fleet lane's acceptance client both ask for
# 0.5.17 at its start, and two builders rm -rf each other's half-built venv (CI: pip's "Failed to restore ...", then
# OSError in one and an AssertionError in the other, so both acceptance tests failed). The second waits, then reuses.
mkdir -p "$DIR"
exec 9> "$DIR.lock"
flock 9
if [[ -f $DIR/.done ]] && [[ "$(cat "$DIR/.done")" == "$stamp" ]] && [[ -x $VENV/bin/python ]]; then
  echo "reusing $VENV" >&2
  echo "$VENV"
  exit 0
fi

mkdir -p "$DIR"
rm -rf "$VENV" "$DIR/.done"
t0=$(date +%s)
"$PY" -m venv "$VENV"
# --no-compile: no .pyc at install (Python writes them on first import); pip asserts that each .pyc it compiled
# exists afterwards, which failed twice in CI's background prebuild (AssertionError in _install_wheel, torch)
PIP=("$VENV/bin/pip" install -q --disable-pip-version-check --no-compile)
# CPU torch first: the CPU wheel has no nvidia-* dependencies.
"${PIP[@]}" "$TORCH_PIN"
"${PIP[@]}" "${DEPS[@]}"
"${PIP[@]}" --no-deps "${NODEPS[@]}"
"$VENV/bin/python" - <<'PY'
import importlib.metadata as m
print("sglang", m.version("sglang"), "torch", m.version("torch"))
PY
echo "$stamp" > "$DIR/.done"
echo "built $VENV in $(( $(date +%s) - t0 )) s ($(du -sh "$VENV" | cut -f1))" >&2
echo "$VENV"
