#!/usr/bin/env bash
# Proves a change to the gather kernel (daemon/gpu/gather.cu) on the GPU machine, one call
# (after pack.sh, carry .gpu): the kernel shapes side by side with every byte checked
# (gather_variants.cu), the GPU suite's vectored, prepared, cancel and checksum tests on
# LOCAL and CUDA_IPC, and the vecdev benchmark with the daemons' timings. Results in $OUT.
#   bash deploy/gpu/gather_check.sh
set -u
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/gpumove-gpu}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
nvcc -O3 -std=c++17 -I. -DGPUMOVE_HAVE_CUDA -arch=sm_90 -o /tmp/gv deploy/gpu/gather_variants.cu daemon/gpu/gather.cu && timeout 120 /tmp/gv > "$OUT"/gv.txt 2>&1
grep -E 'device->device|WRONG' "$OUT"/gv.txt
export LD_LIBRARY_PATH=$PWD/.gpu/lib GPU_IPC_CLIENT=$PWD/.gpu/bin/gpu_ipc_client GPUMOVED=$PWD/.gpu/bin/gpumoved
timeout 100 .gpu/bin/gpu_local_test --gtest_filter='*ector*:*repared*:*ancel*:*hecksum*' > "$OUT"/gpu_local_test.log 2>&1; echo "gpu_local_test rc=$?"; grep -E '^\[  (PASSED|FAILED)|FAILED  \]' "$OUT"/gpu_local_test.log
PARTS=vecdev VEC_ARGS="--trace --daemon_flags=--v=2" timeout 150 bash deploy/gpu/run.sh > "$OUT"/vecdev.txt 2>&1
grep -vE '^(GPU gather|  |\[)' "$OUT"/vecdev.txt | grep -v 'job log' | tail -22
timeout 60 .gpu/bin/gpu_ipc_test --gtest_filter="*ector*:*repared*:*ancel*" > "$OUT"/gpu_ipc_test.log 2>&1; echo "gpu_ipc_test rc=$?"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" "$OUT"/gpu_ipc_test.log
