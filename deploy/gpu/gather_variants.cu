// Gather kernel shapes side by side, one process, CUDA events: the daemon's kernel
// (daemon/gpu/gather.cu, GatherPiece descriptors), the one it had before and other shapes
// against the raw gather of the benchmark's baseline (b) (deploy/gpu/raw_gather.cu: a
// thread block of 256 per block, one 16-byte load and store a thread a turn). 65536 x 4 KiB
// and 8192 x 64 KiB shuffled blocks, device->device, pinned->device and device->pinned;
// every shape's bytes are checked against a gather on the host. Prints "variant <name>
// <direction> <count> x <KiB> KiB: <GB/s> median" lines. Built and run on the GPU machine:
//   nvcc -O3 -std=c++17 -I. -DGPUMOVE_HAVE_CUDA -o /tmp/gather_variants \
//     deploy/gpu/gather_variants.cu daemon/gpu/gather.cu && /tmp/gather_variants
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "daemon/gpu/gather.h"
#include "deploy/gpu/raw_gather.h"

using gpumove::GatherPiece;

// The daemon's kernel before: a thread block of 256 per piece, one load a thread a turn.
__global__ void Before(const GatherPiece* pieces, const char* src, char* dst) {
  const GatherPiece p = pieces[blockIdx.x];
  const char* s = src + p.src;
  char* d = dst + p.dst;
  uint64_t len = p.length;
  const uint64_t s_mis = reinterpret_cast<uintptr_t>(s) & 15;
  if (s_mis == (reinterpret_cast<uintptr_t>(d) & 15)) {
    const uint64_t head = s_mis == 0 ? 0 : (len < 16 - s_mis ? len : 16 - s_mis);
    if (threadIdx.x < head) d[threadIdx.x] = s[threadIdx.x];
    s += head;
    d += head;
    len -= head;
    const uint64_t vectors = len / 16;
    const uint4* s4 = reinterpret_cast<const uint4*>(s);
    uint4* d4 = reinterpret_cast<uint4*>(d);
    for (uint64_t i = threadIdx.x; i < vectors; i += 256) d4[i] = s4[i];
    const uint64_t tail = len - vectors * 16;
    if (threadIdx.x < tail) d[vectors * 16 + threadIdx.x] = s[vectors * 16 + threadIdx.x];
    return;
  }
  for (uint64_t i = threadIdx.x; i < len; i += 256) d[i] = s[i];
}

// A block of kThreads per piece, U loads in flight a thread before the stores.
template <int kThreads, int U>
__global__ void BlockUnrolled(const GatherPiece* pieces, const char* src, char* dst) {
  const GatherPiece p = pieces[blockIdx.x];
  const uint4* s4 = reinterpret_cast<const uint4*>(src + p.src);
  uint4* d4 = reinterpret_cast<uint4*>(dst + p.dst);
  const uint64_t vectors = p.length / 16;
  uint64_t i = threadIdx.x;
  for (; i + (U - 1) * kThreads < vectors; i += U * kThreads) {
    uint4 r[U];
#pragma unroll
    for (int u = 0; u < U; ++u) r[u] = s4[i + u * kThreads];
#pragma unroll
    for (int u = 0; u < U; ++u) d4[i + u * kThreads] = r[u];
  }
  for (; i < vectors; i += kThreads) d4[i] = s4[i];
}

