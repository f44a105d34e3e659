// Baseline (b) of the vectored benchmark on the GPU: one gather kernel in one process (a
// thread block per block, 16-byte loads and stores; block indices already on the GPU)
// copying shuffled blocks device -> device, pinned host -> device and device -> pinned host
// (host memory reached mapped). Prints GB/s per shape and direction, best and median of 9
// CUDA-event-timed launches, as "raw_gather <direction> <count> x <KiB> KiB: <GB/s>" lines
// that deploy/gpu/run.sh sets beside the daemon's figures. Built and run on the GPU machine:
//   nvcc -O3 -std=c++17 -o /tmp/raw_gather deploy/gpu/raw_gather.cu && /tmp/raw_gather
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>

#include "raw_gather.h"

int main() {
  struct Shape {
    unsigned long long block;
    size_t count;
  };
  char *dev_a, *dev_b, *host;
  const size_t max_bytes = 512ull << 20;
  CHECK(cudaMalloc(&dev_a, max_bytes));
  CHECK(cudaMalloc(&dev_b, max_bytes));
  CHECK(cudaHostAlloc(&host, max_bytes, cudaHostAllocMapped));
  CHECK(cudaMemset(dev_a, 1, max_bytes));
  CHECK(cudaMemset(dev_b, 2, max_bytes));
  char* host_dev = nullptr;
  CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&host_dev), host, 0));
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  for (const Shape& shape : {Shape{4096, 65536}, Shape{65536, 8192}}) {
    std::vector<unsigned long long> si(shape.count), di(shape.count);
    std::iota(si.begin(), si.end(), 0);
    std::iota(di.begin(), di.end(), 0);
    std::mt19937_64 rng(shape.block);
    std::shuffle(si.begin(), si.end(), rng);
    std::shuffle(di.begin(), di.end(), rng);
    unsigned long long *dsi, *ddi;
    CHECK(cudaMalloc(&dsi, shape.count * 8));
    CHECK(cudaMalloc(&ddi, shape.count * 8));
    CHECK(cudaMemcpy(dsi, si.data(), shape.count * 8, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(ddi, di.data(), shape.count * 8, cudaMemcpyHostToDevice));
    const double bytes = static_cast<double>(shape.block * shape.count);
    struct Way {
      const char* name;
      const char* src;
      char* dst;
    };
    for (const Way& w : {Way{"device->device", dev_a, dev_b}, Way{"pinned->device", host_dev, dev_b},
                         Way{"device->pinned", dev_a, host_dev}}) {
      std::vector<double> rates;
      for (int r = 0; r < 10; ++r) {
        CHECK(cudaEventRecord(start, stream));
        GatherBlocks<<<shape.count, 256, 0, stream>>>(dsi, ddi, shape.block, w.src, w.dst);
        CHECK(cudaGetLastError());
        CHECK(cudaEventRecord(stop, stream));
        CHECK(cudaEventSynchronize(stop));
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, start, stop));
        if (r > 0) rates.push_back(bytes / (ms / 1e3) / 1e9);  // The first warms up.
      }
      std::sort(rates.begin(), rates.end());
      std::printf("raw_gather %s %zu x %llu KiB: %.1f GB/s median, %.1f best\n", w.name,
                  shape.count, shape.block >> 10, rates[rates.size() / 2], rates.back());
    }
    CHECK(cudaFree(dsi));
    CHECK(cudaFree(ddi));
  }
  return 0;
}
