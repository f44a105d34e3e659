#include "daemon/memory/allocator.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace gpumove {
namespace {

TEST(Allocator, AlignsAndRoundsEveryBlock) {
  Allocator a(1 << 20, 256);
  auto x = a.Allocate(1);
  auto y = a.Allocate(300);
  ASSERT_TRUE(x.ok() && y.ok());
  EXPECT_EQ(*x % 256, 0u);
  EXPECT_EQ(*y % 256, 0u);
  EXPECT_NE(*x, *y);
  EXPECT_EQ(a.free_bytes(), (1u << 20) - 256 - 512);
}

TEST(Allocator, RejectsZeroAndOversizedRequests) {
  Allocator a(4096, 256);
  EXPECT_EQ(a.Allocate(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a.Allocate(4097).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a.Allocate(UINT64_MAX).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a.free_bytes(), 4096u);
}

TEST(Allocator, ReportsExhaustionHonestly) {
  Allocator a(4096, 1024);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(a.Allocate(1024).ok());
  EXPECT_EQ(a.Allocate(1).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(a.free_bytes(), 0u);
}

TEST(Allocator, CoalescesNeighboursOnFree) {
  Allocator a(4096, 1024);
  uint64_t b[4];
  for (auto& off : b) off = *a.Allocate(1024);
  ASSERT_TRUE(a.Free(b[1]).ok());
  ASSERT_TRUE(a.Free(b[3]).ok());
  EXPECT_EQ(a.largest_free(), 1024u);
  EXPECT_EQ(a.Allocate(2048).status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(a.Free(b[2]).ok());  // Joins 1..3 into one block.
  EXPECT_EQ(a.largest_free(), 3072u);
  EXPECT_EQ(a.free_blocks(), 1u);
  ASSERT_TRUE(a.Free(b[0]).ok());
  EXPECT_EQ(a.free_blocks(), 1u);
  EXPECT_EQ(a.largest_free(), 4096u);
  EXPECT_TRUE(a.Allocate(4096).ok());
}

TEST(Allocator, PicksTheBestFit) {
  Allocator a(8192, 1024);
  uint64_t b[8];
  for (auto& off : b) off = *a.Allocate(1024);
  ASSERT_TRUE(a.Free(b[1]).ok());                             // 1 KiB hole
  ASSERT_TRUE(a.Free(b[3]).ok() && a.Free(b[4]).ok());        // 2 KiB hole
  EXPECT_EQ(*a.Allocate(1024), b[1]);
  EXPECT_EQ(*a.Allocate(2048), b[3]);
}

TEST(Allocator, DoubleFreeAndUnknownOffsetsChangeNothing) {
  Allocator a(4096, 256);
  uint64_t x = *a.Allocate(256);
  ASSERT_TRUE(a.Free(x).ok());
  EXPECT_EQ(a.Free(x).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a.Free(12345).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a.free_bytes(), 4096u);
  EXPECT_EQ(a.free_blocks(), 1u);
}

TEST(Allocator, RandomWorkloadKeepsAccountsStraight) {
  Allocator a(1 << 24, 256);
  std::mt19937_64 rng(7);
  std::vector<std::pair<uint64_t, uint64_t>> live;  // offset, size
  for (int step = 0; step < 20000; ++step) {
    if (live.empty() || rng() % 3 != 0) {
      const uint64_t size = 1 + rng() % 65536;
      auto off = a.Allocate(size);
      if (!off.ok()) {
        EXPECT_EQ(off.status().code(), absl::StatusCode::kResourceExhausted);
        continue;
      }
      for (auto& [o, s] : live) {
        ASSERT_TRUE(*off + size <= o || o + s <= *off) << "blocks overlap";
      }
      live.emplace_back(*off, size);
    } else {
      const size_t i = rng() % live.size();
      ASSERT_TRUE(a.Free(live[i].first).ok());
      live.erase(live.begin() + i);
    }
  }
  for (auto& [o, s] : live) ASSERT_TRUE(a.Free(o).ok());
  EXPECT_EQ(a.free_bytes(), 1u << 24);
  EXPECT_EQ(a.free_blocks(), 1u);
}

}  // namespace
}  // namespace gpumove
