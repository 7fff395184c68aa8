#!/usr/bin/env bash
# The S3-compatible store of tests/integration/test_weights.py: moto's own server (moto[server], a kept S3 double
# from the package index: bucket/object API, ranged GET, SigV4 requests accepted) in its own venv under .cache, so its
# ~40 dependencies stay out of the controller's .venv. Idempotent; prints the venv's python on the last line.
#   tools/weights-s3-venv.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
V=$ROOT/.cache/weights-s3/venv
PIN="moto[server]==5.2.5"
if [[ -x $V/bin/python ]] && [[ "$(cat "$V/.done" 2>/dev/null)" == "$PIN" ]]; then
  echo "$V/bin/python"
  exit 0
fi
rm -rf "$V"
python3 -m venv "$V"
"$V/bin/pip" install -q --disable-pip-version-check "$PIN" 2> >(grep -v "is ignored: it is neither" >&2)
"$V/bin/python" -c "import moto.server, boto3" >&2
echo "$PIN" > "$V/.done"
echo "$V/bin/python"
