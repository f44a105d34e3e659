#include "daemon/path/ucx/ucx_engine.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "daemon/common/log.h"

namespace gpumove {
namespace {

// With --v=2, when each chunk of a staged move ended each step (microseconds from the
// start), logged as one line when the move ends: where a pipeline waits shows there.
class StageTrace {
 public:
  explicit StageTrace(uint64_t length) : length_(length), on_(LogVerbosity() >= 2) {}
  ~StageTrace() {
    if (!on_) return;
    absl::MutexLock lock(&mu_);
    VLOG(2) << "staged move of " << length_
            << " bytes, per chunk (us from start): " << absl::StrJoin(events_, " ");
  }
  // Marks `step` of the chunk at `offset` as ended now; passes its status on.
  absl::Status Marked(uint64_t offset, const char* step, absl::Status status) {
    Mark(offset, step);
    return status;
  }
  void Mark(uint64_t offset, const char* step) {
    if (!on_) return;
    const double us = absl::ToDoubleMicroseconds(absl::Now() - start_);
    absl::MutexLock lock(&mu_);
    events_.push_back(absl::StrCat(offset >> 20, "M:", step, "@", static_cast<int64_t>(us)));
  }

 private:
  const uint64_t length_;
  const bool on_;
  const absl::Time start_ = absl::Now();
  absl::Mutex mu_;
  std::vector<std::string> events_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::Status UcxEngine::CanServe(const Endpoint& src, const Endpoint& dst) const {
  if ((src.remote == nullptr) == (dst.remote == nullptr)) {
    return absl::FailedPreconditionError("UCX moves need exactly one end on another node");
  }
  const RemoteHold& remote = src.remote != nullptr ? *src.remote : *dst.remote;
  const UcxOffer* offer = remote.offer<UcxOffer>();
  if (offer == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("node ", remote.node, " has no UCX engine"));
  }
  if (offer->stage.has_value()) {
    if (offer->stage->rkey.empty() || offer->stage->slot_size == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "node ", remote.node, " stages this range but its bounce pool is not registered"));
    }
  } else if (offer->rkey.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the remote buffer's pool on ", remote.node, " is not registered with UCX"));
  }
  const Endpoint& local = src.remote != nullptr ? dst : src;
  if (local.kind == MemoryKind::kDevice && !transport_->cuda_aware() && pinned_ == nullptr) {
    return absl::FailedPreconditionError(
        "staging device memory needs a pinned pool on this node (--pinned_pool_size)");
  }
  return absl::OkStatus();
}

const char* UcxStrategyName(UcxStrategy strategy) {
  switch (strategy) {
    case UcxStrategy::kRemoteStaged:
      return "staged by the other node";
    case UcxStrategy::kLocalStaged:
      return "staged here";
    case UcxStrategy::kLanes:
      return "split over lanes";
    case UcxStrategy::kWhole:
      return "one put or get";
  }
  return "?";
}

UcxStrategy ChooseUcxStrategy(bool remote_staged, bool local_staged, size_t lanes, bool direct) {
  if (remote_staged) return UcxStrategy::kRemoteStaged;
  if (local_staged) return UcxStrategy::kLocalStaged;
  if (lanes > 0 && !direct) return UcxStrategy::kLanes;
  return UcxStrategy::kWhole;
}

bool UcxEngine::MovesPieces(const Endpoint& src, const Endpoint& dst) const {
  const bool push = dst.remote != nullptr;
  const RemoteHold* hold = push ? dst.remote : src.remote;
  if (hold == nullptr) return false;
  const UcxOffer* offer = hold->offer<UcxOffer>();
  const Endpoint& local = push ? src : dst;
  return offer != nullptr &&
         (local.kind != MemoryKind::kDevice || transport_->cuda_aware() || pinned_ != nullptr);
}

