// The order of moves over overlapping bytes (RangeOrder), apart from the scheduler.
#include "daemon/core/range_order.h"

#include <deque>
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
  bool Waited(RangeOrder::Id id) const { return waited_[id - 1]; }
  std::vector<RangeOrder::Id> End(RangeOrder::Id id) {
    std::vector<RangeOrder::Id> ready;
    order_.End(id, ready);
    return ready;
  }

  RangeOrder order_;
  std::deque<RangeSpec> ranges_;
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

}  // namespace
}  // namespace gpumove
