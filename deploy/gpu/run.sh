#!/usr/bin/env bash
# Runs on the GPU machine from a carried .gpu/ (see pack.sh): the GPU test suite, then
# the GPU and host benchmarks; prints a summary. Exit status: the test suite's.
# gpumove-bench's runs also go to $OUT/*.json: `gpumove-bench plot $OUT/*.json -o DIR`
# (here, with matplotlib) draws them.
# The whole run takes about 7.5 minutes (a device call may last 10): PARTS picks sections,
# e.g. PARTS="tests mpi" (tests gpu mpidev mpi staged host node; default all of them;
# tcpscale only when named).
# ROUNDS=N runs the host MPI and node-to-node benchmarks N times per size, gpumove and the
# baselines taking turns, and prints medians (this machine's speed drifts between runs);
# MPI_ARGS, NODE_ARGS and VEC_ARGS add flags to them, e.g. NODE_ARGS=--node_min_size=1MiB.
set -uo pipefail
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH="$PWD/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export GPUMOVED="$PWD/.gpu/bin/gpumoved"
# Baselines carried by pack.sh (the machine has none of them).
export PATH="$PWD/.gpu/tools:$PATH"
OUT=${OUT:-/tmp/gpumove-gpu}
mkdir -p "$OUT"
PARTS=${PARTS:-tests gpu mpidev mpi staged host node}
ROUNDS=${ROUNDS:-1}
read -r -a MPI_EXTRA <<< "${MPI_ARGS:-}"
read -r -a NODE_EXTRA <<< "${NODE_ARGS:-}"
read -r -a VEC_EXTRA <<< "${VEC_ARGS:-}"
# Whether section $1 runs; prints how long the run has taken so far.
part() {
  [[ " $PARTS " == *" $1 "* ]] || return 1
  echo "-- $1 at ${SECONDS}s"
}
tests_rc=0
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv | tee "$OUT/gpus.txt"
# What decides how Open MPI moves bytes between two ranks here: single copy (CMA needs
# ptrace rights between the ranks) or copy-in/copy-out through shared memory.
{ echo "kernel.yama.ptrace_scope=$(cat /proc/sys/kernel/yama/ptrace_scope 2>/dev/null || echo none)"
  ompi_info --param btl vader --level 9 2>/dev/null | grep -E 'single_copy_mechanism' | head -2
  nproc; } 2>&1 | tee -a "$OUT/gpus.txt"

summary() {
  passed=$(cat "$OUT"/gpu_*_test.log 2>/dev/null | grep -c '\[       OK \]')
  failed=$(cat "$OUT"/gpu_*_test.log 2>/dev/null | grep -c '\[  FAILED  \].*(')
  echo "GPU suite: $passed passed, $failed failed"
}

if part tests; then
echo "== GPU test suite"
.gpu/bin/gpu_local_test --gtest_output=xml:"$OUT/gpu_local_test.xml" 2>&1 | tee "$OUT/gpu_local_test.log" | grep -vE '^(gpu|  )'
tests_rc=${PIPESTATUS[0]}
.gpu/bin/gpu_staging_test --gtest_output=xml:"$OUT/gpu_staging_test.xml" 2>&1 | tee "$OUT/gpu_staging_test.log" | grep -vE '^(  )'
[ "${PIPESTATUS[0]}" = 0 ] || tests_rc=1
export GPU_IPC_CLIENT="$PWD/.gpu/bin/gpu_ipc_client"
.gpu/bin/gpu_ipc_test --gtest_output=xml:"$OUT/gpu_ipc_test.xml" 2>&1 | tee "$OUT/gpu_ipc_test.log" | grep -E '^\[|Failure|Expected|Which|error|MPI path'
[ "${PIPESTATUS[0]}" = 0 ] || tests_rc=1
summary
fi

if part gpu; then
echo "== GPU local benchmark (LOCAL and CUDA_IPC against cudaMemcpyAsync)"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
cases="pinned_to_device device_to_pinned"
[ "$gpus" -gt 1 ] && cases="device $cases both_ways ipc"
for c in $cases; do
  .gpu/bin/gpumove-bench gpu_local --gl_case="$c" --dst_device=$((gpus > 1 ? 1 : 0)) \
    --gpu_min_size=4KiB --gpu_max_size=1GiB --seconds=0.2 --json="$OUT/gpu_local_$c.json" 2>&1 |
    tee "$OUT/gpu_local_$c.txt"
done
fi
netpipe=$(command -v NPopenmpi >/dev/null && echo true || echo false)
if part mpidev; then
echo "== path MPI benchmark, GPU0 -> GPU1 staged through pinned buffers (two ranks)"
.gpu/bin/gpumove-bench mpi --mpi_device --seconds=0.3 --rounds=1 --mpi_max_size=1GiB --netpipe=$netpipe \
  --json="$OUT/mpi_device.json" 2>&1 | tee "$OUT/mpi_device.txt"
