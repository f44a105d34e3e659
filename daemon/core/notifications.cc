#include "daemon/core/notifications.h"

#include <algorithm>

#include "daemon/core/buffer_registry.h"

namespace gpumove {

void NotificationLog::AppendLocked(Stream& s, const std::shared_ptr<const Notification>& n) {
  ++s.published;
  s.kept.push_back(n);
  if (s.kept.size() > capacity_) s.kept.pop_front();
}

void NotificationLog::Publish(const std::string& owner, Notification n) {
  auto shared = std::make_shared<const Notification>(std::move(n));
  absl::MutexLock lock(&mu_);
  AppendLocked(streams_[owner], shared);
  if (owner != kAnyOwner) AppendLocked(streams_[kAnyOwner], shared);
  changed_.SignalAll();
  TellLocked(owner);
  if (owner != kAnyOwner) TellLocked(kAnyOwner);
}

void NotificationLog::TellLocked(const std::string& reader) {
  auto it = listeners_.find(reader);
  if (it == listeners_.end()) return;
  for (auto& [id, published] : it->second) published();
}

uint64_t NotificationLog::Listen(const std::string& reader, std::function<void()> published) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_listener_++;
  listener_readers_.emplace(id, reader);
  listeners_[reader].emplace(id, std::move(published));
  return id;
}

void NotificationLog::Unlisten(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = listener_readers_.find(id);
  if (it == listener_readers_.end()) return;
  auto of = listeners_.find(it->second);
  if (of != listeners_.end()) {
    of->second.erase(id);
    if (of->second.empty()) listeners_.erase(of);
  }
  listener_readers_.erase(it);
}

NotificationLog::Batch NotificationLog::Read(const std::string& reader, uint64_t after,
                                             const std::function<bool(const Notification&)>& accept,
                                             size_t max, absl::Time deadline) {
  Batch batch;
  batch.next_after = after;
  absl::MutexLock lock(&mu_);
  while (true) {
    auto it = streams_.find(reader);
    if (it != streams_.end() && it->second.published > batch.next_after) {
      const Stream& s = it->second;
      const uint64_t first_kept = s.published - s.kept.size() + 1;
      uint64_t missed = 0;
      uint64_t seq = batch.next_after + 1;
      if (seq < first_kept) {
        missed = first_kept - seq;
        seq = first_kept;
      }
      for (; seq <= s.published && batch.entries.size() < max; ++seq) {
        const auto& n = s.kept[seq - first_kept];
        batch.next_after = seq;
        if (accept && !accept(*n)) continue;
        batch.entries.push_back(Entry{seq, n, missed});
        missed = 0;
      }
      if (!batch.entries.empty()) return batch;
      if (missed > 0) {
        // Nothing taken after the loss: it is reported on its own (no notification).
        batch.entries.push_back(Entry{batch.next_after, nullptr, missed});
        return batch;
      }
    }
    if (stopped_ || absl::Now() >= deadline) return batch;
    changed_.WaitWithDeadline(&mu_, deadline);
  }
}

uint64_t NotificationLog::Last(const std::string& reader) const {
  absl::MutexLock lock(&mu_);
  auto it = streams_.find(reader);
  return it == streams_.end() ? 0 : it->second.published;
}

bool NotificationLog::stopped() const {
  absl::MutexLock lock(&mu_);
  return stopped_;
}

void NotificationLog::Stop() {
  absl::MutexLock lock(&mu_);
  stopped_ = true;
  changed_.SignalAll();
  for (auto& [reader, of] : listeners_) {
    for (auto& [id, published] : of) published();
  }
}

}  // namespace gpumove
