#include "daemon/core/transfer_scheduler.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "daemon/common/status_macros.h"
#include "daemon/core/hold_planner.h"
#include "daemon/core/transfer_record.h"

namespace gpumove {

// The most bytes of one batch's small moves that run on the waiting caller's thread.
constexpr uint64_t kInlineBatchBytes = 1 << 20;

TransferScheduler::TransferScheduler(SchedulerOptions options, BufferRegistry* registry,
                                     std::vector<Engine*> engines, RangeHasher hasher,
                                     RemoteRanges* remote)
    : options_(std::move(options)),
      registry_(registry),
      engines_(std::move(engines)),
      hasher_(std::move(hasher)),
      remote_(remote),
      planner_(std::make_unique<HoldPlanner>(options_, registry_, engines_, remote_)),
      ready_(options_.qos, options_.weights) {
  for (int i = 0; i < std::max(1, options_.workers); ++i) {
    workers_.emplace_back([this] { WorkerLoop(/*latency_only=*/false); });
  }
  for (int i = 0; i < std::clamp(options_.latency_workers, 0, 64); ++i) {
    workers_.emplace_back([this] { WorkerLoop(/*latency_only=*/true); });
  }
}

TransferScheduler::~TransferScheduler() {
  CancelAll();
  {
    absl::MutexLock lock(&mu_);
    StopLocked();
    accepting_ = false;
  }
  for (auto& w : workers_) w.join();
  {
    // Acknowledgements still travelling end their transfers through this scheduler.
    absl::MutexLock lock(&mu_);
    auto acked = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return acking_ == 0; };
    mu_.Await(absl::Condition(&acked));
  }
  // Whatever is left (queued behind a cancelled one) never started: end it.
  {
    absl::MutexLock lock(&mu_);
    for (auto& t : UnfinishedLocked()) {
      FinishLocked(t, absl::CancelledError("daemon stopped"));
    }
  }
  ReleaseUnrunHolds();
}

absl::StatusOr<std::vector<TransferSnapshot>> TransferScheduler::Submit(
    const std::string& owner, const std::vector<TransferSpec>& specs,
    const std::string& idempotency_key, bool caller_waits, bool wait_bounded) {
  if (specs.empty()) return absl::InvalidArgumentError("no transfers in the request");
  if (specs.size() > options_.max_batch) {
    return absl::InvalidArgumentError(
        absl::StrCat(specs.size(), " transfers in one request; at most ", options_.max_batch));
  }
  const std::string idem = idempotency_key.empty()
                               ? ""
                               : absl::StrCat(owner, absl::string_view("\0", 1), idempotency_key);
  {
    absl::MutexLock lock(&mu_);
    if (auto r = ReplayLocked(idem)) return *r;
    if (!accepting_) return absl::UnavailableError("daemon is draining; not accepting transfers");
  }

  // Check everything (and hold the buffers, here and on other nodes) before anything is
  // queued; on any error the holds taken so far are let go.
  std::vector<std::shared_ptr<Record>> batch;
  bool committed = false;
  absl::Cleanup release_holds = [&] {
    if (committed) return;
    for (auto& t : batch) {
      if (t->remote_hold.has_value()) planner_->ReleaseUnrun(*t->remote_hold);
    }
  };
  std::vector<absl::StatusOr<std::shared_ptr<Record>>> prepared =
      planner_->PrepareAll(owner, specs);
  absl::Status first_error;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (prepared[i].ok()) {
      (*prepared[i])->idempotency_key = idempotency_key;
      batch.push_back(*std::move(prepared[i]));
    } else if (first_error.ok()) {
      const absl::Status& st = prepared[i].status();
      first_error = absl::Status(st.code(), specs.size() == 1
                                                ? std::string(st.message())
                                                : absl::StrCat("transfer ", i, ": ", st.message()));
    }
  }
  if (!first_error.ok()) return first_error;  // The cleanup releases what was prepared.

  std::vector<TransferSnapshot> out;
  std::vector<std::shared_ptr<Record>> run_inline;
  uint64_t inline_bytes = 0;
  {
    absl::MutexLock lock(&mu_);
    if (auto r = ReplayLocked(idem)) return *r;  // A concurrent retry won the race.
    if (!accepting_) return absl::UnavailableError("daemon is draining; not accepting transfers");
    GPUMOVE_RETURN_IF_ERROR(AdmitLocked(owner, batch.size()));
    const absl::Time now = absl::Now();
    std::vector<std::string> ids;
    for (auto& t : batch) {
      if (transfers_.contains(t->id)) return absl::InternalError("transfer id collision; retry");
      t->create_time = now;
      ChangedLocked(*t);
      t->order = ++orders_;
      const bool waits = order_.Add(t->order, &t->source, &t->destination,
                                    t->pieces != nullptr ? &t->pieces->list : nullptr);
      if (waits) waiting_.emplace(t->order, t);
      transfers_.emplace(t->id, t);
      ++active_;
      if (options_.quotas != nullptr) ++active_by_owner_[t->owner];
      // Inline: a lone move that is small or finds a worker idle; in a batch, its small
      // moves up to kInlineBatchBytes in all (the rest go to the workers meanwhile).
      const bool small = t->length <= options_.inline_max_bytes;
      const bool may_inline =
          caller_waits && (!wait_bounded || (small && options_.rate_limit == 0));
      if (!waits && may_inline && options_.inline_max_bytes > 0 &&
          (batch.size() == 1 ? small || (ready_.empty() && running_ < options_.workers)
                             : small && inline_bytes + t->length <= kInlineBatchBytes)) {
        ++running_;
        t->state = TransferState::kRunning;
        t->start_time = absl::Now();
        ChangedLocked(*t);
        inline_bytes += t->length;
        run_inline.push_back(t);
      } else if (!waits) {
        ReadyLocked(t);
      }
      ids.push_back(t->id);
      out.push_back(SnapshotLocked(*t));
    }
    if (!idem.empty()) idempotency_[idem] = std::move(ids);
    committed = true;
  }
  if (run_inline.empty()) return out;
  RunInline(run_inline, batch, out);
  return out;
}

