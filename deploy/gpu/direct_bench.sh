#!/usr/bin/env bash
# Issue 27 on the GPU machine, one command: with the CUDA-aware Open MPI + UCX of
# ../shared/cuda-aware (carried by pack.sh, unpacked into .gpu/), two daemons on GPU 0,
# device -> device moves over path UCX direct and CUDA_IPC, 4 KiB ... 1 GiB, against
# ucx_perftest put_bw -m cuda,cuda of the same sizes (medians; deploy/gpu/direct_bench.py).
# PEER=1 (a two-GPU machine, issue 30): a daemon per GPU, GPU0 -> GPU1, and ucx_perftest's
# server on GPU1 (CUDA_VISIBLE_DEVICES=1,0: both processes see both GPUs, in another order).
# Usage (device machine): bash deploy/gpu/direct_bench.sh   [ROUNDS=5] [PEER=1]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpumove-gpu}
mkdir -p "$OUT"
source deploy/gpu/cuda_aware_env.sh
DAEMON_FLAGS=${DAEMON_FLAGS:-}
[ "$CUDA_AWARE_OK" = 1 ] || { echo "SKIPPED: no .gpu/cuda-aware-*.tar.xz (see pack.sh)"; exit 0; }
A_GPU=() B_GPU=() SERVER_GPUS=() b_device=0
if [ "${PEER:-0}" = 1 ]; then
  gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
  [ "$gpus" -ge 2 ] || { echo "SKIPPED: PEER=1 needs two GPUs, this machine has $gpus"; exit 0; }
  A_GPU=(--gpus=0) B_GPU=(--gpus=1) SERVER_GPUS=(env CUDA_VISIBLE_DEVICES=1,0) b_device=1
fi
D=.gpu/bin/gpumoved
CTL=.gpu/bin/gpumovectl
echo "== ucx_perftest put_bw -m cuda,cuda"
: >"$OUT/perftest.txt"
port=23500
for size in 65536 1048576 16777216 67108864 268435456 1073741824; do
  port=$((port + 1))
  n=$((size >= 268435456 ? 40 : 200))
  ("${SERVER_GPUS[@]}" ucx_perftest -t ucp_put_bw -m cuda,cuda -s "$size" -n "$n" -p "$port" >/dev/null 2>&1 &)
  sleep 0.7
  mbs=$(ucx_perftest 127.0.0.1 -t ucp_put_bw -m cuda,cuda -s "$size" -n "$n" -p "$port" 2>&1 |
        awk '/Final:/{print $(NF-2)}')
  echo "$size ${mbs:-nan}" | tee -a "$OUT/perftest.txt"
done
# The like-for-like baseline of one move: ONE put of the size, flushed (-n 1 after three
# warm-up puts), where put_bw above keeps n puts in flight and times the stream.
echo "== ucx_perftest put_bw -m cuda,cuda, a single flushed put (-n 1)"
: >"$OUT/perftest_single.txt"
for size in 65536 1048576 16777216 67108864 268435456 1073741824; do
  best=""
  for r in 1 2 3; do
    port=$((port + 1))
    ("${SERVER_GPUS[@]}" ucx_perftest -t ucp_put_bw -m cuda,cuda -s "$size" -n 1 -w 3 -p "$port" >/dev/null 2>&1 &)
    sleep 0.7
    mbs=$(ucx_perftest 127.0.0.1 -t ucp_put_bw -m cuda,cuda -s "$size" -n 1 -w 3 -p "$port" 2>&1 |
          awk '/Final:/{print $(NF-2)}')
    best="$best ${mbs:-nan}"
  done
  med=$(echo $best | tr ' ' '\n' | sort -g | sed -n 2p)
  echo "$size $med" | tee -a "$OUT/perftest_single.txt"
done
"$D" --node=a --listen=127.0.0.1:7801 --host_pool_size=64MiB --pinned_pool_size=256MiB \
  --device_pool_size=12GiB --heartbeat=200ms "${A_GPU[@]}" $DAEMON_FLAGS >"$OUT/direct_a.log" 2>&1 &
pa=$!
sleep 1.5
"$D" --node=b --listen=127.0.0.1:7802 --host_pool_size=64MiB --pinned_pool_size=256MiB \
  --device_pool_size=12GiB --heartbeat=200ms "${B_GPU[@]}" $DAEMON_FLAGS --peers=127.0.0.1:7801 >"$OUT/direct_b.log" 2>&1 &
pb=$!
for _ in $(seq 100); do "$CTL" --addr 127.0.0.1:7801 peers 2>/dev/null | grep -q "b.*up" && break; sleep 0.2; done
"$CTL" --addr 127.0.0.1:7801 info | grep -E '^  (UCX|CUDA_IPC|MPI) '
echo "== gpumove device -> device, medians of ${ROUNDS:-5}"
PYTHONPATH="$PWD/.gpu/python" python3 deploy/gpu/direct_bench.py --a 127.0.0.1:7801 \
  --rounds "${ROUNDS:-5}" --perftest "$OUT/perftest.txt" --b-device "$b_device" \
  --perftest_single "$OUT/perftest_single.txt" 2>&1 | tee "$OUT/direct_bench.txt"
kill $pa $pb 2>/dev/null
wait 2>/dev/null
[ "${MPI:-1}" = 1 ] || exit 0
echo "== path MPI direct (two ranks of the CUDA-aware Open MPI, device buffers) vs raw MPI_Send/Recv of device buffers"
GPUMOVED=$PWD/.gpu/bin/gpumoved .gpu/bin/mpi_bench --device --baselines=false --min_size=64KiB \
  --max_size=1GiB --seconds_per_size=0.3 --rounds="${MPI_ROUNDS:-1}" 2>&1 | tee "$OUT/mpi_direct_bench.txt"
