#!/usr/bin/env bash
# Build the execution environment image localhost/b300-ee:latest (execution-environment.yml) with ansible-builder
# and podman, OFFLINE: wheels are downloaded on the host into .cache/ee/wheels (the build installs with --no-index),
# the collection b300.rollout is built into .cache/ee/collection. Cached: when the image carries the label
# b300.ee.inputs=<sha256 of the inputs> (execution-environment.yml, ee/, the collection's files) nothing is rebuilt.
#   tools/build-ee.sh            # build when the inputs changed; prints the image and the time
#   tools/build-ee.sh --hash     # print the inputs' hash only
#   tools/build-ee.sh --cached   # exit 0 when the image for the current inputs exists, 1 otherwise (builds nothing)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
export CONTAINERS_CONF=${CONTAINERS_CONF:-$ROOT/sandbox/containers.conf}
export PATH=$ROOT/.venv/bin:$PATH
IMAGE=${EE_IMAGE:-localhost/b300-ee:latest}
OUT=$ROOT/.cache/ee

inputs_hash() {
  { cat execution-environment.yml ee/*
    git ls-files -co --exclude-standard collections/ansible_collections/b300/rollout | sort | xargs sha256sum
  } | sha256sum | cut -c1-16
}
HASH=$(inputs_hash)
have() { [ "$(podman image inspect --format '{{ index .Labels "b300.ee.inputs" }}' "$IMAGE" 2>/dev/null)" = "$HASH" ]; }
case "${1:-}" in
  --hash) echo "$HASH"; exit 0 ;;
  --cached) have; exit $? ;;
esac
if have; then
  echo "ee: $IMAGE is up to date (inputs $HASH)"
  exit 0
fi
podman image exists localhost/b300-sandbox:latest || sandbox/fleet.sh image
t0=$SECONDS
mkdir -p "$OUT/wheels" "$OUT/collection"
# every wheel the build installs: ee/requirements.txt, ansible-core/-runner, ansible-builder's own build-stage tools
# (bindep, pyyaml, packaging, dumb-init) and pip/wheel/setuptools for the venv
python -m pip download -q --dest "$OUT/wheels" --prefer-binary -r ee/requirements.txt \
  ansible-core==2.19.14 ansible-runner==2.4.3 bindep pyyaml packaging dumb-init==1.2.5 pip wheel setuptools
rm -f "$OUT/collection/"*.tar.gz
ansible-galaxy collection build --force --output-path "$OUT/collection" collections/ansible_collections/b300/rollout >/dev/null
mv "$OUT/collection/"b300-rollout-*.tar.gz "$OUT/collection/b300-rollout.tar.gz"
ansible-builder build -f execution-environment.yml -c "$OUT/context" --container-runtime podman -t "$IMAGE" \
  --extra-build-cli-args "--label b300.ee.inputs=$HASH" -v 2
echo "ee: built $IMAGE (inputs $HASH) in $((SECONDS - t0)) s"
