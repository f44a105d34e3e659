// Ways to get a vectored move's piece list to the gather kernel, side by side, one
// process, timed on the host from "list ready" to "bytes landed" as a daemon's gather is:
// 65536 shuffled 4 KiB blocks device->device, the list (gpumove::Segment, the same layout
// as GatherPiece) written by another thread before each run (as a Submit's thread makes it
// and a worker's gather reads it). The kernel is the daemon's (daemon/gpu/gather.cu).
//   kept            descriptors already on the GPU: the kernel alone (a prepared list)
//   raw-host-ids    the baseline's raw kernel (raw_gather.h) with its block ids copied from
//                   host memory first: what a program holding the ids on the CPU pays
//   one-shot        count pass, per-piece writes into page-locked memory, one copy, one kernel
//   pipelined/B     the same writes in batches of B, each batch's copy and kernel queued
//                   behind it (the CPU writes the next batch while the GPU copies)
//   memcpy/B        no count pass: each batch's lengths checked, the batch memcpy'd into
//                   page-locked memory, copied, its kernel queued
//   mapped/B        as memcpy/B into mapped page-locked memory the kernel reads in place
//                   (no copy to the GPU)
//   mapped-once     the whole list memcpy'd into mapped memory, one kernel
//   pageable        cudaMemcpyAsync straight from the list's own (pageable) memory, one kernel
// Every variant's bytes are checked against a gather on the host. Built and run on the GPU
// machine:
//   nvcc -O3 -std=c++17 -I. -DGPUMOVE_HAVE_CUDA -arch=sm_90 -o /tmp/dv \
//     deploy/gpu/descriptor_variants.cu daemon/gpu/gather.cu && /tmp/dv
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "daemon/common/segment.h"
#include "daemon/gpu/gather.h"
#include "deploy/gpu/raw_gather.h"

using gpumove::GatherPiece;
using gpumove::kGatherPieceMax;
using gpumove::Segment;
static_assert(sizeof(Segment) == sizeof(GatherPiece), "the layouts this compares");

