#include "daemon/core/transfer_scheduler.h"

#include <algorithm>
#include <atomic>
#include <optional>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/common/log.h"
#include "daemon/common/quote.h"
#include "daemon/common/status_macros.h"
#include "daemon/core/range.h"

namespace gpumove {

// The most bytes of one batch's small moves that run on the waiting caller's thread.
constexpr uint64_t kInlineBatchBytes = 1 << 20;

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

struct TransferScheduler::Record {
  // Fixed at Submit.
  std::string id;
  std::string owner;
  std::string label;
  std::string idempotency_key;
  RangeSpec source;
  RangeSpec destination;
  uint64_t length = 0;
  // A vectored move's pieces, relative to the ranges held (src.data, dst.data); let go
  // when it ends (a finished move is kept as a record, its list of up to megabytes not).
  std::shared_ptr<const Segments> pieces;
  size_t piece_count = 0;
  PathKind path = PathKind::kAuto;
  bool checksum = false;
  std::optional<std::string> notify;
  Engine* engine = nullptr;
  Endpoint src;
  Endpoint dst;
  absl::Time create_time;
  // The end of the move on another node, if any (src.remote or dst.remote points here).
  std::optional<RemoteHold> remote_hold;
  bool remote_completed = false;  // Complete was called (by the worker, before finishing).
  // The end of a copy the move left running (MoveControl::KeepRunning): the other node
  // waits for it before acknowledging; dropped (which waits for it) before the end.
  std::unique_ptr<CopyFence> fence;

  // Owned by the scheduler's lock.
  TransferState state = TransferState::kQueued;
  BufferUse src_use;
  BufferUse dst_use;
  absl::Time start_time = absl::InfinitePast();
  absl::Time end_time = absl::InfinitePast();
  absl::Status status;
  uint64_t source_xxh3 = 0;
  uint64_t destination_xxh3 = 0;
  uint64_t version = 0;
  RangeOrder::Id order = 0;  // Its place in order_.

  // Written by the worker without the lock.
  std::atomic<uint64_t> bytes_done{0};
  std::atomic<bool> cancel_requested{false};
};

// Progress, cancel and the rate limit for one running move.
class TransferScheduler::Control : public MoveControl {
 public:
  Control(TransferScheduler* s, Record* t, uint64_t rate_limit)
      : s_(s), t_(t), rate_limit_(rate_limit), start_(absl::Now()) {}

