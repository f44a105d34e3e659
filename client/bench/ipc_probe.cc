// Why does a CUDA_IPC move copy slower than a peer copy inside one process? Copies GPU0 ->
// GPU1 of 64 MiB .. 1 GiB into (a) GPU1 memory of this process and (b) GPU1 memory of
// another process mapped through CUDA IPC (opened on GPU1's context, as gpumoved does,
// and on GPU0's), issued on either GPU's stream, whole or in the daemon's 64 MiB chunks.
// Medians of 10, GB/s.
//   bazel run //client/bench:ipc_probe      (a machine with two GPUs)
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/bench/cuda_check.h"
#include "client/bench/stream.h"

#ifdef GPUMOVE_HAVE_CUDA
#include <cuda_runtime.h>

namespace gpumove {
namespace {

constexpr size_t kMax = 1ull << 30;

// Copies `size` bytes src -> dst on `device`'s stream, `chunk` at a time with two in
// flight (as GpuRuntime::Copy does); chunk 0: one copy. Seconds, median of 10.
double Time(void* dst, const void* src, size_t size, int device, size_t chunk) {
  CHECK_CUDA(cudaSetDevice(device));
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t ev[2];
  for (auto& event : ev) CHECK_CUDA(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  if (chunk == 0) chunk = size;
  std::vector<double> t;
  for (int rep = 0; rep < 11; ++rep) {
    const absl::Time t0 = absl::Now();
    size_t issued = 0;
    int slot = 0, wait = 0;
    size_t in_flight = 0;
    while (issued < size || in_flight > 0) {
      while (issued < size && in_flight < 2) {
        const size_t n = std::min(chunk, size - issued);
        CHECK_CUDA(cudaMemcpyAsync(static_cast<char*>(dst) + issued,
                                   static_cast<const char*>(src) + issued, n, cudaMemcpyDefault,
                                   s));
        CHECK_CUDA(cudaEventRecord(ev[slot], s));
        slot ^= 1;
        issued += n;
        ++in_flight;
      }
      CHECK_CUDA(cudaEventSynchronize(ev[wait]));
      wait ^= 1;
      --in_flight;
    }
    if (rep > 0) t.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
  }
  for (auto& event : ev) CHECK_CUDA(cudaEventDestroy(event));
  CHECK_CUDA(cudaStreamDestroy(s));
  return Median(t);
}

int Main() {
  int to_parent[2], to_child[2];
  if (pipe(to_parent) != 0 || pipe(to_child) != 0) return 1;
  const pid_t child = fork();
  if (child == 0) {  // The other daemon: owns GPU1 memory and exports it.
    CHECK_CUDA(cudaSetDevice(1));
    void* mem = nullptr;
    CHECK_CUDA(cudaMalloc(&mem, kMax));
    cudaIpcMemHandle_t h;
    CHECK_CUDA(cudaIpcGetMemHandle(&h, mem));
    (void)!write(to_parent[1], &h, sizeof(h));
    char done;
    (void)!read(to_child[0], &done, 1);
    _exit(0);
  }
  cudaIpcMemHandle_t h;
  if (read(to_parent[0], &h, sizeof(h)) != sizeof(h)) return 1;
  // As gpumoved at start: peer access both ways.
  for (int i = 0; i < 2; ++i) {
    CHECK_CUDA(cudaSetDevice(i));
    cudaError_t e = cudaDeviceEnablePeerAccess(1 - i, 0);
    if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) CHECK_CUDA(e);
    cudaGetLastError();
  }
  void *src = nullptr, *native = nullptr, *ipc1 = nullptr, *ipc0 = nullptr;
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaMalloc(&src, kMax));
  CHECK_CUDA(cudaMemset(src, 1, kMax));
  CHECK_CUDA(cudaSetDevice(1));
  CHECK_CUDA(cudaMalloc(&native, kMax));
  CHECK_CUDA(cudaIpcOpenMemHandle(&ipc1, h, cudaIpcMemLazyEnablePeerAccess));
  CHECK_CUDA(cudaSetDevice(0));
  cudaError_t e0 = cudaIpcOpenMemHandle(&ipc0, h, cudaIpcMemLazyEnablePeerAccess);
  if (e0 != cudaSuccess) {
    std::cout << "opening the handle on GPU0's context too: " << cudaGetErrorString(e0) << "\n";
    cudaGetLastError();
    ipc0 = nullptr;
  }
  std::cout << "GPU0 -> GPU1, GB/s (medians of 10)\n";
  std::cout << absl::StrFormat("%8s %10s %10s %10s %10s %10s %10s %10s\n", "size", "native",
                               "native@1", "ipc1", "ipc1@1", "ipc1 64M", "ipc0", "ipc0 64M");
  for (size_t size = 64ull << 20; size <= kMax; size *= 4) {
    auto bw = [&](void* dst, int device, size_t chunk) {
      return dst == nullptr ? 0.0 : size / Time(dst, src, size, device, chunk) / 1e9;
    };
    std::cout << absl::StrFormat(
        "%7lluM %10.1f %10.1f %10.1f %10.1f %10.1f %10.1f %10.1f\n",
        static_cast<unsigned long long>(size >> 20), bw(native, 0, 0), bw(native, 1, 0),
        bw(ipc1, 0, 0), bw(ipc1, 1, 0), bw(ipc1, 0, 64 << 20), bw(ipc0, 0, 0),
        bw(ipc0, 0, 64 << 20));
  }
  (void)!write(to_child[1], "x", 1);
  waitpid(child, nullptr, 0);
  return 0;
}

}  // namespace
}  // namespace gpumove

int main() { return gpumove::Main(); }
#else
int main() {
  std::cout << "ipc_probe: built without the CUDA toolkit\n";
  return 0;
}
#endif
