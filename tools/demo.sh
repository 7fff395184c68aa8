#!/usr/bin/env bash
# make demo: the sandbox is up (make sandbox); deploy PROFILE with the main command, then run it again to show
# that a converged fleet reports changed=0.
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE=${1:-kimi_k3}
tools/build-wheelhouse.sh >/dev/null
run() {
  ANSIBLE_STDOUT_CALLBACK=default ansible-playbook -i inventory/sandbox site.yml -l b300a,b300b \
    -e sglang_profile="$PROFILE" "$@"
}
echo "=== ansible-playbook site.yml -l b300a,b300b -e sglang_profile=$PROFILE  (sandbox)"
t=$SECONDS; run | tee .cache/demo-run1.log; echo "first run: $((SECONDS - t)) s"
echo "=== second run (idempotence: expect changed=0 on every host)"
t=$SECONDS; run | tee .cache/demo-run2.log | sed -n '/PLAY RECAP/,$p'; echo "second run: $((SECONDS - t)) s"
if grep -E '^(b300a|b300b) .*changed=[1-9]' .cache/demo-run2.log; then
  echo "demo: the second run changed something (see .cache/demo-run2.log)" >&2; exit 1
fi
echo "=== demo done: summary above; logs in .cache/demo-run{1,2}.log"
