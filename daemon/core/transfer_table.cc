// The scheduler's transfer table: names of states and paths, lookups, snapshots,
// listing, waiting for a transfer's end or change, cancelling and draining.
#include <algorithm>
#include <memory>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/common/quote.h"
#include "daemon/core/transfer_record.h"
#include "daemon/core/transfer_scheduler.h"

namespace gpumove {

const char* PathKindName(PathKind path) {
  switch (path) {
    case PathKind::kAuto:
      return "AUTO";
    case PathKind::kLocal:
      return "LOCAL";
    case PathKind::kCudaIpc:
      return "CUDA_IPC";
    case PathKind::kUcx:
      return "UCX";
    case PathKind::kMpi:
      return "MPI";
    case PathKind::kFile:
      return "FILE_IO";
  }
  return "?";
}

const char* TransferStateName(TransferState state) {
  switch (state) {
    case TransferState::kQueued:
      return "QUEUED";
    case TransferState::kRunning:
      return "RUNNING";
    case TransferState::kSucceeded:
      return "SUCCEEDED";
    case TransferState::kFailed:
      return "FAILED";
    case TransferState::kCancelled:
      return "CANCELLED";
  }
  return "?";
}

std::vector<std::shared_ptr<TransferScheduler::Record>> TransferScheduler::UnfinishedLocked()
    const {
  std::vector<std::shared_ptr<Record>> out;
  for (const auto& [id, t] : transfers_) {
    if (!IsTerminal(t->state)) out.push_back(t);
  }
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a->create_time < b->create_time; });
  return out;
}

std::shared_ptr<TransferScheduler::Record> TransferScheduler::FindLocked(
    const std::string& owner, const std::string& id) const {
  auto it = transfers_.find(id);
  if (it == transfers_.end() || !OwnerSees(owner, it->second->owner)) return nullptr;
  return it->second;
}

TransferSnapshot TransferScheduler::SnapshotLocked(const Record& t) const {
  TransferSnapshot s;
  s.id = t.id;
  s.source = t.source;
  s.destination = t.destination;
  s.length = t.length;
  s.path = t.path;
  s.state = t.state;
  s.bytes_done = t.state == TransferState::kSucceeded ? t.length : t.bytes_done.load();
  s.owner = t.owner;
  s.node = options_.node;
  s.label = t.label;
  s.idempotency_key = t.idempotency_key;
  s.create_time = t.create_time;
  s.start_time = t.start_time;
  s.end_time = t.end_time;
  s.status = t.status;
  s.checksum = t.checksum;
  s.durable = t.durable;
  s.pieces = t.piece_count;
  s.source_xxh3 = t.source_xxh3;
  s.destination_xxh3 = t.destination_xxh3;
  s.version = t.version;
  s.cancel_requested = t.cancel_requested.load();
  s.carrier = t.carrier;
  s.priority = t.priority;
  if (t.state == TransferState::kQueued) s.waits_for = order_.waits_for(t.order);
  return s;
}

absl::StatusOr<TransferSnapshot> TransferScheduler::Get(const std::string& owner,
                                                        const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto t = FindLocked(owner, id);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("no transfer ", Quoted(id)));
  return SnapshotLocked(*t);
}

std::vector<TransferSnapshot> TransferScheduler::List(const std::string& owner,
                                                      const std::vector<TransferState>& states,
                                                      size_t limit) const {
  std::vector<TransferSnapshot> out;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, t] : transfers_) {
      if (!OwnerSees(owner, t->owner)) continue;
      if (!states.empty() && std::find(states.begin(), states.end(), t->state) == states.end()) {
        continue;
      }
      out.push_back(SnapshotLocked(*t));
    }
  }
  std::sort(out.begin(), out.end(), [](const TransferSnapshot& a, const TransferSnapshot& b) {
    return std::tie(a.create_time, a.id) > std::tie(b.create_time, b.id);
  });
  if (out.size() > limit) out.resize(limit);
  return out;
}

