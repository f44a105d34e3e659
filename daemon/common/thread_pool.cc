#include "daemon/common/thread_pool.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/time/clock.h"

namespace gpumove {
namespace {

std::atomic<int64_t> idle_spin_ns{0};

}  // namespace

void SetPoolIdleSpin(absl::Duration spin) {
  idle_spin_ns = absl::ToInt64Nanoseconds(std::max(spin, absl::ZeroDuration()));
}

absl::Duration PoolIdleSpin() { return absl::Nanoseconds(idle_spin_ns.load()); }

void ThreadPool::Run(std::function<void()> job) {
  absl::MutexLock lock(&mu_);
  jobs_.push_back(std::move(job));
  queued_ = jobs_.size();
  // A thread for every job no idle thread will take.
  if (static_cast<int>(jobs_.size()) > idle_ && (max_threads_ == 0 || started_ < max_threads_)) {
    ++started_;
    std::thread([this] { Loop(); }).detach();
  }
}

int ThreadPool::threads() const {
  absl::MutexLock lock(&mu_);
  return started_;
}

void ThreadPool::Loop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      ++idle_;
    }
    // Counted idle while it looks, so a job posted meanwhile is left to it.
    if (const absl::Duration spin = PoolIdleSpin(); spin > absl::ZeroDuration()) {
      for (const absl::Time until = absl::Now() + spin; queued_ == 0 && absl::Now() < until;) {
        std::this_thread::yield();
      }
    }
    std::function<void()> job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](std::deque<std::function<void()>>* q) { return !q->empty(); }, &jobs_));
      --idle_;
      job = std::move(jobs_.front());
      jobs_.pop_front();
      queued_ = jobs_.size();
    }
    job();
  }
}

}  // namespace gpumove
