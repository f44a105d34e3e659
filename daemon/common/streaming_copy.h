// A host copy with streaming (non-temporal) stores: the bytes go to memory without
// filling the cache, for copies whose destination no CPU reads next (bounce slots a GPU
// copies out of, big buffers). Header-only and free of dependencies, so that the raw
// probes in deploy/gpu/ (built with nvcc on the GPU machine) copy as the daemon does.
#ifndef GPUMOVE_DAEMON_COMMON_STREAMING_COPY_H_
#define GPUMOVE_DAEMON_COMMON_STREAMING_COPY_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>

namespace gpumove {

// Needs AVX2 (check __builtin_cpu_supports("avx2") first).
__attribute__((target("avx2"))) inline void StreamingCopy(char* dst, const char* src, size_t n) {
  // Align the destination to 32 bytes with an ordinary copy of the head.
  const size_t head = std::min<size_t>((32 - (reinterpret_cast<uintptr_t>(dst) & 31)) & 31, n);
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

}  // namespace gpumove

#endif  // __x86_64__

#endif  // GPUMOVE_DAEMON_COMMON_STREAMING_COPY_H_