  bool cancelled() const override { return t_->cancel_requested.load(); }
  // Only for a move with nothing queued behind it: its acknowledgement then overlaps its
  // own copy. With moves waiting, the worker's next copy overlaps it instead, and an
  // acknowledgement that waits for the copy would hold up the others batched with it.
  bool AcceptsFence() const override {
    return t_->remote_hold.has_value() && t_->remote_hold->waits_fences && !s_->MovesWaiting();
  }
  void KeepRunning(std::unique_ptr<CopyFence> fence) override { t_->fence = std::move(fence); }
  uint64_t rate_limit() const override { return rate_limit_; }

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

TransferScheduler::TransferScheduler(SchedulerOptions options, BufferRegistry* registry,
                                     std::vector<Engine*> engines, RangeHasher hasher,
                                     RemoteRanges* remote)
    : options_(std::move(options)),
      registry_(registry),
      engines_(std::move(engines)),
      hasher_(std::move(hasher)),
      remote_(remote) {
  for (int i = 0; i < std::max(1, options_.workers); ++i) {
    workers_.emplace_back([this] { WorkerLoop(); });
  }
}

TransferScheduler::~TransferScheduler() {
  CancelAll();
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
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

absl::StatusOr<Engine*> TransferScheduler::ChooseEngine(PathKind path, const Endpoint& src,
                                                        const Endpoint& dst, bool pieces) const {
  // AUTO: the first engine (LOCAL, UCX, MPI, in that order) that can serve the move and
  // needs no host staging of device memory; else the first that can serve it.
  std::string reasons;
  Engine* staged = nullptr;
  for (Engine* e : engines_) {
    if (path != PathKind::kAuto && e->path() != path) continue;
    absl::Status st = e->CanServe(src, dst);
    if (st.ok() && pieces && !e->MovesPieces(src, dst)) {
      st = absl::FailedPreconditionError("does not move the pieces of a vectored move yet");
    }
    if (st.ok()) {
      if (path != PathKind::kAuto || !e->Stages(src, dst)) return e;
      if (staged == nullptr) staged = e;
      continue;
    }
    absl::StrAppend(&reasons, reasons.empty() ? "" : "; ", PathKindName(e->path()), ": ",
                    st.message());
  }
  if (staged != nullptr) return staged;
  if (reasons.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("path ", PathKindName(path), " is not available on this node"));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("no path can move these buffers (", reasons, ")"));
}

std::string TransferScheduler::BufferKey(const RangeSpec& r) {
  return absl::StrCat(r.node, "/", r.buffer_id);
}

std::vector<absl::StatusOr<std::shared_ptr<TransferScheduler::Record>>>
TransferScheduler::PrepareAll(const std::string& owner, const std::vector<TransferSpec>& given) {
  // A vectored move holds the smallest ranges holding its pieces.
  std::vector<TransferSpec> bounded;
  std::vector<absl::Status> bad(given.size());
  const bool any_pieces = std::any_of(given.begin(), given.end(),
                                      [](const TransferSpec& s) { return s.pieces != nullptr; });
  if (any_pieces) {
    bounded = given;
    for (size_t i = 0; i < bounded.size(); ++i) {
      TransferSpec& s = bounded[i];
      if (s.pieces == nullptr) continue;
      const Segments& p = *s.pieces;
      if (s.source.length != 0 && p.src_hi > s.source.length) {
        bad[i] = absl::InvalidArgumentError(absl::StrCat(
            "a piece ends at ", p.src_hi, ", past the source range's ", s.source.length, " bytes"));
      } else if (s.destination.length != 0 && p.dst_hi > s.destination.length) {
        bad[i] = absl::InvalidArgumentError(absl::StrCat("a piece ends at ", p.dst_hi,
                                                         ", past the destination range's ",
                                                         s.destination.length, " bytes"));
      } else if (s.source.offset > UINT64_MAX - p.src_hi ||
                 s.destination.offset > UINT64_MAX - p.dst_hi) {
        bad[i] = absl::InvalidArgumentError("a piece ends past 2^64");
      } else if (s.checksum && !options_.piece_hasher) {
        bad[i] = absl::UnimplementedError("no checksums of vectored moves here");
      }
      s.source.offset += p.src_lo;
      s.source.length = p.src_hi - p.src_lo;
      s.destination.offset += p.dst_lo;
      s.destination.length = p.dst_hi - p.dst_lo;
      s.pieces = Rebased(s.pieces);
    }
  }
  const std::vector<TransferSpec>& specs = any_pieces ? bounded : given;
  // Each move is checked and its ranges held: local ones in the registry, those on other
  // nodes with one PrepareRemoteBatch per node (per phase). Sources come first, since a
  // destination's default length is its source's: phase 1 holds remote sources (pulls),
  // phase 2 remote destinations (pushes).
  struct Draft {
    std::shared_ptr<Record> t;
    absl::Status error;
    std::string src_node, dst_node;
    bool src_local = true, dst_local = true;
  };
  std::vector<Draft> drafts(specs.size());
  thread_local absl::BitGen rng;
  for (size_t i = 0; i < specs.size(); ++i) {
    const TransferSpec& spec = specs[i];
    Draft& d = drafts[i];
    for (const RangeSpec* r : {&spec.source, &spec.destination}) {
      if (r->buffer_id.empty()) d.error = absl::InvalidArgumentError("buffer_id is empty");
    }
    if (d.error.ok() && !bad[i].ok()) d.error = bad[i];
    if (!d.error.ok()) continue;
    d.src_node = spec.source.node.empty() ? options_.node : spec.source.node;
    d.dst_node = spec.destination.node.empty() ? options_.node : spec.destination.node;
    d.src_local = d.src_node == options_.node;
    d.dst_local = d.dst_node == options_.node;
    if (remote_ == nullptr) {
      for (const std::string* n : {&d.src_node, &d.dst_node}) {
        if (*n != options_.node && d.error.ok()) {
          d.error =
              absl::NotFoundError(absl::StrCat("unknown node ", Quoted(*n), " (this node is \"",
                                               options_.node, "\" and has no peers)"));
        }
      }
      if (!d.error.ok()) continue;
    }
    if (spec.notify.has_value() && spec.notify->size() > kMaxNotifyBytes) {
      d.error = absl::InvalidArgumentError(
          absl::StrCat("notify has ", spec.notify->size(), " bytes; at most ", kMaxNotifyBytes));
      continue;
    }
    if (spec.notify.has_value() && d.dst_local && options_.notifications == nullptr) {
      d.error = absl::FailedPreconditionError("this node publishes no notifications");
      continue;
    }
    if (!d.src_local && !d.dst_local) {
      d.error = absl::InvalidArgumentError(
          absl::StrCat("neither end of the move is on node \"", options_.node, "\""));
      continue;
    }
    d.t = std::make_shared<Record>();
    d.t->id = absl::StrFormat("t-%016x.%s", absl::Uniform<uint64_t>(rng), options_.node);
    d.t->owner = owner;
    d.t->label = spec.label;
    d.t->checksum = spec.checksum;
    d.t->pieces = spec.pieces;
    d.t->piece_count = spec.pieces != nullptr ? spec.pieces->list.size() : 0;
    d.t->notify = spec.notify;
  }

  // Holds the remote ends asked for in one phase: one batch per node, nodes in parallel.
  auto hold_remote = [&](bool write) {
    absl::flat_hash_map<std::string, std::vector<size_t>> by_node;
    std::vector<std::string> nodes;
    for (size_t i = 0; i < drafts.size(); ++i) {
      const Draft& d = drafts[i];
      if (!d.error.ok() || d.t == nullptr) continue;
      if (write ? d.dst_local : d.src_local) continue;
      const std::string& node = write ? d.dst_node : d.src_node;
      auto [it, added] = by_node.try_emplace(node);
      if (added) nodes.push_back(node);
      it->second.push_back(i);
    }
    auto hold_on = [&](const std::string& node) {
      const std::vector<size_t>& idx = by_node[node];
      std::vector<RemoteAsk> asks;
      for (size_t i : idx) {
        const TransferSpec& spec = specs[i];
        const RangeSpec& r = write ? spec.destination : spec.source;
        // Whether our end is device memory (the remote node then may not need to stage).
        const RangeSpec& ours = write ? spec.source : spec.destination;
        auto our_info = registry_->Get(owner, ours.buffer_id);
        uint64_t length = r.length;
        if (write && length == 0 && spec.pieces == nullptr) length = drafts[i].t->source.length;
        asks.push_back(RemoteAsk{drafts[i].t->id, r.buffer_id, r.offset, length, write, spec.path,
                                 our_info.ok() && our_info->kind == MemoryKind::kDevice});
        if (write) asks.back().notify = spec.notify;
        if (spec.checksum) asks.back().pieces = spec.pieces;
        asks.back().vectored = spec.pieces != nullptr;
        asks.back().piece_count = spec.pieces != nullptr ? spec.pieces->list.size() : 0;
        asks.back().list_serial = spec.pieces != nullptr ? spec.pieces->serial : 0;
        // A path asked for by name may have the other node start its half with the hold.
        if (spec.path != PathKind::kAuto) {
          for (Engine* e : engines_) {
            if (e->path() == spec.path) e->PrepareAsk(asks.back());
          }
        }
      }
      std::vector<absl::StatusOr<RemoteHold>> held = remote_->PrepareMany(owner, node, asks);
      for (size_t k = 0; k < idx.size(); ++k) {
        Draft& d = drafts[idx[k]];
        if (k >= held.size() || !held[k].ok()) {
          d.error = k < held.size() ? held[k].status() : absl::InternalError("no hold");
          continue;
        }
        Record& t = *d.t;
        t.remote_hold = *std::move(held[k]);
        Endpoint e{nullptr, t.remote_hold->kind, t.remote_hold->device, &*t.remote_hold};
        RangeSpec resolved{node, asks[k].buffer_id, asks[k].offset, t.remote_hold->length};
        if (write) {
          t.dst = e;
          t.destination = resolved;
        } else {
          t.src = e;
          t.source = resolved;
        }
      }
    };
    std::vector<std::thread> helpers;
    for (size_t n = 1; n < nodes.size(); ++n) helpers.emplace_back(hold_on, nodes[n]);
    if (!nodes.empty()) hold_on(nodes[0]);
    for (auto& h : helpers) h.join();
  };
  auto hold_local = [&](Draft& d, const RangeSpec& r, uint64_t length, bool write) {
    auto u = registry_->Acquire(owner, r.buffer_id, r.offset, length);
    if (!u.ok()) {
      d.error = u.status();
      return;
    }
    Record& t = *d.t;
    const Endpoint e{u->data(), u->kind(), u->device()};
    const RangeSpec resolved{options_.node, u->buffer_id(), u->offset(), u->length()};
    if (write) {
      t.dst = e;
      t.destination = resolved;
      t.dst_use = *std::move(u);
    } else {
      t.src = e;
      t.source = resolved;
      t.src_use = *std::move(u);
    }
  };

  for (size_t i = 0; i < drafts.size(); ++i) {
    Draft& d = drafts[i];
    if (d.error.ok() && d.t != nullptr && d.src_local) {
      hold_local(d, specs[i].source, specs[i].source.length, false);
    }
  }
  if (remote_ != nullptr) hold_remote(false);
  for (size_t i = 0; i < drafts.size(); ++i) {
    Draft& d = drafts[i];
    if (d.error.ok() && d.t != nullptr && d.dst_local) {
      const uint64_t length = specs[i].destination.length;
      hold_local(d, specs[i].destination,
                 length == 0 && specs[i].pieces == nullptr ? d.t->source.length : length, true);
    }
  }
  if (remote_ != nullptr) hold_remote(true);

  std::vector<absl::StatusOr<std::shared_ptr<Record>>> out;
  for (size_t i = 0; i < drafts.size(); ++i) {
    Draft& d = drafts[i];
    if (d.error.ok()) {
      Record& t = *d.t;
      const uint64_t length = t.pieces != nullptr ? t.pieces->total : t.source.length;
      if (t.pieces == nullptr && t.destination.length != length) {
        d.error = absl::InvalidArgumentError(absl::StrCat(
            "destination length ", t.destination.length, " differs from source length ", length));
      } else if (BufferKey(t.source) == BufferKey(t.destination) &&
                 RangesOverlap(t.source.offset, t.source.length, t.destination.offset,
                               t.destination.length)) {
        d.error = absl::InvalidArgumentError(
            t.pieces != nullptr
                ? "source and destination ranges overlap (a vectored move within one buffer "
                  "needs the ranges holding its source and destination pieces apart)"
                : "source and destination ranges overlap");
      } else {
        t.length = length;
        auto engine = ChooseEngine(specs[i].path, t.src, t.dst, t.pieces != nullptr);
        if (engine.ok()) {
          t.engine = *engine;
          t.path = t.engine->path();
          if (t.pieces != nullptr && t.pieces->serial == 0 &&
              (t.path == PathKind::kLocal || t.path == PathKind::kCudaIpc) &&
              options_.stage_pieces &&
              (t.src.kind == MemoryKind::kDevice || t.dst.kind == MemoryKind::kDevice)) {
            options_.stage_pieces(t.pieces);
          }
        } else {
          d.error = engine.status();
        }
      }
    }
    if (d.error.ok()) {
      out.push_back(std::move(d.t));
      continue;
    }
    // A hold taken on another node is let go when its move is refused after all.
    if (d.t != nullptr && d.t->remote_hold.has_value()) ReleaseUnrun(*d.t->remote_hold);
    out.push_back(d.error);
  }
  return out;
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
  auto replay =
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> std::optional<std::vector<TransferSnapshot>> {
    if (idem.empty()) return std::nullopt;
    auto it = idempotency_.find(idem);
    if (it == idempotency_.end()) return std::nullopt;
    std::vector<TransferSnapshot> out;
    for (const std::string& id : it->second) out.push_back(SnapshotLocked(*transfers_.at(id)));
    return out;
  };
  {
    absl::MutexLock lock(&mu_);
    if (auto r = replay()) return *r;
    if (!accepting_) return absl::UnavailableError("daemon is draining; not accepting transfers");
  }

  // Check everything (and hold the buffers, here and on other nodes) before anything is
  // queued; on any error the holds taken so far are let go.
  std::vector<std::shared_ptr<Record>> batch;
  bool committed = false;
  absl::Cleanup release_holds = [&] {
    if (committed) return;
    for (auto& t : batch) {
      if (t->remote_hold.has_value()) ReleaseUnrun(*t->remote_hold);
    }
  };
  std::vector<absl::StatusOr<std::shared_ptr<Record>>> prepared = PrepareAll(owner, specs);
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
    if (auto r = replay()) return *r;  // A concurrent retry won the race.
    if (!accepting_) return absl::UnavailableError("daemon is draining; not accepting transfers");
    if (active_ + batch.size() > options_.max_active) {
      return absl::ResourceExhaustedError(absl::StrCat("transfer queue is full (", active_,
                                                       " queued or running, limit ",
                                                       options_.max_active, "); retry later"));
    }
    if (options_.quotas != nullptr) {
      const std::optional<uint64_t> limit = options_.quotas->TransferLimit(owner);
      auto it = active_by_owner_.find(owner);
      const size_t mine = it == active_by_owner_.end() ? 0 : it->second;
      if (limit.has_value() && mine + batch.size() > *limit) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "tenant ", owner, " has ", mine, " transfers queued or running here and asked for ",
            batch.size(), " more; its quota is ", *limit));
      }
    }
    const absl::Time now = absl::Now();
    std::vector<std::string> ids;
    for (auto& t : batch) {
      if (transfers_.contains(t->id)) return absl::InternalError("transfer id collision; retry");
      t->create_time = now;
      t->version = ++sequence_;
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
      const bool may_inline = caller_waits && (!wait_bounded || (small && options_.rate_limit == 0));
      if (!waits && may_inline && options_.inline_max_bytes > 0 &&
          (batch.size() == 1 ? small || (ready_.empty() && running_ < options_.workers)
                             : small && inline_bytes + t->length <= kInlineBatchBytes)) {
        ++running_;
        t->state = TransferState::kRunning;
        t->start_time = absl::Now();
        t->version = ++sequence_;
        inline_bytes += t->length;
        run_inline.push_back(t);
      } else if (!waits) {
        ready_.push_back(t);
      }
      ids.push_back(t->id);
      out.push_back(SnapshotLocked(*t));
    }
    if (!idem.empty()) idempotency_[idem] = std::move(ids);
    committed = true;
  }
  if (run_inline.empty()) return out;
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
  return out;
}

