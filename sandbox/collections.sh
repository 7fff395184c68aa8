#!/usr/bin/env bash
# Install the collections of requirements.yml into .cache/collections/ansible_collections/ WITHOUT Galaxy:
# they are taken from the `ansible` community package on PyPI (pinned below), which bundles them.
# Cached: does nothing when every collection is already there at its pinned version. Fails when the wheel carries
# another version than requirements.yml pins (so the two never drift apart silently).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
ANSIBLE_PKG_VERSION=12.3.0
DEST=$ROOT/.cache/collections/ansible_collections
WHEELS=$ROOT/.cache/wheels
PY=${PYTHON:-$ROOT/.venv/bin/python}
[ -x "$PY" ] || PY=python3

# name version pairs from requirements.yml (no PyYAML needed: the file's layout is fixed)
mapfile -t wanted < <(awk '/- name:/ { n = $3 } /version:/ { gsub(/"/, "", $2); print n, $2 }' "$ROOT/requirements.yml")
[ ${#wanted[@]} -gt 0 ] || { echo "collections: no collections found in requirements.yml" >&2; exit 1; }

installed_version() {  # namespace.name -> version from its MANIFEST.json, or empty
  local m=$DEST/${1%%.*}/${1#*.}/MANIFEST.json
  [ -f "$m" ] && "$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["collection_info"]["version"])' "$m"
}

missing=()
for nv in "${wanted[@]}"; do
  set -- $nv
  [ "$(installed_version "$1" || true)" = "$2" ] || missing+=("$nv")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "collections: up to date in .cache/collections (${wanted[*]})"
  exit 0
fi

start=$SECONDS
whl=$WHEELS/ansible-$ANSIBLE_PKG_VERSION-py3-none-any.whl
if [ ! -f "$whl" ]; then
  mkdir -p "$WHEELS"
  "$PY" -m pip download -q --no-deps --only-binary=:all: "ansible==$ANSIBLE_PKG_VERSION" -d "$WHEELS"
fi
mkdir -p "$DEST"
"$PY" - "$whl" "$DEST" "${missing[@]}" <<'PY'
import json, shutil, sys, zipfile
whl, dest, wanted = sys.argv[1], sys.argv[2], [w.split() for w in sys.argv[3:]]
with zipfile.ZipFile(whl) as z:
    names = z.namelist()
    for fqcn, version in wanted:
        ns, name = fqcn.split(".")
        prefix = f"ansible_collections/{ns}/{name}/"
        manifest = json.loads(z.read(prefix + "MANIFEST.json"))["collection_info"]
        if manifest["version"] != version:
            sys.exit(f"collections: ansible wheel {whl} has {fqcn} {manifest['version']}, requirements.yml pins {version}")
        target = f"{dest}/{ns}/{name}"
        shutil.rmtree(target, ignore_errors=True)
        for n in names:
            if n.startswith(prefix) and not n.endswith("/"):
                z.extract(n, dest.rsplit("/ansible_collections", 1)[0])
        print(f"collections: {fqcn} {version} -> {target}")
PY
echo "collections: done in $((SECONDS - start)) s"
