#!/usr/bin/env bash
# Issue 27 on the GPU machine, one command: with the CUDA-aware Open MPI + UCX of
# ../shared/cuda-aware (carried by pack.sh, unpacked into .gpu/), `gpumove-bench direct`:
# two daemons, device -> device moves over path UCX direct and CUDA_IPC, 1 MiB ... 1 GiB,
# against ucx_perftest put_bw -m cuda,cuda of the same sizes (puts in flight, and one
# flushed put), rounds in turns; then path MPI direct against raw CUDA-aware MPI.
# PEER=1 (a two-GPU machine, issue 30): node b's buffers on GPU1, and ucx_perftest's server
# on GPU1 (CUDA_VISIBLE_DEVICES=1,0).
# Usage (device machine): bash deploy/gpu/direct_bench.sh   [ROUNDS=5] [PEER=1] [MPI=0]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpumove-gpu}
mkdir -p "$OUT"
source deploy/gpu/cuda_aware_env.sh
[ "$CUDA_AWARE_OK" = 1 ] || { echo "SKIPPED: no .gpu/cuda-aware-*.tar.xz (see pack.sh)"; exit 0; }
peer=()
if [ "${PEER:-0}" = 1 ]; then
  gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
  [ "$gpus" -ge 2 ] || { echo "SKIPPED: PEER=1 needs two GPUs, this machine has $gpus"; exit 0; }
  peer=(--dst_device=1)
fi
daemon_flags=()
[ -n "${DAEMON_FLAGS:-}" ] && daemon_flags=(--daemon_flags="${DAEMON_FLAGS// /,}")
GPUMOVED=$PWD/.gpu/bin/gpumoved timeout 500 .gpu/bin/gpumove-bench direct --rounds="${ROUNDS:-5}" \
  --gpu_min_size=64KiB "${peer[@]}" "${daemon_flags[@]}" --json="$OUT/direct.json" 2>&1 |
  tee "$OUT/direct.txt"
[ "${MPI:-1}" = 1 ] || exit 0
echo "== path MPI direct (two ranks of the CUDA-aware Open MPI, device buffers) vs raw MPI_Send/Recv of device buffers"
GPUMOVED=$PWD/.gpu/bin/gpumoved .gpu/bin/gpumove-bench mpi --mpi_device --nonetpipe \
  --mpi_min_size=64KiB --mpi_max_size=1GiB --seconds=0.3 --rounds="${MPI_ROUNDS:-1}" \
  --json="$OUT/mpi_direct.json" 2>&1 | tee "$OUT/mpi_direct.txt"