absl::Status UcxEngine::MovePieces(const Endpoint& src, const Endpoint& dst, const Segments& pieces,
                                   MoveControl& control) {
  if (!MovesPieces(src, dst)) {
    return absl::FailedPreconditionError(
        "this vectored UCX move needs bounce buffers here (device memory, a UCX that is not "
        "CUDA-aware) and this node has no pinned pool");
  }
  const bool push = dst.remote != nullptr;
  const RemoteHold& hold = push ? *dst.remote : *src.remote;
  const UcxOffer* offer = hold.offer<UcxOffer>();
  if (offer->stage.has_value()) {
    return MoveRemoteStagedPieces(src, dst, hold, *offer, pieces, control);
  }
  RemoteRange remote;
  remote.peer_key = hold.peer().Key();
  remote.worker_address = offer->worker_address;
  remote.rkey = offer->rkey;
  remote.address = hold.address;
  remote.peer_error_handling = !hold.same_host;
  remote.device = (push ? src : dst).kind == MemoryKind::kDevice || hold.kind == MemoryKind::kDevice;
  if (control.cancelled()) return absl::CancelledError("cancelled");
  VLOG(2) << "UCX move of " << pieces.list.size() << " pieces (" << pieces.total << " bytes) with "
          << hold.node;
  const Endpoint& local = push ? src : dst;
  if (local.kind == MemoryKind::kDevice && !transport_->cuda_aware()) {
    remote.device = hold.kind == MemoryKind::kDevice;
    return MoveLocalStagedPieces(push, remote, local, pieces, control);
  }
  return push ? transport_->PutPieces(remote, src.data, pieces, control.Reporter())
              : transport_->GetPieces(remote, dst.data, pieces, control.Reporter());
}

absl::Status UcxEngine::Move(const Endpoint& src, const Endpoint& dst, uint64_t length,
                             MoveControl& control) {
  const bool push = dst.remote != nullptr;
  const RemoteHold& hold = push ? *dst.remote : *src.remote;
  const UcxOffer* offer = hold.offer<UcxOffer>();
  if (offer == nullptr) return CanServe(src, dst);
  RemoteRange remote;
  remote.peer_key = hold.peer().Key();
  remote.worker_address = offer->worker_address;
  remote.rkey = offer->rkey;
  remote.address = hold.address;
  remote.peer_error_handling = !hold.same_host;
  auto progress = control.Reporter();
  if (control.cancelled()) return absl::CancelledError("cancelled");
  const Endpoint& local = push ? src : dst;
  const bool remote_staged = offer->stage.has_value();
  const bool local_staged = local.kind == MemoryKind::kDevice && !transport_->cuda_aware();
  // Host memory over the wire goes over every lane both nodes have.
  const size_t lanes = !remote_staged && local.kind != MemoryKind::kDevice
                           ? std::min(lanes_.lanes.size(), offer->lanes.size())
                           : 0;
  const bool direct = lanes > 0 && transport_->Direct(remote);
  const UcxStrategy strategy = ChooseUcxStrategy(remote_staged, local_staged, lanes, direct);
  VLOG(2) << "UCX move of " << length << " bytes with " << hold.node << ": "
          << UcxStrategyName(strategy);
  switch (strategy) {
    case UcxStrategy::kRemoteStaged:
      return MoveRemoteStaged(src, dst, hold, *offer, length, control, progress);
    case UcxStrategy::kLanes: {
      // A rate cap is held by Progress on the moving thread: a capped move runs whole.
      const uint64_t share = std::max<uint64_t>(lanes_.min_share, 64 << 10);
      const uint64_t most = control.rate_limit() > 0 ? 1 : std::max<uint64_t>(1, length / share);
      // Big moves spread over every lane even when others use them (so moves that
      // overlap share all lanes evenly); small ones take free lanes only (a split costs
      // a thread per share, which a stream of small moves does not need).
      const bool spread = length / (lanes + 1) >= kSpreadShare;
      const std::vector<size_t> use = TakeLanes(lanes + 1, most, spread);
      absl::Status st = MoveOverLanes(push, remote, *offer, local.data, length, control, use);
      GiveBackLanes(use);
      return st;
    }
    case UcxStrategy::kWhole: {
      // Device memory on either side, moved by a CUDA-aware UCX: bigger requests.
      RemoteRange r = remote;
      r.device = local.kind == MemoryKind::kDevice || hold.kind == MemoryKind::kDevice;
      return push ? transport_->Put(r, src.data, length, progress)
                  : transport_->Get(r, dst.data, length, progress);
    }
    case UcxStrategy::kLocalStaged:
      return MoveLocalStaged(push, remote, src, dst, length, control, progress);
  }
  return absl::InternalError("no UCX strategy");
}

