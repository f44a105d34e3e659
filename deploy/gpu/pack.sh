#!/usr/bin/env bash
# Builds the GPU suite here and copies what runs into .gpu/ (git-ignored): the binaries and
# the shared libraries the GPU machine lacks (gRPC, Abseil, re2, c-ares, ...). Carry .gpu/
# to the GPU machine and run deploy/gpu/run.sh there.
set -euo pipefail
cd "$(dirname "$0")/../.."
TARGETS=(//daemon:gpumoved //client/cli:gpumovectl //tests:gpu_local_test //tests:gpu_staging_test
         //tests:gpu_ipc_test //tests:gpu_ipc_client
         //client/bench:gpu_local_bench //client/bench:local_bench //client/bench:node_bench
         //client/bench:gpu_staged_bench //client/bench:mpi_bench //client/bench:rpc_probe
         //client/bench:ipc_probe)
bazel build "${TARGETS[@]}" 2>&1 | tail -1
BIN=$(bazel info bazel-bin 2>/dev/null)
rm -rf .gpu && mkdir -p .gpu/bin .gpu/lib
for t in "${TARGETS[@]}"; do
  p=${t#//}; p=${p/://}
  cp "$BIN/$p" .gpu/bin/
done
# Everything the binaries link but glibc and the compiler runtime, which the GPU machine
# has in newer versions, and Open MPI with what it loads (the machine's own Open MPI must
# be used: it finds its plugins by path).
ldd .gpu/bin/* | awk '/=> \//{print $3}' | sort -u |
  grep -vE '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libstdc\+\+|libgcc_s)\.so' |
  grep -vE '/(libmpi|libopen-rte|libopen-pal|libpmix|libhwloc|libevent[^/]*|libudev|libnuma)\.so' |
  while read -r lib; do cp -L "$lib" .gpu/lib/; done
du -sh .gpu
