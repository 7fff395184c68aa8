#!/usr/bin/env bash
# ad-hoc: the two-runs-at-once case of two_runs_then_ctrl_c.sh again, after the reboot record (roles/host_lock
# tasks_from rebooting): B with the default host_lock_wait_s (60 s), then B waiting long enough (600 s). Sandbox b300c.
set -u
cd "$(dirname "$0")/../../../.."   # the repository root
export PATH=$PWD/.venv/bin:$PATH ANSIBLE_CONFIG=$PWD/ansible.cfg CONTAINERS_CONF=$PWD/sandbox/containers.conf ANSIBLE_FORCE_COLOR=0 NO_COLOR=1
run() { ansible-playbook -i "$INV" playbooks/host_stack.yml -l b300c -e host_stack_enabled=true -e host_stack_reboot=reboot "$@"; }
for wait in 60 600; do
  sandbox/fleet.sh down --keep 2 >/dev/null 2>&1; sandbox/fleet.sh up 3 >/dev/null; INV=$(sandbox/fleet.sh inventory)
  echo "== run A and run B (host_lock_wait_s=$wait) on bare b300c, B started 3 s after A"
  t0=$(date +%s)
  ( run > /tmp/rr_A_$wait.log 2>&1; echo "A rc=$? at +$(( $(date +%s) - t0 )) s" ) & sleep 3
  ( run -e host_lock_wait_s=$wait > /tmp/rr_B_$wait.log 2>&1; echo "B rc=$? at +$(( $(date +%s) - t0 )) s" ) & wait
  for x in A B; do
    echo "-- $x"
    grep -E "^b300c +: ok=|install \(in order\)|reboot: |REBOOTING|held by another run" /tmp/rr_${x}_$wait.log | sed -E 's/^ +//' | cut -c1-420
    echo "reboots: $(grep -c 'TASK \[host_stack : Reboot | through the controller' /tmp/rr_${x}_$wait.log)," \
      "lock tries while waiting: $(grep -c 'FAILED - RETRYING: \[b300c\]: Host lock' /tmp/rr_${x}_$wait.log)"
  done
  echo "holds: $(sandbox/fleet.sh ssh b300c 'apt-mark showhold' | tr '\n' ' ')"
  echo "reboot record left: $(sandbox/fleet.sh ssh b300c 'ls /var/lib/b300-rollout/host-lock.rebooting.json 2>/dev/null || echo none')"
done
sandbox/fleet.sh down --keep 2 >/dev/null 2>&1
