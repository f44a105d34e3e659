#!/usr/bin/env bash
# Builds gpumove's image (deploy/container/Containerfile) with podman or docker.
#   deploy/container/build.sh [--prebuilt] [--tag TAG]
# --prebuilt   take gpumoved and gpumovectl from this host's Bazel build (built here first;
#              seconds) instead of building them inside the image's builder stage (minutes)
# --tag TAG    image name (default localhost/gpumove:VERSION, also tagged :latest)
# Environment: ENGINE=podman|docker (default podman), BASE=an image to start from (default
# localhost/debian-min:bookworm, made by make-base.sh from Debian's archive when missing;
# with a registry: BASE=docker.io/library/debian:bookworm-slim).
# CUDA: a host with the toolkit at /usr/local/cuda gives the builder stage the toolkit
# (podman: a read-only volume), so the image's gpumoved has GPU pools; without it, host
# pools only. The image's label gpumove.cuda says which.
set -euo pipefail
cd "$(dirname "$0")/../.."
PREBUILT=0
TAG=""
while [ $# -gt 0 ]; do
  case "$1" in
    --prebuilt) PREBUILT=1 ;;
    --tag) TAG=$2; shift ;;
    *) echo "usage: $0 [--prebuilt] [--tag TAG]" >&2; exit 2 ;;
  esac
  shift
done
ENGINE=${ENGINE:-podman}
BASE=${BASE:-localhost/debian-min:bookworm}
VERSION=$(sed -n 's/.*kVersion\[\] = "\(.*\)";/\1/p' daemon/server/node_service.h)
TAG=${TAG:-localhost/gpumove:$VERSION}
REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)
SOURCE=$(git remote get-url origin 2>/dev/null || echo unknown)
command -v "$ENGINE" >/dev/null || { echo "build: $ENGINE is not installed" >&2; exit 1; }
if [ "$BASE" = localhost/debian-min:bookworm ]; then
  ENGINE=$ENGINE bash deploy/container/make-base.sh "$BASE"
fi
# podman on hosts like the CI machines needs runc and cgroupfs (containers.conf says why).
if [ "$ENGINE" = podman ] && [ -z "${CONTAINERS_CONF:-}" ] &&
   ! podman run --rm "$BASE" true >/dev/null 2>&1; then
  export CONTAINERS_CONF=$PWD/deploy/container/containers.conf
  echo "build: podman's defaults do not run containers here; using $CONTAINERS_CONF"
fi
ARGS=(--build-arg "BASE=$BASE" --build-arg "VERSION=$VERSION" --build-arg "REVISION=$REVISION"
      --build-arg "SOURCE=$SOURCE")
[ "$ENGINE" = podman ] && ARGS+=(--format docker)  # Keeps HEALTHCHECK (OCI has none).
if [ "$PREBUILT" = 1 ]; then
  bazel build //daemon:gpumoved //client/cli:gpumovectl 2>&1 | tail -1
  rm -rf .container-bin && mkdir -p .container-bin
  cp "$(bazel info bazel-bin 2>/dev/null)"/daemon/gpumoved \
     "$(bazel info bazel-bin 2>/dev/null)"/client/cli/gpumovectl .container-bin/
  chmod u+w .container-bin/* && strip .container-bin/*
  cuda=$(grep -q 'HAVE_CUDA = True' "$(bazel info output_base 2>/dev/null)/external/local_cuda/defs.bzl" 2>/dev/null \
         && echo yes || echo no)
  ARGS+=(--build-arg BINARIES=prebuilt --build-arg "CUDA=$cuda")
else
  cuda=no
  if [ -f /usr/local/cuda/include/cuda_runtime.h ]; then
    if [ "$ENGINE" = podman ]; then
      ARGS+=(-v /usr/local/cuda:/usr/local/cuda:ro)
      cuda=yes
    else
      echo "build: docker cannot lend /usr/local/cuda to the build; the image gets host pools" \
           "only (use --prebuilt, or a BASE with the CUDA toolkit)"
    fi
  fi
  ARGS+=(--build-arg "CUDA=$cuda")
fi
start=$SECONDS
"$ENGINE" build "${ARGS[@]}" -f deploy/container/Containerfile -t "$TAG" .
"$ENGINE" tag "$TAG" "${TAG%:*}:latest"
rm -rf .container-bin
size=$("$ENGINE" image inspect "$TAG" --format '{{.Size}}')
echo "build: $TAG (CUDA: $cuda) in $((SECONDS - start)) s, $((size / 1000000)) MB"
