#!/usr/bin/env bash
# Install the system packages the sandbox and molecule need (Debian 12). Idempotent: installs only what is missing,
# does nothing (no apt-get update) when everything is present. Needs root (or sudo).
set -euo pipefail
# iptables: netavark programs the (internal) sandbox network through it.
# openssh-client: fleet.sh makes keys and checks SSH logins (ssh, ssh-keygen, ssh-keyscan in tests).
PKGS=(podman debootstrap runc uidmap slirp4netns iptables nftables openssh-client)

missing=()
for p in "${PKGS[@]}"; do
  if [ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)" != "installed" ]; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all present (${PKGS[*]})"
  exit 0
fi

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "install-deps: installing ${missing[*]}"
start=$SECONDS
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq "${missing[@]}"
echo "install-deps: done in $((SECONDS - start)) s"
