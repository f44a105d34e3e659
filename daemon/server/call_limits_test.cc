#include "daemon/server/call_limits.h"

#include <vector>

#include "gtest/gtest.h"

namespace gpumove {
namespace {

TEST(LongCalls, CapsPerPrincipalAndInAllAndSlotsGiveBack) {
  LongCalls calls({.total = 5, .per_principal = 3});
  std::vector<LongCalls::Slot> held;
  for (int i = 0; i < 3; ++i) {
    auto s = calls.Enter("alice");
    ASSERT_TRUE(s.ok()) << s.status();
    held.push_back(*std::move(s));
  }
  auto fourth = calls.Enter("alice");
  EXPECT_EQ(fourth.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(fourth.status().message().find("per_principal"), std::string::npos);
  for (int i = 0; i < 2; ++i) {
    auto s = calls.Enter("bob");
    ASSERT_TRUE(s.ok());
    held.push_back(*std::move(s));
  }
  auto sixth = calls.Enter("carol");
  EXPECT_EQ(sixth.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(sixth.status().message().find("--max_open_calls)"), std::string::npos);
  EXPECT_EQ(calls.open(), 5);
  EXPECT_EQ(calls.refused(), 2u);
  held.clear();
  EXPECT_EQ(calls.open(), 0);
  EXPECT_TRUE(calls.Enter("alice").ok());
  EXPECT_EQ(calls.open(), 0);  // The slot went with the temporary.
}

}  // namespace
}  // namespace gpumove
