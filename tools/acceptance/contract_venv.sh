#!/usr/bin/env bash
# The venv of the contract tests against the REAL packages (tests/parser/test_real_contract.py): the CPU venv of
# tools/sglang_argcheck/build_venv.sh for one pinned SGLang (its DEPS list is left alone: changing it rebuilds the
# shared venv for everybody), layered (a .pth file) under a small venv that adds the REAL packages the contract
# points import beyond the parser:
#   prometheus-client  (the metrics collector and the /metrics app; a real server dependency of sglang)
#   triton (CPU import only: torch's flop_counter needs its real types), einops, loguru, gguf, compressed-tensors
#   (--no-deps), xxhash, zstandard, uvloop, setproctitle, jsonschema, soundfile, python-multipart: what
#   srt/entrypoints/http_server.py imports at module level (its route table is built at import time)
#   sglang-router 0.3.2 (router_args.py defaults), from the project's wheelhouse when built, else the index.
# Nothing here is a stand-in; the only stand-in the tests use is sandbox/client_standins/datasets for the import of
# sglang.benchmark.datasets (said in the test).
#   tools/acceptance/contract_venv.sh 0.5.17   -> prints the python path on the last line
set -euo pipefail
VER=${1:?usage: contract_venv.sh SGLANG_VERSION}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BASE_VENV=$("$ROOT/tools/sglang_argcheck/build_venv.sh" "$VER" | tail -n 1)
DIR=$ROOT/.cache/sglang-contract/$VER
V=$DIR/venv
PINS=(prometheus-client==0.26.0 triton==3.9.0 einops==0.8.2 loguru==0.7.3 xxhash==4.1.0 zstandard==0.25.0
      uvloop==0.23.0 setproctitle==1.3.8 jsonschema==4.26.0 soundfile==0.14.0 python-multipart==0.0.34)
NODEPS=(gguf==0.19.0 compressed-tensors==0.20.1)
ROUTER=sglang-router==0.3.2
stamp="$VER|$BASE_VENV|${PINS[*]}|${NODEPS[*]}|$ROUTER"
mkdir -p "$DIR"
exec 9> "$DIR.lock"   # one builder at a time (build_venv.sh says why)
flock 9
if [[ -f $DIR/.done ]] && [[ "$(cat "$DIR/.done")" == "$stamp" ]] && [[ -x $V/bin/python ]]; then
  echo "$V/bin/python"
  exit 0
fi
mkdir -p "$DIR"
rm -rf "$V" "$DIR/.done"
python3.11 -m venv "$V"
echo "$BASE_VENV/lib/python3.11/site-packages" > "$V/lib/python3.11/site-packages/zz_sglang_argcheck.pth"
PIP=("$V/bin/pip" install -q --disable-pip-version-check --no-compile)   # as build_venv.sh
# pip's resolver warns about the layered sglang's own pins (torch 2.11, ...): the parser venv's choice, not ours
"${PIP[@]}" "${PINS[@]}" 2> >(grep -v "dependency conflicts\|requires\|incompatible\|is ignored" >&2)
"${PIP[@]}" --no-deps "${NODEPS[@]}"
wheel=$(ls "$ROOT"/.cache/wheelhouse/sglang_router-0.3.2-*.whl 2>/dev/null | head -n 1 || true)
"${PIP[@]}" --no-deps "${wheel:-$ROUTER}"
PYTHONPATH="$ROOT/tools/sglang_argcheck/standins" "$V/bin/python" -c "import prometheus_client, sglang_router.router_args, importlib.metadata as m; print('sglang', m.version('sglang'))" >&2
echo "$stamp" > "$DIR/.done"
echo "$V/bin/python"
