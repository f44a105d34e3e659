#include "daemon/core/prepared_pieces.h"

#include "absl/strings/match.h"
#include "daemon/core/buffer_registry.h"
#include "gtest/gtest.h"

namespace gpumove {
namespace {

std::shared_ptr<const Segments> Pieces(std::vector<Segment> list) {
  auto s = MakeSegments(std::move(list), 1 << 20);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

TEST(PreparedPieceLists, KeptPerTenantAndFoundOnlyByIt) {
  PreparedPieceLists lists("a", {});
  auto p = lists.Add("t1", *Pieces({{0, 8, 4}, {16, 0, 4}}), "layout");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(absl::StartsWith(p->id, "p-") && absl::EndsWith(p->id, ".a")) << p->id;
  EXPECT_EQ(p->owner, "t1");
  EXPECT_EQ(p->label, "layout");
  EXPECT_EQ(p->pieces->list.size(), 2u);
  EXPECT_EQ(p->pieces->total, 8u);
  auto found = lists.Find("t1", p->id);
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(found->pieces.get(), p->pieces.get());  // The same list, not a copy.
  EXPECT_EQ(lists.Find("t2", p->id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(lists.Find(kAnyOwner, p->id).ok());  // An admin sees every tenant's.
  EXPECT_EQ(lists.Remove("t2", p->id).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(lists.Find("t1", p->id).ok());
  EXPECT_EQ(lists.List("t1").size(), 1u);
  EXPECT_TRUE(lists.List("t2").empty());
  EXPECT_TRUE(lists.Remove("t1", p->id).ok());
  EXPECT_EQ(lists.Find("t1", p->id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(lists.Remove("t1", p->id).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(lists.lists(), 0u);
  EXPECT_EQ(lists.pieces(), 0u);
}

TEST(PreparedPieceLists, KeepsTheRebasedFormOnceWhenOffsetsNeedIt) {
  PreparedPieceLists lists("a", {});
  auto p = lists.Add("t", *Pieces({{100, 50, 10}, {120, 70, 20}}), "");
  ASSERT_TRUE(p.ok());
  ASSERT_NE(p->pieces->rebased, nullptr);
  EXPECT_EQ(Rebased(p->pieces).get(), p->pieces->rebased.get());
  EXPECT_EQ(p->pieces->rebased->list[1].src, 20u);
  EXPECT_EQ(p->pieces->rebased->list[1].dst, 20u);
  EXPECT_EQ(p->pieces->rebased->src_hi, 40u);
  // Both forms numbered, apart from each other and from every other list.
  EXPECT_NE(p->pieces->serial, 0u);
  EXPECT_NE(p->pieces->rebased->serial, 0u);
  EXPECT_NE(p->pieces->rebased->serial, p->pieces->serial);
  auto q = lists.Add("t", *Pieces({{0, 0, 10}}), "");
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->pieces->rebased, nullptr);
  EXPECT_EQ(Rebased(q->pieces).get(), q->pieces.get());
  EXPECT_NE(q->pieces->serial, 0u);
  EXPECT_NE(q->pieces->serial, p->pieces->serial);
  EXPECT_NE(q->pieces->serial, p->pieces->rebased->serial);
  EXPECT_EQ(Rebased(*Pieces({{100, 50, 10}}))->serial, 0u);  // A list for one move.
}

TEST(PreparedPieceLists, EachTenantsListsAndPiecesAreBounded) {
  PreparedPieceLists lists("a", {.lists_per_owner = 2, .pieces_per_owner = 5});
  auto two = Pieces({{0, 0, 1}, {1, 1, 1}});
  ASSERT_TRUE(lists.Add("t1", *two, "").ok());
  auto second = lists.Add("t1", *two, "");
  ASSERT_TRUE(second.ok());
  auto third = lists.Add("t1", *two, "");
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(third.status().message(), "--max_prepared_lists"));
  ASSERT_TRUE(lists.Add("t2", *two, "").ok());  // Another tenant has its own bounds.
  ASSERT_TRUE(lists.Remove("t1", second->id).ok());
  auto six = Pieces({{0, 0, 1}, {1, 1, 1}, {2, 2, 1}, {3, 3, 1}});
  auto over = lists.Add("t1", *six, "");  // 2 + 4 pieces > 5.
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(over.status().message(), "--max_prepared_pieces"));
  EXPECT_TRUE(lists.Add("t1", *Pieces({{0, 0, 1}, {1, 1, 1}, {2, 2, 1}}), "").ok());
  EXPECT_EQ(lists.lists(), 3u);
  EXPECT_EQ(lists.pieces(), 7u);
  auto listed = lists.List(kAnyOwner);
  ASSERT_EQ(listed.size(), 3u);
  EXPECT_LE(listed[0].created, listed[1].created);
}

}  // namespace
}  // namespace gpumove
