#!/usr/bin/env bash
# Issue 27, second look: why a daemon's UCX put of device memory to another daemon's device
# memory on this host takes "software emulation" while ucx_perftest's takes cuda_ipc.
# Prints ucx_perftest's protocol choice for put cuda -> cuda, then the registration and
# rkey lines of two daemons (UCX_LOG_LEVEL=debug, filtered) around one 64 MiB move.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpumove-gpu}
mkdir -p "$OUT"
source deploy/gpu/cuda_aware_env.sh
[ "$CUDA_AWARE_OK" = 1 ] || { echo "SKIPPED: no .gpu/cuda-aware-*.tar.xz (see pack.sh)"; exit 0; }
echo "== ucx_perftest put_bw cuda,cuda: protocol"
(UCX_PROTO_INFO=y ucx_perftest -t ucp_put_bw -m cuda,cuda -s 67108864 -n 20 -p 23457 >"$OUT/pt_server.txt" 2>&1 &)
sleep 1
UCX_PROTO_INFO=y ucx_perftest 127.0.0.1 -t ucp_put_bw -m cuda,cuda -s 67108864 -n 20 -p 23457 >"$OUT/pt_client.txt" 2>&1
grep -E "cfg#|cuda/GPU0 to cuda|zcopy|emulation|Final" -A3 "$OUT/pt_client.txt" | head -40
D=.gpu/bin/gpumoved
CTL=.gpu/bin/gpumovectl
for variant in "" "UCX_RNDV_THRESH=inf" "UCX_MAX_RMA_LANES=4"; do
  echo "== daemons with ${variant:-no extra UCX settings}"
  env $variant UCX_LOG_LEVEL=debug "$D" --node=a --listen=127.0.0.1:7711 --host_pool_size=64MiB \
    --pinned_pool_size=64MiB --device_pool_size=512MiB --heartbeat=200ms >"$OUT/d_a.log" 2>&1 &
  pa=$!
  sleep 2
  env $variant UCX_LOG_LEVEL=debug UCX_PROTO_INFO=y "$D" --node=b --listen=127.0.0.1:7712 \
    --host_pool_size=64MiB --pinned_pool_size=64MiB --device_pool_size=512MiB --heartbeat=200ms \
    --peers=127.0.0.1:7711 >"$OUT/d_b.log" 2>&1 &
  pb=$!
  for i in $(seq 50); do
    "$CTL" --addr 127.0.0.1:7712 peers 2>/dev/null | grep -q "a" && break
    sleep 0.2
  done
  sleep 1
  src=$("$CTL" --addr 127.0.0.1:7712 alloc 64MiB --kind device)
  dst=$("$CTL" --addr 127.0.0.1:7711 alloc 64MiB --kind device)
  "$CTL" --addr 127.0.0.1:7712 move "$src" "a/$dst" --path ucx
  "$CTL" --addr 127.0.0.1:7712 move "$src" "a/$dst" --path ucx
  kill $pa $pb
  wait $pa $pb 2>/dev/null
  echo "-- node a (holder): registrations"
  grep -iE "mem_reg|memh|rkey|cuda_ipc|md_map|register" "$OUT/d_a.log" | grep -viE "^I1|tcp|sysv|posix|cma" | head -25
  echo "-- node b (runner): lanes and the put protocol"
  grep -E "cfg#|cuda/GPU0 to cuda" -A3 "$OUT/d_b.log" | grep -vE "^--$" | head -30
  grep -iE "rkey|cuda_ipc" "$OUT/d_b.log" | grep -viE "^I1" | head -15
done
