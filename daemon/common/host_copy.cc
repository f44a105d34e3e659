#include "daemon/common/host_copy.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

#include "absl/synchronization/blocking_counter.h"
#include "daemon/common/streaming_copy.h"
#include "daemon/common/thread_pool.h"

namespace gpumove {
namespace {

#if defined(__x86_64__)
const bool kHaveAvx2 = __builtin_cpu_supports("avx2");
#endif

std::atomic<uint64_t> streamed_bytes{0};
std::atomic<uint64_t> helper_bytes{0};

void CopyPart(char* dst, const char* src, size_t n, bool streaming) {
#if defined(__x86_64__)
  if (streaming && kHaveAvx2) {
    StreamingCopy(dst, src, n);
    streamed_bytes.fetch_add(n, std::memory_order_relaxed);
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

// Helper threads for ParallelHostCopy, started on first use and kept for the process.
ThreadPool& CopyPool() {
  static ThreadPool* pool = new ThreadPool(15);  // Never destroyed: its threads outlive main.
  return *pool;
}

}  // namespace

void HostCopy(void* dst, const void* src, size_t n, size_t streaming_min) {
  CopyPart(static_cast<char*>(dst), static_cast<const char*>(src), n, n >= streaming_min);
}

void ParallelHostCopy(void* dst, const void* src, size_t n, int threads, size_t streaming_min) {
  const size_t parts = std::min<size_t>(std::max(threads, 1), n / kParallelCopyPart);
  if (parts <= 1) {
    HostCopy(dst, src, n, streaming_min);
    return;
  }
  const bool streaming = n >= streaming_min;
  // Parts end on 4 KiB boundaries; the last takes the rest.
  const size_t part = (n / parts) & ~size_t{4095};
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  absl::BlockingCounter helpers(static_cast<int>(parts - 1));
  for (size_t i = 1; i < parts; ++i) {
    const size_t off = i * part;
    const size_t len = i + 1 == parts ? n - off : part;
    CopyPool().Run([=, &helpers] {
      CopyPart(d + off, s + off, len, streaming);
      helper_bytes.fetch_add(len, std::memory_order_relaxed);
      helpers.DecrementCount();
    });
  }
  CopyPart(d, s, part, streaming);
  helpers.Wait();
}

void RunCopyParts(int parts, const std::function<void(int part)>& job) {
  if (parts <= 1) {
    job(0);
    return;
  }
  absl::BlockingCounter helpers(parts - 1);
  for (int i = 1; i < parts; ++i) {
    CopyPool().Run([i, &job, &helpers] {
      job(i);
      helpers.DecrementCount();
    });
  }
  job(0);
  helpers.Wait();
}

uint64_t StreamedCopyBytes() { return streamed_bytes.load(std::memory_order_relaxed); }
uint64_t HelperCopyBytes() { return helper_bytes.load(std::memory_order_relaxed); }

}  // namespace gpumove
