#include "daemon/core/hold_planner.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/blocking_counter.h"
#include "daemon/common/quote.h"
#include "daemon/common/thread_pool.h"
#include "daemon/core/notifications.h"
#include "daemon/core/range.h"

namespace gpumove {
namespace {

// Helper threads for holding one phase's ranges on several nodes at once, kept for the
// process instead of a thread started per node and Submit. While all are busy a Submit
// holds its other nodes on its own thread (RunEach): none waits for another's holds.
constexpr int kHoldHelpers = 16;

ThreadPool& HoldPool() {
  // Never destroyed: its threads outlive main.
  static ThreadPool* pool = new ThreadPool(kHoldHelpers);
  return *pool;
}

// Runs job(0) .. job(n - 1) on this thread and on up to n - 1 helpers of HoldPool;
// returns when all are done. This thread also runs every job no helper has started by
// the time it is free, so it never waits for a helper busy with another caller's jobs
// (a helper that comes late finds nothing left).
void RunEach(size_t n, const std::function<void(size_t)>& job) {
  if (n == 0) return;
  struct Jobs {
    Jobs(size_t n, const std::function<void(size_t)>* job)
        : n(n), job(job), done(static_cast<int>(n)) {}
    // `job` is called only for an index claimed here, which RunEach waits for: it is
    // alive then, though a late helper may outlive it.
    void RunClaimed() {
      for (size_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) {
        (*job)(i);
        done.DecrementCount();
      }
    }
    const size_t n;
    const std::function<void(size_t)>* const job;
    std::atomic<size_t> next{0};
    absl::BlockingCounter done;
  };
  auto jobs = std::make_shared<Jobs>(n, &job);
  for (size_t k = 1; k < n; ++k) HoldPool().Run([jobs] { jobs->RunClaimed(); });
  jobs->RunClaimed();
  jobs->done.Wait();
}

// A vectored move whose range does not fit its buffer: the first piece past the buffer's
// end, named by its index (a block list's block index), instead of the range around them
// all, which names no piece. Other refusals as they were.
absl::Status NamePiecePastEnd(const BufferRegistry& registry, const std::string& owner,
                              const RangeSpec& r, bool write, const Segments* pieces,
                              absl::Status refused) {
  if (pieces == nullptr || !absl::IsInvalidArgument(refused)) return refused;
  auto info = registry.Get(owner, r.buffer_id);
  if (!info.ok()) return refused;
  for (size_t i = 0; i < pieces->list.size(); ++i) {
    const Segment& p = pieces->list[i];
    const uint64_t at = r.offset + (write ? p.dst : p.src);  // BoundPieces checked 2^64.
    if (at >= info->size || p.length > info->size - at) {
      return absl::InvalidArgumentError(
          absl::StrCat(write ? "destination" : "source", " piece ", i, " (block ", i,
                       " of a block list: ", p.length, " bytes at offset ", at,
                       ") ends past the end of buffer ", r.buffer_id, " (", info->size, " bytes)"));
    }
  }
  return refused;
}
}  // namespace

struct HoldPlanner::Draft {
  std::shared_ptr<TransferRecord> t;
  absl::Status error;
  std::string src_node, dst_node;
  bool src_local = true, dst_local = true;
};

std::string HoldPlanner::BufferKey(const RangeSpec& r) {
  return absl::StrCat(r.node, "/", r.buffer_id);
}

std::vector<absl::StatusOr<std::shared_ptr<TransferRecord>>> HoldPlanner::PrepareAll(
    const std::string& owner, const std::vector<TransferSpec>& given) const {
  // A vectored move holds the smallest ranges holding its pieces.
  std::vector<TransferSpec> bounded;
  std::vector<absl::Status> bad(given.size());
  const bool any_pieces = std::any_of(given.begin(), given.end(),
                                      [](const TransferSpec& s) { return s.pieces != nullptr; });
  if (any_pieces) {
    bounded = given;
    BoundPieces(bounded, bad);
  }
  const std::vector<TransferSpec>& specs = any_pieces ? bounded : given;
  // Each move is checked and its ranges held: local ones in the registry, those on other
  // nodes with one PrepareRemoteBatch per node (per phase). Sources come first, since a
  // destination's default length is its source's: phase 1 holds remote sources (pulls),
  // phase 2 remote destinations (pushes).
  std::vector<Draft> drafts;
  drafts.reserve(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) drafts.push_back(NewDraft(owner, specs[i], bad[i]));

  for (size_t i = 0; i < drafts.size(); ++i) {
    Draft& d = drafts[i];
    if (d.error.ok() && d.t != nullptr && d.src_local) {
      HoldLocal(owner, d, specs[i].source, specs[i].source.length, false);
    }
  }
  if (remote_ != nullptr) HoldRemote(owner, specs, drafts, false);
  for (size_t i = 0; i < drafts.size(); ++i) {
    Draft& d = drafts[i];
    if (d.error.ok() && d.t != nullptr && d.dst_local) {
      const uint64_t length = specs[i].destination.length;
      HoldLocal(owner, d, specs[i].destination,
                length == 0 && specs[i].pieces == nullptr ? d.t->source.length : length, true);
    }
  }
  if (remote_ != nullptr) HoldRemote(owner, specs, drafts, true);

  std::vector<absl::StatusOr<std::shared_ptr<TransferRecord>>> out;
  for (size_t i = 0; i < drafts.size(); ++i) {
    Draft& d = drafts[i];
    if (d.error.ok()) Settle(specs[i], d);
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

void HoldPlanner::BoundPieces(std::vector<TransferSpec>& specs,
                              std::vector<absl::Status>& bad) const {
  for (size_t i = 0; i < specs.size(); ++i) {
    TransferSpec& s = specs[i];
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

HoldPlanner::Draft HoldPlanner::NewDraft(const std::string& owner, const TransferSpec& spec,
                                         const absl::Status& bad) const {
  thread_local absl::BitGen rng;
  Draft d;
  for (const RangeSpec* r : {&spec.source, &spec.destination}) {
    if (r->buffer_id.empty()) d.error = absl::InvalidArgumentError("buffer_id is empty");
  }
  if (d.error.ok() && !bad.ok()) d.error = bad;
  if (!d.error.ok()) return d;
  d.src_node = spec.source.node.empty() ? options_.node : spec.source.node;
  d.dst_node = spec.destination.node.empty() ? options_.node : spec.destination.node;
  d.src_local = d.src_node == options_.node;
  d.dst_local = d.dst_node == options_.node;
  if (remote_ == nullptr) {
    for (const std::string* n : {&d.src_node, &d.dst_node}) {
      if (*n != options_.node && d.error.ok()) {
        d.error = absl::NotFoundError(absl::StrCat("unknown node ", Quoted(*n), " (this node is \"",
                                                   options_.node, "\" and has no peers)"));
      }
    }
    if (!d.error.ok()) return d;
  }
  if (spec.notify.has_value() && spec.notify->size() > kMaxNotifyBytes) {
    d.error = absl::InvalidArgumentError(
        absl::StrCat("notify has ", spec.notify->size(), " bytes; at most ", kMaxNotifyBytes));
    return d;
  }
  if (spec.notify.has_value() && d.dst_local && options_.notifications == nullptr) {
    d.error = absl::FailedPreconditionError("this node publishes no notifications");
    return d;
  }
  if (!d.src_local && !d.dst_local) {
    d.error = absl::InvalidArgumentError(
        absl::StrCat("neither end of the move is on node \"", options_.node, "\""));
    return d;
  }
  d.t = std::make_shared<TransferRecord>();
  d.t->id = absl::StrFormat("t-%016x.%s", absl::Uniform<uint64_t>(rng), options_.node);
  d.t->owner = owner;
  d.t->label = spec.label;
  d.t->priority = spec.priority;
  d.t->require_transport = spec.require_transport;
  d.t->checksum = spec.checksum;
  d.t->durable = spec.durable;
  d.t->pieces = spec.pieces;
  d.t->piece_count = spec.pieces != nullptr ? spec.pieces->list.size() : 0;
  d.t->notify = spec.notify;
  return d;
}

void HoldPlanner::HoldLocal(const std::string& owner, Draft& d, const RangeSpec& r, uint64_t length,
                            bool write) const {
  auto u = registry_->Acquire(owner, r.buffer_id, r.offset, length, /*files=*/true);
  if (!u.ok()) {
    d.error = NamePiecePastEnd(*registry_, owner, r, write, d.t->pieces.get(), u.status());
    return;
  }
  TransferRecord& t = *d.t;
  Endpoint e{u->data(), u->kind(), u->device()};
  if (u->file() != nullptr) {
    e.file = u->file();
    e.file_offset = u->file()->offset() + u->offset();
  }
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
}

void HoldPlanner::HoldRemote(const std::string& owner, const std::vector<TransferSpec>& specs,
                             std::vector<Draft>& drafts, bool write) const {
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
  if (nodes.empty()) return;  // Every end is local (LOCAL moves): no batch, no pool.
  // Each node's batch writes only its own moves' drafts; by_node is only read meanwhile.
  RunEach(nodes.size(),
          [&](size_t n) { HoldOn(owner, specs, drafts, nodes[n], by_node.at(nodes[n]), write); });
}

void HoldPlanner::HoldOn(const std::string& owner, const std::vector<TransferSpec>& specs,
                         std::vector<Draft>& drafts, const std::string& node,
                         const std::vector<size_t>& idx, bool write) const {
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
    TransferRecord& t = *d.t;
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
}

void HoldPlanner::Settle(const TransferSpec& spec, Draft& d) const {
  TransferRecord& t = *d.t;
  const uint64_t length = t.pieces != nullptr ? t.pieces->total : t.source.length;
  if (t.pieces == nullptr && t.destination.length != length) {
    d.error = absl::InvalidArgumentError(absl::StrCat("destination length ", t.destination.length,
                                                      " differs from source length ", length));
    return;
  }
  if (BufferKey(t.source) == BufferKey(t.destination) &&
      RangesOverlap(t.source.offset, t.source.length, t.destination.offset, t.destination.length)) {
    d.error = absl::InvalidArgumentError(
        t.pieces != nullptr
            ? "source and destination ranges overlap (a vectored move within one buffer "
              "needs the ranges holding its source and destination pieces apart)"
            : "source and destination ranges overlap");
    return;
  }
  t.length = length;
  auto engine = ChooseEngine(spec.path, t.src, t.dst, t.pieces != nullptr);
  if (!engine.ok()) {
    d.error = engine.status();
    return;
  }
  t.engine = *engine;
  t.path = t.engine->path();
  if (t.pieces != nullptr && t.pieces->serial == 0 &&
      (t.path == PathKind::kLocal || t.path == PathKind::kCudaIpc) && options_.stage_pieces &&
      (t.src.kind == MemoryKind::kDevice || t.dst.kind == MemoryKind::kDevice)) {
    options_.stage_pieces(t.pieces);
  }
}

absl::StatusOr<Engine*> HoldPlanner::ChooseEngine(PathKind path, const Endpoint& src,
                                                  const Endpoint& dst, bool pieces) const {
  // AUTO: the first engine (LOCAL, UCX, MPI, in that order) that can serve the move and
  // needs no host staging of device memory; else the first that can serve it.
  std::string reasons;
  Engine* staged = nullptr;
  const bool file = src.kind == MemoryKind::kFile || dst.kind == MemoryKind::kFile;
  for (Engine* e : engines_) {
    if (path != PathKind::kAuto && e->path() != path) continue;
    absl::Status st = file && !e->ServesFiles()
                          ? absl::FailedPreconditionError("does not move file buffers")
                          : e->CanServe(src, dst);
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

void HoldPlanner::ReleaseUnrun(const RemoteHold& hold) const {
  for (Engine* e : engines_) e->Abandon(hold);
  remote_->Release(hold);
}

}  // namespace gpumove
