#include "daemon/server/call_pool.h"

#include <algorithm>

namespace gpumove {

CallPool& CallPool::Shared() {
  static CallPool* const pool =
      new CallPool(std::max(8, 2 * static_cast<int>(std::thread::hardware_concurrency())));
  return *pool;
}

CallPool::CallPool(int threads) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { Loop(); });
}

CallPool::~CallPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void CallPool::Run(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  tasks_.push_back(std::move(task));
}

void CallPool::Loop() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !tasks_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (tasks_.empty()) return;  // Stopping.
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace gpumove