absl::Status UcxEngine::MoveLocalStaged(bool push, const RemoteRange& remote, const Endpoint& src,
                                        const Endpoint& dst, uint64_t length, MoveControl& control,
                                        const std::function<bool(uint64_t)>& progress) {
  auto ring =
      BounceRing::TakeWaiting(pinned_, SizedFor(staging_, length), absl::Now() + BounceRing::kWait,
                              [&control] { return control.cancelled(); });
  if (!ring.ok()) return ring.status();
  // A push's puts (two at once) take the staged copies' threads; a pull's gets, one at a
  // time, keep direct_threads (twice as fast; docs/performance/tuning.md).
  auto at = [&remote, push](uint64_t offset) {
    RemoteRange r = remote;
    r.address += offset;
    r.staged = push;
    return r;
  };
  if (push) {
    // Puts land at distinct offsets: two at once keep the wire busy while one waits.
    return StageOut(
        gpu_, src.data, src.device, length, *ring,
        [&](const char* host, uint64_t offset, uint64_t n) {
          return transport_->Put(at(offset), host, n, nullptr);
        },
        progress, /*senders=*/2);
  }
  return StageIn(
      gpu_, dst.data, dst.device, length, *ring,
      [&](char* host, uint64_t offset, uint64_t n) {
        return transport_->Get(at(offset), host, n, nullptr);
      },
      progress);
}

namespace {

// The rounds of a vectored staged move through two steps, `first` then `second`, round k
// in slot k % slots: round k's second step runs while round k+1's first does (with one
// slot, in turn). `first_here`: the first step stays on the calling thread and the second
// goes to a helper, else the other way round — the GPU's step stays here (a fresh thread's
// first CUDA calls cost milliseconds: 16 ms a round measured for gathers on helpers).
// `make(round)` packs the next round and returns its bytes (0: none left). Progress after
// each round; a cancel stops between rounds.
template <typename Round, typename Make, typename First, typename Second>
absl::Status RunRounds(size_t slots, const Make& make, const First& first, const Second& second,
                       bool first_here, MoveControl& control) {
  Round rounds[2];
  uint64_t bytes[2] = {make(rounds[0]), 0};
  if (bytes[0] == 0) return absl::OkStatus();
  if (absl::Status st = first(rounds[0], 0); !st.ok()) return st;
  uint64_t done = 0;
  for (size_t k = 0;; ++k) {
    const size_t c = k % 2, n = (k + 1) % 2;
    const size_t s = k % slots, t = (k + 1) % slots;
    const bool overlap = slots > 1 && !control.cancelled() && (bytes[n] = make(rounds[n])) > 0;
    absl::Status next_first, this_second;
    std::thread helper;
    if (first_here) {
      helper = std::thread([&] { this_second = second(rounds[c], s); });
      if (overlap) next_first = first(rounds[n], t);
    } else {
      if (overlap) helper = std::thread([&] { next_first = first(rounds[n], t); });
      this_second = second(rounds[c], s);
    }
    if (helper.joinable()) helper.join();
    if (!this_second.ok()) return this_second;
    if (!next_first.ok()) return next_first;
    done += bytes[c];
    control.Progress(done);
    if (!overlap) {
      // One slot, a cancel, or the end: the next round (if any) starts from its first step.
      if ((bytes[n] = make(rounds[n])) == 0) return absl::OkStatus();
      if (control.cancelled()) return absl::CancelledError("cancelled");
      if (absl::Status st = first(rounds[n], t); !st.ok()) return st;
    }
  }
}

}  // namespace

