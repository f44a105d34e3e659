#!/usr/bin/env bash
# Issue 26 on the GPU machine: vectored device moves over staged UCX (the machine's UCX is
# not CUDA-aware) against the same bytes moved whole; two daemons on GPU 0.
# PEER=1 (a two-GPU machine, issue 30): a daemon per GPU, GPU0 -> GPU1.
# Usage (device machine, after pack.sh): bash deploy/gpu/staged_vectored_bench.sh [ROUNDS=5] [PEER=1]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpumove-gpu}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
D=.gpu/bin/gpumoved
CTL=.gpu/bin/gpumovectl
A_GPU=() B_GPU=() b_device=0
if [ "${PEER:-0}" = 1 ]; then
  gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
  [ "$gpus" -ge 2 ] || { echo "SKIPPED: PEER=1 needs two GPUs, this machine has $gpus"; exit 0; }
  A_GPU=(--gpus=0) B_GPU=(--gpus=1) b_device=1
fi
"$D" --node=a --listen=127.0.0.1:7811 --host_pool_size=2GiB --pinned_pool_size=256MiB \
  --device_pool_size=4GiB --heartbeat=200ms "${A_GPU[@]}" ${DAEMON_FLAGS:-} >"$OUT/staged_vec_a.log" 2>&1 &
pa=$!
sleep 1.5
"$D" --node=b --listen=127.0.0.1:7812 --host_pool_size=2GiB --pinned_pool_size=256MiB \
  --device_pool_size=4GiB --heartbeat=200ms "${B_GPU[@]}" ${DAEMON_FLAGS:-} --peers=127.0.0.1:7811 >"$OUT/staged_vec_b.log" 2>&1 &
pb=$!
up=0
for _ in $(seq 100); do
  "$CTL" --addr 127.0.0.1:7811 peers 2>/dev/null | grep -q "b.*up" && { up=1; break; }
  sleep 0.2
done
if [ "$up" != 1 ]; then
  echo "FAIL: the two daemons did not come up; their logs:"
  tail -5 "$OUT/staged_vec_a.log" "$OUT/staged_vec_b.log"
  kill $pa $pb 2>/dev/null
  exit 1
fi
"$CTL" --addr 127.0.0.1:7811 info | grep -E '^  UCX '
PYTHONPATH="$PWD/.gpu/python" timeout "${BENCH_TIMEOUT:-300}" python3 deploy/gpu/staged_vectored_bench.py --a 127.0.0.1:7811 \
  --rounds "${ROUNDS:-5}" --b-device "$b_device" 2>&1 | tee "$OUT/staged_vectored_bench.txt"
kill $pa $pb 2>/dev/null
wait 2>/dev/null
