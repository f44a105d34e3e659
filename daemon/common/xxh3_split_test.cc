#include "daemon/common/xxh3_split.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "gtest/gtest.h"

namespace gpumove {
namespace {

std::string Random(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

// The hash through block sums, the blocks added `step` at a time, the end from the last
// `tail` bytes.
uint64_t Split(const std::string& s, uint64_t step, uint64_t tail, bool* ok) {
  const uint64_t full = (s.size() - 1) / kXxh3Block;
  std::vector<uint64_t> sums(full * kXxh3Lanes);
  Xxh3BlockSums(s.data(), full, sums.data());
  Xxh3Long h;
  for (uint64_t b = 0; b < full; b += step) {
    h.AddBlocks(sums.data() + b * kXxh3Lanes, std::min(step, full - b));
  }
  tail = std::min<uint64_t>(tail, s.size());
  return h.Finish(s.size(), s.data() + s.size() - tail, tail, ok);
}

TEST(Xxh3Split, EqualsXxh3OfTheWholeStream) {
  uint64_t seed = 1;
  for (size_t len : {size_t{241}, size_t{1000}, size_t{1023}, size_t{1024}, size_t{1025},
                     size_t{1087}, size_t{1088}, size_t{1089}, size_t{2047}, size_t{2048},
                     size_t{2049}, size_t{3 * 1024 + 64}, size_t{65536 + 7}, size_t{1} << 20,
                     (size_t{1} << 20) + 1, (size_t{5} << 20) + 333}) {
    const std::string s = Random(len, seed++);
    for (uint64_t step : {uint64_t{1}, uint64_t{3}, uint64_t{1} << 30}) {
      bool ok = false;
      EXPECT_EQ(Split(s, step, kXxh3Block + 64, &ok), XXH3_64bits(s.data(), s.size()))
          << len << " bytes, " << step << " blocks a step";
      EXPECT_TRUE(ok);
    }
  }
}

TEST(Xxh3Split, RefusesWhatItCannotFinish) {
  const std::string s = Random(5000, 9);
  bool ok = true;
  Split(s, 1, 100, &ok);  // Too little of the end.
  EXPECT_FALSE(ok);
  Xxh3Long h;  // No blocks added for a stream that has four.
  h.Finish(s.size(), s.data(), s.size(), &ok);
  EXPECT_FALSE(ok);
  h.Finish(240, s.data(), 240, &ok);  // Short streams are XXH3_64bits' own.
  EXPECT_FALSE(ok);
}

TEST(Xxh3Split, StripeSecretIsTheDefaultSecretsWords) {
  const uint64_t* words = kXxh3StripeSecret;
  for (int w = 0; w < kXxh3StripeWords; ++w) {
    EXPECT_EQ(words[w], XXH_readLE64(XXH3_kSecret + 8 * w)) << "word " << w;
  }
  // The sums of one block from the words, as the GPU kernel computes them.
  const std::string s = Random(kXxh3Block, 3);
  uint64_t want[kXxh3Lanes];
  Xxh3BlockSums(s.data(), 1, want);
  for (int i = 0; i < kXxh3Lanes; ++i) {
    uint64_t sum = 0;
    for (int n = 0; n < 16; ++n) {
      uint64_t mine, other;
      std::memcpy(&mine, s.data() + 64 * n + 8 * i, 8);
      std::memcpy(&other, s.data() + 64 * n + 8 * (i ^ 1), 8);
      const uint64_t key = mine ^ words[n + i];
      sum += other + (key & 0xffffffff) * (key >> 32);
    }
    EXPECT_EQ(sum, want[i]) << "lane " << i;
  }
}

}  // namespace
}  // namespace gpumove
