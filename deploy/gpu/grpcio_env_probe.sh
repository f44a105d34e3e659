export LD_LIBRARY_PATH=$PWD/.gpu/lib
.gpu/bin/gpumoved --listen=127.0.0.1:7901 --host_pool_size=64MiB --pinned_pool_size=16MiB >/tmp/d.log 2>&1 &
sleep 2
P="env PYTHONPATH=$PWD/.gpu/python python3 .gpu/python/grpcio_latency.py 127.0.0.1:7901"
for e in "" "GRPC_EXPERIMENTS=-event_engine_client" "GRPC_EXPERIMENTS=-event_engine_client,-event_engine_listener,-event_engine_dns" "GRPC_POLL_STRATEGY=poll" "GRPC_ENABLE_FORK_SUPPORT=0"; do
  echo "[$e]"; env $e $P 2>&1 | tail -1
done
LD_LIBRARY_PATH=$PWD/.gpu/lib .gpu/bin/client_probe --addr=127.0.0.1:7901 --kind=host --small_moves=2000 --big_size=1048576 --big_moves=1 | head -3
