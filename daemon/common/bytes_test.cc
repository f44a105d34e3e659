#include "daemon/common/bytes.h"

#include "gtest/gtest.h"

namespace gpumove {
namespace {

TEST(ParseBytes, AcceptsPlainNumbersAndSuffixes) {
  EXPECT_EQ(*ParseBytes("0"), 0u);
  EXPECT_EQ(*ParseBytes("4096"), 4096u);
  EXPECT_EQ(*ParseBytes("4KiB"), 4096u);
  EXPECT_EQ(*ParseBytes("4k"), 4096u);
  EXPECT_EQ(*ParseBytes("64MiB"), 64u << 20);
  EXPECT_EQ(*ParseBytes("1GiB"), 1u << 30);
  EXPECT_EQ(*ParseBytes(" 2 GB "), 2000000000u);
  EXPECT_EQ(*ParseBytes("3TiB"), 3ull << 40);
  EXPECT_EQ(*ParseBytes("17B"), 17u);
}

TEST(ParseBytes, RejectsGarbageAndOverflow) {
  EXPECT_EQ(ParseBytes("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseBytes("MiB").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseBytes("-1").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseBytes("12 parsecs").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseBytes("1.5GiB").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseBytes("99999999999999999999").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseBytes("16777216TiB").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(FormatBytes, PicksTheLargestWholeUnit) {
  EXPECT_EQ(FormatBytes(17), "17 B");
  EXPECT_EQ(FormatBytes(4096), "4 KiB");
  EXPECT_EQ(FormatBytes(3u << 29), "1.50 GiB");
}

}  // namespace
}  // namespace gpumove