fi
if part mpi; then
echo "== path MPI benchmark, host memory (two ranks)"
.gpu/bin/gpumove-bench mpi --seconds=0.3 --netpipe=$netpipe --rounds="$ROUNDS" --json="$OUT/mpi.json" \
  "${MPI_EXTRA[@]}" 2>&1 | tee "$OUT/mpi.txt"
fi
if part staged; then
echo "== staged UCX benchmark (two daemons, each stage alone and the pipeline)"
.gpu/bin/gpumove-bench staged --gpu_min_size=16MiB --rounds=5 --json="$OUT/staged.json" 2>&1 |
  tee "$OUT/staged.txt"
# The same pipeline without the daemon (one process, spinning threads, no calls): the
# ceiling of the staged structure on this host, beside the daemon's figures above.
if command -v nvcc >/dev/null; then
  echo "== raw staged pipeline (no daemon), for comparison"
  nvcc -O2 -std=c++17 -I. -DGPUMOVE_HAVE_CUDA -o /tmp/gpumove_raw_pipeline deploy/gpu/raw_pipeline.cu &&
    /tmp/gpumove_raw_pipeline 2>&1 | tee "$OUT/raw_pipeline.txt"
fi
fi
if part host; then
echo "== host local benchmark"
.gpu/bin/gpumove-bench local --seconds=0.3 --max_size=1GiB --json="$OUT/local.json" 2>&1 |
  tee "$OUT/local.txt"
fi

if part node; then
# The daemons and ucx_perftest on the carried UCX (that of the build machine), when there.
ucx_lib="$PWD/.gpu/ucx:$LD_LIBRARY_PATH"
[ -e .gpu/ucx/libucp.so.0 ] || ucx_lib=$LD_LIBRARY_PATH
echo "== node-to-node benchmark (two daemons on this host, UCX shared memory)"
LD_LIBRARY_PATH=$ucx_lib .gpu/bin/gpumove-bench node --seconds=0.3 --rounds="$ROUNDS" \
  --node_min_size=4KiB --node_max_size=256MiB --json="$OUT/node.json" "${NODE_EXTRA[@]}" 2>&1 |
  tee "$OUT/node.txt"
echo "== node-to-node benchmark (two daemons on this host, UCX over TCP)"
LD_LIBRARY_PATH=$ucx_lib .gpu/bin/gpumove-bench node --ucx_tls=tcp --seconds=0.3 --rounds="$ROUNDS" \
  --node_min_size=1MiB --node_max_size=256MiB --json="$OUT/node_tcp.json" "${NODE_EXTRA[@]}" 2>&1 |
  tee "$OUT/node_tcp.txt"
fi

# Opt-in (PARTS=direct): the direct UCX path's GPU tests under the CUDA-aware stack of
# ../shared/cuda-aware (carried by pack.sh), then its figures (deploy/gpu/direct_bench.sh).
if part direct; then
echo "== GPU suite, direct UCX and MPI paths (CUDA-aware UCX and Open MPI)"
( export GPU_IPC_CLIENT="$PWD/.gpu/bin/gpu_ipc_client"
  source deploy/gpu/cuda_aware_env.sh
  if [ "$CUDA_AWARE_OK" = 1 ]; then
    .gpu/bin/gpu_direct_test --gtest_output=xml:"$OUT/gpu_direct_test.xml" 2>&1 |
      tee "$OUT/gpu_direct_test.log" | grep -E '^\[|Failure|Expected|Which|SKIPPED|error'
  else
    echo "SKIPPED: no .gpu/cuda-aware-*.tar.xz (see pack.sh)"
  fi )
summary
fi

# Opt-in (PARTS=security): security on against off (mTLS and the cluster secret).
if part security; then
echo "== security on against off"
.gpu/bin/gpumove-bench tls --rounds=3 --tls_small_moves=3000 --json="$OUT/tls.json" 2>&1 |
  tee "$OUT/tls.txt"
echo "== the cluster secret alone on against off"
.gpu/bin/gpumove-bench tls --rounds=3 --tls_small_moves=3000 --tls_big_moves=1 --secured=secret \
  --json="$OUT/tls_secret.json" 2>&1 | tee "$OUT/tls_secret.txt"
fi

# Opt-in (PARTS=vectored): vectored moves on the host paths (LOCAL, UCX a -> b) against one
# contiguous move, a gather memcpy and separate specs (gpumove-bench vectored); PARTS=vecdev:
# GPU memory (LOCAL device, pinned <-> device, CUDA_IPC) against the same-process gather
# kernel (deploy/gpu/raw_gather.cu) as well; VEC_ARGS adds flags (e.g. --dst_device=1).
if part vectored; then
echo "== vectored moves, host paths"
for c in local ucx; do
  .gpu/bin/gpumove-bench vectored --vec_case=$c --rounds=5 --json="$OUT/vectored_$c.json" \
    "${VEC_EXTRA[@]}" 2>&1 | tee "$OUT/vectored_$c.txt"
