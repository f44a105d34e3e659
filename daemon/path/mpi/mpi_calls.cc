#include "daemon/path/mpi/mpi_calls.h"

#include "daemon/common/status_macros.h"
#include "daemon/path/mpi/mpi_protocol.h"

namespace gpumove {

absl::Status RegisterMpiCalls(MpiHolder* holder, const HoldTable* holds, PathCalls* calls) {
  // Neither answers at once: a start posts receives (and may wait for bounce buffers).
  GPUMOVE_RETURN_IF_ERROR((RegisterPathCall<peer::v1::StartMpiRequest, peer::v1::StartMpiResponse>(
      calls, kMpiCalls, kStartMpiCall, /*at_once=*/false,
      [holder, holds](const PathCaller& caller, const peer::v1::StartMpiRequest& request,
                      peer::v1::StartMpiResponse*) {
        return holder->Start(*holds, caller.node, request);
      })));
  return RegisterPathCall<peer::v1::StopMpiRequest, peer::v1::StopMpiResponse>(
      calls, kMpiCalls, kStopMpiCall, /*at_once=*/false,
      [holder, holds](const PathCaller& caller, const peer::v1::StopMpiRequest& request,
                      peer::v1::StopMpiResponse*) {
        return holder->Stop(*holds, caller.node, request);
      });
}

}  // namespace gpumove