std::optional<std::vector<TransferSnapshot>> TransferScheduler::ReplayLocked(
    const std::string& idem) const {
  if (idem.empty()) return std::nullopt;
  auto it = idempotency_.find(idem);
  if (it == idempotency_.end()) return std::nullopt;
  std::vector<TransferSnapshot> out;
  for (const std::string& id : it->second) out.push_back(SnapshotLocked(*transfers_.at(id)));
  return out;
}

absl::Status TransferScheduler::AdmitLocked(const std::string& owner, size_t count) const {
  if (active_ + count > options_.max_active) {
    return absl::ResourceExhaustedError(absl::StrCat("transfer queue is full (", active_,
                                                     " queued or running, limit ",
                                                     options_.max_active, "); retry later"));
  }
  if (options_.quotas != nullptr) {
    const std::optional<uint64_t> limit = options_.quotas->TransferLimit(owner);
    auto it = active_by_owner_.find(owner);
    const size_t mine = it == active_by_owner_.end() ? 0 : it->second;
    if (limit.has_value() && mine + count > *limit) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "tenant ", owner, " has ", mine, " transfers queued or running here and asked for ",
          count, " more; its quota is ", *limit));
    }
  }
  return absl::OkStatus();
}

void TransferScheduler::RunInline(const std::vector<std::shared_ptr<Record>>& run_inline,
                                  const std::vector<std::shared_ptr<Record>>& batch,
                                  std::vector<TransferSnapshot>& out) {
  // The caller waits: its small moves run here one after another and their ends are
  // recorded together, under one lock (not one per move: the lock is every caller's).
  std::vector<Ended> ended;
  ended.reserve(run_inline.size());
  for (const std::shared_ptr<Record>& t : run_inline) Run(t, &ended);
  bool unrun = false;
  {
    absl::MutexLock lock(&mu_);
    running_ -= static_cast<int>(run_inline.size());
    for (Ended& e : ended) {
      e.t->source_xxh3 = e.src_hash;
      e.t->destination_xxh3 = e.dst_hash;
      FinishLocked(e.t, std::move(e.status));
    }
    for (size_t i = 0; i < batch.size(); ++i) {
      if (IsTerminal(batch[i]->state)) out[i] = SnapshotLocked(*batch[i]);
    }
    unrun = !unrun_.empty();
  }
  if (unrun) ReleaseUnrunHolds();
}

}  // namespace gpumove
