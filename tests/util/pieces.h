// Piece lists for the vectored-move tests: shuffled pieces, as request segments, the
// bytes a destination should hold after them, and a checked move between two nodes.
#ifndef GPUMOVE_TESTS_UTIL_PIECES_H_
#define GPUMOVE_TESTS_UTIL_PIECES_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "absl/strings/str_cat.h"
#include "client/gpumove_client.h"
#include "gtest/gtest.h"
#include "proto/gpumove/v1/gpumove.grpc.pb.h"
#include "tests/util/random_bytes.h"

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
// Shuffled pieces of 1 to `max_len` bytes in slots of `slot` bytes (3 more on the
// destination side, so that bytes between pieces are there to stay untouched).
inline std::vector<Piece> RandomPieces(size_t n, uint64_t slot, uint64_t max_len, uint64_t seed) {
  std::mt19937_64 rng(seed);
  return Shuffled(
      n, slot, slot + 3, [&](size_t) { return 1 + rng() % max_len; }, seed);
}

inline std::string Expected(const std::string& src, std::string dst,
                            const std::vector<Piece>& pieces) {
  for (const Piece& p : pieces) dst.replace(p.dst, p.len, src, p.src, p.len);
  return dst;
}

// xxh3-64 of the pieces' source bytes in list order (what a vectored move's checksum is).
inline uint64_t PiecesHash(const std::string& src, const std::vector<Piece>& pieces) {
  std::string all;
  for (const Piece& p : pieces) all.append(src, p.src, p.len);
  return XXH3_64bits(all.data(), all.size());
}

// One end of a move between nodes: the node's name and a client of it.
struct NodeEnd {
  Client* client;
  std::string node;
};

// A vectored move between nodes: from a buffer of `src_size` random bytes on `from` into
// one of `dst_size` on `to`, submitted at `via` on `path`, checksummed; the end state, the
// path (`expected`), the piece count, both hashes and every destination byte checked; both
// buffers (of `from_kind` and `to_kind`, on GPU 0 if device memory) let go. With
// `prepare_on`, the pieces are a list prepared on that node (which then runs the move),
// moved `repeats` times (fresh bytes on both sides each time: what a node keeps of the
// list must move them all again) and released after it.
inline void MoveVectoredAndCheck(const NodeEnd& from, const NodeEnd& to, const NodeEnd& via,
                                 v1::Path path, v1::Path expected, const std::vector<Piece>& pieces,
                                 uint64_t src_size, uint64_t dst_size, uint64_t seed,
                                 v1::MemoryKind from_kind = v1::HOST,
                                 v1::MemoryKind to_kind = v1::HOST,
                                 const NodeEnd* prepare_on = nullptr, int repeats = 1) {
  SCOPED_TRACE(absl::StrCat(from.node, " -> ", to.node, " via ", via.node, ", ", pieces.size(),
                            " pieces, ", v1::MemoryKind_Name(from_kind), " -> ",
                            v1::MemoryKind_Name(to_kind)));
  auto s = from.client->Allocate(src_size, from_kind, 0);
  auto d = to.client->Allocate(dst_size, to_kind, 0);
  ASSERT_TRUE(s.ok() && d.ok()) << s.status() << d.status();
  MoveOptions o;
  std::string prepared;
  if (prepare_on != nullptr) {
    auto list = via.client->PreparePieces(AsSegments(pieces), {}, prepare_on->node);
    ASSERT_TRUE(list.ok()) << list.status();
    EXPECT_EQ(list->pieces(), pieces.size());
    prepared = o.prepared_pieces = list->id();
  } else {
    o.segments = AsSegments(pieces);
  }
  o.checksum = true;  // The other node hashes its side of the pieces, in list order.
  o.path = path;
  v1::BufferRef f = Ref(s->id()), t = Ref(d->id());
  f.set_node(from.node);
  t.set_node(to.node);
  for (int r = 0; r < (prepare_on != nullptr ? repeats : 1); ++r) {
    SCOPED_TRACE(absl::StrCat("move ", r + 1));
    const std::string src = RandomBytes(src_size, seed + 2 * r),
                      dst = RandomBytes(dst_size, seed + 2 * r + 1);
    ASSERT_TRUE(from.client->Write(Ref(s->id()), src).ok());
    ASSERT_TRUE(to.client->Write(Ref(d->id()), dst).ok());
    auto moved = via.client->Move(f, t, o);
    ASSERT_TRUE(moved.ok()) << moved.status();
    ASSERT_EQ(moved->state(), v1::SUCCEEDED) << moved->error_message();
    EXPECT_EQ(moved->path(), expected);
    EXPECT_EQ(moved->pieces(), pieces.size());
    if (prepare_on != nullptr) {
      EXPECT_EQ(moved->node(), prepare_on->node);  // The node that keeps the list runs it.
    }
    EXPECT_EQ(moved->source_xxh3(), PiecesHash(src, pieces));
    EXPECT_EQ(moved->destination_xxh3(), moved->source_xxh3());
    auto back = to.client->Read(Ref(d->id()));
    ASSERT_TRUE(back.ok());
    EXPECT_TRUE(*back == Expected(src, dst, pieces));
  }
  if (prepare_on != nullptr) EXPECT_TRUE(via.client->ReleasePieces(prepared).ok());
  ASSERT_TRUE(from.client->Release(s->id()).ok());
  ASSERT_TRUE(to.client->Release(d->id()).ok());
}

}  // namespace gpumove

#endif  // GPUMOVE_TESTS_UTIL_PIECES_H_
