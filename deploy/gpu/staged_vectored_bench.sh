#!/usr/bin/env bash
# Issue 26 on the GPU machine: `gpumove-bench vectored --vec_case=ucx_device`, vectored
# device moves over staged UCX between two daemons (the machine's UCX is not CUDA-aware)
# against the same bytes moved whole, separate specs and the prepared list, rounds in turns.
# PEER=1 (a two-GPU machine, issue 30): node b's buffers on GPU1.
# Usage (device machine, after pack.sh): bash deploy/gpu/staged_vectored_bench.sh [ROUNDS=5] [PEER=1]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpumove-gpu}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
peer=()
if [ "${PEER:-0}" = 1 ]; then
  gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
  [ "$gpus" -ge 2 ] || { echo "SKIPPED: PEER=1 needs two GPUs, this machine has $gpus"; exit 0; }
  peer=(--dst_device=1)
fi
daemon_flags=()
[ -n "${DAEMON_FLAGS:-}" ] && daemon_flags=(--daemon_flags="${DAEMON_FLAGS// /,}")
GPUMOVED=$PWD/.gpu/bin/gpumoved timeout "${BENCH_TIMEOUT:-300}" .gpu/bin/gpumove-bench vectored \
  --vec_case=ucx_device --rounds="${ROUNDS:-5}" "${peer[@]}" "${daemon_flags[@]}" \
  --json="$OUT/vectored_ucx_device.json" 2>&1 | tee "$OUT/staged_vectored_bench.txt"