namespace {

constexpr uint64_t kBlocks = 65536, kBlock = 4096, kBytes = kBlocks * kBlock;

struct Ctx {
  char *src = nullptr, *dst = nullptr;
  GatherPiece *host = nullptr, *dev = nullptr, *mapped = nullptr, *mapped_dev = nullptr;
  GatherPiece* kept = nullptr;
  cudaStream_t stream = nullptr;
};

void CountPass(const std::vector<Segment>& list, uint64_t* count, uint64_t* total) {
  *count = *total = 0;
  for (const Segment& p : list) {
    *count += (p.length + kGatherPieceMax - 1) / kGatherPieceMax;
    *total += p.length;
  }
}

// Per-piece writes of pieces [i, end) into `room` from descriptor k on; returns the new k.
uint64_t WritePieces(const std::vector<Segment>& list, size_t i, size_t end, GatherPiece* room,
                     uint64_t k) {
  for (; i < end; ++i) {
    const Segment& p = list[i];
    for (uint64_t off = 0; off < p.length; off += kGatherPieceMax) {
      room[k++] = GatherPiece{p.src + off, p.dst + off, std::min(kGatherPieceMax, p.length - off)};
    }
  }
  return k;
}

void OneShot(Ctx& c, const std::vector<Segment>& list) {
  uint64_t count, total;
  CountPass(list, &count, &total);
  const uint64_t k = WritePieces(list, 0, list.size(), c.host, 0);
  CHECK(cudaMemcpyAsync(c.dev, c.host, k * sizeof(GatherPiece), cudaMemcpyHostToDevice, c.stream));
  CHECK(gpumove::LaunchGather(c.dev, k, c.src, c.dst, c.stream));
}

void Pipelined(Ctx& c, const std::vector<Segment>& list, size_t batch) {
  uint64_t count, total;
  CountPass(list, &count, &total);
  uint64_t k = 0;
  for (size_t i = 0; i < list.size(); i += batch) {
    const uint64_t from = k;
    k = WritePieces(list, i, std::min(list.size(), i + batch), c.host, k);
    CHECK(cudaMemcpyAsync(c.dev + from, c.host + from, (k - from) * sizeof(GatherPiece),
                          cudaMemcpyHostToDevice, c.stream));
    CHECK(gpumove::LaunchGather(c.dev + from, k - from, c.src, c.dst, c.stream));
  }
}

// Lengths of [i, end) checked (a longer piece would need cutting) and summed.
bool Small(const std::vector<Segment>& list, size_t i, size_t end, uint64_t* bytes) {
  uint64_t longest = 0, sum = 0;
  for (; i < end; ++i) {
    longest = std::max(longest, list[i].length);
    sum += list[i].length;
  }
  *bytes += sum;
  return longest <= kGatherPieceMax;
}

// Where a Memcpy variant's CPU time went (the last run's): scanning the lengths, the
// memcpy, the copy's and the kernel's queueing.
double g_scan, g_memcpy, g_copy_call, g_launch;

double Since(std::chrono::steady_clock::time_point& t) {
  const auto now = std::chrono::steady_clock::now();
  const double us = std::chrono::duration<double, std::micro>(now - t).count();
  t = now;
  return us;
}

void Memcpy(Ctx& c, const std::vector<Segment>& list, size_t batch, bool mapped) {
  uint64_t bytes = 0;
  GatherPiece* room = mapped ? c.mapped : c.host;
  g_scan = g_memcpy = g_copy_call = g_launch = 0;
  auto t = std::chrono::steady_clock::now();
  for (size_t i = 0; i < list.size(); i += batch) {
    const size_t end = std::min(list.size(), i + batch);
    if (!Small(list, i, end, &bytes)) std::abort();  // Not in this benchmark's lists.
    g_scan += Since(t);
    std::memcpy(room + i, list.data() + i, (end - i) * sizeof(Segment));
    g_memcpy += Since(t);
    if (mapped) {
      CHECK(gpumove::LaunchGather(c.mapped_dev + i, end - i, c.src, c.dst, c.stream));
    } else {
      CHECK(cudaMemcpyAsync(c.dev + i, c.host + i, (end - i) * sizeof(GatherPiece),
                            cudaMemcpyHostToDevice, c.stream));
      g_copy_call += Since(t);
      CHECK(gpumove::LaunchGather(c.dev + i, end - i, c.src, c.dst, c.stream));
    }
    g_launch += Since(t);
  }
}

// The list itself in page-locked memory (as if the daemon made it there): each batch's
// copy to the GPU and kernel queued, no CPU pass over it; or read in place by the kernel.
Segment* g_pinned_list = nullptr;
Segment* g_pinned_list_dev = nullptr;
void PinnedList(Ctx& c, size_t n, size_t batch, bool in_place) {
  for (size_t i = 0; i < n; i += batch) {
    const size_t m = std::min(n, i + batch) - i;
    if (in_place) {
      CHECK(gpumove::LaunchGather(reinterpret_cast<const GatherPiece*>(g_pinned_list_dev + i), m,
                                  c.src, c.dst, c.stream));
    } else {
      CHECK(cudaMemcpyAsync(c.dev + i, g_pinned_list + i, m * sizeof(GatherPiece),
                            cudaMemcpyHostToDevice, c.stream));
      CHECK(gpumove::LaunchGather(c.dev + i, m, c.src, c.dst, c.stream));
    }
  }
}

void MappedOnce(Ctx& c, const std::vector<Segment>& list) {
  uint64_t bytes = 0;
  if (!Small(list, 0, list.size(), &bytes)) std::abort();
  std::memcpy(c.mapped, list.data(), list.size() * sizeof(Segment));
  CHECK(gpumove::LaunchGather(c.mapped_dev, list.size(), c.src, c.dst, c.stream));
}

void Pageable(Ctx& c, const std::vector<Segment>& list) {
  uint64_t bytes = 0;
  if (!Small(list, 0, list.size(), &bytes)) std::abort();
  CHECK(cudaMemcpyAsync(c.dev, list.data(), list.size() * sizeof(Segment), cudaMemcpyHostToDevice,
                        c.stream));
  CHECK(gpumove::LaunchGather(c.dev, list.size(), c.src, c.dst, c.stream));
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main() {
  Ctx c;
  CHECK(cudaSetDevice(0));
  CHECK(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking));
  CHECK(cudaMalloc(&c.src, kBytes));
  CHECK(cudaMalloc(&c.dst, kBytes));
  CHECK(cudaHostAlloc(&c.host, kBlocks * sizeof(GatherPiece), 0));
  CHECK(cudaMalloc(&c.dev, kBlocks * sizeof(GatherPiece)));
  CHECK(cudaMalloc(&c.kept, kBlocks * sizeof(GatherPiece)));
  CHECK(cudaHostAlloc(&c.mapped, kBlocks * sizeof(GatherPiece),
                      cudaHostAllocMapped | cudaHostAllocPortable));
  CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&c.mapped_dev), c.mapped, 0));

  std::mt19937_64 rng(26);
  std::vector<uint64_t> s_idx(kBlocks), d_idx(kBlocks);
  std::iota(s_idx.begin(), s_idx.end(), 0);
  std::iota(d_idx.begin(), d_idx.end(), 0);
  std::shuffle(s_idx.begin(), s_idx.end(), rng);
  std::shuffle(d_idx.begin(), d_idx.end(), rng);
  std::vector<Segment> list(kBlocks);
  for (uint64_t i = 0; i < kBlocks; ++i) list[i] = {s_idx[i] * kBlock, d_idx[i] * kBlock, kBlock};
  std::vector<unsigned char> src_host(kBytes), want(kBytes), got(kBytes);
  for (uint64_t i = 0; i < kBytes; i += 8) {
    const uint64_t v = rng();
    std::memcpy(&src_host[i], &v, 8);
  }
  for (const Segment& p : list) std::memcpy(&want[p.dst], &src_host[p.src], p.length);
  CHECK(cudaMemcpy(c.src, src_host.data(), kBytes, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(c.kept, list.data(), kBlocks * sizeof(Segment), cudaMemcpyHostToDevice));

  // The baseline (b)'s raw kernel with its block ids in host memory, as a program that has
  // them from its scheduler: both id arrays copied to the GPU (pageable), then the kernel.
  unsigned long long* ids_dev = nullptr;
  CHECK(cudaMalloc(&ids_dev, 2 * kBlocks * sizeof(uint64_t)));
  auto raw_host_ids = [&](Ctx& x, const std::vector<Segment>&) {
    CHECK(cudaMemcpyAsync(ids_dev, s_idx.data(), kBlocks * sizeof(uint64_t), cudaMemcpyHostToDevice,
                          x.stream));
    CHECK(cudaMemcpyAsync(ids_dev + kBlocks, d_idx.data(), kBlocks * sizeof(uint64_t),
                          cudaMemcpyHostToDevice, x.stream));
    GatherBlocks<<<kBlocks, 256, 0, x.stream>>>(ids_dev, ids_dev + kBlocks, kBlock, x.src, x.dst);
    CHECK(cudaGetLastError());
  };
  auto kept = [&](Ctx& x, const std::vector<Segment>&) {
    CHECK(gpumove::LaunchGather(x.kept, kBlocks, x.src, x.dst, x.stream));
  };
  struct Variant {
    std::string name;
    std::function<void(Ctx&, const std::vector<Segment>&)> run;
  };
  std::vector<Variant> variants = {
      {"kept", kept},
      {"raw-host-ids", raw_host_ids},
      {"one-shot", OneShot},
      {"pipelined/8192", [](Ctx& x, const auto& l) { Pipelined(x, l, 8192); }},
      {"pipelined/16384", [](Ctx& x, const auto& l) { Pipelined(x, l, 16384); }},
      {"memcpy/4096", [](Ctx& x, const auto& l) { Memcpy(x, l, 4096, false); }},
      {"memcpy/8192", [](Ctx& x, const auto& l) { Memcpy(x, l, 8192, false); }},
      {"memcpy/16384", [](Ctx& x, const auto& l) { Memcpy(x, l, 16384, false); }},
      {"mapped/8192", [](Ctx& x, const auto& l) { Memcpy(x, l, 8192, true); }},
      {"mapped/16384", [](Ctx& x, const auto& l) { Memcpy(x, l, 16384, true); }},
      {"mapped-once", MappedOnce},
      {"pageable", Pageable},
      {"list-pinned/16384", [](Ctx& x, const auto& l) { PinnedList(x, l.size(), 16384, false); }},
      {"list-pinned/65536", [](Ctx& x, const auto& l) { PinnedList(x, l.size(), 65536, false); }},
      {"list-mapped/65536", [](Ctx& x, const auto& l) { PinnedList(x, l.size(), 65536, true); }},
  };
  CHECK(cudaHostAlloc(&g_pinned_list, kBlocks * sizeof(Segment),
                      cudaHostAllocMapped | cudaHostAllocPortable));
  CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&g_pinned_list_dev), g_pinned_list, 0));
  // The kernel alone, CUDA events (the yardstick).
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<double> kernel_us;
  for (int r = 0; r < 12; ++r) {
    CHECK(cudaEventRecord(a, c.stream));
    CHECK(gpumove::LaunchGather(c.kept, kBlocks, c.src, c.dst, c.stream));
    CHECK(cudaEventRecord(b, c.stream));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    kernel_us.push_back(ms * 1000.0);
  }
  const double kernel = Median(kernel_us);
  std::printf("kernel alone (events): %.1f us, %.1f GB/s\n", kernel, kBytes / kernel / 1e3);
  for (const Variant& v : variants) {
    CHECK(cudaMemset(c.dst, 0, kBytes));
    CHECK(cudaDeviceSynchronize());
    std::vector<double> us;
    for (int r = 0; r < 13; ++r) {
      // Another thread writes the list (as a Submit's thread does); a pause as between RPCs.
      std::thread([&] {
        for (uint64_t i = 0; i < kBlocks; ++i) {
          list[i] = {s_idx[i] * kBlock, d_idx[i] * kBlock, kBlock};
          g_pinned_list[i] = list[i];
        }
      }).join();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      const auto t0 = std::chrono::steady_clock::now();
      v.run(c, list);
      CHECK(cudaStreamSynchronize(c.stream));
      const auto t1 = std::chrono::steady_clock::now();
      if (r > 0) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    CHECK(cudaMemcpy(got.data(), c.dst, kBytes, cudaMemcpyDeviceToHost));
    const bool right = got == want;
    const double m = Median(us);
    std::printf(
        "variant %-16s %8.1f us median (best %.1f): %7.1f GB/s, %.2f of the kernel alone%s\n",
        v.name.c_str(), m, *std::min_element(us.begin(), us.end()), kBytes / m / 1e3, kernel / m,
        right ? "" : "  WRONG BYTES");
    if (v.name.rfind("memcpy", 0) == 0 || v.name.rfind("mapped/", 0) == 0) {
      std::printf(
          "    last run's CPU: scan %.1f us, memcpy %.1f us, copy queued %.1f us, kernels "
          "queued %.1f us\n",
          g_scan, g_memcpy, g_copy_call, g_launch);
    }
  }
  return 0;
}
