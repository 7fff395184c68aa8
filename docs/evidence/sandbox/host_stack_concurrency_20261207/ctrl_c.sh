#!/usr/bin/env bash
set -u
cd "$(dirname "$0")/../../../.."   # the repository root
export PATH=$PWD/.venv/bin:$PATH ANSIBLE_CONFIG=$PWD/ansible.cfg CONTAINERS_CONF=$PWD/sandbox/containers.conf ANSIBLE_FORCE_COLOR=0 NO_COLOR=1
sandbox/fleet.sh down --keep 2 >/dev/null 2>&1; sandbox/fleet.sh up 3 >/dev/null; INV=$(sandbox/fleet.sh inventory)
echo "== run C on bare b300c; SIGINT (Ctrl-C) to its process group when the package install task starts; then run D"
setsid bash -c 'exec ansible-playbook -i "$0" playbooks/host_stack.yml -l b300c -e host_stack_enabled=true -e host_stack_reboot=reboot > /tmp/conc_C.log 2>&1' "$INV" &
C=$!
for i in $(seq 300); do grep -q "TASK \[host_stack : Install | the declared packages" /tmp/conc_C.log 2>/dev/null && break; sleep 0.2; done
sleep 1.5
echo "Ctrl-C after $i polls + 1.5 s"; kill -INT -- -$C; wait $C; echo "C rc=$?"
grep -E "^TASK|^b300c +: ok=|interrupt|User interrupted" /tmp/conc_C.log | tail -4 | cut -c1-200
echo "on the host: dpkg --audit [$(sandbox/fleet.sh ssh b300c 'dpkg --audit' 2>&1 | head -3)]; stand-ins installed: $(sandbox/fleet.sh ssh b300c 'ls /usr/share/doc/*/STAND-IN 2>/dev/null | wc -l'); holds: $(sandbox/fleet.sh ssh b300c 'apt-mark showhold' | wc -l); lock: $(sandbox/fleet.sh ssh b300c 'cat /run/lock/b300-rollout/host.lock 2>/dev/null | head -c 200')"
ansible-playbook -i "$INV" playbooks/host_stack.yml -l b300c -e host_stack_enabled=true -e host_stack_reboot=reboot > /tmp/conc_D.log 2>&1; echo "D rc=$?"
grep -E "^b300c +: ok=|took over|gone|install \(in order\)" /tmp/conc_D.log | cut -c1-300 | head -6
echo "holds after D: $(sandbox/fleet.sh ssh b300c 'apt-mark showhold' | wc -l); dpkg --audit [$(sandbox/fleet.sh ssh b300c 'dpkg --audit' 2>&1 | head -3)]"
sandbox/fleet.sh down --keep 2 >/dev/null 2>&1
