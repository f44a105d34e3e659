#include "daemon/common/thread_pool.h"

#include <thread>
#include <utility>

namespace gpumove {

void ThreadPool::Run(std::function<void()> job) {
  absl::MutexLock lock(&mu_);
  jobs_.push_back(std::move(job));
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
    std::function<void()> job;
    {
      absl::MutexLock lock(&mu_);
      ++idle_;
      mu_.Await(absl::Condition(
          +[](std::deque<std::function<void()>>* q) { return !q->empty(); }, &jobs_));
      --idle_;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

}  // namespace gpumove
