#!/bin/bash
# Worker death through the REAL sglang-router 0.3.2 on LOOPBACK (no sandbox): 2 stub workers (regular) or 2P2D stubs
# (pd), the router with the profile's seed|resilient router_flag_sets (health/cb/retry/queue flags), 4 concurrent
# requests for 45 s, kill -9 of one worker (w | p | d) at 15 s, not restarted. Prints sent/ok/failed.
#   ROUTER_PY=/path/venv/bin/python tools/router_kill_loopback.sh regular|pd seed|resilient w|p|d [BASE_PORT]
set -u
MODE=$1 FLAGS=$2 VICTIM=$3 BASE=${4:-31000}
W=$(cd "$(dirname "$0")/.." && pwd); OUT=${OUT_DIR:-/tmp/router-kill-loopback}/$MODE-$FLAGS-$VICTIM; rm -rf $OUT; mkdir -p $OUT
pids=()
start_stub() { # port extra...
  local port=$1; shift
  mkdir -p $OUT/ctl/$port; echo 200 > $OUT/ctl/$port/latency_ms
  SGLANG_STUB_CONTROL_DIR=$OUT/ctl/$port SGLANG_STUB_LOAD_SECONDS=1 SGLANG_STUB_INSTANCE_NAME=$port \
    python3 $W/sandbox/sglang_stub/bin/sglang-0.5.18 serve --model-path /models/m --served-model-name M \
    --host 127.0.0.1 --port $port "$@" > $OUT/stub-$port.log 2>&1 &
  echo $!
}
if [ $MODE = regular ]; then
  P1=$(start_stub $((BASE+1))); P2=$(start_stub $((BASE+2)))
  declare -A VP=([w]=$P2)
  WARGS="--worker-urls http://127.0.0.1:$((BASE+1)) http://127.0.0.1:$((BASE+2)) --policy round_robin"
  PROFILE=kimi_k3
else
  PP1=$(start_stub $((BASE+1)) --disaggregation-mode prefill --disaggregation-bootstrap-port $((BASE+11)))
  PP2=$(start_stub $((BASE+2)) --disaggregation-mode prefill --disaggregation-bootstrap-port $((BASE+12)))
  DP1=$(start_stub $((BASE+3)) --disaggregation-mode decode)
  DP2=$(start_stub $((BASE+4)) --disaggregation-mode decode)
  declare -A VP=([p]=$PP2 [d]=$DP2)
  WARGS="--pd-disaggregation --prefill http://127.0.0.1:$((BASE+1)) $((BASE+11)) --prefill http://127.0.0.1:$((BASE+2)) $((BASE+12)) --decode http://127.0.0.1:$((BASE+3)) --decode http://127.0.0.1:$((BASE+4)) --prefill-policy round_robin --decode-policy round_robin"
  PROFILE=glm52_pd
fi
FLAGARGS=$(python3 - $PROFILE $FLAGS $W <<'PY'
import sys, yaml
p = yaml.safe_load(open(sys.argv[3] + "/roles/sglang/files/profiles/%s.yml" % sys.argv[1]))
# the flag set as the plan resolves it (module_utils/sglang/sglang_plan.py router_flag_set): shared file + the profile's own
sys.path.insert(0, sys.argv[3] + "/collections")
from ansible_collections.b300.rollout.plugins.module_utils.sglang.sglang_plan import router_flag_set
shared = yaml.safe_load(open(sys.argv[3] + "/roles/sglang/files/router_flag_sets.yml"))
args = dict(p["router"]["args"]); args.update(router_flag_set(p, shared, sys.argv[2]))
keep = [k for k in args if k.startswith(("--health", "--cb-", "--retry", "--disable-retries", "--request-timeout", "--queue", "--max-concurrent"))]
out = []
for k in keep:
    v = args[k]
    if v is False or v is None: continue
    out += [k] if v is True else [k, str(v)]
print(" ".join(out))
PY
)
echo "router flags: $FLAGARGS" > $OUT/flags.txt
sleep 3
${ROUTER_PY:?set ROUTER_PY to a python with sglang_router 0.3.2} -m sglang_router.launch_router $WARGS --host 127.0.0.1 --port $((BASE+80)) \
  --prometheus-host 127.0.0.1 --prometheus-port $((BASE+81)) $FLAGARGS > $OUT/router.log 2>&1 &
RP=$!
for i in $(seq 60); do curl -sf http://127.0.0.1:$((BASE+80))/readiness >/dev/null && break; sleep 1; done
$W/.venv/bin/python $W/tools/loadgen.py --url http://127.0.0.1:$((BASE+80)) --requests 5000 --duration 45 \
  --concurrency 4 --timeout 60 --model M --window 5 --out $OUT/req.jsonl --summary $OUT/summary.json > $OUT/loadgen.out 2>&1 &
LP=$!
sleep 15; kill -9 ${VP[$VICTIM]}; echo "killed ${VP[$VICTIM]} at $(date +%s.%N)" > $OUT/kill.txt
wait $LP
kill $RP; for p in ${P1:-} ${P2:-} ${PP1:-} ${PP2:-} ${DP1:-} ${DP2:-}; do kill $p 2>/dev/null; done
python3 -c "import json;s=json.load(open('$OUT/summary.json'));print('$MODE $FLAGS victim=$VICTIM', {k:s.get(k) for k in ('sent','ok','failed','errors','requests','failures') if k in s})"
