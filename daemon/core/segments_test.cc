#include "daemon/core/segments.h"

#include <algorithm>
#include <limits>
#include <random>

#include "gtest/gtest.h"

namespace gpumove {
namespace {

using absl::StatusCode;

TEST(Segments, BoundsTotalsAndRebasing) {
  auto s = MakeSegments({{100, 50, 10}, {0, 0, 20}, {300, 20, 5}}, 16);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->total, 35u);
  EXPECT_EQ((*s)->src_lo, 0u);
  EXPECT_EQ((*s)->src_hi, 305u);
  EXPECT_EQ((*s)->dst_lo, 0u);
  EXPECT_EQ((*s)->dst_hi, 60u);
  auto t = MakeSegments({{100, 50, 10}, {120, 70, 20}}, 16);
  ASSERT_TRUE(t.ok());
  auto r = Rebased(**t);
  EXPECT_EQ(r->list[0].src, 0u);
  EXPECT_EQ(r->list[1].src, 20u);
  EXPECT_EQ(r->list[1].dst, 20u);
  EXPECT_EQ(r->src_hi, 40u);
  EXPECT_EQ(r->dst_hi, 40u);
}

TEST(Segments, BadListsAreRefused) {
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  EXPECT_EQ(MakeSegments({}, 16).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeSegments({{0, 0, 0}}, 16).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeSegments({{kMax - 4, 0, 8}}, 16).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeSegments({{0, kMax, 1}}, 16).status().code(), StatusCode::kInvalidArgument);
  // Destination overlaps, in order and out of order; sources may overlap.
  EXPECT_EQ(MakeSegments({{0, 0, 8}, {16, 7, 8}}, 16).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeSegments({{0, 100, 8}, {16, 0, 8}, {32, 104, 8}}, 16).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(MakeSegments({{0, 100, 8}, {0, 0, 8}, {0, 108, 8}}, 16).ok());
  EXPECT_EQ(MakeSegments(std::vector<Segment>(17, Segment{0, 0, 1}), 16).status().code(),
            StatusCode::kResourceExhausted);
}

TEST(Segments, BlockListsExpandWithStrides) {
  BlockListSpec b;
  // The spec views index arrays it does not own.
  std::vector<uint64_t> src, dst;
  auto set = [&](std::vector<uint64_t> s, std::vector<uint64_t> d) {
    src = std::move(s);
    dst = std::move(d);
    b.source_blocks = src;
    b.destination_blocks = dst;
  };
  b.block_size = 4096;
  set({3, 0, 7}, {0, 2, 1});
  auto s = ExpandBlocks(b, 16);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ((*s)->list.size(), 3u);
  EXPECT_EQ((*s)->list[0].src, 3u * 4096);
  EXPECT_EQ((*s)->list[2].dst, 4096u);
  EXPECT_EQ((*s)->total, 3u * 4096);
  b.source_stride = 8192;
  b.destination_stride = 16384;
  s = ExpandBlocks(b, 16);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->list[0].src, 3u * 8192);
  EXPECT_EQ((*s)->list[1].dst, 2u * 16384);
  // A destination block named twice (the bitmap's check, and the sort's with a stride).
  set({3, 0, 7}, {0, 2, 0});
  EXPECT_EQ(ExpandBlocks(b, 16).status().code(), StatusCode::kInvalidArgument);
  set({3, 0, 7}, {0, 2, 1});
  // A stride smaller than the block makes destination blocks overlap.
  b.destination_stride = 1024;
  EXPECT_EQ(ExpandBlocks(b, 16).status().code(), StatusCode::kInvalidArgument);
  b.destination_stride = 0;
  set({uint64_t{1} << 60, 0, 1}, {0, 2, 1});
  EXPECT_EQ(ExpandBlocks(b, 16).status().code(), StatusCode::kInvalidArgument);  // Overflow.
  set({0, 1}, {0, 2, 1});
  EXPECT_EQ(ExpandBlocks(b, 16).status().code(), StatusCode::kInvalidArgument);  // Lengths.
  set({0, 1, 2}, {0, 2, 1});
  b.block_size = 0;
  EXPECT_EQ(ExpandBlocks(b, 16).status().code(), StatusCode::kInvalidArgument);
  b.block_size = 1;
  EXPECT_EQ(ExpandBlocks(b, 2).status().code(), StatusCode::kResourceExhausted);
}

TEST(Segments, CutsAtPieceBoundariesByBytes) {
  std::vector<Segment> list = {{0, 0, 10}, {0, 10, 10}, {0, 20, 10}, {0, 30, 30}};
  EXPECT_EQ(CutPieces(list, 0, 4, 60, 2), (std::vector<size_t>{0, 3, 4}));
  EXPECT_EQ(CutPieces(list, 1, 3, 20, 2), (std::vector<size_t>{1, 2, 3}));
  EXPECT_EQ(CutPieces(list, 0, 4, 60, 1), (std::vector<size_t>{0, 4}));
}

TEST(Segments, PiecesAnotherNodeNamesMustLieInTheHeldRange) {
  auto total = CheckPiecesIn({{0, 0, 10}, {90, 0, 10}, {50, 0, 1}}, 100, 3);
  ASSERT_TRUE(total.ok()) << total.status();
  EXPECT_EQ(*total, 21u);
  for (const Segment& bad :
       {Segment{91, 0, 10}, Segment{0, 0, 0}, Segment{101, 0, 1}, Segment{1, 0, UINT64_MAX}}) {
    EXPECT_EQ(CheckPiecesIn({{0, 0, 1}, bad}, 100, 3).status().code(), StatusCode::kInvalidArgument)
        << bad.src << "+" << bad.length;
  }
  EXPECT_EQ(CheckPiecesIn({{0, 0, 1}, {1, 0, 1}}, 100, 1).status().code(),
            StatusCode::kInvalidArgument);  // Too many.
  // Pieces may repeat (a source read twice); their sum is still checked for overflow.
  EXPECT_EQ(CheckPiecesIn({{0, 0, UINT64_MAX}, {0, 0, UINT64_MAX}}, UINT64_MAX, 2).status().code(),
            StatusCode::kInvalidArgument);
}

// Every window of the packed stream names exactly its bytes: the parts, laid at their
// places in the window, give the pieces' bytes in list order, whatever the cut.
TEST(Segments, PackedWindowsNameTheirPiecesBytes) {
  std::mt19937_64 rng(7);
  std::vector<Segment> list;
  uint64_t dst = 0;
  for (int i = 0; i < 300; ++i) {
    const uint64_t length = 1 + rng() % (i % 3 == 0 ? 5000 : 17);
    list.push_back(Segment{rng() % 100000, dst, length});
    dst += length + rng() % 3;
  }
  auto s = MakeSegments(list, 1000);
  ASSERT_TRUE(s.ok()) << s.status();
  const PackedPieces packed(**s);
  ASSERT_EQ(packed.total(), (*s)->total);
  // The packed stream as (src offset) per byte.
  std::vector<uint64_t> want;
  for (const Segment& p : list) {
    for (uint64_t k = 0; k < p.length; ++k) want.push_back(p.src + k);
  }
  for (int round = 0; round < 200; ++round) {
    const uint64_t offset = rng() % packed.total();
    const uint64_t n = 1 + rng() % (packed.total() - offset);
    std::vector<uint64_t> got(n, ~uint64_t{0});
    size_t parts = 0;
    uint64_t next_at = 0;
    packed.ForEach(offset, n, [&](uint64_t src, uint64_t, uint64_t length, uint64_t at) {
      EXPECT_EQ(at, next_at);
      next_at = at + length;
      ++parts;
      for (uint64_t k = 0; k < length; ++k) got[at + k] = src + k;
    });
    EXPECT_EQ(next_at, n);
    EXPECT_EQ(parts, packed.Count(offset, n));
    EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin() + offset)) << offset << "+" << n;
  }
  EXPECT_EQ(packed.Count(0, packed.total()), list.size());
}

}  // namespace
}  // namespace gpumove
