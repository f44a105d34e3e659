#!/usr/bin/env bash
# The figures of docs/benchmarks.md, one command on the GPU machine (after pack.sh, carry
# .gpu): every gpumove-bench subcommand with its baselines, rounds in turns, each run's
# JSON into $OUT (default /tmp/gpumove-gpu/bench), and the plots drawn into $OUT/plots
# where matplotlib is there. ~7 minutes on the H200 for the first eight subcommands below;
# gpu_local, mpi, mpi_datatype and tls (added since) are estimated at 3-4 more, not yet
# timed there: a device call may last 10, so split SUBS over two calls.
# The JSON files come back with $OUT; draw (or redraw) them here into the docs with
#   bazel run //client/bench/tool:gpumove-bench -- plot $PWD/OUT/*.json -o $PWD/docs/benchmarks
# SUBS picks subcommands (default: local small node vectored vecdev staged direct gpu_local
# python mpi mpi_datatype tls qos storage);
# SECONDS_PER=0.3 and ROUNDS=3 set each point's time and rounds.
# Usage (device machine): bash deploy/gpu/plots.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpumove-gpu/bench}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export GPUMOVED="$PWD/.gpu/bin/gpumoved" PATH="$PWD/.gpu/tools:$PATH"
SUBS=${SUBS:-local small node vectored vecdev staged direct gpu_local python mpi mpi_datatype tls qos storage}
B=(.gpu/bin/gpumove-bench)
common=(--rounds="${ROUNDS:-3}" --seconds="${SECONDS_PER:-0.3}")
rc=0
bench() {  # bench NAME SUBCOMMAND FLAGS...: one run, its table in NAME.txt, JSON in NAME.json.
  local name=$1
  shift
  echo "== gpumove-bench $* at ${SECONDS}s"
  timeout 300 "${B[@]}" "$@" "${common[@]}" --json="$OUT/$name.json" 2>&1 | tee "$OUT/$name.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
}
on() { [[ " $SUBS " == *" $1 "* ]]; }
# The daemons and ucx_perftest on the carried UCX (that of the build machine), when there.
ucx_lib="$PWD/.gpu/ucx:$LD_LIBRARY_PATH"
[ -e .gpu/ucx/libucp.so.0 ] || ucx_lib=$LD_LIBRARY_PATH
on local && bench local local --max_size=1GiB
on small && bench small small --max_clients=16 --small_node
on node && LD_LIBRARY_PATH=$ucx_lib bench node node
on vectored && bench vectored_local vectored --vec_case=local
if on vecdev; then
  gather=()
  nvcc -O3 -std=c++17 -o /tmp/gpumove_raw_gather deploy/gpu/raw_gather.cu &&
    gather=(--raw_gather=/tmp/gpumove_raw_gather)
  bench vectored_device vectored --vec_case=device "${gather[@]}"
fi
on staged && bench staged staged --gpu_min_size=4MiB
if on direct; then
  ( source deploy/gpu/cuda_aware_env.sh
    if [ "$CUDA_AWARE_OK" = 1 ]; then
      bench direct direct --gpu_min_size=64KiB
    else
      echo "direct: SKIPPED: no .gpu/cuda-aware-*.tar.xz (see pack.sh)"
    fi
    exit "$rc" ) || rc=1
fi
on gpu_local && bench gpu_local gpu_local --gl_case=pinned_to_device --gpu_min_size=4KiB
on python && bench python python --python_path="$PWD/.gpu/python" --py_max_size=256MiB
netpipe=$(command -v NPopenmpi >/dev/null && echo true || echo false)
on mpi && bench mpi mpi --mpi_max_size=256MiB --netpipe="$netpipe"
on mpi_datatype && bench mpi_datatype mpi_datatype
on tls && bench tls tls --tls_small_moves=3000
on qos && bench qos qos --qos_window=10s
on storage && bench storage storage --storage_dir=/var/tmp --storage_max_size=1GiB
"${B[@]}" plot "$OUT"/*.json -o "$OUT/plots" ||
  echo "not drawn here (matplotlib?): draw the JSON files of $OUT on the build machine (see above)"
echo "-- done at ${SECONDS}s"
exit "$rc"
