#include "daemon/path/ucx/ucx_engine.h"

#include <algorithm>
#include <optional>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "daemon/common/log.h"
#include "daemon/common/status_macros.h"

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

// A range for copies piece by piece with a peer on this host: on every direct copy thread
// (small pieces gain from them all; whole chunks of a staged move keep their share of
// them; docs/performance/tuning.md, "Vectored moves").
RemoteRange ForPieceCopies(RemoteRange r) {
  r.staged = false;
  return r;
}

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
    return MoveRemoteStaged(src, dst, hold, *offer, pieces.total, control, control.Reporter(),
                            &pieces);
  }
  RemoteRange remote;
  remote.peer_key = hold.peer().Key();
  remote.worker_address = offer->worker_address;
  remote.rkey = offer->rkey;
  remote.address = hold.address;
  remote.peer_error_handling = !hold.same_host;
  remote.device =
      (push ? src : dst).kind == MemoryKind::kDevice || hold.kind == MemoryKind::kDevice;
  if (control.cancelled()) return absl::CancelledError("cancelled");
  GPUMOVE_RETURN_IF_ERROR(Carry(hold, remote, /*direct=*/false, control));
  VLOG(2) << "UCX move of " << pieces.list.size() << " pieces (" << pieces.total << " bytes) with "
          << hold.node;
  const Endpoint& local = push ? src : dst;
  if (local.kind == MemoryKind::kDevice && !transport_->cuda_aware()) {
    remote.device = hold.kind == MemoryKind::kDevice;
    return MoveLocalStaged(push, remote, src, dst, pieces.total, control, control.Reporter(),
                           &pieces);
  }
  return push ? transport_->PutPieces(remote, src.data, pieces, control.Reporter())
              : transport_->GetPieces(remote, dst.data, pieces, control.Reporter());
}