void TransferScheduler::WorkerLoop() {
  while (true) {
    std::shared_ptr<Record> t;
    {
      absl::MutexLock lock(&mu_);
      auto wake = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_ || !ready_.empty(); };
      mu_.Await(absl::Condition(&wake));
      if (ready_.empty()) return;  // Stopping.
      t = std::move(ready_.front());
      ready_.pop_front();
      if (t->state != TransferState::kQueued) continue;  // Cancelled while queued.
      t->state = TransferState::kRunning;
      t->start_time = absl::Now();
      t->version = ++sequence_;
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
    // With a fence the last bytes are still on their way: counted once acknowledged.
    if (status.ok() && t->fence == nullptr) t->bytes_done.store(t->length);
  }
  const absl::Time move_end = absl::Now();
  if (!status.ok()) t->fence.reset();  // Only a move that went through leaves one.
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
  AckFence fence;
  if (t->fence != nullptr) {
    fence = {t->fence->ipc_handle(), t->fence->pending_bytes(), /*runner_waits=*/true};
  }
  remote_->CompleteAsync(
      *t->remote_hold, status, t->checksum, fence, /*caller_busy=*/MovesWaiting(),
      [this, t, status, src_hash, move_start, move_end](absl::StatusOr<uint64_t> ack) {
        // The other node acknowledged the move, maybe before its copy ended (it ends its
        // hold when it sees the fence pass): the move is done once this node sees the
        // fence pass too. Without an acknowledgement the copy may still run, so it is
        // waited for before the buffers are let go. The fence (stream, event, mapping)
        // is let go after the end is recorded.
        std::unique_ptr<CopyFence> landed;
        absl::Status copied;
        if (t->fence != nullptr && ack.ok()) {
          landed = std::move(t->fence);
          copied = landed->Wait();
          if (copied.ok()) t->bytes_done.store(t->length);
        }
        t->fence.reset();
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

void TransferScheduler::ReleaseUnrun(const RemoteHold& hold) {
  for (Engine* e : engines_) e->Abandon(hold);
  remote_->Release(hold);
}

void TransferScheduler::ReleaseUnrunHolds() {
  std::vector<RemoteHold> holds;
  {
    absl::MutexLock lock(&mu_);
    holds.swap(unrun_);
  }
  for (const RemoteHold& h : holds) ReleaseUnrun(h);
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

void TransferScheduler::FinishLocked(const std::shared_ptr<Record>& t, absl::Status status) {
  t->state = status.ok()                                     ? TransferState::kSucceeded
             : status.code() == absl::StatusCode::kCancelled ? TransferState::kCancelled
                                                             : TransferState::kFailed;
  t->status = std::move(status);
  t->end_time = absl::Now();
  t->version = ++sequence_;
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
    ready_.push_back(std::move(it->second));
    waiting_.erase(it);
  }
  --active_;
  if (options_.quotas != nullptr) {
    auto mine = active_by_owner_.find(t->owner);
    if (mine != active_by_owner_.end() && --mine->second == 0) active_by_owner_.erase(mine);
  }
  if (options_.on_end) {
    options_.on_end(
        TransferEnd{t->path, t->state, t->length, t->create_time, t->start_time, t->end_time});
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
  s.pieces = t.piece_count;
  s.source_xxh3 = t.source_xxh3;
  s.destination_xxh3 = t.destination_xxh3;
  s.version = t.version;
  s.cancel_requested = t.cancel_requested.load();
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
