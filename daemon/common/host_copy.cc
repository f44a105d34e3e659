#include "daemon/common/host_copy.h"

#include <cstdint>
#include <cstring>

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

}  // namespace

void HostCopy(void* dst, const void* src, size_t n) {
#if defined(__x86_64__)
  if (n >= kStreamingCopyMin && kHaveAvx2) {
    StreamingCopy(static_cast<char*>(dst), static_cast<const char*>(src), n);
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

}  // namespace gpumove
