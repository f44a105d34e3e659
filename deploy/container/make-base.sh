#!/usr/bin/env bash
# Makes the Debian 12 base image the Containerfile starts from, out of Debian's archive
# (mmdebstrap), for hosts that reach no container registry. A host that can pull skips
# this and builds with --build-arg BASE=docker.io/library/debian:bookworm-slim.
#   usage: deploy/container/make-base.sh [IMAGE]   (default localhost/debian-min:bookworm)
# Needs root (mmdebstrap --mode=root), mmdebstrap and podman (or docker: ENGINE=docker).
# Does nothing when the image is already there (FORCE=1 remakes it).
set -euo pipefail
IMAGE=${1:-localhost/debian-min:bookworm}
ENGINE=${ENGINE:-podman}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
if [ "${FORCE:-0}" != 1 ] && "$ENGINE" image exists "$IMAGE" 2>/dev/null; then
  echo "make-base: $IMAGE is already there"
  exit 0
fi
command -v mmdebstrap >/dev/null || { echo "make-base: needs mmdebstrap (apt-get install mmdebstrap)" >&2; exit 1; }
tmp=$(mktemp -d /var/tmp/gpumove-base.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
# minbase: essential packages and apt only (~170 MB unpacked); ca-certificates so that a
# build inside can use an https mirror.
mmdebstrap --variant=minbase --mode=root --format=tar --include=ca-certificates \
  bookworm "$tmp/base.tar" "deb $MIRROR bookworm main" "deb $MIRROR bookworm-updates main" \
  "deb http://security.debian.org/debian-security bookworm-security main"
"$ENGINE" import --change 'CMD ["/bin/bash"]' "$tmp/base.tar" "$IMAGE" >/dev/null
echo "make-base: $IMAGE made ($(du -h "$tmp/base.tar" | cut -f1) tar)"
