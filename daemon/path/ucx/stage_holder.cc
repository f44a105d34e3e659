#include "daemon/path/ucx/stage_holder.h"

#include "daemon/path/ucx/ucx_protocol.h"

namespace gpumove {

const BounceRing* StagePart::ring() const {
  absl::MutexLock lock(&mu_);
  return ring_.has_value() ? &*ring_ : nullptr;
}

namespace {

StageHolder::Slots SlotsOf(const BounceRing& ring) {
  StageHolder::Slots out;
  out.slot_size = ring.chunk();
  for (size_t i = 0; i < ring.slots(); ++i) out.slots.push_back(ring.slot(i));
  return out;
}

}  // namespace

bool StageHolder::Stages(const HoldContext& context, const BufferUse& range) const {
  const peer::v1::PrepareRemoteRequest& r = context.request;
  if (r.path() != v1::PATH_AUTO && r.path() != v1::UCX) return false;
  // Device memory is staged when UCX cannot take it, and so is memory lent by a client
  // (Import) or in a buffer's own allocation (exportable): no pool's UCX key covers it.
  const bool device = range.kind() == MemoryKind::kDevice;
  if (!options_.all && !(device && (options_.device || range.outside_pools()))) return false;
  // GPU to GPU between daemons on this host goes over CUDA IPC when AUTO.
  return !(r.path() == v1::PATH_AUTO && r.runner_device() && context.runner_same_host &&
           context.runner_same_host());
}

absl::StatusOr<std::unique_ptr<HoldPart>> StageHolder::Offer(
    const HoldContext& context, const BufferUse& range, peer::v1::PrepareRemoteResponse* response) {
  if (!Stages(context, range)) return nullptr;
  const StagingOptions sized = SizedFor(options_.staging, range.length());
  auto ring = BounceRing::Take(options_.pinned, sized);
  std::unique_ptr<StagePart> part;
  if (ring.ok()) {
    part = std::make_unique<StagePart>(*std::move(ring), sized.chunk);
    OfferStage(*self_, SlotsOf(*part->ring()).slots, sized.chunk, false, response);
  } else if (absl::IsResourceExhausted(ring.status()) &&
             BounceRing::CouldFit(options_.pinned, sized)) {
    // Busy, not too small: the runner takes the ring when the move runs (holds for a
    // whole Submit are made at once, but its moves run a few at a time).
    part = std::make_unique<StagePart>(std::nullopt, sized.chunk);
    OfferStage(*self_, {}, sized.chunk, true, response);
    ++deferred_;
  } else {
    return ring.status();
  }
  return part;
}

absl::StatusOr<StageHolder::Slots> StageHolder::TakeRing(const HoldTable& holds,
                                                         const std::string& from_node,
                                                         const std::string& transfer_id) {
  auto hold = holds.Find(from_node, transfer_id);
  if (!hold.ok()) return hold.status();
  StagePart* part = hold->part<StagePart>();
  if (part == nullptr) return absl::FailedPreconditionError("this range is not staged");
  absl::MutexLock lock(&part->mu_);
  if (!part->ring_.has_value()) {
    auto ring =
        BounceRing::Take(options_.pinned, SizedFor(options_.staging, hold->range().length()));
    if (!ring.ok()) return ring.status();
    part->ring_.emplace(*std::move(ring));
  }
  return SlotsOf(*part->ring_);
}

absl::Status StageHolder::StageChunk(const HoldTable& holds, const std::string& from_node,
                                     const std::string& transfer_id, uint32_t slot,
                                     uint64_t slot_offset, uint64_t offset, uint64_t length,
                                     bool to_range) {
  auto hold = holds.Find(from_node, transfer_id);  // Kept until the copy ends.
  if (!hold.ok()) return hold.status();
  const StagePart* part = hold->part<StagePart>();
  if (part == nullptr) return absl::FailedPreconditionError("this range is not staged");
  const BounceRing* ring = part->ring();  // Set once, kept with the hold.
  if (ring == nullptr) {
    return absl::FailedPreconditionError("no bounce slots taken for this range yet");
  }
  const BufferUse& use = hold->range();
  uint64_t end = 0;
  if (slot >= ring->slots() || slot_offset > ring->chunk() ||
      length > ring->chunk() - slot_offset || __builtin_add_overflow(offset, length, &end) ||
      end > use.length()) {
    return absl::InvalidArgumentError("stage chunk outside the slot or the held range");
  }
  char* bounce = ring->slot(slot) + slot_offset;
  const int device = use.kind() == MemoryKind::kDevice ? use.device() : kHostDevice;
  char* data = use.data() + offset;
  return to_range ? options_.gpu->Copy(data, device, bounce, kHostDevice, length, length, nullptr)
                  : options_.gpu->Copy(bounce, kHostDevice, data, device, length, length, nullptr);
}

absl::Status StageHolder::StagePieces(const HoldTable& holds, const std::string& from_node,
                                      const std::string& transfer_id, uint32_t slot,
                                      uint64_t slot_offset,
                                      const std::vector<std::pair<uint64_t, uint64_t>>& pieces,
                                      bool to_range) {
  if (pieces.empty() || pieces.size() > kMaxStagePieces) {
    return absl::InvalidArgumentError(
        absl::StrCat(pieces.size(), " pieces in one stage call; 1 to ", kMaxStagePieces));
  }
  auto hold = holds.Find(from_node, transfer_id);  // Kept until the copy ends.
  if (!hold.ok()) return hold.status();
  const StagePart* part = hold->part<StagePart>();
  if (part == nullptr) return absl::FailedPreconditionError("this range is not staged");
  const BounceRing* ring = part->ring();
  if (ring == nullptr) {
    return absl::FailedPreconditionError("no bounce slots taken for this range yet");
  }
  const BufferUse& use = hold->range();
  if (slot >= ring->slots() || slot_offset > ring->chunk()) {
    return absl::InvalidArgumentError("stage pieces outside the slot");
  }
  // Slot side packed from 0 (the slot pointer below starts at slot_offset).
  std::vector<Segment> list;
  list.reserve(pieces.size());
  uint64_t packed = 0;
  for (const auto& [offset, length] : pieces) {
    uint64_t end = 0;
    if (length == 0 || __builtin_add_overflow(offset, length, &end) || end > use.length() ||
        length > ring->chunk() - slot_offset - packed) {
      return absl::InvalidArgumentError("a stage piece lies outside the slot or the held range");
    }
    list.push_back(to_range ? Segment{packed, offset, length} : Segment{offset, packed, length});
    packed += length;
  }
  char* bounce = ring->slot(slot) + slot_offset;
  const int device = use.kind() == MemoryKind::kDevice ? use.device() : kHostDevice;
  return to_range ? options_.gpu->CopyPieces(use.data(), device, bounce, kHostDevice, list.data(),
                                             list.size(), packed, nullptr)
                  : options_.gpu->CopyPieces(bounce, kHostDevice, use.data(), device, list.data(),
                                             list.size(), packed, nullptr);
}

}  // namespace gpumove
