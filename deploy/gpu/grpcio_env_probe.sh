#!/usr/bin/env bash
# On the GPU machine (after pack.sh): grpcio's own floor for a 4 KiB Submit+wait under
# several gRPC environment settings, beside the C++ client (docs/python.md, "Speed").
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/.gpu/lib
.gpu/bin/gpumoved --listen=127.0.0.1:7901 --host_pool_size=64MiB --pinned_pool_size=16MiB >/tmp/d.log 2>&1 &
daemon=$!
sleep 2
for e in "" "GRPC_EXPERIMENTS=-event_engine_client" \
         "GRPC_EXPERIMENTS=-event_engine_client,-event_engine_listener,-event_engine_dns" \
         "GRPC_POLL_STRATEGY=poll"; do
  echo "[${e:-defaults}]"
  env $e PYTHONPATH="$PWD/.gpu/python:$PWD/.gpu/python/tests" python3 .gpu/python/bench.py \
    --addr 127.0.0.1:7901 --grpcio_only --small 2000 2>&1 | tail -1
done
.gpu/bin/client_probe --addr=127.0.0.1:7901 --kind=host --small_moves=2000 \
  --big_size=1048576 --big_moves=1 | head -1
kill $daemon