absl::StatusOr<TransferSnapshot> TransferScheduler::Cancel(const std::string& owner,
                                                           const std::string& id) {
  TransferSnapshot out;
  {
    absl::MutexLock lock(&mu_);
    auto t = FindLocked(owner, id);
    if (t == nullptr) return absl::NotFoundError(absl::StrCat("no transfer ", Quoted(id)));
    if (t->state == TransferState::kQueued) {
      FinishLocked(t, absl::CancelledError("cancelled while queued"));
    } else if (t->state == TransferState::kRunning) {
      t->cancel_requested = true;
    }
    out = SnapshotLocked(*t);
  }
  ReleaseUnrunHolds();  // Before the caller hears it ended.
  return out;
}

absl::StatusOr<TransferSnapshot> TransferScheduler::Wait(const std::string& owner,
                                                         const std::string& id,
                                                         absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto t = FindLocked(owner, id);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("no transfer ", Quoted(id)));
  auto done = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return IsTerminal(t->state) || stop_; };
  mu_.AwaitWithDeadline(absl::Condition(&done), deadline);
  if (!IsTerminal(t->state)) {
    return absl::DeadlineExceededError(
        absl::StrCat("transfer ", Quoted(id), " is still ", TransferStateName(t->state)));
  }
  return SnapshotLocked(*t);
}

absl::StatusOr<TransferSnapshot> TransferScheduler::WaitForChange(const std::string& owner,
                                                                  const std::string& id,
                                                                  uint64_t seen_version,
                                                                  absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto t = FindLocked(owner, id);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("no transfer ", Quoted(id)));
  auto changed = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return t->version != seen_version || stop_;
  };
  mu_.AwaitWithDeadline(absl::Condition(&changed), deadline);
  return SnapshotLocked(*t);
}

uint64_t TransferScheduler::ListenForChanges(const std::string& id,
                                             std::function<void()> changed) {
  absl::MutexLock lock(&mu_);
  const uint64_t listener = next_listener_++;
  listener_ids_.emplace(listener, id);
  listeners_[id].emplace(listener, std::move(changed));
  return listener;
}

void TransferScheduler::ForgetChanges(uint64_t listener) {
  absl::MutexLock lock(&mu_);
  auto it = listener_ids_.find(listener);
  if (it == listener_ids_.end()) return;
  auto of = listeners_.find(it->second);
  if (of != listeners_.end()) {
    of->second.erase(listener);
    if (of->second.empty()) listeners_.erase(of);
  }
  listener_ids_.erase(it);
}

void TransferScheduler::ChangedLocked(Record& t) {
  t.version = ++sequence_;
  auto it = listeners_.find(t.id);
  if (it == listeners_.end()) return;
  for (auto& [listener, changed] : it->second) changed();
}

void TransferScheduler::StopLocked() {
  stop_ = true;
  for (auto& [id, of] : listeners_) {
    for (auto& [listener, changed] : of) changed();
  }
}

void TransferScheduler::StopAccepting() {
  absl::MutexLock lock(&mu_);
  accepting_ = false;
}

bool TransferScheduler::Drain(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  accepting_ = false;
  auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return active_ == 0; };
  return mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
}

void TransferScheduler::CancelAll() {
  {
    absl::MutexLock lock(&mu_);
    for (auto& t : UnfinishedLocked()) {
      if (t->state == TransferState::kQueued) {
        FinishLocked(t, absl::CancelledError("cancelled: daemon shutting down"));
      } else if (t->state == TransferState::kRunning) {
        t->cancel_requested = true;
      }
    }
  }
  ReleaseUnrunHolds();
}

size_t TransferScheduler::active() const {
  absl::MutexLock lock(&mu_);
  return active_;
}

bool TransferScheduler::stopped() const {
  absl::MutexLock lock(&mu_);
  return stop_;
}

}  // namespace gpumove
