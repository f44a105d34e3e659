// Path UCX's part of the hold handshake: what a holder offers (the registered pool that
// holds the range, or bounce slots when it stages the range) and what the runner makes of
// it (the remote keys and worker addresses its RMA needs); and the calls a staged move
// makes to the node that stages its other end.
#ifndef GPUMOVE_DAEMON_PATH_UCX_PROTOCOL_H_
#define GPUMOVE_DAEMON_PATH_UCX_PROTOCOL_H_

#include <optional>
#include <string>
#include <vector>

#include "daemon/cluster/cluster.h"
#include "daemon/memory/pool.h"
#include "daemon/path/ucx/ucx_hello.pb.h"
#include "daemon/peer/path_codec.h"
#include "daemon/peer/path_holder.h"
#include "daemon/peer/remote_ranges.h"

namespace gpumove {

// Set in a UcxOffer when the holder stages the range: its bounce slots (addresses in its
// space), their size and the packed rkey of the pool holding them. `later`: the slots are
// to be taken when the move runs (TakeStageSlots), the holder's pinned pool being busy
// when it was held; `slots` is then empty. (Outside UcxOffer: a nested struct with member
// initializers is not yet default-constructible where std::optional of it is declared.)
struct UcxStageOffer {
  std::vector<uint64_t> slots;
  uint64_t slot_size = 0;
  std::string rkey;
  bool later = false;
};

// How the runner reaches a held range over UCX.
struct UcxOffer : PathOffer {
  std::string worker_address;
  std::string rkey;  // Empty: the remote pool is not registered with UCX.
  // The holder's extra UCX lanes that reach the range (worker address, packed rkey of its
  // pool in that lane), lane 1 first.
  struct Lane {
    std::string worker_address;
    std::string rkey;
  };
  std::vector<Lane> lanes;
  using Stage = UcxStageOffer;
  std::optional<Stage> stage;
};

class UcxCodec : public PathCodec {
 public:
  // The holder's offer, read against its UCX details (ucx_hello.h: checked once, when its
  // Hello was accepted).
  void DecodeOffer(const PeerView& holder, const RemoteAsk& ask,
                   const peer::v1::PrepareRemoteResponse& response,
                   RemoteHold* hold) const override;
};

// Holding side: offers the registered pool holding each range (its rkey travels in Hello).
class UcxHolder : public PathHolder {
 public:
  // `self` (this node's UCX details: UcxHello::self) must outlive this.
  explicit UcxHolder(const peer::v1::UcxDetails* self) : self_(self) {}
  absl::StatusOr<std::unique_ptr<HoldPart>> Offer(
      const HoldContext& context, const BufferUse& range,
      peer::v1::PrepareRemoteResponse* response) override;

 private:
  const peer::v1::UcxDetails* const self_;
};

// Holding side: the offer for a range of `kind` on `device` held on this node (`self`, its
// UCX details): the registered pool that holds it, when there is one.
void OfferUcx(const peer::v1::UcxDetails& self, MemoryKind kind, int device,
              peer::v1::PrepareRemoteResponse* response);
// Holding side, for a range this node stages: its bounce slots (addresses here), their
// size, and `later` when they are to be taken when the move runs.
void OfferStage(const peer::v1::UcxDetails& self, const std::vector<char*>& slots,
                uint64_t slot_size, bool later, peer::v1::PrepareRemoteResponse* response);

// Path UCX's own peer calls (PathCall), as the staging holder registers them
// (stage_calls.h) and the runner makes them.
inline constexpr char kUcxCalls[] = "ucx";
inline constexpr char kTakeStageSlotsCall[] = "take_stage_slots";  // Answers at once.
inline constexpr char kStageChunkCall[] = "stage_chunk";

// Runner: for a staged hold whose slots are to be taken when the move runs, the holder's
// bounce slots for the move, taken now (addresses in its space, of the offered size).
// RESOURCE_EXHAUSTED while its pinned pool has no room: try again later.
struct StageSlots {
  std::vector<uint64_t> slots;
  uint64_t slot_size = 0;
};
absl::StatusOr<StageSlots> TakeStageSlots(ClusterRemoteRanges& remote, const RemoteHold& hold);
// Runner: has the holder copy one piece between its bounce slot (from `slot_offset` in it)
// and the range (to_range after a put into the slot, else before a get from it).
absl::Status StageChunk(ClusterRemoteRanges& remote, const RemoteHold& hold, uint32_t slot,
                        uint64_t slot_offset, uint64_t offset, uint64_t length, bool to_range);
// Runner: has the holder copy a round of a vectored move, `pieces` of its range ({offset,
// length}) packed in its slot from `slot_offset`, in one gather or scatter copy.
absl::Status StagePieces(ClusterRemoteRanges& remote, const RemoteHold& hold, uint32_t slot,
                         uint64_t slot_offset,
                         const std::vector<std::pair<uint64_t, uint64_t>>& pieces, bool to_range);

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_PATH_UCX_PROTOCOL_H_
