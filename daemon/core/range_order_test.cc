// The order of moves over overlapping bytes (RangeOrder), apart from the scheduler.
#include "daemon/core/range_order.h"

#include <algorithm>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace gpumove {
namespace {

class RangeOrderTest : public ::testing::Test {
 protected:
  // Adds a move from (buffer, offset, length) to (buffer, offset, length) on this node;
  // returns its id. Ranges live in a deque so that their addresses stay put.
  RangeOrder::Id Move(const std::string& src, uint64_t src_offset, const std::string& dst,
                      uint64_t dst_offset, uint64_t length, const std::string& node = "") {
    ranges_.push_back(RangeSpec{node, src, src_offset, length});
    const RangeSpec* s = &ranges_.back();
    ranges_.push_back(RangeSpec{node, dst, dst_offset, length});
    const RangeSpec* d = &ranges_.back();
    const RangeOrder::Id id = ++next_;
    waited_.push_back(order_.Add(id, s, d));
    return id;
  }
  // A vectored move: `pieces` ({src, dst, length}, relative to the ranges' offsets) in
  // ranges of `length` bytes.
  RangeOrder::Id Vectored(const std::string& src, uint64_t src_offset, const std::string& dst,
                          uint64_t dst_offset, uint64_t length,
                          const std::vector<Segment>& pieces) {
    ranges_.push_back(RangeSpec{"", src, src_offset, length});
    const RangeSpec* s = &ranges_.back();
    ranges_.push_back(RangeSpec{"", dst, dst_offset, length});
    const RangeSpec* d = &ranges_.back();
    pieces_.push_back(pieces);
    const RangeOrder::Id id = ++next_;
    waited_.push_back(order_.Add(id, s, d, &pieces_.back()));
    return id;
  }
  bool Waited(RangeOrder::Id id) const { return waited_[id - 1]; }
  std::vector<RangeOrder::Id> End(RangeOrder::Id id) {
    std::vector<RangeOrder::Id> ready;
    order_.End(id, ready);
    return ready;
  }

