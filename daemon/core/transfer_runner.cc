// The scheduler's runner: workers take ready moves, run them on their engines, wait for
// the other node's acknowledgement when remote, and record each move's end (checksums,
// state, the moves that waited for it).
#include <algorithm>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/common/log.h"
#include "daemon/core/hold_planner.h"
#include "daemon/core/transfer_record.h"
#include "daemon/core/transfer_scheduler.h"

namespace gpumove {

// Progress, cancel and the rate limit for one running move.
class TransferScheduler::Control : public MoveControl {
 public:
  Control(TransferScheduler* s, Record* t, uint64_t rate_limit)
      : s_(s), t_(t), rate_limit_(rate_limit), start_(absl::Now()) {}

  bool cancelled() const override { return t_->cancel_requested.load(); }
  // Only for a move with nothing queued behind it: its acknowledgement then overlaps its
  // own copy. With moves waiting, the worker's next copy overlaps it instead, and an
  // acknowledgement that waits for the copy would hold up the others batched with it.
  bool AcceptsTail() const override {
    return t_->remote_hold.has_value() && t_->remote_hold->reads_tails && !s_->MovesWaiting();
  }
  void KeepRunning(std::unique_ptr<MoveTail> tail) override { t_->tail = std::move(tail); }
  void Carried(std::string what) override {
    absl::MutexLock lock(&s_->mu_);
    t_->carrier = std::move(what);
  }
  uint64_t rate_limit() const override { return rate_limit_; }
  bool durable() const override { return t_->durable; }
  const std::string& required_transport() const override { return t_->require_transport; }

  void Progress(uint64_t bytes_done) override {
    t_->bytes_done.store(bytes_done);
    if (rate_limit_ == 0) return;
    const absl::Time due =
        start_ + absl::Seconds(static_cast<double>(bytes_done) / static_cast<double>(rate_limit_));
    // Sleep in short steps so a cancel is seen promptly.
    for (absl::Time now = absl::Now(); now < due && !cancelled(); now = absl::Now()) {
      absl::SleepFor(std::min(due - now, absl::Milliseconds(10)));
    }
  }

 private:
  TransferScheduler* const s_;
  Record* const t_;
  const uint64_t rate_limit_;
  const absl::Time start_;
};

void TransferScheduler::WorkerLoop(bool latency_only) {
  while (true) {
    std::shared_ptr<Record> t;
    {
      absl::MutexLock lock(&mu_);
      auto has_work = [this, latency_only]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return latency_only ? ready_.size(Priority::kLatency) > 0 : !ready_.empty();
      };
      auto wake = [this, &has_work]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stop_ || has_work();
      };
      mu_.Await(absl::Condition(&wake));
      if (!has_work()) return;  // Stopping.
      t = latency_only ? ready_.PopClass(Priority::kLatency, absl::Now()) : ready_.Pop(absl::Now());
      if (t->state != TransferState::kQueued) continue;  // Cancelled while queued.
      t->state = TransferState::kRunning;
      t->start_time = absl::Now();
      ChangedLocked(*t);
      ++running_;
    }
    Run(t);
    absl::MutexLock lock(&mu_);
    --running_;
  }
}

