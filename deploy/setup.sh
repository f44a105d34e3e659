#!/usr/bin/env bash
# Installs what building and testing gpumove needs, from Debian/Ubuntu packages only.
# Safe to run again: it installs only what is missing. With --tests (tests/run.sh), also
# what only the tests use.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap bazel-platforms bazel-rules-java
  g++ libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  libabsl-dev libgtest-dev libgmock-dev libxxhash-dev prometheus-cpp-dev liburing-dev
  libucx-dev ucx-utils libopenmpi-dev openmpi-bin libmpich-dev mpich netpipe-openmpi
  libnuma1 libxml2 libibverbs1 librdmacm1 python3-matplotlib
  iproute2 python3 clang libclang-rt-14-dev libssl-dev openssl
  python3-grpcio python3-protobuf python3-numpy python3-pytest python3-pytest-asyncio
  python3-build python3-setuptools python3-wheel python3-venv libsystemd-dev
  podman buildah runc netavark aardvark-dns iptables mmdebstrap prometheus python3-yaml
)
if [ "${1:-}" = --tests ]; then
  # tests/disaggregated_test (a decoder's KV cache moved layer by layer): PyTorch 1.13 for
  # the CPU, about 76 MB fetched; 194 s to install here (2 CPUs, with Recommends). The
  # quick start's main job does not need it.
  PACKAGES+=(python3-torch)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
command -v bazel >/dev/null || { echo "setup: bazel not found after install" >&2; exit 1; }