absl::Status UcxEngine::MoveLocalStagedPieces(bool push, const RemoteRange& remote,
                                              const Endpoint& local, const Segments& pieces,
                                              MoveControl& control) {
  auto ring = BounceRing::TakeWaiting(pinned_, SizedFor(staging_, pieces.total),
                                      absl::Now() + BounceRing::kWait,
                                      [&control] { return control.cancelled(); });
  if (!ring.ok()) return ring.status();
  const uint64_t cap = ring->chunk();
  // Rounds of whole pieces of at most a slot (a longer piece is cut into slot-sized
  // parts): `near` maps our device side to the packed slot, `far` the slot to the pieces'
  // places at the other node.
  struct Round {
    std::vector<Segment> near;
    Segments far;
  };
  const std::vector<Segment>& list = pieces.list;
  size_t next = 0;       // The next piece to pack,
  uint64_t in_piece = 0;  // and how much of it is packed already.
  auto make_round = [&](Round& r) {
    r.near.clear();
    r.far.list.clear();
    uint64_t bytes = 0;
    while (next < list.size() && bytes < cap) {
      const Segment& p = list[next];
      const uint64_t n = std::min(p.length - in_piece, cap - bytes);
      const uint64_t ours = (push ? p.src : p.dst) + in_piece;
      const uint64_t theirs = (push ? p.dst : p.src) + in_piece;
      if (push) {
        r.near.push_back(Segment{ours, bytes, n});
        r.far.list.push_back(Segment{bytes, theirs, n});
      } else {
        r.far.list.push_back(Segment{theirs, bytes, n});
        r.near.push_back(Segment{bytes, ours, n});
      }
      bytes += n;
      in_piece += n;
      if (in_piece == p.length) {
        ++next;
        in_piece = 0;
      }
    }
    r.far.total = bytes;
    return bytes;
  };
  RemoteRange at = remote;
  at.staged = push;
  // The GPU side of a round: gather into slot `slot` (push) or scatter out of it (pull).
  auto gpu_copy = [&](const Round& r, char* slot) {
    const absl::Time t0 = absl::Now();
    absl::Cleanup log = [&] {
      VLOG(1) << "staged pieces: GPU copy of " << r.near.size() << " pieces ("
              << r.far.total << " bytes) " << absl::ToDoubleMicroseconds(absl::Now() - t0)
              << " us";
    };
    return push ? gpu_->CopyPieces(slot, kHostDevice, local.data, local.device, r.near.data(),
                                   r.near.size(), r.far.total, nullptr)
                : gpu_->CopyPieces(local.data, local.device, slot, kHostDevice, r.near.data(),
                                   r.near.size(), r.far.total, nullptr);
  };
  auto wire = [&](const Round& r, char* slot) {
    const absl::Time t0 = absl::Now();
    absl::Cleanup log = [&] {
      VLOG(1) << "staged pieces: wire of " << r.far.list.size() << " pieces ("
              << r.far.total << " bytes) " << absl::ToDoubleMicroseconds(absl::Now() - t0)
              << " us";
    };
    return push ? transport_->PutPieces(at, slot, r.far, nullptr)
                : transport_->GetPieces(at, slot, r.far, nullptr);
  };
  // Push: gather (here) then put; pull: get then scatter (here).
  auto gather_or_get = [&](const Round& r, size_t slot) {
    return push ? gpu_copy(r, ring->slot(slot)) : wire(r, ring->slot(slot));
  };
  auto put_or_scatter = [&](const Round& r, size_t slot) {
    return push ? wire(r, ring->slot(slot)) : gpu_copy(r, ring->slot(slot));
  };
  return RunRounds<Round>(ring->slots(), make_round, gather_or_get, put_or_scatter,
                          /*first_here=*/push, control);
}

