// What a gather's 1.5 MiB piece list (65536 x 24 bytes) costs the CPU on this machine:
// memcpy from the list into ordinary, page-locked and mapped page-locked memory, with the
// list hot in this thread's cache or just written by another thread, and the copy of that
// many bytes to the GPU from page-locked and from pageable memory. Medians of 21, in us.
//   nvcc -O3 -std=c++17 -o /tmp/hcp deploy/gpu/host_copy_probe.cu && /tmp/hcp
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "deploy/gpu/raw_gather.h"

namespace {

constexpr size_t kBytes = 65536 * 24;

double MedianUs(const std::function<void()>& before, const std::function<void()>& run) {
  std::vector<double> us;
  for (int r = 0; r < 21; ++r) {
    before();
    const auto t0 = std::chrono::steady_clock::now();
    run();
    us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

}  // namespace

int main() {
  std::vector<char> list(kBytes, 1), plain(kBytes, 2);
  char *pinned = nullptr, *mapped = nullptr, *dev = nullptr;
  CHECK(cudaHostAlloc(&pinned, kBytes, 0));
  CHECK(cudaHostAlloc(&mapped, kBytes, cudaHostAllocMapped | cudaHostAllocPortable));
  CHECK(cudaMalloc(&dev, kBytes));
  std::memset(pinned, 3, kBytes);
  std::memset(mapped, 4, kBytes);
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  auto hot = [&] { std::memset(list.data(), 5, kBytes); };
  auto cold = [&] { std::thread([&] { std::memset(list.data(), 6, kBytes); }).join(); };
  struct To {
    const char* name;
    char* p;
  } tos[] = {{"ordinary", plain.data()}, {"page-locked", pinned}, {"mapped", mapped}};
  for (const To& to : tos) {
    std::printf(
        "memcpy 1.5 MiB into %-12s list hot %7.1f us, list written by another thread %7.1f us\n",
        to.name, MedianUs(hot, [&] { std::memcpy(to.p, list.data(), kBytes); }),
        MedianUs(cold, [&] { std::memcpy(to.p, list.data(), kBytes); }));
  }
  std::printf("memset 1.5 MiB of page-locked %7.1f us, of ordinary %7.1f us\n",
              MedianUs([] {}, [&] { std::memset(pinned, 7, kBytes); }),
              MedianUs([] {}, [&] { std::memset(plain.data(), 7, kBytes); }));
  auto to_gpu = [&](const char* from) {
    CHECK(cudaMemcpyAsync(dev, from, kBytes, cudaMemcpyHostToDevice, s));
    CHECK(cudaStreamSynchronize(s));
  };
  std::printf(
      "1.5 MiB to the GPU: from page-locked %7.1f us, from pageable (hot) %7.1f us, "
      "(cold) %7.1f us\n",
      MedianUs([] {}, [&] { to_gpu(pinned); }), MedianUs(hot, [&] { to_gpu(list.data()); }),
      MedianUs(cold, [&] { to_gpu(list.data()); }));
  std::printf("a thread started and joined: %7.1f us\n",
              MedianUs([] {}, [] { std::thread([] {}).join(); }));
  return 0;
}
