#!/usr/bin/env bash
# sandbox/fleet.sh — a fleet of emulated B300 hosts: systemd-in-Podman containers reachable over SSH.
#
#   sandbox/fleet.sh image            build localhost/b300-sandbox:latest (cached by recipe hash)
#   sandbox/fleet.sh up [N]           start hosts 1..N (default 2, max 32); idempotent, fast when already running
#   sandbox/fleet.sh down             remove every sandbox container and the network (the image and keys stay)
#   sandbox/fleet.sh down --keep N    remove only hosts N+1.. (shrink a big fleet back)
#   sandbox/fleet.sh status           containers, addresses, state, emulated-hardware scenario
#   sandbox/fleet.sh scenario HOST NAME   switch HOST's emulated hardware (/opt/hwemu/bin/hwemu-scenario NAME)
#   sandbox/fleet.sh ssh HOST [CMD]   SSH into a host with the sandbox key
#   sandbox/fleet.sh inventory        print the inventory path that covers the running fleet
#   sandbox/fleet.sh provision CONTAINER [SCENARIO]   emulated hardware into any container (molecule's prepare)
#   sandbox/fleet.sh reboot [HOST...]   power-cycle hosts (default: all running): restart the containers, wait for
#                                     sshd; nothing is provisioned and no Ansible runs (boot realism: sandbox/hwemu)
#
# Layout (docs/CONTRACTS.md "Sandbox"): containers b300-<host>, hostnames b300a, b300b, ... b300z, then b300h27...;
# network b300-sandbox 10.89.30.0/24 (internal: no route out), host i at 10.89.30.(10+i); root SSH with the
# per-sandbox key .cache/sandbox/id_ed25519. Each host has its own machine-id and SSH host key (kept in
# .cache/sandbox/hosts/<host>/ so they survive down/up, like real hosts).
#
# Emulated hardware, after sshd answers: sandbox/hwemu/ -> /opt/hwemu, sandbox/sglang_stub/ -> /opt/sglang-stub
# (when those directories exist; re-copied only when their content changed), then
# `/opt/hwemu/bin/hwemu-scenario <scenario>` (when it exists) with the scenario from, in order:
# env SCENARIO_<host> (e.g. SCENARIO_b300b=cx8_fw_mismatch), the inventory var `sandbox_scenario`, `healthy`.
# On a running host `up` keeps the scenario it has (tests switch them); only SCENARIO_<host> changes it.
#
# Environment: CONTAINERS_CONF (default sandbox/containers.conf), SANDBOX_IMAGE, SANDBOX_MAX_HOSTS (32).
set -euo pipefail
# Callers hold /tmp/b300-sandbox-use.lock (or /tmp/b300-integration.lock, the developers' lock) with flock(1). A daemon that podman starts from here (aardvark-dns for the
# network, conmon) would inherit the lock's file descriptor and keep the sandbox locked for everyone long after the
# caller finished: close it here (the flock process itself keeps the lock while this script runs).
for _fd in /proc/$$/fd/*; do
  case "$(readlink "$_fd" 2>/dev/null)" in */b300-sandbox-use.lock|*/b300-integration.lock) eval "exec ${_fd##*/}>&-" ;; esac
done

ROOT=$(cd "$(dirname "$0")/.." && pwd)
export CONTAINERS_CONF=${CONTAINERS_CONF:-$ROOT/sandbox/containers.conf}
IMAGE=${SANDBOX_IMAGE:-localhost/b300-sandbox:latest}
NET=b300-sandbox
SUBNET=10.89.30.0/24
GATEWAY=10.89.30.1
NET_PREFIX=10.89.30
MAX_HOSTS=${SANDBOX_MAX_HOSTS:-32}
LABEL=b300.sandbox=1
STATE=$ROOT/.cache/sandbox
KEY=$STATE/id_ed25519
GEN_INV=$STATE/inventory.yml
STATIC_INV=$ROOT/inventory/sandbox
INOTIFY_MIN=512
SSH_OPTS=(-i "$KEY" -o BatchMode=yes -o IdentitiesOnly=yes -o StrictHostKeyChecking=no
          -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o ConnectTimeout=5)