absl::StatusOr<UcxEngine::StageSides> UcxEngine::TakeStageSides(const Endpoint& local,
                                                                const RemoteHold& hold,
                                                                const UcxOffer::Stage& offered,
                                                                MoveControl& control) {
  const absl::Time deadline = absl::Now() + BounceRing::kWait;
  auto cancelled = [&control] { return control.cancelled(); };
  StageSides sides;
  sides.far = offered.slots;
  if (sides.far.empty()) {
    // Held while the remote node's pinned pool was busy: its slots are taken now, once
    // there is room (it answers at once; we try again, a little later each time).
    auto taken = RetryWhileBusy<StageSlots>(deadline, cancelled,
                                            [&] { return TakeStageSlots(*remote_, hold); });
    if (!taken.ok()) return taken.status();
    if (taken->slots.empty() || taken->slot_size != offered.slot_size) {
      return absl::InternalError(absl::StrCat("node ", hold.node, " gave ", taken->slots.size(),
                                              " bounce slots of ", taken->slot_size, " bytes, not ",
                                              offered.slot_size));
    }
    sides.far = std::move(taken->slots);
  }
  if (offered.slot_size == 0) return absl::InternalError("bounce slots of 0 bytes");
  // Our own device memory goes through bounce slots of ours, as many and as big.
  if (local.kind == MemoryKind::kDevice && !transport_->cuda_aware()) {
    auto ring = BounceRing::TakeWaiting(
        pinned_, {.chunk = offered.slot_size, .slots = static_cast<int>(sides.far.size())},
        deadline, cancelled);
    if (!ring.ok()) return ring.status();
    sides.ours.emplace(*std::move(ring));
  }
  return sides;
}

