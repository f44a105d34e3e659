#include "daemon/common/host_copy.h"

#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace gpumove {
namespace {

// Every alignment of source and destination and every tail length, around the size
// where the streaming path takes over.
TEST(HostCopy, CopiesExactlyAtAnyAlignmentAndLength) {
  std::mt19937 rng(11);
  const size_t max = kStreamingCopyMin + 300;
  std::vector<char> src(max + 64), dst(max + 64);
  for (auto& c : src) c = static_cast<char>(rng());
  for (size_t n : {size_t{0}, size_t{1}, size_t{127}, kStreamingCopyMin - 1, kStreamingCopyMin,
                   kStreamingCopyMin + 1, kStreamingCopyMin + 129, max}) {
    for (size_t s_off : {0, 1, 31, 32}) {
      for (size_t d_off : {0, 3, 17, 32}) {
        std::fill(dst.begin(), dst.end(), 'z');
        HostCopy(dst.data() + d_off, src.data() + s_off, n);
        ASSERT_EQ(std::memcmp(dst.data() + d_off, src.data() + s_off, n), 0)
            << n << " " << s_off << " " << d_off;
        for (size_t i = 0; i < d_off; ++i) ASSERT_EQ(dst[i], 'z');
        for (size_t i = d_off + n; i < dst.size(); ++i) ASSERT_EQ(dst[i], 'z');
      }
    }
  }
}

// Split over threads: every part lands, nothing outside the range is touched, for sizes
// around the part boundaries and odd alignments, and from many callers at once.
TEST(HostCopy, ParallelCopiesExactlyFromManyCallers) {
  std::mt19937 rng(12);
  const size_t max = 9 * kParallelCopyPart + 4099;
  std::vector<char> src(max + 64);
  for (auto& c : src) c = static_cast<char>(rng());
  auto check = [&](size_t n, size_t s_off, size_t d_off, int threads) {
    std::vector<char> dst(max + 64, 'z');
    ParallelHostCopy(dst.data() + d_off, src.data() + s_off, n, threads);
    ASSERT_EQ(std::memcmp(dst.data() + d_off, src.data() + s_off, n), 0)
        << n << " " << s_off << " " << d_off << " " << threads;
    for (size_t i = 0; i < d_off; ++i) ASSERT_EQ(dst[i], 'z');
    for (size_t i = d_off + n; i < dst.size(); ++i) ASSERT_EQ(dst[i], 'z');
  };
  for (size_t n : {size_t{0}, size_t{5}, 2 * kParallelCopyPart - 1, 2 * kParallelCopyPart,
                   3 * kParallelCopyPart + 17, max}) {
    for (int threads : {1, 2, 3, 8, 64}) check(n, 3, 17, threads);
  }
  std::vector<std::thread> callers;
  for (int i = 0; i < 6; ++i) callers.emplace_back([&, i] { check(max - i * 4096, i, 2 * i, 4); });
  for (auto& t : callers) t.join();
}

// Streaming stores from the least size a caller gives (a bounce buffer's copy), else from
// kStreamingCopyMin; the counter counts exactly the bytes copied that way.
TEST(HostCopy, StreamsFromTheLeastSizeItIsGiven) {
#if defined(__x86_64__)
  if (!__builtin_cpu_supports("avx2")) GTEST_SKIP() << "no streaming stores without AVX2";
#else
  GTEST_SKIP() << "streaming stores are x86-64 only";
#endif
  const size_t n = 3 << 20;
  std::vector<char> src(n + 5), dst(n + 5, 'z');
  std::mt19937 rng(13);
  for (auto& c : src) c = static_cast<char>(rng());
  auto copied = [&](size_t bytes, auto&& copy) {
    std::fill(dst.begin(), dst.end(), 'z');
    const uint64_t before = StreamedCopyBytes();
    copy();
    EXPECT_EQ(std::memcmp(dst.data() + 1, src.data() + 2, bytes), 0);
    EXPECT_EQ(dst[1 + bytes], 'z');
    return StreamedCopyBytes() - before;
  };
  EXPECT_EQ(copied(n, [&] { HostCopy(dst.data() + 1, src.data() + 2, n); }), 0u);
  EXPECT_EQ(copied(n, [&] { HostCopy(dst.data() + 1, src.data() + 2, n, 1 << 20); }), n);
  EXPECT_EQ(copied(n - 1, [&] { HostCopy(dst.data() + 1, src.data() + 2, n - 1, n); }), 0u);
  EXPECT_EQ(copied(n, [&] { ParallelHostCopy(dst.data() + 1, src.data() + 2, n, 4); }), 0u);
  EXPECT_EQ(copied(n, [&] { ParallelHostCopy(dst.data() + 1, src.data() + 2, n, 4, 1 << 20); }),
            n);
}

// ParallelHostCopy's helpers copy every part but the first (the caller's), and the counter
// counts exactly their bytes; one thread, or a copy too small to split, has no helpers.
TEST(HostCopy, HelpersCopyEveryPartButTheCallers) {
  const size_t n = (3 << 20) + 100;
  std::vector<char> src(n), dst(n);
  std::mt19937 rng(17);
  for (auto& c : src) c = static_cast<char>(rng());
  auto helped = [&](size_t bytes, int threads) {
    std::fill(dst.begin(), dst.end(), 0);
    const uint64_t before = HelperCopyBytes();
    ParallelHostCopy(dst.data(), src.data(), bytes, threads);
    EXPECT_EQ(std::memcmp(dst.data(), src.data(), bytes), 0);
    return HelperCopyBytes() - before;
  };
  // Four parts: the caller's (n / 4, rounded down to 4 KiB), the helpers' the rest.
  EXPECT_EQ(helped(n, 4), n - ((n / 4) & ~size_t{4095}));
  EXPECT_EQ(helped(n, 1), 0u);
  EXPECT_EQ(helped(kParallelCopyPart, 4), 0u);  // One part.
  EXPECT_EQ(helped(2 * kParallelCopyPart, 8), kParallelCopyPart);  // Two at most.
}

}  // namespace
}  // namespace gpumove
