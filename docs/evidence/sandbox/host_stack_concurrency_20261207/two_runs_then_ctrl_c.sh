#!/usr/bin/env bash
# ad-hoc: two host-stack runs on one bare host at once, then a Ctrl-C mid-install and a re-run (sandbox b300c)
set -u
cd "$(dirname "$0")/../../../.."   # the repository root
export PATH=$PWD/.venv/bin:$PATH ANSIBLE_CONFIG=$PWD/ansible.cfg CONTAINERS_CONF=$PWD/sandbox/containers.conf ANSIBLE_FORCE_COLOR=0 NO_COLOR=1
run() { ansible-playbook -i "$INV" playbooks/host_stack.yml -l b300c -e host_stack_enabled=true -e host_stack_reboot=reboot "$@"; }
sandbox/fleet.sh down --keep 2 >/dev/null 2>&1; sandbox/fleet.sh up 3 >/dev/null; INV=$(sandbox/fleet.sh inventory)
echo "== 1. run A and run B on bare b300c, B started 3 s after A"
( run > /tmp/conc_A.log 2>&1; echo "A rc=$?" ) & sleep 3
( run > /tmp/conc_B.log 2>&1; echo "B rc=$?" ) & wait
for x in A B; do echo "-- $x"; grep -E "^b300c +: ok=|held by another run|install \(in order\)" /tmp/conc_$x.log | cut -c1-400; grep -c "Reboot | through the controller" /tmp/conc_$x.log; done
echo "holds: $(sandbox/fleet.sh ssh b300c 'apt-mark showhold' | tr '\n' ' ')"
sandbox/fleet.sh down --keep 2 >/dev/null 2>&1; sandbox/fleet.sh up 3 >/dev/null; INV=$(sandbox/fleet.sh inventory)
echo "== 2. run C on bare b300c, SIGINT (Ctrl-C) to its process group once apt-get install runs, then run D"
setsid bash -c 'ansible-playbook -i "$0" playbooks/host_stack.yml -l b300c -e host_stack_enabled=true -e host_stack_reboot=reboot > /tmp/conc_C.log 2>&1' "$INV" &
C=$!
for i in $(seq 200); do sandbox/fleet.sh ssh b300c 'pgrep -f "apt-get|dpkg"' >/dev/null 2>&1 && break; sleep 0.3; done
echo "apt/dpkg seen after $i polls; Ctrl-C now"; kill -INT -- -$C; wait $C; echo "C rc=$?"
tail -5 /tmp/conc_C.log | cut -c1-300
echo "dpkg --audit: [$(sandbox/fleet.sh ssh b300c 'dpkg --audit' | head -5)]"
run > /tmp/conc_D.log 2>&1; echo "D rc=$?"
grep -E "^b300c +: ok=|took over|gone run|install \(in order\)" /tmp/conc_D.log | cut -c1-400
echo "holds: $(sandbox/fleet.sh ssh b300c 'apt-mark showhold' | tr '\n' ' ')"
sandbox/fleet.sh down --keep 2 >/dev/null 2>&1
