// A host move over the network split into contiguous shares, one per lane, run at once —
// with failover inside the move: a share whose lane fails is sent again on a lane that has
// not failed in this move, and the move fails only when no lane is left. Knows nothing of
// UCX (the engine hands it a put-or-get per lane), so that the policy is tested alone.
#ifndef GPUMOVE_DAEMON_PATH_UCX_UCX_SHARES_H_
#define GPUMOVE_DAEMON_PATH_UCX_UCX_SHARES_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace gpumove {

// Moves bytes [offset, offset + n) of the move on `lane`, reporting the bytes of that
// range done so far through `progress` (false: stop, the move is cancelled).
using ShareRma = std::function<absl::Status(size_t lane, uint64_t offset, uint64_t n,
                                            const std::function<bool(uint64_t)>& progress)>;

struct ShareLanes {
  std::vector<size_t> use;    // The lanes the shares start on, one share each (≥ 1).
  std::vector<size_t> spare;  // Lanes a failed share may move to before those in `use`.
};

struct SharesOutcome {
  absl::Status status;
  std::vector<size_t> failed;  // Lanes that failed during the move, in the order they did.
  std::vector<absl::Status> why;  // What each of `failed` failed with.
  // Bytes each lane carried in shares that ended well (lane, bytes).
  std::vector<std::pair<size_t, uint64_t>> carried;
  uint64_t resent = 0;  // Bytes of shares sent again after their lane failed.
};

// Whether a failed share's lane is at fault (so another lane may carry the share): the
// transport's errors are UNAVAILABLE (a broken endpoint, a device gone, no progress). A
// peer that died fails every lane at once, and cheaply: the transports' peer state goes
// down with it. Cancelled and every other error end the move.
bool LaneFault(const absl::Status& st);

// Runs the move of `length` bytes in one contiguous share per lane of `lanes.use` (whole
// pages; the last one takes the rest), the first on this thread and the others on a
// thread each; this thread reports the move's progress, the sum of what the shares did
// (never going back), every `report_every` (false from `progress`: every share stops).
//
// A share whose lane faults is sent again whole, from its first byte (a put completes
// locally before it lands: what a failed lane said was done proves nothing, and puts and
// gets of the same bytes are idempotent), on the lane that has not failed and runs the
// fewest shares now (a spare before a lane of `use` on a tie). At most one try
// per lane a share: a bound of use + spare tries each.
//
// `may_take(lane)`, when given, says whether a failed share may move to `lane` now (the
// engine: the peer was not seen down during the move, and the lane already has an endpoint
// to it, as making one toward an unreachable host can block UCX for minutes).
SharesOutcome RunShares(uint64_t length, const ShareLanes& lanes, const ShareRma& rma,
                        const std::function<bool(uint64_t)>& progress,
                        absl::Duration report_every = absl::Milliseconds(2),
                        const std::function<bool(size_t)>& may_take = nullptr);

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_PATH_UCX_UCX_SHARES_H_
