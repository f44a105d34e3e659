#include "daemon/common/thread_pool.h"

#include <atomic>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace gpumove {
namespace {

TEST(ThreadPool, JobsThatWaitForEachOtherAllRunWithoutALimit) {
  ThreadPool& pool = *new ThreadPool(0);  // Lives for the process, as pools do.
  // Eight jobs that each wait until all eight have started: only one thread per job
  // gets them through.
  absl::BlockingCounter finished(8);
  std::atomic<int> waiting{0};
  absl::Notification all_in;
  for (int i = 0; i < 8; ++i) {
    pool.Run([&] {
      if (++waiting == 8) all_in.Notify();
      all_in.WaitForNotification();
      finished.DecrementCount();
    });
  }
  finished.Wait();
  EXPECT_EQ(pool.threads(), 8);
  // Threads are reused once idle: more rounds, one at a time, start none.
  for (int round = 0; round < 20; ++round) {
    absl::Notification done;
    pool.Run([&] { done.Notify(); });
    done.WaitForNotification();
  }
  EXPECT_EQ(pool.threads(), 8);
}

TEST(ThreadPool, ALimitedPoolQueuesWhatItHasNoThreadFor) {
  ThreadPool& pool = *new ThreadPool(2);
  absl::BlockingCounter done(10);
  std::atomic<int> ran{0};
  for (int i = 0; i < 10; ++i) {
    pool.Run([&] {
      ++ran;
      done.DecrementCount();
    });
  }
  done.Wait();
  EXPECT_EQ(ran.load(), 10);
  EXPECT_LE(pool.threads(), 2);
}

// An idle thread that looks for work before it sleeps (SetPoolIdleSpin) counts as idle:
// a job posted meanwhile is left to it, not given a new thread, and it runs.
TEST(ThreadPool, AThreadLookingForWorkTakesTheNextJob) {
  SetPoolIdleSpin(absl::Seconds(5));
  EXPECT_EQ(PoolIdleSpin(), absl::Seconds(5));
  ThreadPool& pool = *new ThreadPool(0);
  for (int round = 0; round < 10; ++round) {
    absl::Notification done;
    pool.Run([&] { done.Notify(); });
    done.WaitForNotification();
    // Time for its thread to come back from the job and look for the next.
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(pool.threads(), 1);
  SetPoolIdleSpin(absl::ZeroDuration());
  // Its thread still looks (for up to the 5 s it read); a job now ends that at once.
  absl::Notification last;
  pool.Run([&] { last.Notify(); });
  last.WaitForNotification();
  EXPECT_EQ(pool.threads(), 1);
  absl::SleepFor(absl::Milliseconds(20));
  SetPoolIdleSpin(absl::Milliseconds(-3));  // Negative: none.
  EXPECT_EQ(PoolIdleSpin(), absl::ZeroDuration());
}

}  // namespace
}  // namespace gpumove