absl::Status UcxEngine::MoveRemoteStagedPieces(const Endpoint& src, const Endpoint& dst,
                                               const RemoteHold& hold, const UcxOffer& offer,
                                               const Segments& pieces, MoveControl& control) {
  const bool push = dst.remote != nullptr;
  const Endpoint& local = push ? src : dst;
  const UcxOffer::Stage& offered = *offer.stage;
  const uint64_t chunk = offered.slot_size;
  auto sides = TakeStageSides(local, hold, offered, control);
  if (!sides.ok()) return sides.status();
  const std::vector<uint64_t>& far_slots = sides->far;
  std::optional<BounceRing>& ours = sides->ours;
  // Rounds: whole pieces (a piece longer than a slot cut into slot-sized parts), packed.
  struct Round {
    std::vector<std::pair<uint64_t, uint64_t>> theirs;  // {offset in their range, length}.
    Segments here;  // Ours <-> the packed slot, in the direction of the move.
  };
  const std::vector<Segment>& list = pieces.list;
  size_t next = 0;
  uint64_t in_piece = 0;
  auto make_round = [&](Round& r) {
    r.theirs.clear();
    r.here.list.clear();
    uint64_t bytes = 0;
    while (next < list.size() && bytes < chunk && r.theirs.size() < kRoundPieces) {
      const Segment& p = list[next];
      const uint64_t n = std::min(p.length - in_piece, chunk - bytes);
      const uint64_t mine = (push ? p.src : p.dst) + in_piece;
      r.theirs.emplace_back((push ? p.dst : p.src) + in_piece, n);
      r.here.list.push_back(push ? Segment{mine, bytes, n} : Segment{bytes, mine, n});
      bytes += n;
      in_piece += n;
      if (in_piece == p.length) {
        ++next;
        in_piece = 0;
      }
    }
    r.here.total = bytes;
    return bytes;
  };
  auto far = [&](size_t slot) {
    RemoteRange r;
    r.peer_key = hold.peer().Key();
    r.worker_address = offer.worker_address;
    r.rkey = offered.rkey;
    r.address = far_slots[slot];
    r.peer_error_handling = !hold.same_host;
    r.bounce = true;
    r.staged = true;
    return r;
  };
  const size_t slots = ours.has_value() ? std::min(ours->slots(), far_slots.size())
                                        : far_slots.size();
  // This side of round r in slot s: into their slot (push) or out of it (pull).
  auto near_side = [&](const Round& r, size_t s) -> absl::Status {
    const absl::Time t0 = absl::Now();
    absl::Cleanup log = [&] {
      VLOG(1) << "far-staged pieces: this side of " << r.here.list.size() << " pieces ("
              << r.here.total << " bytes) " << absl::ToDoubleMicroseconds(absl::Now() - t0)
              << " us";
    };
    if (push) {
      if (ours.has_value()) {
        absl::Status st = gpu_->CopyPieces(ours->slot(s), kHostDevice, local.data, local.device,
                                           r.here.list.data(), r.here.list.size(), r.here.total,
                                           nullptr);
        if (!st.ok()) return st;
        return transport_->Put(far(s), ours->slot(s), r.here.total, nullptr);
      }
      return transport_->PutPieces(far(s), local.data, r.here, nullptr);
    }
    if (ours.has_value()) {
      absl::Status st = transport_->Get(far(s), ours->slot(s), r.here.total, nullptr);
      if (!st.ok()) return st;
      return gpu_->CopyPieces(local.data, local.device, ours->slot(s), kHostDevice,
                              r.here.list.data(), r.here.list.size(), r.here.total, nullptr);
    }
    return transport_->GetPieces(far(s), local.data, r.here, nullptr);
  };
  // Their side: the scatter out of their slot (push) or the gather into it (pull).
  auto far_side = [&](const Round& r, size_t s) {
    const absl::Time t0 = absl::Now();
    absl::Cleanup log = [&] {
      VLOG(1) << "far-staged pieces: their side of " << r.theirs.size() << " pieces "
              << absl::ToDoubleMicroseconds(absl::Now() - t0) << " us";
    };
    return StagePieces(*remote_, hold, static_cast<uint32_t>(s), 0, r.theirs, /*to_range=*/push);
  };
  // A push: ours (here) then their scatter; a pull: their gather then ours (here). Their
  // copy of one round overlaps our side of the next.
  auto first = [&](const Round& r, size_t slot) {
    return push ? near_side(r, slot) : far_side(r, slot);
  };
  auto second = [&](const Round& r, size_t slot) {
    return push ? far_side(r, slot) : near_side(r, slot);
  };
  return RunRounds<Round>(slots, make_round, first, second, /*first_here=*/push, control);
}

std::vector<size_t> ChooseLanes(const std::vector<int>& busy, uint64_t most, bool spread) {
  std::vector<size_t> order(busy.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&busy](size_t a, size_t b) { return busy[a] < busy[b]; });
  const size_t idle = std::count(busy.begin(), busy.end(), 0);
  order.resize(std::clamp<uint64_t>(spread ? busy.size() : idle, 1, std::max<uint64_t>(most, 1)));
  return order;
}

std::vector<size_t> UcxEngine::TakeLanes(size_t usable, uint64_t most, bool spread) {
  absl::MutexLock lock(&lane_mu_);
  if (lane_busy_.size() < usable) lane_busy_.resize(usable, 0);
  const std::vector<int> busy(lane_busy_.begin(), lane_busy_.begin() + usable);
  std::vector<size_t> use = ChooseLanes(busy, most, spread);
  for (size_t l : use) ++lane_busy_[l];
  return use;
}

void UcxEngine::GiveBackLanes(const std::vector<size_t>& lanes) {
  absl::MutexLock lock(&lane_mu_);
  for (size_t l : lanes) --lane_busy_[l];
}

