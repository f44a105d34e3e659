// The staged path's best case, without the daemon: one process moves a buffer from GPU0 to
// GPU1 through two pinned rings (the two nodes' bounce slots) in pieces, the three steps
// (device->pinned A, a copy A->B by CPU threads, pinned B->device) pipelined with spinning
// threads and no calls, and compares the time with each step alone on the whole buffer.
// What it prints is what a staged move between two daemons on this host can reach in each
// structure (the daemon adds its calls and hand-offs to it). Built and run on the GPU
// machine (it has nvcc):
//   nvcc -O2 -std=c++17 -I. -DGPUMOVE_HAVE_CUDA -o /tmp/rp deploy/gpu/raw_pipeline.cu
//   /tmp/rp [MiB ...]     (from the repository's root; ROUNDS=9 by default; STREAMING=0
//                         copies with glibc memcpy; CONFIGS picks the structures, below)
// deploy/gpu/run.sh builds and runs it after gpumove-bench staged (PARTS=staged).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "client/bench/cuda_check.h"
#include "daemon/common/streaming_copy.h"

using Clock = std::chrono::steady_clock;

// The wire's copy: the daemon's into a bounce slot (streaming stores), or glibc's memcpy.
bool g_streaming = true;
void CopyBytes(char* dst, const char* src, size_t n, bool streaming) {
  if (streaming) {
    gpumove::StreamingCopy(dst, src, n);
  } else {
    std::memcpy(dst, src, n);
  }
}

double Seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Buffers {
  char* src;  // GPU0
  char* dst;  // GPU1
  char* a;    // pinned ring of the sending node
  char* b;    // pinned ring of the receiving node
  cudaStream_t s0, s1;
};

// Threads are started, and have made their first CUDA call, before the clock starts (the
// daemon keeps its threads in pools): each calls Wait() once ready, and Release(n) starts
// the clock once n of them wait.
class StartLine {
 public:
  void Wait() {
    ++ready_;
    while (!go_.load()) {}
  }
  Clock::time_point Release(int n) {
    while (ready_.load() < n) {}
    const auto t0 = Clock::now();
    go_ = true;
    return t0;
  }

 private:
  std::atomic<bool> go_{false};
  std::atomic<int> ready_{0};
};

// One staged move of `bytes` in pieces of `piece` through rings of `slots` pieces, the
// wire step on `wire` threads, each piece split into `split` parts. Returns seconds.
double Pipeline(Buffers& m, size_t bytes, size_t piece, int slots, int split, int wire,
                bool streaming) {
  const int pieces = static_cast<int>((bytes + piece - 1) / piece);
  std::vector<std::atomic<int>> parts(pieces);
  for (auto& p : parts) p = 0;
  std::atomic<int> filled{0}, carried_in_row{0}, drained{0};
  std::vector<std::atomic<bool>> carried(pieces);
  for (auto& c : carried) c = false;
  auto len = [&](int k) { return std::min(piece, bytes - k * piece); };
  StartLine line;
  Clock::time_point end;
  std::thread fill([&] {
    CHECK_CUDA(cudaSetDevice(0));
    line.Wait();
    for (int k = 0; k < pieces; ++k) {
      while (k >= carried_in_row.load() + slots) {}
      CHECK_CUDA(cudaMemcpyAsync(m.a + (k % slots) * piece, m.src + k * piece, len(k),
                                 cudaMemcpyDeviceToHost, m.s0));
      CHECK_CUDA(cudaStreamSynchronize(m.s0));
      filled = k + 1;
    }
  });
  std::thread drain([&] {
    CHECK_CUDA(cudaSetDevice(1));
    line.Wait();
    for (int k = 0; k < pieces; ++k) {
      while (!carried[k].load()) {}
      CHECK_CUDA(cudaMemcpyAsync(m.dst + k * piece, m.b + (k % slots) * piece, len(k),
                                 cudaMemcpyHostToDevice, m.s1));
      CHECK_CUDA(cudaStreamSynchronize(m.s1));
      drained = k + 1;
    }
    end = Clock::now();
  });
  // Wire workers: each piece is `split` parts; `wire` workers take the parts in order
  // (so up to wire / split pieces are on the wire at once).
  std::atomic<int> next_task{0};
  std::vector<std::thread> wires;
  for (int t = 0; t < wire; ++t) {
    wires.emplace_back([&] {
      line.Wait();
      for (int task; (task = next_task.fetch_add(1)) < pieces * split;) {
        const int k = task / split, part = task % split;
        while (filled.load() <= k || k >= drained.load() + slots) {}
        const size_t n = len(k);
        const size_t share = (n / split + 4095) & ~size_t{4095};
        const size_t lo = std::min(n, part * share), hi = std::min(n, lo + share);
        CopyBytes(m.b + (k % slots) * piece + lo, m.a + (k % slots) * piece + lo, hi - lo,
                  streaming);
        if (parts[k].fetch_add(1) + 1 == split) {
          carried[k] = true;
          // Moves the in-row count over every piece carried (never backwards).
          int row = carried_in_row.load();
          for (;;) {
            int to = row;
            while (to < pieces && carried[to].load()) ++to;
            if (to == row || carried_in_row.compare_exchange_weak(row, to)) break;
          }
        }
      }
    });
  }
  const auto t0 = line.Release(wire + 2);
  fill.join();
  for (auto& w : wires) w.join();
  drain.join();
  return std::chrono::duration<double>(end - t0).count();
}

