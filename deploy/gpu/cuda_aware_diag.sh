#!/usr/bin/env bash
# Issue 27 diagnostics on the GPU machine: the CUDA-aware Open MPI + UCX of
# ../shared/cuda-aware (carried as .gpu/cuda-aware-*.tar.xz by pack.sh), two daemons on
# GPU 0, device -> device moves over path UCX (direct when the probe says the UCX is
# CUDA-aware), with UCX's own account of what it chose (UCX_PROTO_INFO, UCX_LOG_LEVEL=info)
# and ucx_perftest -m cuda,cuda beside them. Writes the daemons' logs to $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpumove-gpu}
mkdir -p "$OUT"
source deploy/gpu/cuda_aware_env.sh
[ "$CUDA_AWARE_OK" = 1 ] || { echo "SKIPPED: no .gpu/cuda-aware-*.tar.xz (see pack.sh)"; exit 0; }
echo "== ucx_info: CUDA transports"
ucx_info -v | head -3
ucx_info -d | grep -E 'Transport|Memory domain' | sort | uniq -c | head -20
D=.gpu/bin/gpumoved
CTL=.gpu/bin/gpumovectl
start() {  # name port extra...
  local name=$1 port=$2
  shift 2
  UCX_LOG_LEVEL=info UCX_PROTO_INFO=y UCX_PROTO_ENABLE=y \
    "$D" --node="$name" --listen=127.0.0.1:"$port" --host_pool_size=64MiB \
    --pinned_pool_size=256MiB --device_pool_size=2GiB --heartbeat=200ms "$@" \
    >"$OUT/ca_$name.log" 2>&1 &
}
start a 7701
sleep 2
start b 7702 --peers=127.0.0.1:7701
for i in $(seq 50); do
  "$CTL" --addr 127.0.0.1:7701 peers 2>/dev/null | grep -q "b.*up" && break
  sleep 0.2
done
echo "== node a's info"
"$CTL" --addr 127.0.0.1:7701 info | grep -iE 'ucx|mpi|cuda|path|gpu' | head -20
for size in 4MiB 64MiB 256MiB; do
  src=$("$CTL" --addr 127.0.0.1:7701 alloc "$size" --kind device)
  dst=$("$CTL" --addr 127.0.0.1:7702 alloc "$size" --kind device)
  for r in 1 2 3; do
    echo "-- $size device a -> device b, path ucx, round $r"
    "$CTL" --addr 127.0.0.1:7701 move "$src" "b/$dst" --path ucx
  done
  "$CTL" --addr 127.0.0.1:7701 release "$src" >/dev/null
  "$CTL" --addr 127.0.0.1:7702 release "$dst" >/dev/null
done
kill %1 %2 2>/dev/null
wait
echo "== what UCX chose (node a)"
grep -E 'UCX|ucp|proto|cuda|select|lane|rndv|md ' "$OUT/ca_a.log" | grep -vE '^\s*$' | head -120
echo "== gpumoved's own lines about UCX (node a)"
grep -iE 'cuda-aware|direct|device memory|ucx' "$OUT/ca_a.log" | grep -v '^\[' | head -20
echo "== ucx_perftest put_bw cuda,cuda 64 MiB"
(ucx_perftest -t ucp_put_bw -m cuda,cuda -s 67108864 -n 50 -p 23456 >/dev/null 2>&1 &)
sleep 1
ucx_perftest 127.0.0.1 -t ucp_put_bw -m cuda,cuda -s 67108864 -n 50 -p 23456 2>&1 | tail -3
