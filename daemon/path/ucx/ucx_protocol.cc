#include "daemon/path/ucx/ucx_protocol.h"

#include <memory>

#include "daemon/peer/kinds.h"
#include "daemon/peer/piece_list.h"
#include "daemon/path/ucx/ucx_hello.h"

namespace gpumove {

void UcxCodec::DecodeOffer(const PeerView& peer, const RemoteAsk& ask,
                           const peer::v1::PrepareRemoteResponse& response,
                           RemoteHold* hold) const {
  const peer::v1::UcxDetails* found = UcxDetailsOf(peer);
  // The holder (or this node) has no UCX engine.
  if (found == nullptr || found->worker_address().empty()) return;
  const peer::v1::UcxDetails& holder = *found;
  auto offer = std::make_shared<UcxOffer>();
  offer->worker_address = holder.worker_address();
  const int pool = response.has_ucx() ? response.ucx().pool_index() : -1;
  if (pool >= 0 && pool < holder.pools_size()) {
    offer->rkey = holder.pools(pool).rkey();
    for (const peer::v1::UcxLane& lane : holder.lanes()) {
      if (pool >= lane.rkeys_size()) break;
      offer->lanes.push_back({lane.worker_address(), lane.rkeys(pool)});
    }
  }
  if (response.has_stage() && (response.stage().slots_size() > 0 || response.stage().later())) {
    const peer::v1::StageOffer& s = response.stage();
    UcxOffer::Stage& stage = offer->stage.emplace();
    stage.slots.assign(s.slots().begin(), s.slots().end());
    stage.slot_size = s.slot_size();
    stage.later = s.later() && s.slots().empty();
    if (s.pool_index() >= 0 && s.pool_index() < holder.pools_size()) {
      stage.rkey = holder.pools(s.pool_index()).rkey();
    }
  }
  hold->offers.push_back(std::move(offer));
}

absl::StatusOr<std::unique_ptr<HoldPart>> UcxHolder::Offer(
    const HoldContext& context, const BufferUse& range, peer::v1::PrepareRemoteResponse* response) {
  // A client's lent memory, or a buffer's own allocation, lies outside every registered
  // pool: a pool's key must not be offered for it (the stage holder offers bounce slots).
  if (range.outside_pools()) return nullptr;
  OfferUcx(*self_, range.kind(), range.device(), response);
  return nullptr;
}

void OfferUcx(const peer::v1::UcxDetails& self, MemoryKind kind, int device,
              peer::v1::PrepareRemoteResponse* response) {
  for (int i = 0; i < self.pools_size(); ++i) {
    const peer::v1::RegisteredPool& p = self.pools(i);
    if (p.kind() == ToProto(kind) && p.device() == device) {
      response->mutable_ucx()->set_pool_index(i);
    }
  }
}

void OfferStage(const peer::v1::UcxDetails& self, const std::vector<char*>& slots,
                uint64_t slot_size, bool later, peer::v1::PrepareRemoteResponse* response) {
  peer::v1::StageOffer* stage = response->mutable_stage();
  for (char* slot : slots) stage->add_slots(reinterpret_cast<uint64_t>(slot));
  stage->set_slot_size(slot_size);
  stage->set_later(later);
  stage->set_pool_index(-1);
  for (int i = 0; i < self.pools_size(); ++i) {
    if (self.pools(i).kind() == v1::PINNED_HOST) stage->set_pool_index(i);
  }
}

absl::StatusOr<StageSlots> TakeStageSlots(ClusterRemoteRanges& remote, const RemoteHold& hold) {
  peer::v1::TakeStageSlotsRequest request;
  request.set_transfer_id(hold.transfer_id);
  peer::v1::TakeStageSlotsResponse response;
  absl::Status st = remote.CallPath(hold, kUcxCalls, kTakeStageSlotsCall, request, &response);
  if (!st.ok()) return st;
  return StageSlots{{response.stage_slots().begin(), response.stage_slots().end()},
                    response.stage_slot_size()};
}

absl::Status StageChunk(ClusterRemoteRanges& remote, const RemoteHold& hold, uint32_t slot,
                        uint64_t slot_offset, uint64_t offset, uint64_t length, bool to_range) {
  peer::v1::StageChunkRequest request;
  request.set_transfer_id(hold.transfer_id);
  request.set_slot(slot);
  request.set_slot_offset(slot_offset);
  request.set_offset(offset);
  request.set_length(length);
  request.set_to_range(to_range);
  peer::v1::StageChunkResponse response;
  return remote.CallPath(hold, kUcxCalls, kStageChunkCall, request, &response);
}

absl::Status StagePieces(ClusterRemoteRanges& remote, const RemoteHold& hold, uint32_t slot,
                         uint64_t slot_offset,
                         const std::vector<std::pair<uint64_t, uint64_t>>& pieces, bool to_range) {
  peer::v1::StageChunkRequest request;
  request.set_transfer_id(hold.transfer_id);
  request.set_slot(slot);
  request.set_slot_offset(slot_offset);
  request.set_to_range(to_range);
  const std::pair<uint64_t, uint64_t>* p = pieces.data();
  EncodePieces(
      pieces.size(), [p](size_t i) { return p[i].first; }, [p](size_t i) { return p[i].second; },
      request.mutable_pieces());
  peer::v1::StageChunkResponse response;
  return remote.CallPath(hold, kUcxCalls, kStageChunkCall, request, &response);
}

}  // namespace gpumove
