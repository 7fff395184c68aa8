#!/usr/bin/env bash
# make sanity: `ansible-test sanity` on the b300.rollout collection (every test but pslint: no PowerShell here).
# ansible-test builds one virtualenv per sanity tool with pinned requirements from the package index (first run about
# 3 minutes, later runs about 1 minute, cached in ~/.ansible/test/venv). Its pip bootstrap script comes from
# ansible-test's own download site, which this network cannot reach: when none is cached, tools/ansible-test-get-pip.py
# (ensurepip + pip install) stands in for it.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
pip_version=$("$PY" - <<'PY'
from ansible_test._internal.python_requirements import get_venv_packages
from ansible_test._internal.host_configs import NativePythonConfig
import sys
print(get_venv_packages(NativePythonConfig(version="%d.%d" % sys.version_info[:2], path=sys.executable))["pip"])
PY
) || pip_version=24.2
cache=~/.ansible/test/cache/get_pip_${pip_version//./_}.py
[ -s "$cache" ] || { mkdir -p "$(dirname "$cache")"; cp "$ROOT/tools/ansible-test-get-pip.py" "$cache"; }
cd "$ROOT/collections/ansible_collections/b300/rollout"
start=$(date +%s)
"$(dirname "$PY")/ansible-test" sanity --python 3.11 --local --skip-test pslint --color no "$@"
echo "ansible-test sanity: passed in $(( $(date +%s) - start )) s"
