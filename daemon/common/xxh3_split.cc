#include "daemon/common/xxh3_split.h"

#include <cstring>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace gpumove {

static_assert(XXH_SECRET_DEFAULT_SIZE == 192 && XXH_STRIPE_LEN == 64 &&
                  XXH_SECRET_CONSUME_RATE == 8 && XXH_ACC_NB == kXxh3Lanes,
              "xxh3's block layout changed");
static_assert((XXH_SECRET_DEFAULT_SIZE - XXH_STRIPE_LEN) / XXH_SECRET_CONSUME_RATE *
                      XXH_STRIPE_LEN ==
                  kXxh3Block,
              "xxh3's block length changed");

void Xxh3BlockSums(const char* data, uint64_t blocks, uint64_t* out) {
  for (uint64_t b = 0; b < blocks; ++b) {
    alignas(64) uint64_t acc[kXxh3Lanes] = {};
    XXH3_accumulate(acc, reinterpret_cast<const xxh_u8*>(data) + b * kXxh3Block, XXH3_kSecret,
                    kXxh3Block / XXH_STRIPE_LEN, XXH3_accumulate_512_scalar);
    std::memcpy(out + b * kXxh3Lanes, acc, sizeof(acc));
  }
}

Xxh3Long::Xxh3Long() {
  const uint64_t init[kXxh3Lanes] = XXH3_INIT_ACC;
  std::memcpy(acc_, init, sizeof(acc_));
}

void Xxh3Long::AddBlocks(const uint64_t* sums, uint64_t blocks) {
  const xxh_u8* scramble = XXH3_kSecret + XXH_SECRET_DEFAULT_SIZE - XXH_STRIPE_LEN;
  for (uint64_t b = 0; b < blocks; ++b) {
    for (int i = 0; i < kXxh3Lanes; ++i) acc_[i] += sums[b * kXxh3Lanes + i];
    XXH3_scrambleAcc(acc_, scramble);  // The vector unit's version (same result).
  }
  blocks_ += blocks;
}

uint64_t Xxh3Long::Finish(uint64_t len, const char* end, uint64_t n, bool* ok) const {
  const uint64_t full = len < 1 ? 0 : (len - 1) / kXxh3Block;
  const uint64_t partial = len - full * kXxh3Block;  // 1 .. kXxh3Block bytes.
  *ok = len >= kXxh3LongMin && full == blocks_ && n <= len &&
        n >= (len < kXxh3Block + XXH_STRIPE_LEN ? len : kXxh3Block + XXH_STRIPE_LEN);
  if (!*ok) return 0;
  alignas(64) uint64_t acc[kXxh3Lanes];
  std::memcpy(acc, acc_, sizeof(acc));
  const xxh_u8* stream_end = reinterpret_cast<const xxh_u8*>(end) + n;
  XXH3_accumulate(acc, stream_end - partial, XXH3_kSecret, (partial - 1) / XXH_STRIPE_LEN,
                  XXH3_accumulate_512_scalar);
  XXH3_accumulate_512_scalar(acc, stream_end - XXH_STRIPE_LEN,
                             XXH3_kSecret + XXH_SECRET_DEFAULT_SIZE - XXH_STRIPE_LEN -
                                 XXH_SECRET_LASTACC_START);
  return XXH3_mergeAccs(acc, XXH3_kSecret + XXH_SECRET_MERGEACCS_START, len * XXH_PRIME64_1);
}

}  // namespace gpumove
