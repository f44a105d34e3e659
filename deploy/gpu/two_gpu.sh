#!/usr/bin/env bash
# Issue 30 on a two-GPU machine (kind nvidia-h200-x2), after pack.sh (carry .gpu): the GPU
# suite and every GPU0 -> GPU1 figure against its raw baseline of the same run.
#   local     LOCAL GPU0 -> GPU1 and both directions at once vs cudaMemcpyAsync (one, and
#             one on each GPU at once), CUDA_IPC between a daemon per GPU vs the same copy
#             (gpumove-bench gpu_local --gl_case=device, both_ways, ipc);
#   vectored  65536 x 4 KiB and 8192 x 64 KiB shuffled blocks GPU0 -> GPU1, LOCAL and
#             CUDA_IPC, vs a same-process gather kernel on GPU1 reading GPU0 over NVLink
#             (deploy/gpu/raw_gather.cu's device0->device1 rows; gpumove-bench vectored);
#   direct    UCX (CUDA-aware, ../shared/cuda-aware) and CUDA_IPC between a daemon per GPU
#             vs ucx_perftest -m cuda,cuda with its server on GPU1, and path MPI between two
#             CUDA-aware ranks GPU0 -> GPU1 vs raw MPI_Isend/Irecv of device buffers
#             (deploy/gpu/direct_bench.sh PEER=1), then vectored MPI GPU0 -> GPU1;
#   staged    staged UCX (Debian's UCX, not CUDA-aware) and staged MPI GPU0 -> GPU1 vs each
#             stage alone (gpumove-bench staged, gpumove-bench mpi --mpi_device), and staged vectored UCX
#             GPU0 -> GPU1 vs the same bytes whole;
#   tests     the GPU suite (deploy/gpu/run.sh PARTS=tests).
# A device call lasts at most 10 minutes: PARTS picks sections (default all, in the order
# above; "local vectored" and "direct staged tests" fit a call each).
# Usage (device machine): PARTS="local vectored" bash deploy/gpu/two_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH="$PWD/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export GPUMOVED="$PWD/.gpu/bin/gpumoved"
export PATH="$PWD/.gpu/tools:$PATH"
export OUT=${OUT:-/tmp/gpumove-gpu}
mkdir -p "$OUT"
PARTS=${PARTS:-local vectored direct staged tests}
ROUNDS=${ROUNDS:-5}
part() {
  [[ " $PARTS " == *" $1 "* ]] || return 1
  echo "-- $1 at ${SECONDS}s"
}
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee "$OUT/gpus.txt"
if [ "$gpus" -lt 2 ]; then
  echo "SKIPPED: issue 30's figures need two GPUs; this machine has $gpus"
  exit 0
fi
nvidia-smi topo -m 2>&1 | head -6 | tee -a "$OUT/gpus.txt"
rc=0

if part local; then
  echo "== LOCAL and CUDA_IPC GPU0 -> GPU1, and both directions at once"
  for c in device both_ways ipc; do
    timeout 150 .gpu/bin/gpumove-bench gpu_local --gl_case=$c --dst_device=1 --gpu_min_size=1MiB \
      --gpu_max_size=1GiB --rounds="$ROUNDS" --seconds=0.2 --json="$OUT/two_gpu_local_$c.json" 2>&1 |
      tee "$OUT/two_gpu_local_$c.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  done
fi

if part vectored; then
  echo "== vectored GPU0 -> GPU1 (LOCAL, CUDA_IPC) vs a gather kernel reading over NVLink"
  nvcc -O3 -std=c++17 -o /tmp/gpumove_raw_gather deploy/gpu/raw_gather.cu || rc=1
  # Ratios: the daemon's move over the kernel's median (device0->device1 rows).
  for c in device ipc; do
    timeout 150 .gpu/bin/gpumove-bench vectored --vec_case=$c --dst_device=1 --rounds="$ROUNDS" \
      --raw_gather=/tmp/gpumove_raw_gather --json="$OUT/two_gpu_vectored_$c.json" 2>&1 |
      tee "$OUT/two_gpu_vectored_$c.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  done
fi

if part direct; then
  echo "== direct UCX, CUDA_IPC and MPI GPU0 -> GPU1 (CUDA-aware stack)"
  PEER=1 MPI_ROUNDS=3 ROUNDS="$ROUNDS" timeout 420 bash deploy/gpu/direct_bench.sh || rc=1
  echo "== vectored MPI GPU0 -> GPU1, direct (CUDA-aware) and staged"
  VEC_ARGS=--dst_device=1 timeout 240 bash deploy/gpu/mpi_vectored_bench.sh 3 || rc=1
fi

if part staged; then
  echo "== staged UCX GPU0 -> GPU1 vs each stage alone"
  timeout 240 .gpu/bin/gpumove-bench staged --dst_device=1 --gpu_min_size=16MiB \
    --json="$OUT/two_gpu_staged.json" 2>&1 | tee "$OUT/two_gpu_staged.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  # Staged MPI's stages: the pinned copies are gpumove-bench staged's D2H and H2D columns above,
  # the wire is raw MPI between two ranks of host memory (the second table's "raw MPI").
  echo "== staged MPI GPU0 -> GPU1 (Debian's Open MPI)"
  timeout 200 .gpu/bin/gpumove-bench mpi --mpi_device --seconds=0.3 --rounds=1 --mpi_min_size=1MiB \
    --mpi_max_size=1GiB --nonetpipe --json="$OUT/two_gpu_mpi_staged.json" 2>&1 |
    tee "$OUT/two_gpu_mpi_staged.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  echo "== its wire alone: host memory between the same two ranks, raw MPI beside gpumove"
  timeout 200 .gpu/bin/gpumove-bench mpi --seconds=0.3 --rounds=1 --mpi_min_size=1MiB \
    --mpi_max_size=256MiB --nonetpipe --json="$OUT/two_gpu_mpi_host.json" 2>&1 |
    tee "$OUT/two_gpu_mpi_host.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  echo "== staged vectored UCX GPU0 -> GPU1 vs the same bytes whole"
  PEER=1 ROUNDS="$ROUNDS" timeout 240 bash deploy/gpu/staged_vectored_bench.sh || rc=1
fi

if part tests; then
  PARTS=tests bash deploy/gpu/run.sh || rc=1
fi
echo "-- done at ${SECONDS}s"
exit "$rc"
