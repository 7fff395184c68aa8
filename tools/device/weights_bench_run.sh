#!/usr/bin/env bash
# The weights stage benchmark on the lent GPU machine (issue 40 part 2): tools/bench/weights_bench.py --local, i.e.
# source, stage and limits (W, N, H, L) on this one machine, playbooks/weights.yml with connection local, several
# model_weights_parallel_files values in one run. Run by the lead from the repository root through the device tool:
#   run(carry=[".whl"], timeout_s=600, command="bash tools/device/weights_bench_run.sh")
# .whl/: the ansible-core 2.19.14 wheels every GPU-path script carries (tools/device/README-thermal.md step 1 makes
# them); jinja2, PyYAML, packaging and MarkupSafe come from the machine's python3 (its PyTorch venv); curl is the
# stage's HTTP client. Nothing else is needed: no internet, no containers, no collection but the repo's own.
# Environment (all optional): WB_GIB model size in whole GiB (default 24, less where the disk or the memory is short),
# WB_PARALLEL (default 2,4,8,16), WB_W_GIB (whole GiB per W measurement, default 8), WB_BUDGET_S (default 510: the bench is
# stopped then and keeps what it measured), WB_DIR (default .cache/weights-bench-local: the disk the repo is on),
# WB_SITE (where the wheels go, default /tmp/site).
# $OUT gets: weights-local.json (every figure), console.txt (the table), env.txt (machine, disk, memory), logs.tgz
# (each playbook's log and task results).
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT (the device tool sets it)}"
mkdir -p "$OUT"
T0=$(date +%s)
die() { echo "weights_bench_run.sh: ERROR: $*" | tee -a "$OUT/console.txt" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "running as uid $(id -u), not root: the stage chowns what it writes; run it as root"
command -v curl >/dev/null || die "curl not found on PATH: the stage's HTTP client"
SITE=${WB_SITE:-/tmp/site}
ls .whl/*.whl >/dev/null 2>&1 || die "no wheels in .whl/: carry .whl with ansible-core 2.19.14 and its deps (tools/device/README-thermal.md step 1)"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .whl/*.whl \
  || die "pip could not install the carried wheels from .whl/"
export PYTHONPATH=$SITE PATH=$SITE/bin:$PATH
ansible-playbook --version | head -1 || die "ansible-playbook does not start (PYTHONPATH=$SITE)"

DIR=${WB_DIR:-$PWD/.cache/weights-bench-local}
mkdir -p "$DIR"
FSTYPE=$(stat -f -c %T "$DIR")
[ "$FSTYPE" != tmpfs ] || die "$DIR is on tmpfs: W would measure memory, not a disk; fix: WB_DIR=<a directory on the disk>"
AVAIL_GIB=$(( $(df --output=avail -k "$DIR" | tail -1) / 1048576 ))
MEM_GIB=$(( $(awk '/^MemTotal/ {print $2}' /proc/meminfo) / 1048576 ))
W_GIB=${WB_W_GIB:-8}
GIB=${WB_GIB:-24}
# room for the source and the staged copy on one file system + W's files + 4 GiB; both copies fit the page cache
FIT=$(( (AVAIL_GIB - W_GIB - 4) / 2 ))
[ "$FIT" -lt "$GIB" ] && GIB=$FIT
[ $(( MEM_GIB / 3 )) -lt "$GIB" ] && GIB=$(( MEM_GIB / 3 ))
[ "$GIB" -ge 2 ] || die "$DIR has $AVAIL_GIB GiB free and the machine $MEM_GIB GiB of memory: under 2 GiB of model fit; fix: WB_DIR elsewhere"
{
  echo "# bash tools/device/weights_bench_run.sh (git $(git rev-parse --short HEAD 2>/dev/null || echo unknown)), $(date -u +%FT%TZ)"
  echo "# model ${GIB} GiB, W ${W_GIB} GiB, parallel ${WB_PARALLEL:-2,4,8,16}; $DIR on $FSTYPE, ${AVAIL_GIB} GiB free"
  nproc; uname -r; free -g; df -h "$DIR"; findmnt -T "$DIR" 2>/dev/null; lsblk -d -o NAME,MODEL,SIZE,ROTA 2>/dev/null
  nvidia-smi -L 2>/dev/null; python3 --version; curl --version | head -1
} > "$OUT/env.txt" 2>&1

# 16 GiB and more in the default pattern (2, 2, 1.5, 1.5, 1 GiB) is 10+ shards; a smaller model gets 1 GiB shards, so
# that P files can still run at once (the stage takes the big directory's files P at a time)
SHARDS=(); [ "$GIB" -lt 16 ] && SHARDS=(--shard-gib 1)
timeout -k 15 "${WB_BUDGET_S:-510}" python3 tools/bench/weights_bench.py --local --gib "$GIB" --w-gib "$W_GIB" "${SHARDS[@]}" \
  --parallel-files "${WB_PARALLEL:-2,4,8,16}" --dir "$DIR" --out "$OUT/weights-local.json" 2>&1 | tee -a "$OUT/console.txt"
RC=${PIPESTATUS[0]}
tar -C "$DIR" -czf "$OUT/logs.tgz" logs 2>/dev/null
rm -rf "$DIR"
echo "weights_bench_run.sh: rc=$RC (124: stopped at WB_BUDGET_S, the figures of the finished runs are kept), total $(( $(date +%s) - T0 )) s" \
  | tee -a "$OUT/console.txt"
exit "$RC"
