// Piece lists for the vectored-move tests: shuffled pieces, as request segments, and the
// bytes a destination should hold after them.
#ifndef GPUMOVE_TESTS_UTIL_PIECES_H_
#define GPUMOVE_TESTS_UTIL_PIECES_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "proto/gpumove/v1/gpumove.grpc.pb.h"

namespace gpumove {

struct Piece {
  uint64_t src, dst, len;
};

// Shuffled pieces: `n` slots of `src_slot` / `dst_slot` bytes on each side, piece i of
// length `len(i)` at a random source slot and a distinct random destination slot.
inline std::vector<Piece> Shuffled(size_t n, uint64_t src_slot, uint64_t dst_slot,
                                   const std::function<uint64_t(size_t)>& len, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> src(n), dst(n);
  std::iota(src.begin(), src.end(), 0);
  std::iota(dst.begin(), dst.end(), 0);
  std::shuffle(src.begin(), src.end(), rng);
  std::shuffle(dst.begin(), dst.end(), rng);
  std::vector<Piece> out;
  for (size_t i = 0; i < n; ++i) out.push_back({src[i] * src_slot, dst[i] * dst_slot, len(i)});
  return out;
}

inline std::vector<v1::Segment> AsSegments(const std::vector<Piece>& pieces) {
  std::vector<v1::Segment> out;
  for (const Piece& p : pieces) {
    v1::Segment g;
    g.set_source_offset(p.src);
    g.set_destination_offset(p.dst);
    g.set_length(p.len);
    out.push_back(g);
  }
  return out;
}

// `dst` after every piece copied from `src`.
inline std::string Expected(const std::string& src, std::string dst,
                            const std::vector<Piece>& pieces) {
  for (const Piece& p : pieces) dst.replace(p.dst, p.len, src, p.src, p.len);
  return dst;
}

}  // namespace gpumove

#endif  // GPUMOVE_TESTS_UTIL_PIECES_H_
