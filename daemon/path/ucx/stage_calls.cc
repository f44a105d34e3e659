#include "daemon/path/ucx/stage_calls.h"

#include <utility>
#include <vector>

#include "daemon/common/status_macros.h"
#include "daemon/path/ucx/ucx_protocol.h"
#include "daemon/peer/piece_list.h"

namespace gpumove {

absl::Status RegisterStageCalls(StageHolder* holder, const HoldTable* holds, PathCalls* calls) {
  GPUMOVE_RETURN_IF_ERROR(
      (RegisterPathCall<peer::v1::TakeStageSlotsRequest, peer::v1::TakeStageSlotsResponse>(
          calls, kUcxCalls, kTakeStageSlotsCall, /*at_once=*/true,
          [holder, holds](const PathCaller& caller, const peer::v1::TakeStageSlotsRequest& request,
                          peer::v1::TakeStageSlotsResponse* response) {
            auto ring = holder->TakeRing(*holds, caller.node, request.transfer_id());
            if (!ring.ok()) return ring.status();
            for (char* slot : ring->slots) {
              response->add_stage_slots(reinterpret_cast<uint64_t>(slot));
            }
            response->set_stage_slot_size(ring->slot_size);
            return absl::OkStatus();
          })));
  return RegisterPathCall<peer::v1::StageChunkRequest, peer::v1::StageChunkResponse>(
      calls, kUcxCalls, kStageChunkCall, /*at_once=*/false,
      [holder, holds](const PathCaller& caller, const peer::v1::StageChunkRequest& request,
                      peer::v1::StageChunkResponse*) {
        auto listed = PieceListView::Of(request.pieces(), StageHolder::kMaxStagePieces);
        if (!listed.ok()) return listed.status();
        if (listed->empty()) {
          return holder->StageChunk(*holds, caller.node, request.transfer_id(), request.slot(),
                                    request.slot_offset(), request.offset(), request.length(),
                                    request.to_range());
        }
        std::vector<std::pair<uint64_t, uint64_t>> pieces(listed->size());
        for (size_t i = 0; i < listed->size(); ++i) {
          pieces[i] = {listed->offset(i), listed->length(i)};
        }
        return holder->StagePieces(*holds, caller.node, request.transfer_id(), request.slot(),
                                   request.slot_offset(), pieces, request.to_range());
      });
}

}  // namespace gpumove
