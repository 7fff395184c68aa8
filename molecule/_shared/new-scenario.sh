#!/usr/bin/env bash
# Create molecule/<name>/ from the sample scenario molecule/default (molecule.yml, converge.yml, verify.yml).
#   molecule/_shared/new-scenario.sh nccl_validation
# Then edit converge.yml (apply your role) and verify.yml (assert the real state it leaves behind).
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 NAME" >&2; exit 2; }
here=$(cd "$(dirname "$0")/.." && pwd)
name=$1
[[ "$name" =~ ^[a-z0-9_]+$ ]] || { echo "scenario name: lower case letters, digits, _ (got '$name')" >&2; exit 2; }
[ ! -e "$here/$name" ] || { echo "molecule/$name exists" >&2; exit 1; }
mkdir "$here/$name"
cp "$here/default/molecule.yml" "$here/default/converge.yml" "$here/default/verify.yml" "$here/$name/"
sed -i "s|^# Sample scenario: proves the shared molecule base (molecule/_shared) works.*|# Scenario $name (made from molecule/default by molecule/_shared/new-scenario.sh).|" "$here/$name/molecule.yml"
sed -i "s|tools/molecule-all.sh default|tools/molecule-all.sh $name|" "$here/$name/molecule.yml"
echo "molecule/$name created: edit converge.yml and verify.yml, then: tools/molecule-all.sh $name"
