// Path UCX's own peer calls on the holding side, registered as path calls: a staged
// hold's bounce slots taken when the move runs, and each chunk's copy between a slot and
// the range.
#ifndef GPUMOVE_DAEMON_PATH_UCX_STAGE_CALLS_H_
#define GPUMOVE_DAEMON_PATH_UCX_STAGE_CALLS_H_

#include "daemon/path/ucx/stage_holder.h"
#include "daemon/peer/holds.h"
#include "daemon/peer/path_calls.h"

namespace gpumove {

// Registers "ucx" "take_stage_slots" (answered at once) and "stage_chunk", served by
// `holder` over `holds` (both must outlive the calls' serving).
absl::Status RegisterStageCalls(StageHolder* holder, const HoldTable* holds, PathCalls* calls);

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_PATH_UCX_STAGE_CALLS_H_
