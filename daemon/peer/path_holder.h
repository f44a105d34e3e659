// The holding side of a path: what a node does when another node's move holds one of its
// ranges. Each path that needs a say adds its offer to the hold's answer and may keep a
// part of its own with the hold (bounce slots, an MPI half), which ends with it. The
// hold table and the peer handler call every holder and read none of their parts.
#ifndef GPUMOVE_DAEMON_PEER_PATH_HOLDER_H_
#define GPUMOVE_DAEMON_PEER_PATH_HOLDER_H_

#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/core/buffer_registry.h"
#include "proto/gpumove/peer/v1/peer.pb.h"

namespace gpumove {

// One path's state kept with a hold; destroyed with the hold, before its range is let go.
class HoldPart {
 public:
  virtual ~HoldPart() = default;
  // The hold ends; `runner_ok`: the runner says the move succeeded. An error (when the
  // runner said OK) is the holder's answer: the bytes did not all land. May block.
  virtual absl::Status End(bool runner_ok) { return absl::OkStatus(); }
  // Whether End may block (the hold's end is then not answered on a thread that must not
  // wait).
  virtual bool EndBlocks() const { return false; }
};

// What a new hold is asked for, as every holder sees it.
struct HoldContext {
  const peer::v1::PrepareRemoteRequest& request;
  // Whether the runner runs on this machine (looked up when asked).
  std::function<bool()> runner_same_host;
};

class PathHolder {
 public:
  virtual ~PathHolder() = default;
  // A new hold of `range` (in use, not yet in the table): this path's offer in `response`
  // and the part it keeps with the hold (null: none). An error refuses the hold.
  virtual absl::StatusOr<std::unique_ptr<HoldPart>> Offer(
      const HoldContext& context, const BufferUse& range,
      peer::v1::PrepareRemoteResponse* response) = 0;
  // Whether Offer may block for `request`.
  virtual bool OfferBlocks(const peer::v1::PrepareRemoteRequest& request) const { return false; }
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_PEER_PATH_HOLDER_H_
