#include "daemon/core/quotas.h"

#include "daemon/core/buffer_registry.h"
#include "gtest/gtest.h"

namespace gpumove {
namespace {

TEST(QuotasTest, ParsesAndRefusesWhatDoesNotFit) {
  auto q = ParseQuotaFile("# comment\nteam-a, 1GiB, -, 8GiB, 64\n*,-,-,-,4\n\n");
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(*q->at("team-a").bytes[0], uint64_t{1} << 30);
  EXPECT_FALSE(q->at("team-a").bytes[1].has_value());
  EXPECT_EQ(*q->at("team-a").bytes[2], uint64_t{8} << 30);
  EXPECT_EQ(*q->at("team-a").transfers, 64u);
  EXPECT_EQ(*q->at("*").transfers, 4u);
  for (const char* bad :
       {"a,1,2,3\n", "a,lots,-,-,-\n", "a,-,-,-,many\n", ",-,-,-,-\n", "a,-,-,-,-\na,1,-,-,-\n"}) {
    auto r = ParseQuotaFile(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("line "), std::string::npos) << r.status();
  }
}

TEST(QuotasTest, ChargesUpToTheLimitPerTenantAndKind) {
  Quotas q;
  q.Set(*ParseQuotaFile("a,100,-,-,2\n*,10,-,-,-\n"));
  EXPECT_TRUE(q.Charge("a", MemoryKind::kHost, 60).ok());
  EXPECT_TRUE(q.Charge("a", MemoryKind::kHost, 40).ok());
  EXPECT_EQ(q.Charge("a", MemoryKind::kHost, 1).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(q.used("a", MemoryKind::kHost), 100u);  // The refused charge counted nothing.
  EXPECT_TRUE(q.Charge("a", MemoryKind::kPinnedHost, 1000).ok());  // No pinned limit.
  q.Uncharge("a", MemoryKind::kHost, 40);
  EXPECT_TRUE(q.Charge("a", MemoryKind::kHost, 40).ok());
  // Others: the default line; admins: none.
  EXPECT_EQ(q.Charge("b", MemoryKind::kHost, 11).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(q.Charge("b", MemoryKind::kHost, 10).ok());
  EXPECT_TRUE(q.Charge(kAnyOwner, MemoryKind::kHost, 1 << 30).ok());
  EXPECT_EQ(*q.TransferLimit("a"), 2u);
  EXPECT_FALSE(q.TransferLimit("b").has_value());
  EXPECT_FALSE(q.TransferLimit(kAnyOwner).has_value());
  // A huge charge does not wrap around the limit.
  EXPECT_EQ(q.Charge("b", MemoryKind::kHost, ~uint64_t{0}).code(),
            absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace gpumove