void TransferScheduler::Run(const std::shared_ptr<Record>& t, std::vector<Ended>* ended) {
  absl::Status status;
  uint64_t src_hash = 0;
  if (t->checksum && t->src.remote == nullptr) {
    auto h = t->pieces != nullptr ? options_.piece_hasher(t->src, *t->pieces, true)
                                  : hasher_(t->src, t->length);
    if (h.ok()) {
      src_hash = *h;
    } else {
      status = h.status();
    }
  }
  if (status.ok() && t->cancel_requested) status = absl::CancelledError("cancelled");
  const absl::Time move_start = absl::Now();
  if (!status.ok() && t->remote_hold.has_value()) {
    for (Engine* e : engines_) e->Abandon(*t->remote_hold);  // Move will not run.
  }
  if (status.ok()) {
    Control control(this, t.get(), options_.rate_limit);
    status = t->pieces != nullptr ? t->engine->MovePieces(t->src, t->dst, *t->pieces, control)
                                  : t->engine->Move(t->src, t->dst, t->length, control);
    // With a tail the last bytes are still on their way: counted once acknowledged.
    if (status.ok() && t->tail == nullptr) t->bytes_done.store(t->length);
  }
  const absl::Time move_end = absl::Now();
  if (!status.ok()) t->tail.reset();  // Only a move that went through leaves one.
  if (!t->remote_hold.has_value()) {
    AfterMove(t, std::move(status), src_hash, 0, ended);
    return;
  }
  // The other node acknowledges the bytes (or just lets its buffer go when the move
  // failed); only then is a move SUCCEEDED. The acknowledgement may travel with others
  // to that node and end this transfer on another thread, while this one moves on.
  t->remote_completed = true;
  {
    absl::MutexLock lock(&mu_);
    ++acking_;
  }
  // The destination's node publishes the move's notification only if the range it holds
  // hashes as the source did.
  if (t->checksum && t->remote_hold->write && status.ok()) t->remote_hold->source_xxh3 = src_hash;
  AckTail tail;
  if (t->tail != nullptr) tail = {t->tail->token(), t->tail->pending_bytes(), /*runner_waits=*/true};
  remote_->CompleteAsync(
      *t->remote_hold, status, t->checksum, tail, /*caller_busy=*/MovesWaiting(),
      [this, t, status, src_hash, move_start, move_end](absl::StatusOr<uint64_t> ack) {
        // The other node acknowledged the move, maybe before its tail landed (it ends its
        // hold when it sees the tail land): the move is done once this node sees the
        // tail land too. Without an acknowledgement the copy may still run, so it is
        // waited for before the buffers are let go. The tail (and what the path keeps
        // for it) is let go after the end is recorded.
        std::unique_ptr<MoveTail> landed;
        absl::Status copied;
        if (t->tail != nullptr && ack.ok()) {
          landed = std::move(t->tail);
          copied = landed->Wait();
          if (copied.ok()) t->bytes_done.store(t->length);
        }
        t->tail.reset();
        VLOG(1) << "transfer " << t->id << " " << t->length << " bytes on "
                << PathKindName(t->engine->path()) << ": move "
                << absl::ToDoubleMicroseconds(move_end - move_start) << " us, acknowledgement "
                << absl::ToDoubleMicroseconds(absl::Now() - move_end) << " us";
        absl::Status st = status;
        uint64_t src = src_hash, dst = 0;
        if (st.ok() && !copied.ok()) {
          st = absl::Status(copied.code(), absl::StrCat("the copy failed: ", copied.message()));
        } else if (st.ok() && !ack.ok()) {
          st = absl::UnavailableError(
              absl::StrCat("node ", t->remote_hold->node,
                           " did not acknowledge the move: ", ack.status().message()));
        } else if (st.ok() && t->checksum) {
          (t->remote_hold->write ? dst : src) = *ack;
        }
        AfterMove(t, std::move(st), src, dst);
        landed.reset();  // Before the scheduler may stop (acking_ reaches 0).
        absl::MutexLock lock(&mu_);
        --acking_;
      });
}

bool TransferScheduler::MovesWaiting() {
  absl::MutexLock lock(&mu_);
  return !ready_.empty();
}

void TransferScheduler::ReleaseUnrunHolds() {
  std::vector<RemoteHold> holds;
  {
    absl::MutexLock lock(&mu_);
    holds.swap(unrun_);
  }
  for (const RemoteHold& h : holds) planner_->ReleaseUnrun(h);
}

