#!/usr/bin/env bash
# Runs a command under CUDA MPS: a private MPS control daemon (its own pipe and log
# directories, stopped when the command ends; the GPU's settings are left as they are).
# Without MPS, kernels of two processes on one GPU take turns in time slices; with it they
# run together, as they would on two GPUs. For one-GPU measurements of paths that run
# kernels in both daemons (vectored MPI, staged vectored moves).
#   bash deploy/gpu/mps_run.sh COMMAND [ARGS...]
set -uo pipefail
if ! command -v nvidia-cuda-mps-control >/dev/null; then
  echo "SKIPPED: nvidia-cuda-mps-control is not on this machine"; exit 0
fi
CUDA_MPS_PIPE_DIRECTORY=$(mktemp -d /tmp/gpumove-mps-pipe.XXXXXX)
CUDA_MPS_LOG_DIRECTORY=$(mktemp -d /tmp/gpumove-mps-log.XXXXXX)
export CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d || { echo "FAIL: the MPS control daemon did not start"; exit 1; }
stop() {
  echo quit | nvidia-cuda-mps-control
  for _ in $(seq 50); do pgrep -f nvidia-cuda-mps >/dev/null || break; sleep 0.1; done
  # Whether the command's processes ran as MPS clients: the server's log names each one.
  echo "-- MPS logs:"
  tail -n 6 "$CUDA_MPS_LOG_DIRECTORY"/*.log 2>/dev/null
  rm -rf "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
}
trap stop EXIT
echo "-- under MPS (pipe $CUDA_MPS_PIPE_DIRECTORY)"
# A client of this daemon, or the command would run without MPS unseen.
if ! (echo get_server_list | nvidia-cuda-mps-control) >/dev/null 2>&1; then
  echo "FAIL: the MPS control daemon does not answer"; exit 1
fi
"$@"
