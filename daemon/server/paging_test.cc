#include "daemon/server/paging.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace gpumove {
namespace {

struct Item {
  int64_t t;
  std::string id;
  size_t bytes = 10;
};
PageKey KeyOf(const Item& i) { return PageKey{absl::FromUnixSeconds(i.t), i.id}; }

// Every entry of a listing, page by page, whatever the page size and order; the entries
// made and removed between pages neither repeat nor shift the others.
TEST(Paging, PagesCoverEveryEntryOnceInOrder) {
  for (bool newest_first : {false, true}) {
    std::vector<Item> items;
    for (int i = 0; i < 25; ++i) items.push_back({i / 3, absl::StrCat("id", i % 3)});
    if (newest_first) std::reverse(items.begin(), items.end());
    for (uint32_t size : {1u, 4u, 25u, 100u}) {
      std::vector<std::string> seen;
      std::string token;
      int pages = 0;
      do {
        auto next = FillPage(items, token, size, newest_first, KeyOf, [&](const Item& i) {
          seen.push_back(absl::StrCat(i.t, i.id));
          return i.bytes;
        });
        ASSERT_TRUE(next.ok()) << next.status();
        token = *next;
        ASSERT_LT(++pages, 100);
      } while (!token.empty());
      ASSERT_EQ(seen.size(), items.size()) << size;
      for (size_t i = 0; i < items.size(); ++i) {
        EXPECT_EQ(seen[i], absl::StrCat(items[i].t, items[i].id));
      }
    }
  }
}

TEST(Paging, AnEntryRemovedBetweenPagesShiftsNothing) {
  std::vector<Item> items = {{1, "a"}, {2, "b"}, {3, "c"}, {4, "d"}};
  std::vector<std::string> seen;
  auto add = [&](const Item& i) {
    seen.push_back(i.id);
    return size_t{1};
  };
  auto token = FillPage(items, "", 2, false, KeyOf, add);
  ASSERT_TRUE(token.ok());
  items.erase(items.begin() + 1);         // "b", already served, goes.
  items.insert(items.begin(), {0, "z"});  // An older one appears: not this listing's any more.
  ASSERT_TRUE(FillPage(items, *token, 2, false, KeyOf, add).ok());
  EXPECT_EQ(seen, (std::vector<std::string>{"a", "b", "c", "d"}));
}

TEST(Paging, APageStopsAtItsByteBudgetButHoldsOneEntry) {
  std::vector<Item> items = {{1, "a", kMaxPageBytes - 1}, {2, "b", 5}, {3, "c", kMaxPageBytes * 3}};
  std::vector<std::string> seen;
  auto add = [&](const Item& i) {
    seen.push_back(i.id);
    return i.bytes;
  };
  auto t = FillPage(items, "", kMaxPageItems, false, KeyOf, add);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(seen, (std::vector<std::string>{"a", "b"}));
  t = FillPage(items, *t, kMaxPageItems, false, KeyOf, add);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(seen.back(), "c");
  EXPECT_EQ(*t, "");
}

TEST(Paging, TokensNotMadeHereAreInvalidArguments) {
  for (const std::string& bad :
       std::vector<std::string>{"x", "cDEuMTIz", std::string(400, 'A'), "!!!!"}) {
    auto key = ParsePageToken(bad);
    EXPECT_EQ(key.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  auto key = ParsePageToken(PageToken({absl::FromUnixNanos(-5), "b-1.node"}));
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ((*key)->id, "b-1.node");
  EXPECT_EQ((*key)->time, absl::FromUnixNanos(-5));
  EXPECT_EQ(PageItems(0), kMaxPageItems);
  EXPECT_EQ(PageItems(7), 7u);
  EXPECT_EQ(PageItems(1u << 30), kMaxPageItems);
}

}  // namespace
}  // namespace gpumove
