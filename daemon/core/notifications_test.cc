#include "daemon/core/notifications.h"

#include <thread>

#include "absl/time/clock.h"
#include "daemon/core/buffer_registry.h"
#include "gtest/gtest.h"

namespace gpumove {
namespace {

Notification Note(const std::string& id, const std::string& buffer = "b-1") {
  return Notification{id, "node-a", buffer, "payload-" + id, absl::Now()};
}

absl::Time Soon() { return absl::Now() + absl::Milliseconds(50); }

TEST(NotificationLog, ReadsInOrderFromASequence) {
  NotificationLog log(16);
  for (int i = 1; i <= 5; ++i) log.Publish("t", Note(std::to_string(i)));
  auto all = log.Read("t", 0, nullptr, 100, Soon());
  ASSERT_EQ(all.entries.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(all.entries[i].sequence, i + 1);
    EXPECT_EQ(all.entries[i].notification->transfer_id, std::to_string(i + 1));
    EXPECT_EQ(all.entries[i].missed, 0u);
  }
  EXPECT_EQ(all.next_after, 5u);
  auto resumed = log.Read("t", 3, nullptr, 100, Soon());
  ASSERT_EQ(resumed.entries.size(), 2u);
  EXPECT_EQ(resumed.entries[0].sequence, 4u);
  auto some = log.Read("t", 0, nullptr, 2, Soon());
  ASSERT_EQ(some.entries.size(), 2u);
  EXPECT_EQ(some.next_after, 2u);
  EXPECT_EQ(log.Last("t"), 5u);
}

TEST(NotificationLog, TenantsAreNumberedApartAndAdminsSeeAll) {
  NotificationLog log(16);
  log.Publish("a", Note("1"));
  log.Publish("b", Note("2"));
  log.Publish("a", Note("3"));
  auto a = log.Read("a", 0, nullptr, 100, Soon());
  ASSERT_EQ(a.entries.size(), 2u);
  EXPECT_EQ(a.entries[1].sequence, 2u);  // No gap for b's.
  EXPECT_EQ(a.entries[1].notification->transfer_id, "3");
  auto b = log.Read("b", 0, nullptr, 100, Soon());
  ASSERT_EQ(b.entries.size(), 1u);
  EXPECT_EQ(b.entries[0].notification->transfer_id, "2");
  auto admin = log.Read(kAnyOwner, 0, nullptr, 100, Soon());
  ASSERT_EQ(admin.entries.size(), 3u);
  EXPECT_EQ(log.Read("c", 0, nullptr, 100, Soon()).entries.size(), 0u);
}

TEST(NotificationLog, AFilterSkipsButStillAdvances) {
  NotificationLog log(16);
  log.Publish("t", Note("1", "b-1"));
  log.Publish("t", Note("2", "b-2"));
  log.Publish("t", Note("3", "b-1"));
  auto only2 = [](const Notification& n) { return n.destination_buffer == "b-2"; };
  auto r = log.Read("t", 0, only2, 100, Soon());
  ASSERT_EQ(r.entries.size(), 1u);
  EXPECT_EQ(r.entries[0].sequence, 2u);
  EXPECT_EQ(r.next_after, 3u);
  EXPECT_TRUE(log.Read("t", r.next_after, only2, 100, Soon()).entries.empty());
}

TEST(NotificationLog, ASubscriberThatFellBehindIsToldHowManyItMissed) {
  NotificationLog log(4);
  for (int i = 1; i <= 10; ++i) log.Publish("t", Note(std::to_string(i)));
  auto r = log.Read("t", 2, nullptr, 100, Soon());
  ASSERT_EQ(r.entries.size(), 4u);  // 7..10 kept.
  EXPECT_EQ(r.entries[0].sequence, 7u);
  EXPECT_EQ(r.entries[0].missed, 4u);  // 3..6.
  EXPECT_EQ(r.entries[1].missed, 0u);
  // A loss followed by nothing the filter takes is still reported.
  auto none = log.Read("t", 0, [](const Notification&) { return false; }, 100, Soon());
  ASSERT_EQ(none.entries.size(), 1u);
  EXPECT_EQ(none.entries[0].notification, nullptr);
  EXPECT_EQ(none.entries[0].missed, 6u);
  EXPECT_EQ(none.next_after, 10u);
  // Another tenant's burst does not push this one's out.
  log.Publish("u", Note("x"));
  for (int i = 0; i < 10; ++i) log.Publish("v", Note("y"));
  EXPECT_EQ(log.Read("u", 0, nullptr, 100, Soon()).entries.size(), 1u);
}

TEST(NotificationLog, AReaderWaitsForTheNextOne) {
  NotificationLog log(16);
  std::thread publisher([&] {
    absl::SleepFor(absl::Milliseconds(30));
    log.Publish("t", Note("late"));
  });
  auto r = log.Read("t", 0, nullptr, 100, absl::Now() + absl::Seconds(10));
  publisher.join();
  ASSERT_EQ(r.entries.size(), 1u);
  EXPECT_EQ(r.entries[0].notification->transfer_id, "late");
  const absl::Time t0 = absl::Now();
  EXPECT_TRUE(log.Read("t", 1, nullptr, 100, absl::Now() + absl::Milliseconds(30)).entries.empty());
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(25));
  log.Stop();
  EXPECT_TRUE(log.Read("t", 1, nullptr, 100, absl::InfiniteFuture()).entries.empty());
}

// Listeners hear what their reader may see (a tenant its own, an admin everyone's) and
// the stop, nothing of another tenant's, and nothing once they stopped listening.
TEST(NotificationLog, ListenersHearWhatTheirReaderMaySee) {
  NotificationLog log(8);
  int a = 0, b = 0, admin = 0, gone = 0;
  log.Listen("a", [&] { ++a; });
  log.Listen("b", [&] { ++b; });
  log.Listen(kAnyOwner, [&] { ++admin; });
  log.Unlisten(log.Listen("a", [&] { ++gone; }));
  log.Publish("a", {.transfer_id = "t-1"});
  log.Publish("a", {.transfer_id = "t-2"});
  EXPECT_EQ(a, 2);
  EXPECT_EQ(b, 0);
  EXPECT_EQ(admin, 2);
  log.Stop();
  EXPECT_EQ(a, 3);
  EXPECT_EQ(b, 1);
  EXPECT_EQ(admin, 3);
  EXPECT_EQ(gone, 0);
}

}  // namespace
}  // namespace gpumove
