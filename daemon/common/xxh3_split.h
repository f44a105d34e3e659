// xxh3-64 (seed 0, the default secret) of a long stream, computed from the sums of its
// 1 KiB blocks: the part a GPU can do in parallel. Within a block the algorithm only adds
// to its eight 64-bit accumulators (each stripe of 64 bytes adds a product and a word per
// lane), so a block's contribution is one sum per lane, independent of the others; only
// the scramble between blocks, and the end (partial block, last stripe, merge), run in
// order. Xxh3Long does those, with xxhash's own functions, from the sums of each full
// block in turn: the result is XXH3_64bits of the stream, bit for bit (checked against it
// in xxh3_split_test), so that hashes made here and on the host compare.
#ifndef GPUMOVE_DAEMON_COMMON_XXH3_SPLIT_H_
#define GPUMOVE_DAEMON_COMMON_XXH3_SPLIT_H_

#include <cstdint>

namespace gpumove {

inline constexpr uint64_t kXxh3Block = 1024;  // Bytes per block (16 stripes of 64).
inline constexpr int kXxh3Lanes = 8;
// Streams longer than this hash through blocks (shorter ones: XXH3_64bits itself).
inline constexpr uint64_t kXxh3LongMin = 241;
// The 64-bit words of the default secret a block's stripes read: stripe n, lane i reads
// word n + i (n < 16, i < 8). Checked against xxhash's own in xxh3_split_test.
inline constexpr int kXxh3StripeWords = 23;
inline constexpr uint64_t kXxh3StripeSecret[kXxh3StripeWords] = {
    0xbe4ba423396cfeb8ull, 0x1cad21f72c81017cull, 0xdb979083e96dd4deull, 0x1f67b3b7a4a44072ull,
    0x78e5c0cc4ee679cbull, 0x2172ffcc7dd05a82ull, 0x8e2443f7744608b8ull, 0x4c263a81e69035e0ull,
    0xcb00c391bb52283cull, 0xa32e531b8b65d088ull, 0x4ef90da297486471ull, 0xd8acdea946ef1938ull,
    0x3f349ce33f76faa8ull, 0x1d4f0bc7c7bbdcf9ull, 0x3159b4cd4be0518aull, 0x647378d9c97e9fc8ull,
    0xc3ebd33483acc5eaull, 0xeb6313faffa081c5ull, 0x49daf0b751dd0d17ull, 0x9e68d429265516d3ull,
    0xfca1477d58be162bull, 0xce31d07ad1b8f88full, 0x280416958f3acb45ull};

// The sums of `blocks` full blocks at `data`: out[8 * b + i] for block b, lane i (what the
// GPU kernel computes; this is its reference).
void Xxh3BlockSums(const char* data, uint64_t blocks, uint64_t* out);

class Xxh3Long {
 public:
  Xxh3Long();
  // The next `blocks` full blocks of the stream, by their sums.
  void AddBlocks(const uint64_t* sums, uint64_t blocks);
  uint64_t blocks() const { return blocks_; }
  // The hash of the stream of `len` bytes (at least kXxh3LongMin), whose first
  // (len - 1) / kXxh3Block blocks were added; `end` holds its last `n` bytes, n at least
  // min(len, kXxh3Block + 64). Returns 0 with `ok` false when those do not hold.
  uint64_t Finish(uint64_t len, const char* end, uint64_t n, bool* ok) const;

 private:
  alignas(64) uint64_t acc_[kXxh3Lanes];
  uint64_t blocks_ = 0;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_COMMON_XXH3_SPLIT_H_
