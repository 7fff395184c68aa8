#!/usr/bin/env bash
# The nccl-tests source archive the nccl_validation role builds on the lent GPU machine (no network there), into the
# checkout's ignored .src/ (carry it: carry=[".src"]), checked by sha256 against the role's pin: version and sha256 are
# read from roles/nccl_validation/defaults/main.yml (nccl_validation_tests_version, nccl_validation_tests_archive_sha256).
# Run on the controller:
#   bash tools/device/nccl_tests_archive.sh SOURCE
# SOURCE is what the operator brings (nothing here downloads; the package registries do not carry nccl-tests):
#   - a git clone, or a bare mirror, of NVIDIA/nccl-tests holding the tag v<version>: the archive is made with
#     `git archive --format=tar.gz --prefix=nccl-tests-<version>/ v<version>`, which git makes byte for byte as the
#     tag archive of nccl_validation_tests_archive_url (same sha256; checked with git 2.39.5 for v2.19.6);
#   - or that tag archive itself, downloaded on a machine that reaches nccl_validation_tests_archive_url.
# Without SOURCE it checks the archive already in .src/. Exit 0: .src/nccl-tests-<version>.tar.gz is there with the
# pinned sha256; 1: it is not (a wrong file is removed, and the message says what was found and what to bring).
set -euo pipefail
cd "$(dirname "$0")/../.."
DEFAULTS=roles/nccl_validation/defaults/main.yml
VER=$(sed -n 's/^nccl_validation_tests_version: *"\([^"]*\)".*/\1/p' "$DEFAULTS")
SHA=${NCCL_TESTS_SHA256:-$(sed -n 's/^nccl_validation_tests_archive_sha256: *"\([0-9a-f]\{64\}\)".*/\1/p' "$DEFAULTS")}
DEST=${NCCL_TESTS_SRC_DIR:-.src}/nccl-tests-$VER.tar.gz
fail() { echo "nccl_tests_archive.sh: $*" >&2; exit 1; }
if [ -z "$VER" ] || [ -z "$SHA" ]; then fail "$DEFAULTS: no nccl_validation_tests_version / _archive_sha256 found"; fi
SOURCE=${1:-}
mkdir -p "$(dirname "$DEST")"
if [ -n "$SOURCE" ] && git -C "$SOURCE" rev-parse -q --verify "refs/tags/v$VER" >/dev/null 2>&1; then
  git -C "$SOURCE" archive --format=tar.gz --prefix="nccl-tests-$VER/" "v$VER" > "$DEST.part"
  mv "$DEST.part" "$DEST"
elif [ -n "$SOURCE" ] && [ -f "$SOURCE" ]; then
  cp "$SOURCE" "$DEST"
elif [ -n "$SOURCE" ]; then
  fail "$SOURCE is neither a git clone of NVIDIA/nccl-tests with the tag v$VER nor an archive file"
elif [ ! -f "$DEST" ]; then
  fail "$DEST is missing: bring a clone of NVIDIA/nccl-tests (tag v$VER) or its tag archive and pass its path"
fi
GOT=$(sha256sum "$DEST" | cut -d' ' -f1)
if [ "$GOT" != "$SHA" ]; then
  rm -f "$DEST"
  fail "${SOURCE:-$DEST} gives sha256 $GOT, expected $SHA (the role's pin for nccl-tests $VER): removed; bring the v$VER tag (clone or archive)"
fi
TOP=$(tar -tzf "$DEST" | sed -n 1p)
[ "$TOP" = "nccl-tests-$VER/" ] || fail "$DEST: top directory $TOP, expected nccl-tests-$VER/"
echo "nccl_tests_archive.sh: $DEST sha256 $GOT (the role's pin): carry=[\".src\"]"
