#!/usr/bin/env bash
# Builds the GPU suite here and copies what runs into .gpu/ (git-ignored): the binaries and
# the shared libraries the GPU machine lacks (gRPC, Abseil, re2, c-ares, ...). Carry .gpu/
# to the GPU machine and run deploy/gpu/run.sh there.
set -euo pipefail
cd "$(dirname "$0")/../.."
TARGETS=(//daemon:gpumoved //client/cli:gpumovectl //tests:gpu_local_test //tests:gpu_staging_test
         //tests:gpu_direct_test
         //tests:gpu_ipc_test //tests:gpu_ipc_client
         //client/bench/tool:gpumove-bench)
bazel build "${TARGETS[@]}" 2>&1 | tail -1
BIN=$(bazel info bazel-bin 2>/dev/null)
rm -rf .gpu && mkdir -p .gpu/bin .gpu/lib
for t in "${TARGETS[@]}"; do
  p=${t#//}; p=${p/://}
  cp "$BIN/$p" .gpu/bin/
done
# gpumove-bench finds these beside itself (plot, python).
cp client/bench/tool/plot.py client/bench/tool/python_driver.py .gpu/bin/
# A device call carries at most 64 MiB: the benchmarks and probes go without their symbol
# tables; the daemon and the tests keep theirs for the stack traces of a failure.
for b in .gpu/bin/*; do
  case $(basename "$b") in gpumoved|gpu_*_test|*.py) ;; *) chmod u+w "$b"; strip --strip-unneeded "$b" ;; esac
done
# Everything the binaries link but glibc and the compiler runtime, which the GPU machine
# has in newer versions, and Open MPI with what it loads (the machine's own Open MPI must
# be used: it finds its plugins by path).
ldd $(ls .gpu/bin/* | grep -v '\.py$') | awk '/=> \//{print $3}' | sort -u |
  grep -vE '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libstdc\+\+|libgcc_s)\.so' |
  grep -vE '/(libmpi|libopen-rte|libopen-pal|libpmix|libhwloc|libevent[^/]*|libudev|libnuma)\.so' |
  while read -r lib; do cp -L "$lib" .gpu/lib/; done
# The baselines the GPU machine lacks (ucx_perftest, NetPIPE, iperf3), where this machine
# has them. The binaries above run on this machine's UCX libraries (copied into .gpu/lib,
# without UCX's transport modules, so no cma there); ucx_perftest needs the same version
# (UCT and UCS have no stable ABI between versions) and its modules: .gpu/ucx/ holds the
# libraries with the modules beside them, and run.sh puts it first on gpumove-bench node's library
# path, so that its daemons and ucx_perftest run the same UCX with the same transports.
# NetPIPE uses the machine's Open MPI (same soname).
mkdir -p .gpu/tools .gpu/ucx
for tool in ucx_perftest NPopenmpi iperf3; do
  if command -v "$tool" >/dev/null; then cp "$(command -v "$tool")" .gpu/tools/; fi
done
if [ -x .gpu/tools/iperf3 ]; then
  ldd .gpu/tools/iperf3 | awk '/=> \//{print $3}' | grep -E '/lib(iperf|sctp)\.so' |
    while read -r lib; do cp -L "$lib" .gpu/lib/; done
fi
if [ -x .gpu/tools/ucx_perftest ]; then
  ucp=$(ldd .gpu/tools/ucx_perftest | awk '/libucp\.so/{print $3}')
  for lib in libucp libuct libucs libucm; do cp -L "$(dirname "$ucp")/$lib.so.0" .gpu/ucx/; done
  # Transport modules are found beside libucs, in ucx/.
  cp -rL "$(dirname "$ucp")/ucx" .gpu/ucx/ && rm -f .gpu/ucx/ucx/*.a
fi
# The Python client with its generated stubs, and its GPU check (run.sh PARTS=python;
# gpumove-bench python --python_path=.gpu/python).
mkdir -p .gpu/python/tests
python3 client/python/gen_stubs.py .gpu/python
cp client/python/gpumove/*.py .gpu/python/gpumove/
cp client/python/tests/daemons.py client/python/tests/gpu_check.py .gpu/python/tests/
mkdir -p .gpu/python/examples && cp examples/python/*.py .gpu/python/examples/
# The CUDA-aware Open MPI + UCX (issue 27; deploy/gpu/cuda_aware_diag.sh unpacks it there).
for t in ../shared/cuda-aware/*.tar.xz; do [ -f "$t" ] && cp "$t" .gpu/; done
du -sh .gpu
