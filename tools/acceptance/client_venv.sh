#!/usr/bin/env bash
# The sandbox's acceptance client venv (controller side): the REAL sglang 0.5.17 CPU venv of
# tools/sglang_argcheck/build_venv.sh, layered (a .pth file) under a small venv that adds what
# `python -m sglang.bench_serving` imports beyond the parser: triton (real, CPU import only), einops, loguru, gguf,
# compressed-tensors (--no-deps). torchvision and `datasets` are import-time stand-ins from sandbox/client_standins
# (put on PYTHONPATH by the role; the generated-shared-prefix dataset uses neither).
# Production does not use this: the client runs from the installed server venv on the router host.
#   tools/acceptance/client_venv.sh   -> prints the python path on the last line
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BASE_VENV=$("$ROOT/tools/sglang_argcheck/build_venv.sh" 0.5.17 | tail -n 1)
DIR=$ROOT/.cache/acceptance-client
V=$DIR/venv
mkdir -p "$DIR"
exec 9> "$DIR.lock"   # one builder at a time (tools/sglang_argcheck/build_venv.sh says why)
flock 9
if [[ ! -f $DIR/.done ]]; then
  mkdir -p "$DIR"
  rm -rf "$V"
  python3.11 -m venv "$V"
  echo "$BASE_VENV/lib/python3.11/site-packages" > "$V/lib/python3.11/site-packages/zz_sglang_argcheck.pth"
  "$V/bin/pip" install -q --disable-pip-version-check triton==3.9.0 einops==0.8.2 loguru==0.7.3
  "$V/bin/pip" install -q --disable-pip-version-check --no-deps gguf==0.19.0 compressed-tensors==0.20.1
  (cd /tmp && PYTHONPATH="$ROOT/sandbox/client_standins" HF_HUB_OFFLINE=1 "$V/bin/python" -m sglang.bench_serving --help \
    | grep -q -- --gsp-system-prompt-len)
  date -u > "$DIR/.done"
fi
echo "$V/bin/python"
