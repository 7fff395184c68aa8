#!/usr/bin/env bash
# The on-call triage's GPU-side parts on the lent GPU machine (lead runs it through the device tool):
#   run(kind="nvidia-h200", carry=[".whl"], timeout_s=300, command="OUT=$OUT bash tools/device/triage_run.sh")
# 1. raw inputs the collector reads, kept as evidence: nvidia-smi -q -x, lspci -vvv of every NVIDIA function,
#    the GPUs' PCIe link sysfs, the kernel log (journalctl -k, else dmesg), lsmod, /sys/class/infiniband;
# 2. playbooks/triage.yml against localhost (-c local, read-only): report.md / report.json / the textfile;
# 3. the same collector's result with a changed-files check (nothing under /etc, /opt, /var/lib changes).
# No RDMA NIC on the lent VMs: the NIC rows say "no RDMA device"; the GPU rows (PCIe link vs capability, AER,
# replay counter, Xid scan, clock-event counters, persistence, recovery action, fabric) are the real part.
# Needs the ansible-core wheels carried in .whl/ (tools/device/wheels.sh, tools/device/README.md). Exit code: the playbook's.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$ROOT/.device-out}
SITE=/tmp/site
ART=/tmp/triage-artifacts
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
cd "$ROOT" || exit 2
ls .whl/*.whl >/dev/null 2>&1 || { echo "no wheels in .whl/: make them on the controller with tools/device/wheels.sh and carry them (tools/device/README.md)"; exit 2; }
python3 -m pip install -q --no-index --no-deps --target "$SITE" .whl/*.whl || exit 2
export PYTHONPATH=$SITE PATH=$SITE/bin:$PATH ANSIBLE_CONFIG=$ROOT/ansible.cfg ANSIBLE_FORCE_COLOR=0
PY=$(command -v python3)
R=$OUT/raw; mkdir -p "$R"
{ echo "python3: $PY"; uname -a; nvidia-smi -L; } > "$R/env.txt" 2>&1
nvidia-smi -q -x > "$R/nvidia-smi-q.xml" 2>&1
for f in $(lspci -D -d 10de: 2>/dev/null | awk '{print $1}'); do
  echo "== $f"; lspci -vvv -s "$f" 2>&1
  for a in current_link_speed current_link_width max_link_speed max_link_width aer_dev_correctable aer_dev_nonfatal aer_dev_fatal; do
    [ -r "/sys/bus/pci/devices/$f/$a" ] && printf '%s: %s\n' "$a" "$(tr '\n' ' ' < "/sys/bus/pci/devices/$f/$a")"
  done
done > "$R/gpu-pcie.txt" 2>&1
{ journalctl -k --no-pager -o short-iso --since "-2h" 2>&1 || dmesg 2>&1; } | tail -2000 > "$R/kernel-log.txt"
{ lsmod 2>&1 | grep -E "nvidia|mlx|ib_" ; ls -la /sys/class/infiniband 2>&1; cat /proc/cmdline; } > "$R/modules.txt"
tar -C "$OUT" -czf "$OUT/raw.tgz" raw && rm -rf "$R"

find /etc /opt /var/lib -xdev -type f -newer "$OUT/raw.tgz" 2>/dev/null | sort > /tmp/before-changed.txt
touch /tmp/triage-mark; sleep 1
rm -rf "$ART"
t0=$(date +%s)
ansible-playbook -i localhost, -c local playbooks/triage.yml -e triage_hosts=localhost -e ansible_python_interpreter="$PY" \
  -e triage_report_dir="$ART" -e triage_report_name=h200 -e triage_since=2h 2>&1 | tee "$OUT/playbook.log"
rc=${PIPESTATUS[0]}
echo "triage playbook rc=$rc in $(( $(date +%s) - t0 )) s" | tee "$OUT/summary.txt"
find /etc /opt /var/lib -xdev -type f -newer /tmp/triage-mark 2>/dev/null | sort > "$OUT/changed-files.txt"
echo "files changed under /etc /opt /var/lib during the triage: $(wc -l < "$OUT/changed-files.txt")" | tee -a "$OUT/summary.txt"
cp "$ART/h200.md" "$OUT/report.md" 2>/dev/null || echo "missing report.md" | tee -a "$OUT/summary.txt"
cp "$ART/h200.json" "$OUT/report.json" 2>/dev/null || echo "missing report.json" | tee -a "$OUT/summary.txt"
cp "$ART"/h200/*.prom "$OUT/" 2>/dev/null || true
exit "$rc"