log() { printf 'fleet: %s\n' "$*"; }
die() { printf 'fleet: ERROR: %s\n' "$*" >&2; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# host name and address of fleet member i (1-based)
host_name() {
  local i=$1
  if [ "$i" -le 26 ]; then printf 'b300%b\n' "\\$(printf '%03o' $((96 + i)))"; else echo "b300h$i"; fi
}
host_ip() { echo "$NET_PREFIX.$((10 + $1))"; }
# a fixed MAC per host (locally administered, 02:...), like a real NIC's across a power cycle: with podman's random MAC
# per start, the other host's neighbour entry still pointed at the old one after a 'reboot' and its connects went
# nowhere for up to ~40 s (CI: the deploy right after test_host_stack_fleet rebooted b300b, "no connection within 8 s")
host_mac() { printf '02:b3:00:00:%02x:%02x\n' $(($1 / 256)) $(($1 % 256)); }
# index of a host name (b300a -> 1, b300h27 -> 27); empty when not a fleet name
host_index() {
  local h=${1#b300-}
  case "$h" in
    b300[a-z]) printf '%d\n' "$(($(printf '%d' "'${h#b300}") - 96))" ;;
    b300h[0-9]*) echo "${h#b300h}" ;;
  esac
}

python_bin() {
  if [ -x "$ROOT/.venv/bin/python" ]; then echo "$ROOT/.venv/bin/python"; else echo python3; fi
}

# Long-lived helpers that podman spawns (conmon, aardvark-dns) must not inherit the lock's fd 9, or the lock would
# stay held for as long as the containers run.
podman() { command podman "$@" 9>&-; }

# One lock per machine, not per checkout: containers, network and image are the machine's.
LOCK=${TMPDIR:-/tmp}/b300-sandbox.lock
with_lock() {
  mkdir -p "$STATE"
  exec 9>"$LOCK"
  flock -w 600 9 || die "another fleet.sh holds $LOCK"
}

# ---------------------------------------------------------------------------------------------------------- image
cmd_image() {
  with_lock
  local t0; t0=$(now)
  "$ROOT/sandbox/image/build.sh"
  log "image step took $(since "$t0") s"
}

# ------------------------------------------------------------------------------------------------------------- up
ensure_key() {
  [ -f "$KEY" ] || ssh-keygen -q -t ed25519 -N '' -C "b300-sandbox" -f "$KEY"
}

# Per-host identity (machine-id, SSH host key), generated once and kept across down/up.
ensure_identity() {
  local h=$1 d=$STATE/hosts/$1
  mkdir -p "$d/etc/ssh" "$d/root/.ssh"
  [ -s "$d/etc/machine-id" ] || tr -d '-' </proc/sys/kernel/random/uuid >"$d/etc/machine-id"
  [ -f "$d/etc/ssh/ssh_host_ed25519_key" ] ||
    ssh-keygen -q -t ed25519 -N '' -C "root@$h" -f "$d/etc/ssh/ssh_host_ed25519_key"
  cp "$KEY.pub" "$d/root/.ssh/authorized_keys"
  chmod 0444 "$d/etc/machine-id"
  chmod 0600 "$d/etc/ssh/ssh_host_ed25519_key" "$d/root/.ssh/authorized_keys"
}

ensure_network() {
  if podman network exists "$NET"; then
    local subnet
    subnet=$(podman network inspect --format '{{range .Subnets}}{{.Subnet}}{{end}}' "$NET")
    [ "$subnet" = "$SUBNET" ] || die "network $NET exists with subnet $subnet (want $SUBNET): run 'sandbox/fleet.sh down'"
    return
  fi
  # --internal: no NAT and no default route in the hosts, so tests cannot reach anything but the fleet and the
  # controller (which owns $GATEWAY on the bridge and reaches the hosts directly).
  podman network create --internal --subnet "$SUBNET" --gateway "$GATEWAY" --label "$LABEL" "$NET" >/dev/null
  log "network $NET ($SUBNET, internal) created"
}