double Copy(cudaStream_t s, int device, void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  CHECK_CUDA(cudaSetDevice(device));
  const auto t0 = Clock::now();
  CHECK_CUDA(cudaMemcpyAsync(dst, src, n, kind, s));
  CHECK_CUDA(cudaStreamSynchronize(s));
  return Seconds(t0);
}

// The wire alone: `threads` threads each copy their share.
double HostCopy(char* dst, const char* src, size_t n, int threads) {
  std::vector<std::thread> ts;
  const size_t share = (n / threads + 4095) & ~size_t{4095};
  StartLine line;
  std::atomic<int> left{threads};
  Clock::time_point end;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      line.Wait();
      const size_t lo = std::min(n, t * share), hi = std::min(n, lo + share);
      CopyBytes(dst + lo, src + lo, hi - lo, g_streaming);
      if (--left == 0) end = Clock::now();
    });
  }
  const auto t0 = line.Release(threads);
  for (auto& t : ts) t.join();
  return std::chrono::duration<double>(end - t0).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The daemon's piece size (StagePiece): a `div`-th of the move, at least 1 MiB, at most a
// slot (8 MiB), a multiple of 4 KiB.
size_t PieceFor(size_t bytes, size_t div) {
  const size_t part = ((bytes / div) + 4095) & ~size_t{4095};
  return std::min(std::max(part, size_t{1} << 20), size_t{8} << 20);
}