void TransferScheduler::AfterMove(const std::shared_ptr<Record>& t, absl::Status status,
                                  uint64_t src_hash, uint64_t dst_hash, std::vector<Ended>* ended) {
  if (status.ok() && t->checksum && t->dst.remote == nullptr) {
    auto h = t->pieces != nullptr ? options_.piece_hasher(t->dst, *t->pieces, false)
                                  : hasher_(t->dst, t->length);
    if (h.ok()) {
      dst_hash = *h;
    } else {
      status = h.status();
    }
  }
  if (status.ok() && t->checksum && dst_hash != src_hash) {
    status = absl::DataLossError(absl::StrFormat(
        "checksum mismatch: source xxh3 %016x, destination xxh3 %016x", src_hash, dst_hash));
  }
  if (!status.ok() && status.code() != absl::StatusCode::kCancelled) {
    LOG(WARNING) << "transfer " << t->id << " failed: " << status;
  }
  if (ended != nullptr) {
    ended->push_back(Ended{t, std::move(status), src_hash, dst_hash});
    return;
  }
  bool unrun = false;
  {
    absl::MutexLock lock(&mu_);
    t->source_xxh3 = src_hash;
    t->destination_xxh3 = dst_hash;
    FinishLocked(t, status);
    unrun = !unrun_.empty();
  }
  if (unrun) ReleaseUnrunHolds();
}

void TransferScheduler::ReadyLocked(std::shared_ptr<Record> t) {
  const std::string& owner = t->owner;
  const Priority priority = t->priority;
  const uint64_t length = t->length;
  ready_.Push(std::move(t), owner, priority, length, absl::Now());
}

void TransferScheduler::FinishLocked(const std::shared_ptr<Record>& t, absl::Status status) {
  t->state = status.ok()                                     ? TransferState::kSucceeded
             : status.code() == absl::StatusCode::kCancelled ? TransferState::kCancelled
                                                             : TransferState::kFailed;
  t->status = std::move(status);
  t->end_time = absl::Now();
  ChangedLocked(*t);
  // The buffers are let go before anyone can see the end state, so a caller that saw it
  // can release them at once. (Lock order: scheduler, then registry, never the reverse.)
  t->src_use.Reset();
  t->dst_use.Reset();
  // Into this node's buffer: the bytes are visible here now (moves into another node's
  // buffer are published there when its hold ends).
  if (t->notify.has_value() && t->status.ok() && t->dst.remote == nullptr &&
      options_.notifications != nullptr) {
    options_.notifications->Publish(
        t->owner, Notification{t->id, t->source.node.empty() ? options_.node : t->source.node,
                               t->destination.buffer_id, *t->notify, t->end_time});
  }
  if (t->remote_hold.has_value() && !t->remote_completed) unrun_.push_back(*t->remote_hold);
  // The moves that waited for it and wait for nothing now are ready for a worker.
  std::vector<RangeOrder::Id> ready;
  order_.End(t->order, ready);
  waiting_.erase(t->order);
  // Its pieces' memory goes back to the heap for the next Submit's list (fresh pages are
  // a fault each). Nothing reads them now: it ran, or never will, and ordering is done.
  t->pieces.reset();
  for (const RangeOrder::Id id : ready) {
    auto it = waiting_.find(id);
    std::shared_ptr<Record> next = std::move(it->second);
    waiting_.erase(it);
    ReadyLocked(std::move(next));
  }
  --active_;
  if (options_.quotas != nullptr) {
    auto mine = active_by_owner_.find(t->owner);
    if (mine != active_by_owner_.end() && --mine->second == 0) active_by_owner_.erase(mine);
  }
  if (options_.on_end) {
    options_.on_end(
        TransferEnd{t->path, t->state, t->length, t->create_time, t->start_time, t->end_time,
                    t->carrier, t->owner, t->priority});
  }
  finished_.push_back(t->id);
  while (finished_.size() > std::max<size_t>(1, options_.max_finished)) {
    auto it = transfers_.find(finished_.front());
    finished_.pop_front();
    if (it == transfers_.end()) continue;
    if (!it->second->idempotency_key.empty()) {
      idempotency_.erase(
          absl::StrCat(it->second->owner, absl::string_view("\0", 1), it->second->idempotency_key));
    }
    transfers_.erase(it);
  }
}

}  // namespace gpumove
