#!/usr/bin/env bash
# Runs on the GPU machine from a carried .gpu/ (see pack.sh): the GPU test suite, then
# the GPU and host benchmarks; prints a summary. Exit status: the test suite's.
set -uo pipefail
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH="$PWD/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export GPUMOVED="$PWD/.gpu/bin/gpumoved"
OUT=${OUT:-/tmp/gpumove-gpu}
mkdir -p "$OUT"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv | tee "$OUT/gpus.txt"

echo "== GPU test suite"
.gpu/bin/gpu_local_test --gtest_output=xml:"$OUT/gpu_local_test.xml" 2>&1 | tee "$OUT/gpu_local_test.log" | grep -vE '^(gpu|  )'
tests_rc=${PIPESTATUS[0]}
.gpu/bin/gpu_staging_test --gtest_output=xml:"$OUT/gpu_staging_test.xml" 2>&1 | tee "$OUT/gpu_staging_test.log" | grep -vE '^(  )'
[ "${PIPESTATUS[0]}" = 0 ] || tests_rc=1

echo "== GPU local benchmark"
.gpu/bin/gpu_local_bench "${BENCH_ARGS[@]:-}" 2>&1 | tee "$OUT/gpu_local_bench.txt"
echo "== staged UCX benchmark (two daemons, each stage alone and the pipeline)"
.gpu/bin/gpu_staged_bench 2>&1 | tee "$OUT/gpu_staged_bench.txt"
echo "== host local benchmark"
.gpu/bin/local_bench --seconds_per_size=0.3 2>&1 | tee "$OUT/local_bench.txt"

echo "== node-to-node benchmark (two daemons on this host, UCX)"
.gpu/bin/node_bench --seconds_per_size=0.3 --baselines="$(command -v ucx_perftest >/dev/null && echo true || echo false)" 2>&1 | tee "$OUT/node_bench.txt"

passed=$(cat "$OUT"/gpu_*_test.log | grep -c '\[       OK \]')
failed=$(cat "$OUT"/gpu_*_test.log | grep -c '\[  FAILED  \].*(')
echo "GPU suite: $passed passed, $failed failed"
exit "$tests_rc"
