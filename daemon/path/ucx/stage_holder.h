// The holding side of the staging pipeline: a node whose ranges a peer's UCX cannot reach
// (device memory and a UCX that is not CUDA-aware; every range with --ucx_force_staging)
// holds them with a ring of its own pinned bounce slots, which the runner puts into or
// gets from, and copies each piece between a slot and the range when told (StageChunk).
#ifndef GPUMOVE_DAEMON_PATH_STAGE_HOLDER_H_
#define GPUMOVE_DAEMON_PATH_STAGE_HOLDER_H_

#include <atomic>
#include <optional>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "daemon/path/ucx/ucx_hello.pb.h"
#include "daemon/peer/holds.h"
#include "daemon/peer/path_holder.h"
#include "daemon/gpu/gpu.h"
#include "daemon/staging/staging.h"

namespace gpumove {

// Which ranges this node stages for peers, and with what.
struct StageHolderOptions {
  bool device = false;  // Device memory: this node's UCX cannot take it.
  bool all = false;     // Every range (to exercise the protocol without a GPU).
  GpuRuntime* gpu = nullptr;
  Pool* pinned = nullptr;
  StagingOptions staging;
};

// A staged hold's bounce ring, taken with the hold or, when the pinned pool was busy
// then, when the move runs (TakeRing).
class StagePart : public HoldPart {
 public:
  // `slot_size`: the size its slots have or will have.
  StagePart(std::optional<BounceRing> ring, uint64_t slot_size)
      : ring_(std::move(ring)), slot_size_(slot_size) {}
  uint64_t slot_size() const { return slot_size_; }
  // The ring, once taken (it is taken once and kept until the hold ends).
  const BounceRing* ring() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class StageHolder;
  mutable absl::Mutex mu_;
  std::optional<BounceRing> ring_ ABSL_GUARDED_BY(mu_);
  const uint64_t slot_size_;
};

class StageHolder : public PathHolder {
 public:
  // `self` (this node's UCX details: the pool the slots are in) and the options' gpu and
  // pool must outlive this.
  StageHolder(const peer::v1::UcxDetails* self, StageHolderOptions options)
      : self_(self), options_(options) {}

  // Bounce slots only serve UCX moves that stage here: not a move that asked for another
  // path, nor one between GPUs of two daemons on this host (AUTO takes CUDA_IPC then). A
  // pinned pool that is big enough but busy (other holds' rings) gives a hold whose slots
  // are taken later; one too small for a ring refuses the hold (RESOURCE_EXHAUSTED).
  absl::StatusOr<std::unique_ptr<HoldPart>> Offer(
      const HoldContext& context, const BufferUse& range,
      peer::v1::PrepareRemoteResponse* response) override;

  // A bounce ring's slots (addresses in this process) and their size, as a peer is told.
  struct Slots {
    std::vector<char*> slots;
    uint64_t slot_size = 0;
  };
  // The bounce ring of a staged hold, taken now if it was left for later. Does not wait:
  // RESOURCE_EXHAUSTED while the pool has no room. NOT_FOUND: no such hold;
  // FAILED_PRECONDITION: the range is not staged.
  absl::StatusOr<Slots> TakeRing(const HoldTable& holds, const std::string& from_node,
                                 const std::string& transfer_id);
  // One piece of a staged move between bounce slot `slot` (from `slot_offset` in it) and
  // the held range. The hold (its range and ring) lives until the copy ends even if it is
  // ended meanwhile (a runner never does; a faulty or hostile peer may).
  absl::Status StageChunk(const HoldTable& holds, const std::string& from_node,
                          const std::string& transfer_id, uint32_t slot, uint64_t slot_offset,
                          uint64_t offset, uint64_t length, bool to_range);
  // A round of a vectored staged move: `pieces` of the held range ({offset in the range,
  // length}), packed one after another in slot `slot` from `slot_offset`, copied between
  // the two in one gather or scatter copy. INVALID_ARGUMENT for pieces outside the range
  // or the slot, or more than kMaxStagePieces.
  absl::Status StagePieces(const HoldTable& holds, const std::string& from_node,
                           const std::string& transfer_id, uint32_t slot, uint64_t slot_offset,
                           const std::vector<std::pair<uint64_t, uint64_t>>& pieces,
                           bool to_range);
  static constexpr size_t kMaxStagePieces = 65536;
  // Holds of staged ranges made without a ring since start (the pool was busy).
  uint64_t deferred() const { return deferred_.load(); }

 private:
  bool Stages(const HoldContext& context, const BufferUse& range) const;

  const peer::v1::UcxDetails* const self_;
  const StageHolderOptions options_;
  std::atomic<uint64_t> deferred_{0};
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_PATH_STAGE_HOLDER_H_
