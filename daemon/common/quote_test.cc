#include "daemon/common/quote.h"

#include <string>

#include "gtest/gtest.h"

namespace gpumove {
namespace {

TEST(QuotedTest, ShortInputIsQuotedWholeAndEscaped) {
  EXPECT_EQ(Quoted("b-12"), "\"b-12\"");
  EXPECT_EQ(Quoted(std::string("a\nb\0", 4)), "\"a\\nb\\x00\"");
}

TEST(QuotedTest, LongInputShowsItsHeadAndSize) {
  const std::string id(1 << 20, 'x');
  const std::string q = Quoted(id);
  EXPECT_LT(q.size(), 2 * kQuotedMax);
  EXPECT_EQ(q.substr(0, 1 + kQuotedMax), "\"" + std::string(kQuotedMax, 'x'));
  EXPECT_NE(q.find("(1048576 bytes)"), std::string::npos) << q;
}

TEST(BoundedTest, LongMessagesAreCutWithoutSplittingUtf8) {
  EXPECT_EQ(Bounded("short"), "short");
  const std::string m = std::string(1023, 'a') + "é" + std::string(5000, 'b');  // é: 2 bytes.
  const std::string b = Bounded(m);
  EXPECT_LE(b.size(), kMessageMax + 40);
  EXPECT_EQ(b.substr(0, 1023), std::string(1023, 'a'));
  EXPECT_EQ(b.substr(1023, 3), "…");  // The é was not split: cut before it.
  EXPECT_NE(b.find("(5002 more bytes)"), std::string::npos) << b.substr(1000);
}

}  // namespace
}  // namespace gpumove