absl::Status UcxEngine::MoveOverLanes(bool push, const RemoteRange& remote, const UcxOffer& offer,
                                      char* local, uint64_t length, MoveControl& control,
                                      const std::vector<size_t>& use) {
  const size_t shares = use.size();
  auto transport = [this](size_t lane) { return lane == 0 ? transport_ : lanes_.lanes[lane - 1]; };
  auto range = [&](size_t lane, uint64_t offset) {
    RemoteRange r = remote;
    if (lane > 0) {
      r.worker_address = offer.lanes[lane - 1].worker_address;
      r.rkey = offer.lanes[lane - 1].rkey;
    }
    r.address += offset;
    return r;
  };
  auto rma = [&](size_t lane, uint64_t offset, uint64_t n,
                 const std::function<bool(uint64_t)>& progress) {
    UcxTransport* t = transport(lane);
    return push ? t->Put(range(lane, offset), local + offset, n, progress)
                : t->Get(range(lane, offset), local + offset, n, progress);
  };
  if (shares == 1) {
    absl::Status st = rma(use[0], 0, length, control.Reporter());
    if (st.ok() && use[0] > 0) lane_bytes_ += length;
    return st;
  }
  // Contiguous shares of whole pages, each on its lane and a thread of its own; this
  // thread sums their progress for the scheduler and carries a cancel to them. A share
  // that fails stops the others.
  struct Share {
    uint64_t offset = 0;
    uint64_t length = 0;
    std::atomic<uint64_t> done{0};
    absl::Status status;
  };
  std::vector<Share> share(shares);
  const uint64_t each = (length / shares + 4095) & ~uint64_t{4095};
  for (size_t i = 0; i < shares; ++i) {
    share[i].offset = std::min<uint64_t>(i * each, length);
    share[i].length =
        i + 1 == shares ? length - share[i].offset : std::min(each, length - share[i].offset);
  }
  std::atomic<bool> stop{false};
  std::atomic<size_t> running{shares};
  absl::Notification finished;
  std::vector<std::thread> threads;
  threads.reserve(shares);
  for (size_t i = 0; i < shares; ++i) {
    threads.emplace_back([&, i] {
      Share& s = share[i];
      s.status = rma(use[i], s.offset, s.length, [&s, &stop](uint64_t done) {
        s.done = done;
        return !stop.load();
      });
      if (!s.status.ok()) stop = true;
      if (running.fetch_sub(1) == 1) finished.Notify();
    });
  }
  auto report = [&] {
    uint64_t done = 0;
    for (const Share& s : share) done += s.done.load();
    control.Progress(done);
    if (control.cancelled()) stop = true;
  };
  while (!finished.WaitForNotificationWithTimeout(absl::Milliseconds(2))) report();
  for (std::thread& t : threads) t.join();
  absl::Status cancelled;
  for (size_t i = 0; i < shares; ++i) {
    const Share& s = share[i];
    if (s.status.ok()) {
      if (use[i] > 0) lane_bytes_ += s.length;
    } else if (absl::IsCancelled(s.status)) {
      cancelled = s.status;
    } else {
      return s.status;  // The others stopped because of it.
    }
  }
  if (cancelled.ok()) report();
  return cancelled;
}

