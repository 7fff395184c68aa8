#!/usr/bin/env bash
# Real-GPU check of the nccl_validation role. Run by the lead on the lent H200 machine (1 or 2 GPUs), from the
# repository root (see tools/device/README-nccl.md for the exact device call):
#   (a) installs the carried ansible-core wheels from .whl/ into /tmp/site,
#   (b) prepares NCCL_HOME (include/ + lib/libnccl.so.2) from the nvidia-nccl-cu13 wheel of the machine's python3,
#   (c) runs the ROLE (tools/device/nccl_local.yml, connection local): builds nccl-tests 2.19.6 from
#       .src/nccl-tests-2.19.6.tar.gz, runs all_reduce_perf -g <all GPUs> K=3 times, classifies, saves verdicts,
#   (d) runs the same all_reduce_perf BY HAND right after, identical arguments and environment,
#   (e) writes to $OUT: summary.json (both figures + ratio), role-verdict.json, byhand.txt, byhand.json,
#       ansible.log and everything else in all.tar.gz (at most 8 files come back from $OUT).
# Budget: ~10 s wheels, ~40-60 s build, ~20 s of runs, well under the 10-minute command limit.
# Environment overrides (only for a dry run off the GPU machine; the device call sets none of them):
#   NCCL_RUN_SKIP_WHEELS=1 (use the ansible already on PATH), NCCL_HOME_SRC=<dir with include/ and lib/libnccl.so.2>,
#   NCCL_INSTALL_ROOT (default /opt/nccl-tests), CUDA_HOME (default /usr/local/cuda), NCCL_TESTS_ARCHIVE.
set -uo pipefail
set -x
cd "$(dirname "$0")/../.." || exit 2
REPO=$PWD
: "${OUT:?set OUT (the device tool sets it)}"
mkdir -p "$OUT"
WORK=/tmp/nccl-device
INSTALL_ROOT=${NCCL_INSTALL_ROOT:-/opt/nccl-tests}
CUDA=${CUDA_HOME:-/usr/local/cuda}
rm -rf "$WORK"
mkdir -p "$WORK"
T0=$(date +%s)
die() { echo "nccl_run.sh: ERROR: $*" >&2; echo "{\"error\": \"$*\"}" > "$OUT/summary.json"; exit 1; }

