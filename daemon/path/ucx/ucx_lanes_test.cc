// How a UCX move goes (ChooseUcxStrategy), and which lanes it takes (ChooseLanes): the
// policy that keeps lanes evenly loaded.
#include <vector>

#include "daemon/path/ucx/ucx_engine.h"
#include "gtest/gtest.h"

namespace gpumove {
namespace {

using Lanes = std::vector<size_t>;

TEST(ChooseLanesTest, ALoneMoveTakesEveryLaneItCanFill) {
  EXPECT_EQ(ChooseLanes({0, 0, 0, 0}, 16, false), (Lanes{0, 1, 2, 3}));
  // Too small for more shares: as many lanes as shares.
  EXPECT_EQ(ChooseLanes({0, 0, 0, 0}, 2, false), (Lanes{0, 1}));
  EXPECT_EQ(ChooseLanes({0, 0, 0, 0}, 0, false), (Lanes{0}));
}

TEST(ChooseLanesTest, SmallMovesTakeFreeLanesOnly) {
  EXPECT_EQ(ChooseLanes({1, 0, 1, 0}, 16, false), (Lanes{1, 3}));
  EXPECT_EQ(ChooseLanes({1, 1, 0, 1}, 2, false), (Lanes{2}));
  // None free: the least used one, whole.
  EXPECT_EQ(ChooseLanes({2, 1, 1, 3}, 16, false), (Lanes{1}));
}

TEST(ChooseLanesTest, BigMovesSpreadOverEveryLaneLeastUsedFirst) {
  EXPECT_EQ(ChooseLanes({2, 1, 1, 3}, 16, true), (Lanes{1, 2, 0, 3}));
  EXPECT_EQ(ChooseLanes({2, 1, 1, 3}, 2, true), (Lanes{1, 2}));
}

TEST(ChooseLanesTest, OneLane) {
  EXPECT_EQ(ChooseLanes({5}, 16, false), (Lanes{0}));
  EXPECT_EQ(ChooseLanes({0}, 16, true), (Lanes{0}));
}

// Staging wins over everything (the other node's first: its slots are where the bytes must
// go); lanes only for host memory that is not copied directly.
TEST(ChooseUcxStrategyTest, EachCaseTakesItsStrategy) {
  struct Case {
    bool remote_staged, local_staged;
    size_t lanes;
    bool direct;
    UcxStrategy want;
  };
  for (const Case& c : std::vector<Case>{
           {true, false, 0, false, UcxStrategy::kRemoteStaged},
           {true, true, 0, false, UcxStrategy::kRemoteStaged},
           {true, false, 3, false, UcxStrategy::kRemoteStaged},
           {false, true, 0, false, UcxStrategy::kLocalStaged},
           {false, false, 3, false, UcxStrategy::kLanes},
           {false, false, 3, true, UcxStrategy::kWhole},
           {false, false, 0, false, UcxStrategy::kWhole},
       }) {
    EXPECT_EQ(ChooseUcxStrategy(c.remote_staged, c.local_staged, c.lanes, c.direct), c.want)
        << c.remote_staged << c.local_staged << c.lanes << c.direct << " -> "
        << UcxStrategyName(c.want);
  }
}

}  // namespace
}  // namespace gpumove