// A warp per piece, U loads in flight a lane before the stores.
template <int U>
__global__ void WarpUnrolled(const GatherPiece* pieces, uint64_t n, const char* src, char* dst) {
  const uint64_t w = (static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const unsigned lane = threadIdx.x & 31;
  if (w >= n) return;
  const GatherPiece p = pieces[w];
  const uint4* s4 = reinterpret_cast<const uint4*>(src + p.src);
  uint4* d4 = reinterpret_cast<uint4*>(dst + p.dst);
  const uint64_t vectors = p.length / 16;
  uint64_t i = lane;
  for (; i + (U - 1) * 32 < vectors; i += U * 32) {
    uint4 r[U];
#pragma unroll
    for (int u = 0; u < U; ++u) r[u] = s4[i + u * 32];
#pragma unroll
    for (int u = 0; u < U; ++u) d4[i + u * 32] = r[u];
  }
  for (; i < vectors; i += 32) d4[i] = s4[i];
}

int main() {
  struct Shape {
    unsigned long long block;
    size_t count;
  };
  const size_t max_bytes = 1024ull << 20;
  char *dev_a, *dev_b, *host, *host_dev = nullptr;
  CHECK(cudaMalloc(&dev_a, max_bytes));
  CHECK(cudaMalloc(&dev_b, max_bytes));
  CHECK(cudaHostAlloc(&host, max_bytes, cudaHostAllocMapped));
  CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&host_dev), host, 0));
  {
    std::vector<unsigned long long> pattern(max_bytes / 8);
    std::mt19937_64 rng(7);
    for (auto& w : pattern) w = rng();
    CHECK(cudaMemcpy(dev_a, pattern.data(), max_bytes, cudaMemcpyHostToDevice));
    std::memcpy(host, pattern.data(), max_bytes);
  }
  std::vector<char> want(max_bytes), got(max_bytes);
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  for (const Shape& shape : {Shape{4096, 65536}, Shape{65536, 8192}}) {
    std::vector<unsigned long long> si(shape.count), di(shape.count);
    std::iota(si.begin(), si.end(), 0);
    std::iota(di.begin(), di.end(), 0);
    std::mt19937_64 rng(shape.block);
    std::shuffle(si.begin(), si.end(), rng);
    std::shuffle(di.begin(), di.end(), rng);
    std::vector<GatherPiece> pieces(shape.count);
    for (size_t i = 0; i < shape.count; ++i) {
      pieces[i] = GatherPiece{si[i] * shape.block, di[i] * shape.block, shape.block};
    }
    unsigned long long *dsi, *ddi;
    GatherPiece* dp;
    CHECK(cudaMalloc(&dsi, shape.count * 8));
    CHECK(cudaMalloc(&ddi, shape.count * 8));
    CHECK(cudaMalloc(&dp, shape.count * sizeof(GatherPiece)));
    CHECK(cudaMemcpy(dsi, si.data(), shape.count * 8, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(ddi, di.data(), shape.count * 8, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dp, pieces.data(), shape.count * sizeof(GatherPiece), cudaMemcpyHostToDevice));
    const size_t bytes = shape.block * shape.count;
    const unsigned n = static_cast<unsigned>(shape.count);
    struct Way {
      const char* name;
      const char* src;
      char* dst;
      char* dst_host;  // Where the destination's bytes are read back from, or null (device).
    };
    for (const Way& w :
         {Way{"device->device", dev_a, dev_b, nullptr},
          Way{"pinned->device", host_dev, dev_b, nullptr},
          Way{"device->pinned", dev_a, host_dev + max_bytes / 2, host + max_bytes / 2}}) {
      if (bytes > max_bytes / 2) std::exit(2);
      struct Variant {
        const char* name;
        void (*launch)(const Way&, const unsigned long long*, const unsigned long long*,
                       const GatherPiece*, unsigned, unsigned long long, cudaStream_t);
      };
      const Variant variants[] = {
          {"raw(b)",
           [](const Way& w, const unsigned long long* a, const unsigned long long* b,
              const GatherPiece*, unsigned n, unsigned long long block,
              cudaStream_t st) { GatherBlocks<<<n, 256, 0, st>>>(a, b, block, w.src, w.dst); }},
          {"daemon", [](const Way& w, const unsigned long long*, const unsigned long long*,
                        const GatherPiece* p, unsigned n, unsigned long long,
                        cudaStream_t st) { gpumove::LaunchGather(p, n, w.src, w.dst, st); }},
          {"before", [](const Way& w, const unsigned long long*, const unsigned long long*,
                        const GatherPiece* p, unsigned n, unsigned long long,
                        cudaStream_t st) { Before<<<n, 256, 0, st>>>(p, w.src, w.dst); }},
          {"block128x2",
           [](const Way& w, const unsigned long long*, const unsigned long long*,
              const GatherPiece* p, unsigned n, unsigned long long,
              cudaStream_t st) { BlockUnrolled<128, 2><<<n, 128, 0, st>>>(p, w.src, w.dst); }},
          {"block64x4",
           [](const Way& w, const unsigned long long*, const unsigned long long*,
              const GatherPiece* p, unsigned n, unsigned long long,
              cudaStream_t st) { BlockUnrolled<64, 4><<<n, 64, 0, st>>>(p, w.src, w.dst); }},
          {"warp_x4",
           [](const Way& w, const unsigned long long*, const unsigned long long*,
              const GatherPiece* p, unsigned n, unsigned long long, cudaStream_t st) {
             WarpUnrolled<4><<<(n * 32 + 255) / 256, 256, 0, st>>>(p, n, w.src, w.dst);
           }},
          {"warp_x8",
           [](const Way& w, const unsigned long long*, const unsigned long long*,
              const GatherPiece* p, unsigned n, unsigned long long, cudaStream_t st) {
             WarpUnrolled<8><<<(n * 32 + 255) / 256, 256, 0, st>>>(p, n, w.src, w.dst);
           }},
      };
      for (const Variant& v : variants) {
        // Wipe the destination, copy once, check every byte against a host gather.
        if (w.dst_host != nullptr) {
          std::memset(w.dst_host, 0, bytes);
        } else {
          CHECK(cudaMemset(w.dst, 0, bytes));
        }
        v.launch(w, dsi, ddi, dp, n, shape.block, stream);
        CHECK(cudaGetLastError());
        CHECK(cudaStreamSynchronize(stream));
        if (w.dst_host != nullptr) {
          std::memcpy(got.data(), w.dst_host, bytes);
        } else {
          CHECK(cudaMemcpy(got.data(), w.dst, bytes, cudaMemcpyDeviceToHost));
        }
        const char* from = w.src == host_dev ? host : nullptr;
        std::vector<char> source;
        if (from == nullptr) {
          source.resize(bytes);
          CHECK(cudaMemcpy(source.data(), w.src, bytes, cudaMemcpyDeviceToHost));
          from = source.data();
        }
        for (size_t i = 0; i < shape.count; ++i) {
          std::memcpy(want.data() + di[i] * shape.block, from + si[i] * shape.block, shape.block);
        }
        const bool same = std::memcmp(got.data(), want.data(), bytes) == 0;
        std::vector<double> rates;
        for (int r = 0; r < 12; ++r) {
          CHECK(cudaEventRecord(start, stream));
          v.launch(w, dsi, ddi, dp, n, shape.block, stream);
          CHECK(cudaEventRecord(stop, stream));
          CHECK(cudaEventSynchronize(stop));
          float ms = 0;
          CHECK(cudaEventElapsedTime(&ms, start, stop));
          if (r > 1) rates.push_back(static_cast<double>(bytes) / (ms / 1e3) / 1e9);
        }
        // The same launches one at a time after the GPU idled 1 ms (as a daemon's move
        // comes after an RPC), timed by events and by the host from launch to sync.
        std::vector<double> idle, host_timed;
        for (int r = 0; r < 10; ++r) {
          const auto pause = std::chrono::steady_clock::now() + std::chrono::milliseconds(1);
          while (std::chrono::steady_clock::now() < pause) {
          }
          const auto t0 = std::chrono::steady_clock::now();
          CHECK(cudaEventRecord(start, stream));
          v.launch(w, dsi, ddi, dp, n, shape.block, stream);
          CHECK(cudaEventRecord(stop, stream));
          CHECK(cudaEventSynchronize(stop));
          const double s =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          float ms = 0;
          CHECK(cudaEventElapsedTime(&ms, start, stop));
          idle.push_back(static_cast<double>(bytes) / (ms / 1e3) / 1e9);
          host_timed.push_back(static_cast<double>(bytes) / s / 1e9);
        }
        std::sort(rates.begin(), rates.end());
        std::sort(idle.begin(), idle.end());
        std::sort(host_timed.begin(), host_timed.end());
        std::printf(
            "variant %-13s %s %zu x %llu KiB: %.1f GB/s median, %.1f best; after idle %.1f, "
            "host-timed %.1f%s\n",
            v.name, w.name, shape.count, shape.block >> 10, rates[rates.size() / 2], rates.back(),
            idle[idle.size() / 2], host_timed[host_timed.size() / 2], same ? "" : "  BYTES WRONG");
      }
    }
    CHECK(cudaFree(dsi));
    CHECK(cudaFree(ddi));
    CHECK(cudaFree(dp));
  }
  std::printf("(%d SMs)\n", sms);
  return 0;
}