ARCHIVE=${NCCL_TESTS_ARCHIVE:-$REPO/.src/nccl-tests-2.19.6.tar.gz}
[ -f "$ARCHIVE" ] || die "nccl-tests source archive $ARCHIVE missing: make it with tools/device/nccl_tests_archive.sh and carry .src (tools/device/README.md)"
[ -n "${NCCL_RUN_SKIP_WHEELS:-}" ] || ls .whl/*.whl >/dev/null 2>&1 || die "no wheels in .whl/: make them with tools/device/wheels.sh and carry .whl"
command -v nvidia-smi >/dev/null || die "nvidia-smi not found: not a GPU machine?"
nvidia-smi -L | tee "$WORK/nvidia-smi-L.txt"
NGPU=${NCCL_RUN_GPUS:-$(nvidia-smi -L | grep -c '^GPU ')}   # NCCL_RUN_GPUS=1: the -g 1 run on a multi-GPU machine
[ "$NGPU" -ge 1 ] || die "nvidia-smi lists no GPU"

# (a) ansible-core from the carried wheels -------------------------------------------------------------------------
if [ -z "${NCCL_RUN_SKIP_WHEELS:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || die "pip could not install the carried wheels"
  export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
fi
export ANSIBLE_CONFIG="$REPO/ansible.cfg" ANSIBLE_CACHE_PLUGIN=memory ANSIBLE_NOCOLOR=1 ANSIBLE_FORCE_COLOR=0
ansible-playbook --version | head -1 || die "ansible-playbook does not start"

# (b) NCCL_HOME from the nvidia-nccl-cu13 wheel ----------------------------------------------------------------------
# The wheel ships include/nccl.h and lib/libnccl.so.2 (no libnccl.so link); its place differs between wheel
# generations (nvidia/nccl/{include,lib} or nvidia/cu13/{include,lib}): search every nvidia namespace dir.
python3 - "$WORK/nccl-home" "${NCCL_HOME_SRC:-}" <<'PY' || die "NCCL (libnccl.so.2 + nccl.h) not found in python3's nvidia packages or /usr"
import glob, os, sys
home, override = sys.argv[1], sys.argv[2]
roots = [override] if override else []
try:
    import nvidia  # namespace package of the nvidia-* wheels
    roots += list(nvidia.__path__)
except ImportError:
    pass
roots += ["/usr/lib/x86_64-linux-gnu", "/usr/local/cuda", "/usr"]
lib = hdr = None
for r in roots:
    libs = sorted(glob.glob(os.path.join(r, "**", "libnccl.so.2"), recursive=True))
    if libs:
        lib = libs[0]
        base = os.path.dirname(os.path.dirname(lib))
        hdrs = sorted(glob.glob(os.path.join(base, "**", "nccl.h"), recursive=True)) or \
            sorted(glob.glob(os.path.join(r, "**", "nccl.h"), recursive=True))
        hdr = hdrs[0] if hdrs else None
        if hdr:
            break
if not (lib and hdr):
    sys.exit("libnccl.so.2=%s nccl.h=%s" % (lib, hdr))
os.makedirs(os.path.join(home, "lib"))
os.symlink(os.path.dirname(hdr), os.path.join(home, "include"))
os.symlink(os.path.realpath(lib), os.path.join(home, "lib", "libnccl.so.2"))
print("NCCL_HOME %s: include -> %s, lib/libnccl.so.2 -> %s" % (home, os.path.dirname(hdr), os.path.realpath(lib)))
PY
ls -la "$WORK/nccl-home" "$WORK/nccl-home/lib"

# (c) the role, connection local -----------------------------------------------------------------------------------
T1=$(date +%s)
ansible-playbook -i localhost, -c local tools/device/nccl_local.yml \
  -e nccl_validation_home="$WORK/nccl-home" \
  -e nccl_validation_tests_archive_local="$ARCHIVE" \
  -e nccl_validation_artifacts_dir="$WORK/artifacts" \
  -e nccl_validation_tests_install_root="$INSTALL_ROOT" \
  -e nccl_validation_cuda_home="$CUDA" \
  -e nccl_validation_build_jobs="$(nproc)" -e nccl_validation_gpu_count="$NGPU" 2>&1 | tee "$OUT/ansible.log"
ROLE_RC=${PIPESTATUS[0]}
T2=$(date +%s)
VERDICT=$(find "$WORK/artifacts/localhost" -maxdepth 1 -name "2*.json" 2>/dev/null | sort | sed -n 1p)
[ -n "$VERDICT" ] && cp "$VERDICT" "$OUT/role-verdict.json"

# (d) the same run by hand: same binary, arguments and environment -------------------------------------------------
BIN=$INSTALL_ROOT/2.19.6/build/all_reduce_perf
[ -x "$BIN" ] || die "role left no $BIN (role rc=$ROLE_RC, see ansible.log)"
LDP=$INSTALL_ROOT/nccl-home-2.19.6/lib:$CUDA/lib64
HAND_ARGS=(-g "$NGPU" -b 8 -e 4G -f 2 -n 20 -w 5 -J "$WORK/byhand.json")
env NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH="$LDP" timeout --kill-after=15s 240s "$BIN" "${HAND_ARGS[@]}" \
  > "$WORK/byhand.txt" 2>&1
HAND_RC=$?
T3=$(date +%s)
cp "$WORK/byhand.txt" "$OUT/byhand.txt"
cp "$WORK/byhand.json" "$OUT/byhand.json" 2>/dev/null || true

# (e) summary: both figures and their ratio, parsed with the project's own module_utils ---------------------------
python3 - "$OUT" "$WORK" "$ROLE_RC" "$HAND_RC" "$NGPU" "$LDP" "$((T1 - T0))" "$((T2 - T1))" "$((T3 - T2))" \
  "$BIN" "${HAND_ARGS[@]}" <<'PY'
import json, os, sys
sys.path.insert(0, "collections/ansible_collections/b300/rollout/plugins/module_utils")
import nccl_results as nr
out, work, role_rc, hand_rc, ngpu, ldp, t_setup, t_role, t_hand, binary = sys.argv[1:11]
hand_args = sys.argv[11:]
role = json.load(open(os.path.join(out, "role-verdict.json"))) if os.path.exists(os.path.join(out, "role-verdict.json")) else None
th = (role or {}).get("threshold") or {"metric": "algbw" if int(ngpu) == 1 else "busbw", "min_gbps": None}
txt = open(os.path.join(work, "byhand.txt")).read()
js_path = os.path.join(work, "byhand.json")
hand = nr.analyze_repeat(1, int(hand_rc), int(hand_rc) in nr.TIMEOUT_RCS, txt,
                         open(js_path).read() if os.path.exists(js_path) else None, th)
hand.pop("failures", None)
role_cmd = (role or {}).get("command")
summary = {
    "gpus": int(ngpu), "gpu_names": hand.get("gpu_names"), "nccl_tests_version": hand.get("version"),
    "metric": th.get("metric"), "threshold_gbps": th.get("min_gbps"), "threshold_id": th.get("id"),
    "role": None if role is None else {
        "rc": int(role_rc), "status": role["status"], "rule": role["rule"], "message": role["message"],
        "gated_gbps": role["gated_gbps"], "per_repeat_gated_gbps": role["per_repeat_gated_gbps"],
        "per_repeat_max_size_busbw_gbps": role["per_repeat_max_size_busbw_gbps"],
        "per_repeat_max_size_algbw_gbps": [r.get("max_size_algbw_gbps") for r in role["repeats"]],
        "gate_sizes": role["gate_sizes"], "command": role_cmd, "env": role.get("env"),
    },
    "by_hand": {"rc": int(hand_rc), "status": hand["status"], "gated_gbps": hand["gated_gbps"],
                "max_size_busbw_gbps": hand["max_size_busbw_gbps"], "max_size_algbw_gbps": hand["max_size_algbw_gbps"],
                "gate_values": hand["gate_values"], "avg_busbw_all_sizes": hand["avg_busbw_all_sizes"],
                "command": [binary] + hand_args, "env": {"NCCL_NVLS_ENABLE": "0", "LD_LIBRARY_PATH": ldp}},
    "same_arguments": bool(role_cmd) and role_cmd == [binary] + hand_args[:-2],
    "same_env": bool(role) and role.get("env") == {"NCCL_NVLS_ENABLE": "0", "LD_LIBRARY_PATH": ldp},
    "ratio_role_over_by_hand": (round(role["gated_gbps"] / hand["gated_gbps"], 4)
                                if role and role.get("gated_gbps") and hand.get("gated_gbps") else None),
    "seconds": {"setup": int(t_setup), "role_incl_build": int(t_role), "by_hand": int(t_hand)},
}
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
print(json.dumps(summary, indent=1))
PY
cp -r /tmp/nccl-validation "$WORK/host-results" 2>/dev/null
tar -C "$WORK" -czf "$OUT/all.tar.gz" --exclude=nccl-home . || echo "nccl_run.sh: tar failed (non-fatal)"
ls -la "$OUT"
echo "nccl_run.sh: role rc=$ROLE_RC, by-hand rc=$HAND_RC, total $(( $(date +%s) - T0 )) s"
