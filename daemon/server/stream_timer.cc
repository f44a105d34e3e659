#include "daemon/server/stream_timer.h"

#include "absl/time/clock.h"

namespace gpumove {

StreamTimer& StreamTimer::Shared() {
  static StreamTimer* const timer = new StreamTimer();
  return *timer;
}

StreamTimer::StreamTimer() : thread_([this] { Loop(); }) {}

StreamTimer::~StreamTimer() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    wake_.Signal();
  }
  thread_.join();
}

uint64_t StreamTimer::At(absl::Time when, std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_++;
  const bool first = tasks_.empty() || when < tasks_.begin()->first.first;
  tasks_.emplace(std::make_pair(when, id), std::move(task));
  when_.emplace(id, when);
  if (first) wake_.Signal();
  return id;
}

void StreamTimer::Cancel(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = when_.find(id);
  if (it == when_.end()) return;
  tasks_.erase(std::make_pair(it->second, id));
  when_.erase(it);
}

size_t StreamTimer::pending() const {
  absl::MutexLock lock(&mu_);
  return tasks_.size();
}

void StreamTimer::Loop() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    if (tasks_.empty()) {
      wake_.Wait(&mu_);
      continue;
    }
    auto first = tasks_.begin();
    if (first->first.first > absl::Now()) {
      wake_.WaitWithDeadline(&mu_, first->first.first);
      continue;
    }
    std::function<void()> task = std::move(first->second);
    when_.erase(first->first.second);
    tasks_.erase(first);
    mu_.Unlock();
    task();
    task = nullptr;  // What it captured goes outside the lock too.
    mu_.Lock();
  }
}

}  // namespace gpumove