absl::Status UcxEngine::Carry(const RemoteHold& hold, const RemoteRange& remote, bool direct,
                              MoveControl& control) {
  if (direct) {
    control.Carried("direct copy");  // Mapped memory on this host, no UCX transport.
    return absl::OkStatus();
  }
  auto route = transport_->Route(remote);
  if (!route.ok()) return absl::OkStatus();  // The move fails on its own, saying why.
  std::string carriers = route->Summary();
  if (!hold.same_host) {
    if (rdma_here_ && !route->Carries("rdma")) fallbacks_.fetch_add(1);
    // The move's own requirement first, then the node's.
    const bool own = !control.required_transport().empty();
    const std::string& need = own ? control.required_transport() : require_;
    if (!need.empty() && !route->Carries(need)) {
      refused_.fetch_add(1);
      return absl::FailedPreconditionError(absl::StrCat(
          "UCX reaches node ", hold.node, " over ", carriers.empty() ? "nothing" : carriers,
          ", not ", need,
          own ? " as the move's require_transport asks" : " as --ucx_require asks",
          " (see UCX_TLS and UCX_NET_DEVICES)"));
    }
  }
  control.Carried(std::move(carriers));
  return absl::OkStatus();
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
  GPUMOVE_RETURN_IF_ERROR(Carry(hold, remote, direct, control));
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
      const ShareLanes use = TakeLanes(remote.peer_key, lanes + 1, most, spread);
      absl::Status st = MoveOverLanes(push, remote, *offer, local.data, length, control, use);
      GiveBackLanes(use.use);
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
                                        const std::function<bool(uint64_t)>& progress,
                                        const Segments* pieces) {
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
  if (pieces != nullptr) {
    // The pieces' bytes one after another, through the same ring: a chunk of them is
    // gathered into a slot by the GPU and put to its places there piece by piece (a pull:
    // got piece by piece into a slot and scattered by the GPU).
    const PackedPieces packed(*pieces);
    const BounceRing& r = *ring;
    auto gpu_side = [&](size_t slot, uint64_t offset, uint64_t n) {
      std::vector<Segment> near;
      near.reserve(packed.Count(offset, n));
      packed.ForEach(offset, n, [&](uint64_t s, uint64_t d, uint64_t len, uint64_t at) {
        near.push_back(push ? Segment{s, at, len} : Segment{at, d, len});
      });
      return push ? gpu_->CopyPieces(r.slot(slot), kHostDevice, src.data, src.device, near.data(),
                                     near.size(), n, nullptr)
                  : gpu_->CopyPieces(dst.data, dst.device, r.slot(slot), kHostDevice, near.data(),
                                     near.size(), n, nullptr);
    };
    auto wire_side = [&](size_t slot, uint64_t offset, uint64_t n) {
      Segments far;
      far.total = n;
      far.list.reserve(packed.Count(offset, n));
      packed.ForEach(offset, n, [&](uint64_t s, uint64_t d, uint64_t len, uint64_t at) {
        far.list.push_back(push ? Segment{at, d, len} : Segment{s, at, len});
      });
      const RemoteRange range = ForPieceCopies(at(0));
      return push ? transport_->PutPieces(range, r.slot(slot), far, nullptr)
                  : transport_->GetPieces(range, r.slot(slot), far, nullptr);
    };
    return push ? RunStaged(length, r.chunk(), r.slots(), gpu_side, wire_side, progress,
                            /*consumers=*/2)
                : RunStaged(length, r.chunk(), r.slots(), wire_side, gpu_side, progress);
  }
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

absl::Status UcxEngine::MoveRemoteStaged(const Endpoint& src, const Endpoint& dst,
                                         const RemoteHold& hold, const UcxOffer& offer,
                                         uint64_t length, MoveControl& control,
                                         const std::function<bool(uint64_t)>& progress,
                                         const Segments* pieces) {
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
  steps.fill_threads = 2;
  steps.carry_threads = kWireThreads;
  if (pieces != nullptr) {
    // A vectored move: the pieces' bytes one after another (PackedPieces) through the same
    // pipeline, each window of them gathered into a slot piece and scattered out of it
    // by a GPU copy or, in host memory here, put or got piece by piece; the peer's copy
    // between its slot and its range is one gather or scatter a window (StagePieces).
    const auto packed = std::make_shared<PackedPieces>(*pieces);
    // This side's parts of window [offset, offset + n): {here, slot, length} in the
    // direction of the move.
    auto here = [packed, push](uint64_t offset, uint64_t n) {
      Segments s;
      s.total = n;
      s.list.reserve(packed->Count(offset, n));
      packed->ForEach(offset, n, [&](uint64_t src, uint64_t dst, uint64_t len, uint64_t at) {
        s.list.push_back(push ? Segment{src, at, len} : Segment{at, dst, len});
      });
      return s;
    };
    // The peer's copy of window [offset, offset + n) in slot piece i, in rounds of at most
    // kRoundPieces pieces.
    auto theirs = [&, packed](size_t i, uint64_t offset, uint64_t n) -> absl::Status {
      std::vector<std::pair<uint64_t, uint64_t>> round;
      uint64_t round_at = 0;
      absl::Status st;
      auto flush = [&] {
        if (round.empty() || !st.ok()) return;
        st = StagePieces(*remote_, hold, static_cast<uint32_t>(i / per_slot),
                         (i % per_slot) * piece + round_at, round, /*to_range=*/push);
        round.clear();
      };
      packed->ForEach(offset, n, [&](uint64_t src, uint64_t dst, uint64_t len, uint64_t at) {
        if (round.size() == kRoundPieces) flush();
        if (round.empty()) round_at = at;
        round.emplace_back(push ? dst : src, len);
      });
      flush();
      return st;
    };
    if (push) {
      steps.fill = [&](size_t a, size_t, uint64_t offset, uint64_t n) -> absl::Status {
        if (!ours.has_value()) return absl::OkStatus();
        const Segments s = here(offset, n);
        return trace.Marked(offset, "gather",
                            gpu_->CopyPieces(near(a, offset), kHostDevice, src.data, src.device,
                                             s.list.data(), s.list.size(), n, nullptr));
      };
      steps.carry = [&](size_t a, size_t b, uint64_t offset, uint64_t n) {
        return trace.Marked(offset, "put",
                            ours.has_value()
                                ? transport_->Put(far(b), near(a, offset), n, nullptr)
                                : transport_->PutPieces(ForPieceCopies(far(b)), local.data,
                                                        here(offset, n), nullptr));
      };
      steps.drain = [&](size_t, size_t b, uint64_t offset, uint64_t n) {
        return trace.Marked(offset, "scatter", theirs(b, offset, n));
      };
      steps.drain_threads = 4;
      return RunThreeSteps(length, piece, near_slots, far_slots, steps, progress);
    }
    steps.fill = [&](size_t a, size_t, uint64_t offset, uint64_t n) {
      return trace.Marked(offset, "gather", theirs(a, offset, n));
    };
    steps.carry = [&](size_t a, size_t b, uint64_t offset, uint64_t n) {
      return trace.Marked(offset, "get",
                          ours.has_value()
                              ? transport_->Get(far(a), near(b, offset), n, nullptr)
                              : transport_->GetPieces(ForPieceCopies(far(a)), local.data,
                                                      here(offset, n), nullptr));
    };
    // Our scatters two at once, as a push's gathers: each waits for its copy to the GPU
    // before its kernel, and for the kernel.
    steps.drain_threads = 2;
    steps.drain = [&](size_t, size_t b, uint64_t offset, uint64_t n) -> absl::Status {
      if (!ours.has_value()) return absl::OkStatus();
      trace.Mark(offset, "scatter<");  // Begun.
      const Segments s = here(offset, n);
      trace.Mark(offset, "scatter=");  // Its list built.
      return trace.Marked(offset, "scatter",
                          gpu_->CopyPieces(dst.data, dst.device, near(b, offset), kHostDevice,
                                           s.list.data(), s.list.size(), n, nullptr));
    };
    return RunThreeSteps(length, piece, far_slots, near_slots, steps, progress);
  }
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
  return RunThreeSteps(length, piece, far_slots, near_slots, steps, progress);
}

}  // namespace gpumove