done
fi
if part vecdev; then
echo "== vectored moves with GPU memory against the same-process gather kernel"
nvcc -O3 -std=c++17 -o /tmp/gpumove_raw_gather deploy/gpu/raw_gather.cu
for c in device pinned_to_device device_to_pinned ipc; do
  .gpu/bin/gpumove-bench vectored --vec_case=$c --rounds=5 --raw_gather=/tmp/gpumove_raw_gather \
    --json="$OUT/vectored_$c.json" "${VEC_EXTRA[@]}" 2>&1 | tee "$OUT/vectored_$c.txt"
done
fi

# Opt-in (PARTS=python): the Python client's CUDA calls (register a torch tensor, open a
# daemon buffer as a tensor, GPU -> GPU and vectored moves) with this machine's torch.
if part python; then
echo "== Python client on the GPU"
GPUMOVE_EXAMPLES="$PWD/.gpu/python/examples" \
  PYTHONPATH="$PWD/.gpu/python:$PWD/.gpu/python/tests" python3 .gpu/python/tests/gpu_check.py 2>&1 |
  tee "$OUT/python_gpu.txt"
echo "== Python client against the C++ client, a numpy copy and a grpcio echo"
.gpu/bin/gpumove-bench python --python_path="$PWD/.gpu/python" --py_max_size=256MiB \
  --json="$OUT/python.json" 2>&1 | tee "$OUT/python.txt"
fi

# Opt-in (PARTS=kv): issue 55, examples/python/disaggregated.py with this machine's torch and
# transformers (LlamaForCausalLM, 16 layers, hidden 2048, GQA 16:4, seeded random weights):
# tokens against one process, then per-layer move times, the Python cost per layer and TTFT
# for layer-wise and whole-cache pushing, over two daemons (CUDA_IPC) and one (LOCAL).
if part kv; then
for how in two-daemons one-daemon; do
  echo "== examples/python/disaggregated.py on the GPU, $how"
  flag=(); [ "$how" = one-daemon ] && flag=(--one-daemon)
  PYTHONPATH="$PWD/.gpu/python" python3 .gpu/python/examples/disaggregated.py \
    --gpumoved "$GPUMOVED" "${flag[@]}" --device cuda --size gpu --prompts 16,100,1000,4000 \
    --steps 16 --repeat 7 2>&1 | grep -v '^decode: ' | tee -a "$OUT/kv.txt"
done
fi

# Opt-in (PARTS=tcpscale): how loopback TCP scales with connections and threads: N
# ucx_perftest pairs at once (512 KiB segments, 4 MiB puts, 1 GiB each) and iperf3 -P N,
# summed: the ceiling for the daemons' UCX lanes (a context, worker, connection and
# progress thread each; gpumove-bench node runs L pairs at once for L lanes over TCP).
if part tcpscale; then
echo "== TCP with N connections at once (GB/s, summed)"
ucx_lib="$PWD/.gpu/ucx:$LD_LIBRARY_PATH"
for n in 1 2 4; do
  pids=()
  for i in $(seq "$n"); do
    port=$((23000 + i))
    LD_LIBRARY_PATH=$ucx_lib UCX_TLS=tcp UCX_TCP_TX_SEG_SIZE=512k UCX_TCP_RX_SEG_SIZE=512k \
      timeout 60 ucx_perftest -t ucp_put_bw -s 4194304 -n 256 -p "$port" >/dev/null 2>&1 &
  done
  sleep 0.5
  for i in $(seq "$n"); do
    port=$((23000 + i))
    LD_LIBRARY_PATH=$ucx_lib UCX_TLS=tcp UCX_TCP_TX_SEG_SIZE=512k UCX_TCP_RX_SEG_SIZE=512k \
      timeout 60 ucx_perftest 127.0.0.1 -t ucp_put_bw -s 4194304 -n 256 -p "$port" >"$OUT/pt_$i.txt" 2>/dev/null &
    pids+=($!)
  done
  wait "${pids[@]}"
  sleep 0.5
  pt=$(cat "$OUT"/pt_*.txt | awk '/Final:/ {s += $7 * 1048576 / 1e9} END {printf "%.2f", s}')
  rm -f "$OUT"/pt_*.txt
  timeout 20 iperf3 -s -1 -p 23100 >/dev/null 2>&1 &
  sleep 0.3
  ip=$(timeout 20 iperf3 -c 127.0.0.1 -p 23100 -t 2 -P "$n" -f g 2>/dev/null |
       awk '/receiver/ {v = $(NF-2)} END {printf "%.2f", v / 8}')
  wait
  echo "connections $n: ucx_perftest $pt GB/s, iperf3 $ip GB/s"
done
fi

echo "-- done at ${SECONDS}s"
summary
exit "$tests_rc"
