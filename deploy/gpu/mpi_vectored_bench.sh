#!/usr/bin/env bash
# Vectored MPI moves of device memory on the GPU machine, one command: two ranks on GPU 0,
# 65536 x 4 KiB and 8192 x 64 KiB shuffled blocks against the same bytes as one contiguous
# MPI move (gpumove-bench vectored --vec_case=mpi --mpi_device): staged through Debian's Open
# MPI, then direct with the CUDA-aware Open MPI + UCX of ../shared/cuda-aware (carried by
# pack.sh). TRACE=1 adds the ranks' --v=2 lines on where each vectored move's time went
# (StartMpi, packing, waits, unpacking).
# STAGED=0 runs the direct part alone, DIRECT=0 the staged part alone. DATATYPES=1 also
# runs the direct moves with their messages as derived datatypes of device memory
# (--mpi_datatypes=always) rather than packed by the gather kernel. VEC_ARGS adds
# gpumove-bench vectored flags (e.g. --dst_device=1: the receiving rank's buffers on GPU1, on a
# two-GPU machine).
# Usage (device machine, after pack.sh): bash deploy/gpu/mpi_vectored_bench.sh [ROUNDS=5]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpumove-gpu}
mkdir -p "$OUT"
ROUNDS=${1:-5}
export GPUMOVED=$PWD/.gpu/bin/gpumoved LD_LIBRARY_PATH=$PWD/.gpu/lib:${LD_LIBRARY_PATH:-}
read -r -a flags <<< "${VEC_ARGS:-}"
if [ "${TRACE:-0}" = 1 ]; then
  flags+=(--daemon_flags=--v=2)
  export GPUMOVE_KEEP_LOGS=1
fi
trace() {  # The kept job logs' trace lines (the bench prints where they were kept).
  [ "${TRACE:-0}" = 1 ] || return 0
  grep -h 'MPI job log kept' "$1" | awk '{print $NF}' | while read -r log; do
    grep -hE 'StartMpi of|MPI vectored|MPI half' "$log" | sed 's/^.*\] //' | head -60
    # The whole log beside the results, packed.
    xz -c "$log" > "$OUT/$(basename "$(dirname "$log")").log.xz"
  done
}
if [ "${STAGED:-1}" = 1 ]; then
  echo "== vectored MPI, device memory staged (Debian's Open MPI, ob1 + shared memory)"
  timeout 300 .gpu/bin/gpumove-bench vectored --vec_case=mpi --mpi_launch=ob1_shm_staged --mpi_device --rounds="$ROUNDS" "${flags[@]}" \
    2>&1 | tee "$OUT/mpi_vectored_staged.txt" | grep -v 'MPI job log kept'
  trace "$OUT/mpi_vectored_staged.txt"
fi
[ "${DIRECT:-1}" = 1 ] || exit 0
( source deploy/gpu/cuda_aware_env.sh
  [ "$CUDA_AWARE_OK" = 1 ] || { echo "SKIPPED: no .gpu/cuda-aware-*.tar.xz (see pack.sh)"; exit 0; }
  echo "== vectored MPI, device memory direct (CUDA-aware Open MPI + UCX)"
  timeout 300 .gpu/bin/gpumove-bench vectored --vec_case=mpi --mpi_launch=ucx --mpi_device --rounds="$ROUNDS" "${flags[@]}" \
    2>&1 | tee "$OUT/mpi_vectored_direct.txt" | grep -v 'MPI job log kept'
  trace "$OUT/mpi_vectored_direct.txt"
  # DATATYPES=1: the same moves with every message a derived datatype of device memory
  # (--mpi_datatypes=always) instead of packed by the gather kernel.
  if [ "${DATATYPES:-0}" = 1 ]; then
    echo "== vectored MPI, device memory direct, messages as derived datatypes"
    read -r -a typed <<< "${VEC_ARGS:-}"
    rank=--mpi_datatypes=always
    [ "${TRACE:-0}" = 1 ] && rank="--v=2,$rank"
    timeout 300 .gpu/bin/gpumove-bench vectored --vec_case=mpi --mpi_launch=ucx --mpi_device --rounds="$ROUNDS" "${typed[@]}" \
      --daemon_flags="$rank" 2>&1 | tee "$OUT/mpi_vectored_direct_typed.txt" |
      grep -v 'MPI job log kept'
    trace "$OUT/mpi_vectored_direct_typed.txt"
  fi
  # The same blocks between two ranks of that MPI without a daemon: a derived datatype
  # (whole, and in 64 MiB messages) against the contiguous bytes (issue 26's choice).
  echo "== vectored MPI without a daemon, device memory (derived datatypes vs contiguous)"
  timeout 200 .gpu/bin/gpumove-bench mpi_datatype --mpi_launch=ucx --mpi_device --mpi_chunk=64MiB \
    --rounds=3 --json="$OUT/mpi_datatype_device.json" 2>&1 | tee "$OUT/mpi_datatype_device.txt" )
