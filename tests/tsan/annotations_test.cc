// The TSan pass is only as good as absl_sync_annotations.cc: code correctly synchronized by
// absl's Mutex, CondVar, conditions, Notification, BlockingCounter and shared Status must give no report (a
// report makes the test binary exit 66 and fail), and a real race must still be reported.
#include <cstdlib>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace {

#if defined(__SANITIZE_THREAD__)
constexpr bool kTsan = true;
#else
constexpr bool kTsan = false;
#endif

#define SKIP_WITHOUT_TSAN() \
  if (!kTsan) GTEST_SKIP() << "built without ThreadSanitizer (run with --config=tsan)"

TEST(TsanAnnotations, AMutexOrdersWhatItGuards) {
  SKIP_WITHOUT_TSAN();
  absl::Mutex mu;
  long value = 0;  // guarded by mu
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        if (i % 2) {
          absl::MutexLock l(&mu);
          ++value;
        } else {
          mu.ReaderLock();
          (void)*static_cast<volatile long*>(&value);
          mu.ReaderUnlock();
          mu.Lock();
          ++value;
          mu.Unlock();
        }
      }
    });
  for (auto& t : threads) t.join();
  absl::MutexLock l(&mu);
  EXPECT_EQ(value, 4000);
}

TEST(TsanAnnotations, AConditionVariableHandsOverData) {
  SKIP_WITHOUT_TSAN();
  absl::Mutex mu;
  absl::CondVar cv;
  int data = 0;
  bool ready = false;
  std::thread producer([&] {
    data = 42;  // published by the mutex below
    absl::MutexLock l(&mu);
    ready = true;
    cv.Signal();
  });
  {
    absl::MutexLock l(&mu);
    while (!ready) cv.WaitWithTimeout(&mu, absl::Seconds(10));
  }
  EXPECT_EQ(data, 42);
  producer.join();
}

TEST(TsanAnnotations, ConditionsEvaluatedByOtherThreadsSeeTheMutexHeld) {
  SKIP_WITHOUT_TSAN();
  absl::Mutex mu;
  int stage = 0;  // guarded by mu; read by conditions that the unlocking thread evaluates
  std::vector<std::thread> waiters;
  for (int w = 1; w <= 4; ++w)
    waiters.emplace_back([&, w] {
      absl::MutexLock l(&mu);
      mu.AwaitWithTimeout(absl::Condition(
                              +[](int* s) { return *s >= 1; }, &stage),
                          absl::Seconds(10));
      stage += w;
    });
  for (int i = 0; i < 20; ++i) {
    absl::MutexLock l(&mu);
    if (i == 10) stage = 1;
  }
  for (auto& t : waiters) t.join();
  mu.LockWhen(absl::Condition(+[](int* s) { return *s == 11; }, &stage));
  mu.Unlock();
}

TEST(TsanAnnotations, NotificationAndBlockingCounterPublish) {
  SKIP_WITHOUT_TSAN();
  int a = 0, b[4] = {};
  absl::Notification done;
  absl::BlockingCounter left(4);
  std::thread t([&] {
    a = 7;
    done.Notify();
  });
  std::vector<std::thread> workers;
  for (int i = 0; i < 4; ++i)
    workers.emplace_back([&, i] {
      b[i] = i + 1;
      left.DecrementCount();
    });
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(a, 7);
  left.Wait();
  EXPECT_EQ(b[0] + b[1] + b[2] + b[3], 10);
  t.join();
  for (auto& w : workers) w.join();
}

TEST(TsanAnnotations, AStatusSharedBetweenThreadsIsFreedByTheLastCopy) {
  SKIP_WITHOUT_TSAN();
  for (int round = 0; round < 20; ++round) {
    absl::Status* first = new absl::Status(absl::NotFoundError("a message long enough to be shared"));
    absl::Status second = *first;
    std::thread t([first] {
      EXPECT_FALSE(first->message().empty());
      delete first;
    });
    absl::SleepFor(absl::Microseconds(round * 50));
    second = absl::OkStatus();  // either copy may be the one that frees the rep
    t.join();
  }
}

// A write under a mutex that the other writer does not take: TSan must report it, or the
// annotations hide races instead of ordering them.
void RaceWithOneSideLocked() {
  absl::Mutex mu;
  static volatile long shared = 0;  // volatile: the optimizer keeps both stores
  std::thread t([&] {
    absl::MutexLock l(&mu);
    shared = 1;
  });
  absl::SleepFor(absl::Milliseconds(50));
  shared = 2;
  t.join();
  std::exit(0);  // TSan turns the exit status into 66 when it reported anything
}

TEST(TsanAnnotationsDeathTest, ARaceIsStillReported) {
  SKIP_WITHOUT_TSAN();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(RaceWithOneSideLocked(), testing::ExitedWithCode(66), "data race");
}

}  // namespace