# systemd needs ~4 inotify instances per container; the default of 128 hangs boots of big fleets.
raise_inotify() {
  local cur; cur=$(sysctl -n fs.inotify.max_user_instances)
  if [ "$cur" -lt "$INOTIFY_MIN" ]; then
    [ -f "$STATE/inotify.orig" ] || echo "$cur" >"$STATE/inotify.orig"
    sysctl -q -w fs.inotify.max_user_instances=$INOTIFY_MIN
    log "fs.inotify.max_user_instances $cur -> $INOTIFY_MIN (restored by 'down')"
  fi
}

restore_inotify() {
  if [ -f "$STATE/inotify.orig" ]; then
    local old; old=$(cat "$STATE/inotify.orig")
    sysctl -q -w fs.inotify.max_user_instances="$old"
    rm -f "$STATE/inotify.orig"
    log "fs.inotify.max_user_instances restored to $old"
  fi
}

# Wait until every address answers with an SSH banner.
wait_ssh() {
  local deadline=$((SECONDS + 60 + 2 * $#)) ip pending=("$@") left
  while [ ${#pending[@]} -gt 0 ]; do
    left=()
    for ip in "${pending[@]}"; do
      timeout 2 bash -c "exec 3<>/dev/tcp/$ip/22 && head -c 4 <&3" 2>/dev/null | grep -q '^SSH-' || left+=("$ip")
    done
    pending=("${left[@]+"${left[@]}"}")
    [ ${#pending[@]} -eq 0 ] && break
    [ $SECONDS -lt $deadline ] || die "sshd not answering on: ${pending[*]}"
    sleep 0.3
  done
}

# Prove key login on every address (in parallel).
login_check() {
  local ip pids=() failed=()
  for ip in "$@"; do ssh "${SSH_OPTS[@]}" "root@$ip" true & pids+=($!); done
  local k=0
  for ip in "$@"; do wait "${pids[$k]}" || failed+=("$ip"); k=$((k + 1)); done
  [ ${#failed[@]} -eq 0 ] || die "SSH key login failed on: ${failed[*]}"
}

# Files of a source directory that travel to the hosts: what git would commit (tracked + untracked, not ignored),
# so build droppings (__pycache__, generated state) never trigger a re-copy. Paths relative to the directory.
tree_files() {
  if git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1; then
    git -C "$1" ls-files -co --exclude-standard -- . | LC_ALL=C sort
  else
    (cd "$1" && find . -path '*/__pycache__' -prune -o \( -type f -o -type l \) -print | sed 's|^\./||' | LC_ALL=C sort)
  fi
}

# content hash of those files (paths + contents)
tree_hash() {
  (cd "$1" && tree_files "$1" | xargs -r -d '\n' sha256sum | sha256sum | cut -c1-16)
}

# Desired scenario of every host given: env SCENARIO_<host>, inventory sandbox_scenario, healthy.
desired_scenarios() {
  local inv=$STATIC_INV
  "$(python_bin)" - "$inv" "$@" <<'PY'
import os, sys, pathlib
try:
    import yaml
except ImportError:  # no PyYAML: inventory defaults cannot be read; env overrides and 'healthy' still apply
    yaml = None
inv, hosts = pathlib.Path(sys.argv[1]), sys.argv[2:]
def load(p):
    if yaml is None or not p.is_file():
        return {}
    return yaml.safe_load(p.read_text()) or {}
default = load(inv / "group_vars" / "all.yml").get("sandbox_scenario") or "healthy"
hostvars = {}
def walk(group):
    for name, hv in ((group or {}).get("hosts") or {}).items():
        if hv and "sandbox_scenario" in hv:
            hostvars[name] = hv["sandbox_scenario"]
    for child in ((group or {}).get("children") or {}).values():
        walk(child)
walk(load(inv / "hosts.yml").get("all"))
for h in hosts:
    hv = load(inv / "host_vars" / f"{h}.yml")
    env = os.environ.get(f"SCENARIO_{h}")
    s = env or hv.get("sandbox_scenario") or hostvars.get(h) or default
    print(h, s, "force" if env else "initial")
PY
}

# Copy hwemu / sglang stub when changed and converge the scenario: one `podman exec` per host when nothing changed.
provision() {
  local h s mode pids=() names=()
  source_hashes
  while read -r h s mode; do
    provision_container "b300-$h" "$s" "$mode" & pids+=($!); names+=("$h")
  done < <(desired_scenarios "$@")
  local k=0 failed=()
  for h in "${names[@]}"; do wait "${pids[$k]}" || failed+=("$h"); k=$((k + 1)); done
  [ ${#failed[@]} -eq 0 ] || die "provisioning failed on: ${failed[*]}"
}

# The host stack's offline mirror (issue 36): sandbox/hoststack_repo/build.py's stand-in .debs (real names and
# versions, nothing inside) built once on the controller per (builder, declared stacks, kernel) into
# $STATE/hoststack-repo/<hash>/{main,newer,proprietary}, copied into each host as /opt/b300-hoststack-repo (main: the
# one declared source, in /etc/apt/sources.list.d/b300-hoststack.list as `deb [trusted=yes] file:... ./`) and
# /opt/b300-hoststack-repo-{newer,proprietary} (the traps' second source and proprietary flavour: not in sources).
# The containers run the controller's kernel, so the per-kernel package names are filled with `uname -r` here.
# REPO_HASH: empty when the builder is absent (the hosts then get no mirror and the stage refuses, naming it).
hoststack_repo() {
  REPO_HASH="" REPO_DIR=""
  [ -f "$ROOT/sandbox/hoststack_repo/build.py" ] || return 0
  command -v dpkg-deb >/dev/null || { log "WARNING: no dpkg-deb on this controller: the hosts get no host stack mirror"; return 0; }
  REPO_HASH=$( { cat "$ROOT/sandbox/hoststack_repo/build.py" "$ROOT/roles/host_stack/vars/stacks.yml"; uname -r; } |
    sha256sum | cut -c1-16)
  REPO_DIR=$STATE/hoststack-repo/$REPO_HASH
  [ -f "$REPO_DIR/.built" ] && return 0
  rm -rf "$REPO_DIR.tmp" && mkdir -p "$REPO_DIR.tmp"
  local v
  for v in main newer proprietary; do
    "$(python_bin)" "$ROOT/sandbox/hoststack_repo/build.py" "$REPO_DIR.tmp/$v" --kernel "$(uname -r)" --variant "$v" \
      >/dev/null || die "sandbox/hoststack_repo/build.py --variant $v failed"
  done
  touch "$REPO_DIR.tmp/.built" && rm -rf "$REPO_DIR" && mv "$REPO_DIR.tmp" "$REPO_DIR"
  log "host stack mirror built ($REPO_HASH): $(ls "$REPO_DIR"/main/*.deb | wc -l) stand-in packages"
}

# copy_repo CONTAINER: the mirror into the host when its copy is another build; apt reads only that list's index
# (no other source is updated: the sandbox hosts may reach no network)
copy_repo() {
  local c=$1 v
  [ -n "$REPO_HASH" ] || return 0
  [ "$(podman exec "$c" cat /opt/b300-hoststack-repo/.b300-tree 2>/dev/null)" != "$REPO_HASH" ] || return 0
  for v in newer proprietary main; do
    local dst=/opt/b300-hoststack-repo
    [ "$v" = main ] || dst=/opt/b300-hoststack-repo-$v
    tar -C "$REPO_DIR/$v" --owner=0 --group=0 -cf - . | untar_into "$c" "$dst" "$REPO_HASH"
  done
  podman exec "$c" sh -c 'echo "deb [trusted=yes] file:/opt/b300-hoststack-repo ./" > /etc/apt/sources.list.d/b300-hoststack.list
    apt-get update -qq -o Dir::Etc::sourcelist=sources.list.d/b300-hoststack.list -o Dir::Etc::sourceparts=- \
      -o APT::Get::List-Cleanup=0' >/dev/null || die "${c#b300-}: apt-get update of the host stack mirror failed"
  log "${c#b300-}: host stack mirror /opt/b300-hoststack-repo ($REPO_HASH)"
}

# HW_HASH / STUB_HASH: content hashes of sandbox/hwemu and sandbox/sglang_stub (empty when absent)
source_hashes() {
  hoststack_repo
  HW_HASH="" STUB_HASH=""
  [ ! -d "$ROOT/sandbox/hwemu" ] || HW_HASH=$(tree_hash "$ROOT/sandbox/hwemu")
  [ ! -d "$ROOT/sandbox/sglang_stub" ] || STUB_HASH=$(cd "$ROOT" && stub_files | xargs -r -d '\n' sha256sum | sha256sum | cut -c1-16)
}

# The stub's files (paths relative to ROOT): sandbox/sglang_stub, plus the one copy of the SGLang option catalogs
# (roles/sglang/files/options/server-options-*.json -> options/) and of the argparse prefix rule (module_utils/
# argparse_abbrev.py -> argparse_abbrev.py), placed next to the stub on the host.
STUB_ABBREV=collections/ansible_collections/b300/rollout/plugins/module_utils/sglang/argparse_abbrev.py
stub_files() {
  tree_files "$ROOT/sandbox/sglang_stub" | sed 's|^|sandbox/sglang_stub/|'
  tree_files "$ROOT/roles/sglang/files/options" | grep '^server-options-.*\.json$' | sed 's|^|roles/sglang/files/options/|'
  echo "$STUB_ABBREV"
}

copy_stub() {
  local c=$1 hash=$2
  (cd "$ROOT" && stub_files) |
    tar -C "$ROOT" --owner=0 --group=0 --verbatim-files-from -T - -cf - \
      --transform 's|^sandbox/sglang_stub/||' --transform 's|^roles/sglang/files/options/|options/|' \
      --transform "s|^$STUB_ABBREV\$|argparse_abbrev.py|" |
    untar_into "$c" /opt/sglang-stub "$hash"
}

# provision_container CONTAINER SCENARIO MODE: also used by molecule/_shared/prepare.yml for molecule's containers.
# MODE initial: SCENARIO only for a host without one (new host, or /opt/hwemu re-copied), so `up` on a running fleet
# never changes a scenario that a test switched; MODE force: SCENARIO whatever the host has now.
provision_container() {
  local c=$1 want_scn=$2 mode=${3:-initial} hw_hash=$HW_HASH stub_hash=$STUB_HASH h=${1#b300-} state have_hw have_stub have_scn has_tool
  # one exec: authorise this checkout's key (a fleet started from another checkout has another key), read state
  state=$(podman exec "$c" sh -c '[ -z "$1" ] || grep -qxF "$1" /root/.ssh/authorized_keys 2>/dev/null || echo "$1" >> /root/.ssh/authorized_keys
    cat /opt/hwemu/.b300-tree 2>/dev/null || echo -; cat /opt/sglang-stub/.b300-tree 2>/dev/null || echo -;
    cat /opt/hwemu/scenario 2>/dev/null || echo -; test -x /opt/hwemu/bin/hwemu-scenario && echo yes || echo no' \
    sh "$(cat "$KEY.pub" 2>/dev/null)")
  { read -r have_hw; read -r have_stub; read -r have_scn; read -r has_tool; } <<<"$state"
  if [ -n "$hw_hash" ] && [ "$have_hw" != "$hw_hash" ]; then
    copy_tree "$c" "$ROOT/sandbox/hwemu" /opt/hwemu "$hw_hash"
    has_tool=$(podman exec "$c" sh -c 'test -x /opt/hwemu/bin/hwemu-scenario && echo yes || echo no')
    have_scn=-   # fresh copy: (re)apply the scenario
    log "$h: /opt/hwemu updated ($hw_hash)"
    # the GPU stack's boot services, emulated (sandbox/hwemu/units): installed and enabled with a fresh hwemu copy
    podman exec "$c" sh -c 'for u in /opt/hwemu/units/*.service; do cp "$u" /etc/systemd/system/; done
      systemctl daemon-reload && systemctl enable --now nvidia-persistenced.service nvidia-fabricmanager.service' \
      >/dev/null 2>&1 || log "$h: WARNING: could not enable the emulated nvidia-persistenced/nvidia-fabricmanager units (no systemd?)"
  fi
  copy_repo "$c"
  if [ -n "$stub_hash" ] && [ "$have_stub" != "$stub_hash" ]; then
    copy_stub "$c" "$stub_hash"
    log "$h: /opt/sglang-stub updated ($stub_hash)"
  fi
  if [ "$has_tool" = yes ] && [ "$have_scn" != "$want_scn" ] && { [ "$mode" = force ] || [ "$have_scn" = - ]; }; then
    podman exec "$c" /opt/hwemu/bin/hwemu-scenario "$want_scn" >/dev/null ||
      die "$h: /opt/hwemu/bin/hwemu-scenario $want_scn failed"
    log "$h: scenario $want_scn"
  fi
}

copy_tree() {
  local c=$1 src=$2 dst=$3 hash=$4
  tree_files "$src" | tar -C "$src" --owner=0 --group=0 --verbatim-files-from -T - -cf - | untar_into "$c" "$dst" "$hash"
}

# untar_into CONTAINER DST HASH: replace DST in the container by the tar on stdin, recording HASH
untar_into() {
  local c=$1 dst=$2 hash=$3
  podman exec -i "$c" sh -c "set -e; rm -rf '$dst.new'; mkdir -p '$dst.new'; tar -C '$dst.new' -xf -;
      echo '$hash' > '$dst.new/.b300-tree'; rm -rf '$dst'; mv '$dst.new' '$dst'"
}

write_inventory() {
  local n=$1
  ln -sfn ../../inventory/sandbox/group_vars "$STATE/group_vars"
  ln -sfn ../../inventory/sandbox/host_vars "$STATE/host_vars"
  "$(python_bin)" - "$STATIC_INV/hosts.yml" "$GEN_INV" "$n" <<PY
import sys, yaml
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
inv = yaml.safe_load(open(src))
hosts = inv["all"]["children"]["gpu_nodes"].setdefault("hosts", {})
for i in range(1, n + 1):
    name = "b300" + chr(96 + i) if i <= 26 else f"b300h{i}"
    hosts.setdefault(name, {})["ansible_host"] = "$NET_PREFIX.%d" % (10 + i)
with open(dst, "w") as f:
    f.write("---\n# GENERATED by sandbox/fleet.sh up %d: inventory/sandbox/hosts.yml + hosts 3..%d. group_vars, host_vars -> inventory/sandbox/\n" % (n, n))
    yaml.safe_dump(inv, f, default_flow_style=False, sort_keys=False)
PY
}

cmd_up() {
  local n=${1:-2}
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le "$MAX_HOSTS" ] || die "up N: N must be 1..$MAX_HOSTS (got '$n')"
  command -v podman >/dev/null || die "podman missing: run sandbox/install-deps.sh"
  with_lock
  local t0 t_img t_start t_ssh; t0=$(now)
  podman image exists "$IMAGE" || "$ROOT/sandbox/image/build.sh"
  t_img=$(since "$t0")
  local image_id; image_id=$(podman image inspect --format '{{.Id}}' "$IMAGE")
  ensure_key
  ensure_network
  raise_inotify

  local i h c st img to_start=() ips=() names=()
  local -A info=()
  while IFS='|' read -r c st img; do info[$c]="$st|$img"; done \
    < <(podman ps -a --filter "label=$LABEL" --format '{{.Names}}|{{.State}}|{{.ImageID}}')
  for ((i = 1; i <= n; i++)); do
    h=$(host_name "$i"); c=b300-$h
    names+=("$h"); ips+=("$(host_ip "$i")")
    if [ -n "${info[$c]:-}" ]; then
      st=${info[$c]%%|*}; img=${info[$c]#*|}
      if [[ "$image_id" != "$img"* ]] && [[ "$img" != "$image_id"* ]]; then
        log "$h: image changed, recreating"
        podman rm -f -t 2 "$c" >/dev/null
      elif [[ "$st" == Up* || "$st" == running ]]; then
        continue
      else
        to_start+=("$c"); continue
      fi
    fi
    create_host "$i"
    to_start+=("$c")
  done
  local extra; extra=$(podman ps -a --filter "label=$LABEL" --format '{{.Names}}' | wc -l)
  # conmon keeps podman's stderr and may write to it later ("failed to connect to syslog"): capture it in a file
  if [ ${#to_start[@]} -gt 0 ] && ! podman start "${to_start[@]}" >/dev/null 2>"$STATE/start.err"; then
    cat "$STATE/start.err" >&2; die "podman start failed"
  fi
  t_start=$(since "$t0")
  wait_ssh "${ips[@]}"
  t_ssh=$(since "$t0")
  provision "${names[@]}"
  login_check "${ips[@]}"
  if [ "$n" -gt 2 ]; then write_inventory "$n"; fi
  log "up $n: ${#to_start[@]} started, $((n - ${#to_start[@]})) already running; image ${t_img} s, start ${t_start} s, ssh-ready ${t_ssh} s, provisioned + login checked $(since "$t0") s"
  [ "$extra" -le "$n" ] || log "note: $((extra - n)) more sandbox host(s) beyond $n are still running ('down --keep $n' removes them)"
  log "inventory: $(inventory_path)"
}

# create (not start) host i with its identity in place before first boot: systemd and sshd never see an empty
# machine-id or a missing host key
create_host() {
  local i=$1 h c
  h=$(host_name "$i"); c=b300-$h
  ensure_identity "$h"
  podman create -q --name "$c" --hostname "$h" --label "$LABEL" --label "b300.host=$h" \
    --network "$NET" --ip "$(host_ip "$i")" --mac-address "$(host_mac "$i")" --network-alias "$h" \
    --systemd=always --stop-timeout 3 \
    "$IMAGE" /sbin/init >/dev/null
  tar -C "$STATE/hosts/$h" --owner=0 --group=0 --numeric-owner -cf - \
    etc/machine-id etc/ssh/ssh_host_ed25519_key etc/ssh/ssh_host_ed25519_key.pub root/.ssh/authorized_keys |
    podman cp - "$c:/"
}

inventory_path() {
  if [ -f "$GEN_INV" ]; then echo "$GEN_INV"; else echo "$STATIC_INV"; fi
}

# ----------------------------------------------------------------------------------------------------------- down
cmd_down() {
  local keep=0
  if [ "${1:-}" = --keep ]; then
    keep=${2:-}; [[ "$keep" =~ ^[0-9]+$ ]] && [ "$keep" -ge 1 ] || die "down --keep N: N >= 1"
  fi
  with_lock
  local t0; t0=$(now)
  local cs
  if [ "$keep" -gt 0 ]; then
    # shrink: remove hosts keep+1.. only; network, inventory of the kept hosts and sysctl stay
    mapfile -t cs < <(podman ps -a --filter "label=$LABEL" --format '{{.Names}}' |
      while read -r c; do [ "$(host_index "$c")" -le "$keep" ] || echo "$c"; done)
    [ ${#cs[@]} -eq 0 ] || podman rm -f -t 2 "${cs[@]}" >/dev/null
    if [ "$keep" -gt 2 ]; then write_inventory "$keep"; else rm -f "$GEN_INV" "$STATE/group_vars" "$STATE/host_vars"; fi
    log "down --keep $keep: removed ${#cs[@]} host(s) in $(since "$t0") s"
    return
  fi
  mapfile -t cs < <(podman ps -a --filter "label=$LABEL" --format '{{.Names}}')
  [ ${#cs[@]} -eq 0 ] || podman rm -f -t 2 "${cs[@]}" >/dev/null
  ! podman network exists "$NET" || podman network rm "$NET" >/dev/null
  rm -f "$GEN_INV" "$STATE/group_vars" "$STATE/host_vars"
  restore_inotify
  log "down: removed ${#cs[@]} host(s) and network $NET in $(since "$t0") s (image kept)"
}

# --------------------------------------------------------------------------------------------------------- status
cmd_status() {
  local recipe
  recipe=$(podman image inspect --format '{{ index .Labels "b300.recipe" }}' "$IMAGE" 2>/dev/null || echo "absent")
  echo "image $IMAGE: recipe ${recipe:-?}"
  if podman network exists "$NET"; then echo "network $NET: $SUBNET"; else echo "network $NET: absent"; fi
  printf '%-10s %-16s %-10s %s\n' HOST ADDRESS STATE SCENARIO
  local c st h scn
  while IFS='|' read -r c st; do
    [ -n "$c" ] || continue
    h=${c#b300-}; scn=-
    case "$st" in Up*) st=running ;; Exited*) st=exited ;; Created*) st=created ;; esac
    [ "$st" != running ] || scn=$(podman exec "$c" cat /opt/hwemu/scenario 2>/dev/null || echo -)
    printf '%-10s %-16s %-10s %s\n' "$h" "$(host_ip "$(host_index "$h")")" "$st" "$scn"
  done < <(podman ps -a --filter "label=$LABEL" --format '{{.Names}}|{{.State}}' | sort -V)
  echo "inventory: $(inventory_path)"
}

# ------------------------------------------------------------------------------------------------------- scenario
cmd_scenario() {
  [ $# -eq 2 ] || die "usage: fleet.sh scenario HOST NAME"
  local h=${1#b300-} name=$2
  podman container exists "b300-$h" || die "no sandbox host $h (container b300-$h)"
  podman exec "b300-$h" test -x /opt/hwemu/bin/hwemu-scenario ||
    die "$h has no /opt/hwemu/bin/hwemu-scenario (sandbox/hwemu not provisioned)"
  podman exec "b300-$h" /opt/hwemu/bin/hwemu-scenario "$name"
  log "$h: scenario $(podman exec "b300-$h" cat /opt/hwemu/scenario)"
}

# provision CONTAINER [SCENARIO]: hwemu + sglang stub + scenario into any running container of the sandbox image
cmd_provision() {
  [ $# -ge 1 ] && [ $# -le 2 ] || die "usage: fleet.sh provision CONTAINER [SCENARIO]"
  podman container exists "$1" || die "no container $1"
  source_hashes
  provision_container "$1" "${2:-healthy}" force
}

cmd_ssh() {
  [ $# -ge 1 ] || die "usage: fleet.sh ssh HOST [CMD...]"
  local i; i=$(host_index "$1"); [ -n "$i" ] || die "not a sandbox host name: $1"
  shift
  exec ssh "${SSH_OPTS[@]}" "root@$(host_ip "$i")" "$@"
}

# reboot [HOST...]: a power cycle. The container restarts (PID 1 anew, /run emptied: nvidia_uvm "unloaded", the
# emulated fabric starts "In Progress"); the disk (/etc, /opt, /var) stays. Units come back as systemd starts them.
cmd_reboot() {
  with_lock
  local t0 h i cs=() ips=(); t0=$(now)
  if [ $# -eq 0 ]; then
    mapfile -t cs < <(podman ps --filter "label=$LABEL" --format '{{.Names}}' | sort -V)
  else
    for h in "$@"; do cs+=("b300-${h#b300-}"); done
  fi
  [ ${#cs[@]} -gt 0 ] || die "reboot: no running sandbox host"
  for h in "${cs[@]}"; do
    podman container exists "$h" || die "no sandbox host ${h#b300-} (container $h)"
    i=$(host_index "$h"); ips+=("$(host_ip "$i")")
  done
  podman restart -t 3 "${cs[@]}" >/dev/null 2>"$STATE/start.err" || { cat "$STATE/start.err" >&2; die "podman restart failed"; }
  wait_ssh "${ips[@]}"
  log "reboot: ${cs[*]#b300-} back (sshd answering) in $(since "$t0") s; no Ansible run"
}

usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; }

sub=${1:-}; shift || true
case "$sub" in
  image) cmd_image "$@" ;;
  up) cmd_up "$@" ;;
  down) cmd_down "$@" ;;
  status) cmd_status "$@" ;;
  scenario) cmd_scenario "$@" ;;
  ssh) cmd_ssh "$@" ;;
  provision) cmd_provision "$@" ;;
  reboot) cmd_reboot "$@" ;;
  inventory) inventory_path ;;
  -h | --help | help) usage ;;
  *) usage >&2; exit 2 ;;
esac