absl::Status UcxEngine::MoveRemoteStaged(const Endpoint& src, const Endpoint& dst,
                                         const RemoteHold& hold, const UcxOffer& offer,
                                         uint64_t length, MoveControl& control,
                                         const std::function<bool(uint64_t)>& progress) {
  const bool push = dst.remote != nullptr;
  const Endpoint& local = push ? src : dst;
  const UcxOffer::Stage& offered = *offer.stage;
  const uint64_t chunk = offered.slot_size;
  StageTrace trace(length);
  auto sides = TakeStageSides(local, hold, offered, control);
  if (!sides.ok()) return sides.status();
  const std::vector<uint64_t>& stage_slots = sides->far;
  const size_t slots = stage_slots.size();
  std::optional<BounceRing>& ours = sides->ours;
  // The move goes in pieces, several to a slot when it is small (StagePiece), through
  // three steps: in a push our GPU copy into our slot, the wire into the peer's slot, and
  // the peer's copy onto its GPU (a call); in a pull the peer's copy into its slot (a
  // call), the wire, and ours onto our GPU. The calls are round trips: several run at
  // once. Two pieces are on the wire at once too (same-host direct copies share memory
  // bandwidth with both DMA steps, and one at a time left it idle). A push's GPU copies run
  // two at once and its calls four, so a call's round trip hides behind the others'
  // copies; pulls gained nothing from more calls. Figures: docs/performance/tuning.md.
  const uint64_t piece = StagePiece(length, chunk);
  const uint64_t per_slot = std::max<uint64_t>(chunk / piece, 1);
  const size_t far_slots = slots * per_slot;
  const size_t near_slots = ours.has_value() ? ours->slots() * per_slot : far_slots;
  auto far = [&](size_t i) {
    RemoteRange r;
    r.peer_key = hold.peer().Key();
    r.worker_address = offer.worker_address;
    r.rkey = offered.rkey;
    r.address = stage_slots[i / per_slot] + (i % per_slot) * piece;
    r.peer_error_handling = !hold.same_host;
    r.bounce = true;
    r.staged = true;
    return r;
  };
  auto stage = [&](size_t i, uint64_t offset, uint64_t n, bool to_range) {
    return StageChunk(*remote_, hold, static_cast<uint32_t>(i / per_slot), (i % per_slot) * piece,
                      offset, n, to_range);
  };
  // Our slot piece, or (host memory here) the bytes themselves.
  auto near = [&](size_t i, uint64_t offset) {
    return ours.has_value() ? ours->slot(i / per_slot) + (i % per_slot) * piece
                            : local.data + offset;
  };
  trace.Mark(0, "slots");  // Ours and the peer's taken.
  ThreeSteps steps;
  if (push) {
    steps.fill = [&](size_t a, size_t, uint64_t offset, uint64_t n) -> absl::Status {
      if (!ours.has_value()) return absl::OkStatus();
      return trace.Marked(
          offset, "d2h",
          gpu_->Copy(near(a, offset), kHostDevice, src.data + offset, src.device, n, n, nullptr));
    };
    steps.carry = [&](size_t a, size_t b, uint64_t offset, uint64_t n) {
      return trace.Marked(offset, "put", transport_->Put(far(b), near(a, offset), n, nullptr));
    };
    steps.drain = [&](size_t, size_t b, uint64_t offset, uint64_t n) {
      return trace.Marked(offset, "h2d", stage(b, offset, n, /*to_range=*/true));
    };
    steps.fill_threads = 2;
    steps.carry_threads = kWireThreads;
    steps.drain_threads = 4;
    return RunThreeSteps(length, piece, near_slots, far_slots, steps, progress);
  }
  steps.fill = [&](size_t a, size_t, uint64_t offset, uint64_t n) {
    return trace.Marked(offset, "d2h", stage(a, offset, n, /*to_range=*/false));
  };
  steps.carry = [&](size_t a, size_t b, uint64_t offset, uint64_t n) {
    return trace.Marked(offset, "get", transport_->Get(far(a), near(b, offset), n, nullptr));
  };
  steps.drain = [&](size_t, size_t b, uint64_t offset, uint64_t n) -> absl::Status {
    if (!ours.has_value()) return absl::OkStatus();
    return trace.Marked(
        offset, "h2d",
        gpu_->Copy(dst.data + offset, dst.device, near(b, offset), kHostDevice, n, n, nullptr));
  };
  steps.fill_threads = 2;
  steps.carry_threads = kWireThreads;
  return RunThreeSteps(length, piece, far_slots, near_slots, steps, progress);
}

}  // namespace gpumove
