// Baseline (b) of the vectored benchmark on the GPU: one gather kernel in one process (a
// thread block per block, 16-byte loads and stores; block indices already on the GPU)
// copying shuffled blocks device -> device, pinned host -> device and device -> pinned host
// (host memory reached mapped). Prints GB/s per shape and direction, best and median of 9
// CUDA-event-timed launches, as "raw_gather <direction> <count> x <KiB> KiB: <GB/s>" lines
// that deploy/gpu/run.sh sets beside the daemon's figures. With two GPUs, also GPU0 -> GPU1
// ("device0->device1"): the kernel on GPU1 reading GPU0's memory over NVLink (peer access),
// as the daemon's gather runs on the destination's GPU. Built and run on the GPU machine:
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
  // A second GPU: its own destination, stream, events, and peer access to GPU0.
  int gpus = 0;
  CHECK(cudaGetDeviceCount(&gpus));
  char* dev_c = nullptr;
  cudaStream_t stream1 = nullptr;
  cudaEvent_t start1 = nullptr, stop1 = nullptr;
  if (gpus > 1) {
    CHECK(cudaSetDevice(1));
    CHECK(cudaMalloc(&dev_c, max_bytes));
    CHECK(cudaMemset(dev_c, 3, max_bytes));
    const cudaError_t e = cudaDeviceEnablePeerAccess(0, 0);
    if (e != cudaErrorPeerAccessAlreadyEnabled) CHECK(e);
    cudaGetLastError();
    CHECK(cudaStreamCreate(&stream1));
    CHECK(cudaEventCreate(&start1));
    CHECK(cudaEventCreate(&stop1));
    CHECK(cudaSetDevice(0));
  }
  for (const Shape& shape : {Shape{4096, 65536}, Shape{65536, 8192}}) {
    std::vector<unsigned long long> si(shape.count), di(shape.count);
    std::iota(si.begin(), si.end(), 0);
    std::iota(di.begin(), di.end(), 0);
    std::mt19937_64 rng(shape.block);
    std::shuffle(si.begin(), si.end(), rng);
    std::shuffle(di.begin(), di.end(), rng);
    // The block indices on each GPU that runs a kernel.
    unsigned long long *dsi[2] = {nullptr, nullptr}, *ddi[2] = {nullptr, nullptr};
    for (int g = 0; g < std::min(gpus, 2); ++g) {
      CHECK(cudaSetDevice(g));
      CHECK(cudaMalloc(&dsi[g], shape.count * 8));
      CHECK(cudaMalloc(&ddi[g], shape.count * 8));
      CHECK(cudaMemcpy(dsi[g], si.data(), shape.count * 8, cudaMemcpyHostToDevice));
      CHECK(cudaMemcpy(ddi[g], di.data(), shape.count * 8, cudaMemcpyHostToDevice));
    }
    CHECK(cudaSetDevice(0));
    const double bytes = static_cast<double>(shape.block * shape.count);
    struct Way {
      const char* name;
      const char* src;
      char* dst;
      int gpu;  // Runs the kernel.
    };
    std::vector<Way> ways = {Way{"device->device", dev_a, dev_b, 0},
                             Way{"pinned->device", host_dev, dev_b, 0},
                             Way{"device->pinned", dev_a, host_dev, 0}};
    if (dev_c != nullptr) ways.push_back(Way{"device0->device1", dev_a, dev_c, 1});
    for (const Way& w : ways) {
      CHECK(cudaSetDevice(w.gpu));
      cudaStream_t st = w.gpu == 0 ? stream : stream1;
      cudaEvent_t t0 = w.gpu == 0 ? start : start1, t1 = w.gpu == 0 ? stop : stop1;
      std::vector<double> rates;
      for (int r = 0; r < 10; ++r) {
        CHECK(cudaEventRecord(t0, st));
        GatherBlocks<<<shape.count, 256, 0, st>>>(dsi[w.gpu], ddi[w.gpu], shape.block, w.src,
                                                  w.dst);
        CHECK(cudaGetLastError());
        CHECK(cudaEventRecord(t1, st));
        CHECK(cudaEventSynchronize(t1));
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, t0, t1));
        if (r > 0) rates.push_back(bytes / (ms / 1e3) / 1e9);  // The first warms up.
      }
      std::sort(rates.begin(), rates.end());
      std::printf("raw_gather %s %zu x %llu KiB: %.1f GB/s median, %.1f best\n", w.name,
                  shape.count, shape.block >> 10, rates[rates.size() / 2], rates.back());
    }
    for (int g = 0; g < std::min(gpus, 2); ++g) {
      CHECK(cudaSetDevice(g));
      CHECK(cudaFree(dsi[g]));
      CHECK(cudaFree(ddi[g]));
    }
    CHECK(cudaSetDevice(0));
  }
  return 0;
}
