#!/usr/bin/env bash
# The wheels the lent GPU machine needs to run Ansible, into the checkout's ignored .whl/ (carry it: carry=[".whl"]).
# Run on the controller (it needs the package index; the GPU machine has no network), from anywhere in the checkout:
#   bash tools/device/wheels.sh
# That machine has CPython 3.12 (its PyTorch venv, which already holds jinja2, PyYAML, packaging, MarkupSafe, torch
# and matplotlib) on manylinux x86_64, and no ansible-core: this fetches ansible-core (the version requirements.txt
# pins), resolvelib<2, cryptography, cffi and pycparser built for it, and Mitogen (ansible.cfg's strategy; pure Python)
# at the version requirements.txt pins (about 7 MB). Any pip can download for another
# platform: the checkout's .venv when `make venv` made it, else a bare venv made here for pip alone (.cache/device-pip,
# seconds; no `make venv` needed).
set -euo pipefail
cd "$(dirname "$0")/../.."
CORE=$(grep -E '^ansible-core==' requirements.txt) || { echo "wheels.sh: requirements.txt pins no ansible-core==VERSION" >&2; exit 1; }
MITOGEN=$(grep -E '^mitogen==' requirements.txt) || { echo "wheels.sh: requirements.txt pins no mitogen==VERSION" >&2; exit 1; }
PIP=.venv/bin/pip
if [ ! -x "$PIP" ]; then
  PIP=.cache/device-pip/bin/pip
  [ -x "$PIP" ] || python3 -m venv .cache/device-pip
fi
mkdir -p .whl
"$PIP" download -q -d .whl --only-binary=:all: --no-deps --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_34_x86_64 "$CORE" 'resolvelib<2' cryptography cffi pycparser "$MITOGEN"
ls -l .whl
echo "wheels.sh: .whl/ ready ($CORE and its dependencies, $MITOGEN, for CPython 3.12 manylinux x86_64): carry=[\".whl\"]"
