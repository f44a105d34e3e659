// StreamTimer: tasks run in the order of their times, not before them, and a cancelled
// one not at all.
#include "daemon/server/stream_timer.h"

#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace gpumove {
namespace {

TEST(StreamTimer, RunsTasksInTimeOrderNotBeforeTheirTimeAndNotWhenCancelled) {
  StreamTimer timer;
  absl::Mutex mu;
  std::vector<int> ran;
  std::vector<absl::Duration> late;
  absl::Notification last;
  const absl::Time start = absl::Now();
  auto task = [&](int n, absl::Duration at) {
    return [&, n, at] {
      absl::MutexLock lock(&mu);
      ran.push_back(n);
      late.push_back(absl::Now() - (start + at));
    };
  };
  timer.At(start + absl::Milliseconds(60), task(3, absl::Milliseconds(60)));
  const uint64_t cancelled =
      timer.At(start + absl::Milliseconds(40), task(99, absl::Milliseconds(40)));
  timer.At(start + absl::Milliseconds(20), task(2, absl::Milliseconds(20)));
  timer.Post(task(1, absl::ZeroDuration()));
  timer.Cancel(cancelled);
  timer.At(start + absl::Milliseconds(80), [&] { last.Notify(); });
  ASSERT_TRUE(last.WaitForNotificationWithTimeout(absl::Seconds(10)));
  absl::MutexLock lock(&mu);
  EXPECT_EQ(ran, (std::vector<int>{1, 2, 3}));
  for (absl::Duration d : late) EXPECT_GE(d, absl::ZeroDuration());
  EXPECT_EQ(timer.pending(), 0u);
}

}  // namespace
}  // namespace gpumove