  RangeOrder order_;
  std::deque<RangeSpec> ranges_;
  std::deque<std::vector<Segment>> pieces_;
  std::vector<bool> waited_;
  RangeOrder::Id next_ = 0;
};

using Ids = std::vector<RangeOrder::Id>;

TEST_F(RangeOrderTest, DisjointBytesAndSharedReadsDoNotWait) {
  const auto a = Move("x", 0, "y", 0, 10);
  const auto b = Move("x", 10, "y", 10, 10);              // Other bytes of the same buffers.
  const auto c = Move("x", 0, "z", 0, 10);                // Reads what a reads.
  const auto d = Move("x", 0, "y", 0, 10, "other-node");  // Same ids, another node.
  for (auto id : {a, b, c, d}) {
    EXPECT_FALSE(Waited(id)) << id;
    EXPECT_EQ(order_.waits_for(id), 0);
  }
  for (auto id : {a, b, c, d}) EXPECT_EQ(End(id), Ids{});
  EXPECT_EQ(order_.size(), 0u);
}

TEST_F(RangeOrderTest, ConflictsWaitInTheOrderAdded) {
  const auto write = Move("x", 0, "y", 0, 10);
  const auto overwrite = Move("z", 0, "y", 5, 10);   // Writes what `write` writes.
  const auto read = Move("y", 12, "w", 0, 2);        // Reads what `overwrite` writes.
  const auto into_source = Move("v", 0, "x", 0, 4);  // Writes what `write` reads.
  EXPECT_FALSE(Waited(write));
  EXPECT_TRUE(Waited(overwrite));
  EXPECT_TRUE(Waited(read));
  EXPECT_TRUE(Waited(into_source));
  EXPECT_EQ(End(write), (Ids{overwrite, into_source}));
  EXPECT_EQ(End(into_source), Ids{});
  EXPECT_EQ(End(overwrite), Ids{read});
  EXPECT_EQ(End(read), Ids{});
  EXPECT_EQ(order_.size(), 0u);
}

TEST_F(RangeOrderTest, ABatchOverOneRangeMakesOneEdgeEach) {
  std::vector<RangeOrder::Id> ids;
  for (int i = 0; i < 1000; ++i) ids.push_back(Move("x", 0, "y", 0, 64));
  EXPECT_EQ(order_.waits_for(ids[0]), 0);
  for (size_t i = 1; i < ids.size(); ++i) ASSERT_EQ(order_.waits_for(ids[i]), 1) << i;
  for (size_t i = 0; i + 1 < ids.size(); ++i) ASSERT_EQ(End(ids[i]), Ids{ids[i + 1]}) << i;
  EXPECT_EQ(End(ids.back()), Ids{});
}

TEST_F(RangeOrderTest, AMoveWaitsForEachPieceItCovers) {
  const auto left = Move("a", 0, "y", 0, 10);
  const auto right = Move("b", 0, "y", 10, 10);
  const auto whole = Move("c", 0, "y", 0, 20);
  EXPECT_EQ(order_.waits_for(whole), 2);
  EXPECT_EQ(End(right), Ids{});
  EXPECT_EQ(End(left), Ids{whole});
}

TEST_F(RangeOrderTest, BothBuffersConflictingWithOneMoveMakeOneEdge) {
  // Source and destination in one buffer; the next move conflicts with both halves.
  const auto first = Move("x", 0, "x", 100, 10);
  const auto second = Move("x", 100, "x", 0, 10);
  EXPECT_EQ(order_.waits_for(second), 1);
  EXPECT_EQ(End(first), Ids{second});
  EXPECT_EQ(End(second), Ids{});
  EXPECT_EQ(order_.size(), 0u);
}

TEST_F(RangeOrderTest, OneEndedWhileWaitingHoldsItsSuccessorsUntilItsPredecessorsEnd) {
  const auto a = Move("s", 0, "y", 0, 10);
  const auto b = Move("s", 0, "y", 0, 10);  // Waits for a.
  const auto c = Move("s", 0, "y", 0, 10);  // Waits for b only (ordered after a through it).
  EXPECT_EQ(order_.waits_for(c), 1);
  EXPECT_EQ(End(b), Ids{});  // Cancelled in the queue: c must still wait for a.
  EXPECT_EQ(order_.waits_for(c), 1);
  EXPECT_EQ(End(a), Ids{c});  // Not b: it ended.
  EXPECT_EQ(End(c), Ids{});
  EXPECT_EQ(order_.size(), 0u);
  EXPECT_EQ(End(c), Ids{});  // Twice, or unknown: nothing.
  EXPECT_EQ(End(12345), Ids{});
}

TEST_F(RangeOrderTest, AMoveAddedAfterOneEndedWhileWaitingDoesNotWaitForIt) {
  const auto a = Move("s", 0, "y", 0, 10);
  const auto b = Move("s", 0, "y", 0, 10);
  EXPECT_EQ(End(b), Ids{});
  const auto c = Move("s", 0, "y", 0, 10);  // Sees a only.
  EXPECT_EQ(order_.waits_for(c), 1);
  EXPECT_EQ(End(a), Ids{c});
}

// Vectored moves conflict where their pieces do, not where their ranges (the pieces'
// hull) do: moves into interleaved blocks of one buffer run at once, each behind the
// moves that touch its own blocks.
TEST_F(RangeOrderTest, VectoredMovesConflictOnlyWhereTheirPiecesDo) {
  // Even and odd 10-byte blocks of y's first 100 bytes, from separate sources.
  std::vector<Segment> even, odd;
  for (uint64_t b = 0; b < 10; ++b) (b % 2 ? odd : even).push_back({b * 10, b * 10, 10});
  const auto e = Vectored("s", 0, "y", 0, 100, even);
  const auto o = Vectored("t", 0, "y", 0, 100, odd);
  EXPECT_FALSE(Waited(o)) << "interleaved blocks are disjoint";
  // A whole move over block 3 (odd) waits for o only; one over bytes 95..105 (the last
  // odd block and past the hull) waits for o only; one over 40..45 for e only.
  const auto w3 = Move("u", 0, "y", 30, 10);
  EXPECT_EQ(order_.waits_for(w3), 1);
  const auto past = Move("u", 0, "y", 95, 10);
  EXPECT_EQ(order_.waits_for(past), 1);
  const auto w4 = Move("u", 0, "y", 40, 5);
  EXPECT_EQ(order_.waits_for(w4), 1);
  // A read of all of y's 100 bytes waits for every writer of them.
  const auto reader = Move("y", 0, "z", 0, 100);
  EXPECT_EQ(order_.waits_for(reader), 5);
  EXPECT_EQ(End(e), (Ids{w4}));
  EXPECT_EQ(End(o), (Ids{w3, past}));
  EXPECT_EQ(order_.waits_for(reader), 3);
}

// A vectored move whose pieces miss an earlier move's bytes does not wait, even inside
// its hull; one whose piece touches a single byte of it does.
TEST_F(RangeOrderTest, ABytesOverlapOfPiecesIsEnough) {
  const auto whole = Move("s", 0, "y", 50, 10);  // Writes y 50..60.
  const auto miss = Vectored("t", 0, "y", 0, 100, {{0, 0, 50}, {60, 60, 40}});
  EXPECT_FALSE(Waited(miss));
  const auto touch = Vectored("t", 0, "y", 0, 100, {{55, 55, 2}});  // y 55..57 only.
  EXPECT_EQ(order_.waits_for(touch), 1);
  // A vectored read of y 20..25 waits for miss (it writes y 0..50), not for the others.
  const auto r = Vectored("y", 20, "z", 0, 10, {{0, 0, 5}});
  EXPECT_EQ(order_.waits_for(r), 1);
  EXPECT_EQ(End(whole), Ids{touch});
  EXPECT_EQ(End(miss), Ids{r});
}

// SpansOf against a plain sort-and-merge, on lists the bitmap takes (aligned blocks,
// strides, repeats on the source side) and lists it leaves to the sort (odd offsets, a
// few pieces far apart).
TEST(SpansOfTest, MatchesASortAndMerge) {
  using Spans = std::vector<std::pair<uint64_t, uint64_t>>;
  auto reference = [](const std::vector<Segment>& list, bool source, uint64_t base) {
    Spans v;
    for (const Segment& p : list) {
      const uint64_t o = base + (source ? p.src : p.dst);
      v.emplace_back(o, o + p.length);
    }
    std::sort(v.begin(), v.end());
    Spans out;
    for (const auto& x : v) {
      if (!out.empty() && x.first <= out.back().second) {
        out.back().second = std::max(out.back().second, x.second);
      } else {
        out.push_back(x);
      }
    }
    return out;
  };
  std::mt19937_64 rng(3);
  for (int round = 0; round < 200; ++round) {
    const size_t n = 1 + rng() % 3000;
    const int shape = round % 4;
    std::vector<Segment> list;
    for (size_t i = 0; i < n; ++i) {
      if (shape == 0) {  // 4 KiB blocks, shuffled indices with gaps.
        list.push_back({(rng() % (4 * n)) * 4096, (rng() % (4 * n)) * 4096, 4096});
      } else if (shape == 1) {  // Strided 3 x 512.
        list.push_back({(rng() % (2 * n)) * 1536, (rng() % (2 * n)) * 1536, 512});
      } else if (shape == 2) {  // Odd offsets and lengths.
        list.push_back({rng() % 100000, rng() % 100000, 1 + rng() % 700});
      } else {  // A few pieces far apart.
        list.push_back({rng() % (uint64_t{1} << 40), rng() % (uint64_t{1} << 40), 64});
      }
    }
    const uint64_t sb = rng() % 1000, db = (rng() % 1000) * 4096;
    const PieceSpans got = SpansOf(list, sb, db);
    EXPECT_EQ(got.source, reference(list, true, sb)) << "round " << round;
    EXPECT_EQ(got.destination, reference(list, false, db)) << "round " << round;
  }
}

}  // namespace
}  // namespace gpumove
