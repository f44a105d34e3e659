#include "daemon/common/host_copy.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

#include "absl/synchronization/blocking_counter.h"
#include "daemon/common/thread_pool.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace gpumove {
namespace {

#if defined(__x86_64__)
__attribute__((target("avx2"))) void StreamingCopy(char* dst, const char* src, size_t n) {
  // Align the destination to 32 bytes with an ordinary copy of the head.
  const size_t head = (32 - (reinterpret_cast<uintptr_t>(dst) & 31)) & 31;
  std::memcpy(dst, src, head);
  dst += head;
  src += head;
  n -= head;
  const size_t body = n & ~size_t{127};
  for (size_t i = 0; i < body; i += 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 64));
    const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 96), d);
  }
  // Streaming stores are weakly ordered: fence so the bytes are visible to whoever is
  // told the copy is done.
  _mm_sfence();
  std::memcpy(dst + body, src + body, n - body);
}

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

uint64_t StreamedCopyBytes() { return streamed_bytes.load(std::memory_order_relaxed); }
uint64_t HelperCopyBytes() { return helper_bytes.load(std::memory_order_relaxed); }

}  // namespace gpumove