int main(int argc, char** argv) {
  // Sizes in MiB (default 16 64 256 1024); ROUNDS and STREAMING=0 (glibc memcpy) from the
  // environment.
  std::vector<size_t> sizes;
  for (int i = 1; i < argc; ++i) sizes.push_back(size_t(std::atoll(argv[i])) << 20);
  if (sizes.empty()) sizes = {16 << 20, 64 << 20, 256 << 20, 1024 << 20};
  const int rounds = std::getenv("ROUNDS") ? std::atoi(std::getenv("ROUNDS")) : 9;
  g_streaming = !(std::getenv("STREAMING") && std::atoi(std::getenv("STREAMING")) == 0) &&
                __builtin_cpu_supports("avx2");
  const size_t most = *std::max_element(sizes.begin(), sizes.end());
  // Structures: the daemon's (pieces of a sixteenth, 32 MiB of slots a side, two pieces on
  // the wire each split over four threads: --staged_copy_threads=4 on 32 CPUs), and others
  // (the eighths on two threads each were the daemon's until the sixteenth session).
  struct Config {
    std::string name;
    size_t div;
    int split, wire;
    size_t piece_kib = 0;  // Fixed piece size instead of div.
    int slots = 0;         // Ring pieces a side; 0: 32 MiB of them.
    bool streaming = true;
  };
  std::vector<Config> configs = {
      {"ours: 1/16 pieces, 2 on the wire x 4 threads", 16, 4, 8},
      {"1/8 pieces, 2 on the wire x 2 threads", 8, 2, 4},
      {"1/8 pieces, 1 on the wire x 4 threads", 8, 4, 4},
      {"1/8 pieces, 2 on the wire x 4 threads", 8, 4, 8},
      {"1/16 pieces, 2 on the wire x 2 threads", 16, 2, 4},
      {"1/16 pieces, 1 on the wire x 4 threads", 16, 4, 4},
  };
  // CONFIGS="piece_KiB/slots/split/wire/s|c;..." replaces them: pieces of piece_KiB through
  // rings of `slots` pieces a side, each piece split over `split` threads of `wire` (so
  // wire/split pieces on the wire at once), s: streaming stores on the wire, c: memcpy
  // (cached stores). H200s, 64 MiB (one run, 7 rounds): pieces of 1-2 MiB in rings of
  // 8-16 MiB lost with either copy (0.31-0.66 of the slowest stage against 0.79 for 4 MiB
  // x 8 streamed): rings that fit the 300 MiB L3 do not save the memory traffic.
  if (const char* env = std::getenv("CONFIGS")) {
    configs.clear();
    for (const char* p = env; *p;) {
      Config c{};
      char mode = 's';
      int used = 0;
      if (std::sscanf(p, "%zu/%d/%d/%d/%c%n", &c.piece_kib, &c.slots, &c.split, &c.wire, &mode,
                      &used) != 5 ||
          c.piece_kib == 0 || c.slots < 1 || c.split < 1 || c.wire < c.split ||
          (mode != 's' && mode != 'c')) {
        std::printf("bad CONFIGS at %s (piece_KiB > 0, slots >= 1, 1 <= split <= wire, s|c)\n",
                    p);
        return 1;
      }
      c.streaming = mode == 's';
      c.name = std::to_string(c.piece_kib) + " KiB x " + std::to_string(c.slots) + " slots, " +
               std::to_string(c.wire / c.split) + " on wire x " + std::to_string(c.split) +
               (c.streaming ? ", streaming" : ", memcpy");
      configs.push_back(c);
      p += used;
      if (*p == ';') ++p;
    }
  }
  Buffers m;
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaStreamCreateWithFlags(&m.s0, cudaStreamNonBlocking));
  CHECK_CUDA(cudaMalloc(&m.src, most));
  CHECK_CUDA(cudaMallocHost(&m.a, most));
  CHECK_CUDA(cudaSetDevice(1));
  CHECK_CUDA(cudaStreamCreateWithFlags(&m.s1, cudaStreamNonBlocking));
  CHECK_CUDA(cudaMalloc(&m.dst, most));
  CHECK_CUDA(cudaMallocHost(&m.b, most));
  std::memset(m.a, 1, most);
  std::memset(m.b, 2, most);
  std::printf("raw staged pipeline GPU0 -> pinned -> pinned -> GPU1 in one process (spinning "
              "threads, no calls), %s copies on the wire, medians of %d rounds, GB/s\n",
              g_streaming ? "streaming" : "memcpy", rounds);
  std::printf("%10s %7s %7s %7s  %s\n", "size", "D2H", "H2D", "wire8",
              "pipeline (/ slowest stage alone)");
  for (size_t bytes : sizes) {
    std::vector<std::vector<double>> alone(3), piped(configs.size());
    for (int r = 0; r < rounds + 1; ++r) {  // Round 0 warms up.
      const double d2h = Copy(m.s0, 0, m.a, m.src, bytes, cudaMemcpyDeviceToHost);
      const double h2d = Copy(m.s1, 1, m.dst, m.b, bytes, cudaMemcpyHostToDevice);
      const double wire = HostCopy(m.b, m.a, bytes, 8);
      if (r > 0) {
        alone[0].push_back(d2h);
        alone[1].push_back(h2d);
        alone[2].push_back(wire);
      }
      for (size_t c = 0; c < configs.size(); ++c) {
        const size_t piece = configs[c].piece_kib > 0 ? configs[c].piece_kib << 10
                                                      : PieceFor(bytes, configs[c].div);
        const int slots = configs[c].slots > 0
                              ? configs[c].slots
                              : static_cast<int>(std::max<size_t>((32 << 20) / piece, 1));
        // A fresh value each move, so that a step left out shows as stale bytes.
        const char value = static_cast<char>(1 + (r * configs.size() + c) % 250);
        CHECK_CUDA(cudaSetDevice(0));
        CHECK_CUDA(cudaMemset(m.src, value, bytes));
        CHECK_CUDA(cudaDeviceSynchronize());
        const double t = Pipeline(m, bytes, piece, slots, configs[c].split, configs[c].wire,
                                  configs[c].streaming && g_streaming);
        // Every move checked: the pipeline must carry every byte.
        std::vector<char> back(bytes);
        CHECK_CUDA(cudaSetDevice(1));
        CHECK_CUDA(cudaMemcpy(back.data(), m.dst, bytes, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < bytes; i += 4093) {
          if (back[i] != value) {
            std::printf("MISMATCH at %zu (%s)\n", i, configs[c].name.c_str());
            return 1;
          }
        }
        if (r > 0) piped[c].push_back(t);
      }
    }
    const double gb = bytes / 1e9;
    const double d2h = gb / Median(alone[0]), h2d = gb / Median(alone[1]),
                 wire = gb / Median(alone[2]);
    const double slowest = std::min({d2h, h2d, wire});
    std::printf("%7zu MiB %7.1f %7.1f %7.1f\n", bytes >> 20, d2h, h2d, wire);
    for (size_t c = 0; c < configs.size(); ++c) {
      const double g = gb / Median(piped[c]);
      std::printf("%34s %-44s %6.1f (%.3f)\n", "", configs[c].name.c_str(), g, g / slowest);
    }
  }
  return 0;
}
