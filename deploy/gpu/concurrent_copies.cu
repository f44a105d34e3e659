// The staged path's three stages as raw copies, alone and at once, on one host with two
// GPUs: device->pinned on GPU0, pinned->device on GPU1, and a host-to-host memcpy by CPU
// threads (the same-host "wire"). Shows what the host keeps up when all three run together,
// without the daemon. Built and run on the GPU machine (it has nvcc):
//   nvcc -O2 -std=c++17 -I. -DGPUMOVE_HAVE_CUDA -o /tmp/cc deploy/gpu/concurrent_copies.cu
//   /tmp/cc [MiB] [threads]      (from the repository's root)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "client/bench/cuda_check.h"

using Clock = std::chrono::steady_clock;

struct Gpu {
  int device;
  cudaStream_t stream;
  char* dev;
  char* pinned;
};

// Copies `reps` times on g's stream (d2h or h2d) and returns GB/s.
double Run(Gpu& g, bool d2h, size_t bytes, int reps) {
  CHECK_CUDA(cudaSetDevice(g.device));
  const auto t0 = Clock::now();
  for (int i = 0; i < reps; ++i) {
    CHECK_CUDA(cudaMemcpyAsync(d2h ? g.pinned : g.dev, d2h ? g.dev : g.pinned, bytes,
                               d2h ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, g.stream));
  }
  CHECK_CUDA(cudaStreamSynchronize(g.stream));
  return bytes * double(reps) / std::chrono::duration<double>(Clock::now() - t0).count() / 1e9;
}

// `threads` CPU threads each copy their share of `bytes` from src to dst `reps` times;
// returns GB/s over the time they ran.
double Memcpy(char* dst, const char* src, size_t bytes, int threads, int reps) {
  std::vector<std::thread> ts;
  const size_t share = bytes / threads;
  const auto t0 = Clock::now();
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < reps; ++i) std::memcpy(dst + t * share, src + t * share, share);
    });
  }
  for (auto& t : ts) t.join();
  return share * double(threads) * reps /
         std::chrono::duration<double>(Clock::now() - t0).count() / 1e9;
}

int main(int argc, char** argv) {
  const size_t bytes = (argc > 1 ? std::atoll(argv[1]) : 64) << 20;
  const int threads = argc > 2 ? std::atoi(argv[2]) : 8;
  const int reps = 40;
  Gpu g[2];
  for (int d = 0; d < 2; ++d) {
    g[d].device = d;
    CHECK_CUDA(cudaSetDevice(d));
    CHECK_CUDA(cudaStreamCreateWithFlags(&g[d].stream, cudaStreamNonBlocking));
    CHECK_CUDA(cudaMalloc(&g[d].dev, bytes));
    CHECK_CUDA(cudaMallocHost(&g[d].pinned, bytes));
    std::memset(g[d].pinned, d + 1, bytes);
  }
  std::vector<char> a(bytes, 3), b(bytes, 4);
  for (int round = 0; round < 3; ++round) {
    const double d2h = Run(g[0], true, bytes, reps);
    const double h2d = Run(g[1], false, bytes, reps);
    const double wire = Memcpy(b.data(), a.data(), bytes, threads, reps);
    double both_d2h = 0, both_h2d = 0;
    {
      std::thread t([&] { both_h2d = Run(g[1], false, bytes, reps); });
      both_d2h = Run(g[0], true, bytes, reps);
      t.join();
    }
    double all_d2h = 0, all_h2d = 0, all_wire = 0;
    {
      std::thread t1([&] { all_h2d = Run(g[1], false, bytes, reps); });
      std::thread t2([&] { all_wire = Memcpy(b.data(), a.data(), bytes, threads, reps); });
      all_d2h = Run(g[0], true, bytes, reps);
      t1.join();
      t2.join();
    }
    std::printf(
        "%zu MiB, %d memcpy threads: alone d2h %.1f h2d %.1f wire %.1f | d2h+h2d %.1f %.1f | "
        "all three %.1f %.1f %.1f GB/s\n",
        bytes >> 20, threads, d2h, h2d, wire, both_d2h, both_h2d, all_d2h, all_h2d, all_wire);
  }
  return 0;
}
