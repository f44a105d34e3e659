#include "daemon/core/range.h"

#include "gtest/gtest.h"

namespace gpumove {
namespace {

TEST(ResolveRange, ZeroLengthMeansToTheEnd) {
  EXPECT_EQ(*ResolveRange(100, 0, 0), 100u);
  EXPECT_EQ(*ResolveRange(100, 40, 0), 60u);
  EXPECT_EQ(*ResolveRange(100, 99, 0), 1u);
}

TEST(ResolveRange, AcceptsRangesInside) {
  EXPECT_EQ(*ResolveRange(100, 0, 100), 100u);
  EXPECT_EQ(*ResolveRange(100, 10, 90), 90u);
  EXPECT_EQ(*ResolveRange(100, 99, 1), 1u);
}

TEST(ResolveRange, RejectsRangesOutside) {
  EXPECT_EQ(ResolveRange(100, 100, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveRange(100, 101, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveRange(100, 0, 101).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveRange(100, 50, 51).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ResolveRange, RejectsOverflow) {
  EXPECT_EQ(ResolveRange(100, 1, UINT64_MAX).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveRange(UINT64_MAX, UINT64_MAX - 1, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RangesOverlap, SharesAByteOrNot) {
  EXPECT_TRUE(RangesOverlap(0, 10, 9, 1));
  EXPECT_FALSE(RangesOverlap(0, 10, 10, 5));
  EXPECT_FALSE(RangesOverlap(10, 5, 0, 10));
  EXPECT_TRUE(RangesOverlap(5, 1, 0, 10));
}

}  // namespace
}  // namespace gpumove
