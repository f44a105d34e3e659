// Notifications (TransferSpec.notify, TransferService.Notifications): published where the
// destination lives once the bytes are there — a subscriber that reads the destination
// the moment it is notified sees the new bytes — for LOCAL moves, pulls, pushes and
// third-party moves over UCX, vectored or not, with checksums; none for a move that
// fails; in order, resumable from a sequence number, with the ones that fell out of the
// log counted as missed; filtered by buffer; streamed through another node.
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/gpumove_client.h"
#include "gtest/gtest.h"
#include "tests/util/daemon_process.h"
#include "tests/util/random_bytes.h"
#include "tests/util/test_node.h"

namespace gpumove {
namespace {

using absl::StatusCode;

v1::BufferRef On(const std::string& node, const std::string& id) {
  v1::BufferRef r = Ref(id);
  r.set_node(node);
  return r;
}

std::unique_ptr<NotificationStream> Subscribe(Client& c, std::vector<std::string> buffers,
                                              std::optional<uint64_t> after = std::nullopt,
                                              const std::string& node = "") {
  v1::NotificationsRequest request;
  request.set_node(node);
  for (const std::string& b : buffers) request.add_buffers(b);
  if (after.has_value()) request.set_after_sequence(*after);
  auto s = c.Subscribe(request, absl::Seconds(60));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

TEST(Notifications, ArriveAfterTheBytesOnEveryWayIn) {
  const std::vector<std::string> flags = {"--host_pool_size=64MiB", "--pinned_pool_size=16MiB"};
  TestNode a = LaunchNode("a", "", flags);
  ASSERT_TRUE(a.client);
  TestNode b = LaunchNode("b", a.process->address(), flags);
  TestNode c = LaunchNode("c", a.process->address(), flags);
  ASSERT_TRUE(b.client && c.client);
  for (TestNode* n : {&a, &b, &c}) ASSERT_TRUE(AwaitPeersUp(*n, 2).ok()) << n->name;
  constexpr uint64_t kSize = 4 << 20;
  auto src_a = a.client->Allocate(kSize);
  auto src_b = b.client->Allocate(kSize);
  auto dst = b.client->Allocate(kSize);
  auto other = b.client->Allocate(kSize);
  ASSERT_TRUE(src_a.ok() && src_b.ok() && dst.ok() && other.ok());
  // Subscribed on b (where the destination lives) and, through c, to b's as well.
  auto here = Subscribe(*b.client, {dst->id()});
  auto via_c = Subscribe(*c.client, {dst->id()}, std::nullopt, "b");
  ASSERT_TRUE(here && via_c);
  struct Way {
    const char* what;
    TestNode* source;
    std::string source_id;
    TestNode* via;
    bool blocks, checksum;
  };
  const std::vector<Way> ways = {
      {"LOCAL", &b, src_b->id(), &b, false, false},
      {"LOCAL vectored", &b, src_b->id(), &b, true, true},
      {"pull a->b by b", &a, src_a->id(), &b, false, true},
      {"push a->b by a", &a, src_a->id(), &a, false, false},
      {"push a->b by a, checksum", &a, src_a->id(), &a, false, true},
      {"push a->b by a, vectored", &a, src_a->id(), &a, true, false},
      {"third party a->b by c", &a, src_a->id(), &c, false, false},
  };
  uint64_t seed = 70;
  uint64_t last_sequence = 0;
  for (const Way& w : ways) {
    for (int round = 0; round < 3; ++round) {
      SCOPED_TRACE(absl::StrCat(w.what, " round ", round));
      const std::string bytes = RandomBytes(kSize, ++seed);
      ASSERT_TRUE(w.source->client->Write(Ref(w.source_id), bytes).ok());
      MoveOptions o;
      o.wait = false;  // The notification may come before the mover hears of the end.
      o.checksum = w.checksum;
      o.notify = absl::StrCat("note ", seed);
      std::string expected = bytes;
      if (w.blocks) {
        // Every other 64 KiB block, reversed: the rest keeps the last round's bytes.
        auto before = b.client->Read(Ref(dst->id()));
        ASSERT_TRUE(before.ok());
        expected = *before;
        constexpr uint64_t kBlock = 64 << 10;
        o.blocks.set_block_size(kBlock);
        const uint64_t n = kSize / kBlock;
        for (uint64_t i = 0; i < n; i += 2) {
          o.blocks.add_source_blocks(i);
          o.blocks.add_destination_blocks(n - 1 - i);
          expected.replace((n - 1 - i) * kBlock, kBlock, bytes, i * kBlock, kBlock);
        }
      }
      auto t = w.via->client->Move(On(w.source->name, w.source_id), On("b", dst->id()), o);
      ASSERT_TRUE(t.ok()) << t.status();
      v1::Notification n;
      ASSERT_TRUE(here->Next(&n)) << here->Finish();
      // Read at once: the bytes must be there already.
      auto now = b.client->Read(Ref(dst->id()));
      ASSERT_TRUE(now.ok()) << now.status();
      EXPECT_TRUE(*now == expected) << "notified before the bytes landed";
      EXPECT_EQ(n.transfer_id(), t->id());
      EXPECT_EQ(n.notify(), o.notify);
      EXPECT_EQ(n.source_node(), w.source->name);
      EXPECT_EQ(n.destination_buffer(), dst->id());
      EXPECT_EQ(n.missed(), 0u);
      EXPECT_GT(n.sequence(), last_sequence);  // In order.
      last_sequence = n.sequence();
      v1::Notification forwarded;
      ASSERT_TRUE(via_c->Next(&forwarded)) << via_c->Finish();
      EXPECT_EQ(forwarded.transfer_id(), t->id());
      EXPECT_EQ(forwarded.sequence(), n.sequence());
      auto end = w.via->client->Wait(t->id(), absl::Seconds(30));
      ASSERT_TRUE(end.ok()) << end.status();
      EXPECT_EQ(end->state(), v1::SUCCEEDED) << end->error_message();
    }
  }
  // A move into another buffer is not seen by the filtered subscriber, and a move without
  // notify bytes publishes nothing: the next one seen is the one after them.
  MoveOptions quiet;
  ASSERT_EQ(b.client->Move(Ref(src_b->id()), Ref(dst->id()), quiet)->state(), v1::SUCCEEDED);
  MoveOptions elsewhere;
  elsewhere.notify = "elsewhere";
  ASSERT_EQ(b.client->Move(Ref(src_b->id()), Ref(other->id()), elsewhere)->state(),
            v1::SUCCEEDED);
  MoveOptions last;
  last.notify = "last";
  auto t = a.client->Move(Ref(src_a->id()), On("b", dst->id()), last);
  ASSERT_TRUE(t.ok() && t->state() == v1::SUCCEEDED);
  v1::Notification n;
  ASSERT_TRUE(here->Next(&n));
  EXPECT_EQ(n.notify(), "last");
  EXPECT_EQ(n.sequence(), last_sequence + 2);  // "elsewhere" took one number, unseen.
  // Refused whole: notify bytes past the limit.
  MoveOptions big;
  big.notify = std::string(4097, 'x');
  EXPECT_EQ(a.client->Move(Ref(src_a->id()), On("b", dst->id()), big).status().code(),
            StatusCode::kInvalidArgument);
  here->Cancel();
  via_c->Cancel();
  EXPECT_EQ(here->Finish().code(), StatusCode::kCancelled);
}

TEST(Notifications, AMoveThatFailsPublishesNothing) {
  // Capped at 8 MiB/s: a 64 MiB move is cancelled long before it ends.
  auto d = DaemonProcess::Start({"--node=a", "--host_pool_size=256MiB", "--max_move_rate=8MiB"});
  ASSERT_TRUE(d.ok()) << d.status();
  auto c = Client::Connect((*d)->address());
  ASSERT_TRUE(c.ok());
  auto s = (*c)->Allocate(64 << 20);
  auto t = (*c)->Allocate(64 << 20);
  ASSERT_TRUE(s.ok() && t.ok());
  auto sub = Subscribe(**c, {});
  MoveOptions slow;
  slow.wait = false;
  slow.notify = "never";
  auto cancelled = (*c)->Move(Ref(s->id()), Ref(t->id()), slow);
  ASSERT_TRUE(cancelled.ok());
  absl::SleepFor(absl::Milliseconds(100));
  ASSERT_TRUE((*c)->Cancel(cancelled->id()).ok());
  auto end = (*c)->Wait(cancelled->id(), absl::Seconds(30));
  ASSERT_TRUE(end.ok());
  EXPECT_EQ(end->state(), v1::CANCELLED);
  v1::BufferRef small = Ref(s->id());
  small.set_length(4096);
  MoveOptions next;
  next.notify = "next";
  ASSERT_EQ((*c)->Move(small, Ref(t->id()), next)->state(), v1::SUCCEEDED);
  v1::Notification n;
  ASSERT_TRUE(sub->Next(&n));
  EXPECT_EQ(n.notify(), "next");
  EXPECT_EQ(n.sequence(), 1u);
  sub->Cancel();
}

TEST(Notifications, ResumeFromASequenceAndCountWhatFellOut) {
  auto d = DaemonProcess::Start({"--node=a", "--host_pool_size=64MiB", "--notification_log=4"});
  ASSERT_TRUE(d.ok()) << d.status();
  auto c = Client::Connect((*d)->address());
  ASSERT_TRUE(c.ok());
  auto s = (*c)->Allocate(4096);
  auto t = (*c)->Allocate(4096);
  ASSERT_TRUE(s.ok() && t.ok());
  for (int i = 0; i < 10; ++i) {
    MoveOptions o;
    o.notify = absl::StrCat("n", i);
    ASSERT_EQ((*c)->Move(Ref(s->id()), Ref(t->id()), o)->state(), v1::SUCCEEDED);
  }
  // From the oldest kept: n6..n9 (sequences 7..10), after 6 missed.
  auto all = Subscribe(**c, {}, 0);
  v1::Notification n;
  ASSERT_TRUE(all->Next(&n));
  EXPECT_EQ(n.sequence(), 7u);
  EXPECT_EQ(n.notify(), "n6");
  EXPECT_EQ(n.missed(), 6u);
  for (int i = 7; i <= 9; ++i) {
    ASSERT_TRUE(all->Next(&n));
    EXPECT_EQ(n.notify(), absl::StrCat("n", i));
    EXPECT_EQ(n.missed(), 0u);
  }
  all->Cancel();
  // Resumed after 8: n8, n9, then the next one published.
  auto resumed = Subscribe(**c, {t->id()}, 8);
  ASSERT_TRUE(resumed->Next(&n));
  EXPECT_EQ(n.notify(), "n8");
  ASSERT_TRUE(resumed->Next(&n));
  EXPECT_EQ(n.notify(), "n9");
  MoveOptions o;
  o.notify = "n10";
  ASSERT_EQ((*c)->Move(Ref(s->id()), Ref(t->id()), o)->state(), v1::SUCCEEDED);
  ASSERT_TRUE(resumed->Next(&n));
  EXPECT_EQ(n.notify(), "n10");
  EXPECT_EQ(n.sequence(), 11u);
  resumed->Cancel();
  // Unknown node: NOT_FOUND.
  v1::NotificationsRequest nowhere;
  nowhere.set_node("nowhere");
  auto gone = (*c)->Subscribe(nowhere, absl::Seconds(10));
  ASSERT_TRUE(gone.ok());
  EXPECT_FALSE((*gone)->Next(&n));
  EXPECT_EQ((*gone)->Finish().code(), StatusCode::kNotFound);
}

// A buffer that does not exist would never see a notification: NOT_FOUND at once. A stream
// whose buffers are all released ends NOT_FOUND instead of waiting for ever.
TEST(Notifications, MissingAndReleasedBuffersEndTheStream) {
  auto d = DaemonProcess::Start({"--node=a", "--host_pool_size=64MiB"});
  ASSERT_TRUE(d.ok()) << d.status();
  auto c = Client::Connect((*d)->address());
  ASSERT_TRUE(c.ok());
  v1::Notification n;
  auto nope = Subscribe(**c, {"b-nope"});
  EXPECT_FALSE(nope->Next(&n));
  const absl::Status missing = nope->Finish();
  EXPECT_EQ(missing.code(), StatusCode::kNotFound) << missing;
  EXPECT_TRUE(absl::StrContains(missing.message(), "b-nope")) << missing;

  auto one = (*c)->Allocate(4096);
  auto two = (*c)->Allocate(4096);
  ASSERT_TRUE(one.ok() && two.ok());
  auto both = Subscribe(**c, {one->id(), two->id()});
  ASSERT_TRUE((*c)->Release(one->id()).ok());
  // One of the two left: the stream goes on and still delivers.
  MoveOptions o;
  o.notify = "still here";
  auto src = (*c)->Allocate(4096);
  ASSERT_EQ((*c)->Move(Ref(src->id()), Ref(two->id()), o)->state(), v1::SUCCEEDED);
  ASSERT_TRUE(both->Next(&n));
  EXPECT_EQ(n.notify(), "still here");
  ASSERT_TRUE((*c)->Release(two->id()).ok());
  const absl::Time start = absl::Now();
  EXPECT_FALSE(both->Next(&n));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  const absl::Status ended = both->Finish();
  EXPECT_EQ(ended.code(), StatusCode::kNotFound) << ended;
  EXPECT_TRUE(absl::StrContains(ended.message(), "released")) << ended;
}

}  // namespace
}  // namespace gpumove
