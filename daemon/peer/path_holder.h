// The holding side of a path: what a node does when another node's move holds one of its
// ranges. Each path that needs a say adds its offer to the hold's answer and may keep a
// part of its own with the hold (bounce slots, an MPI half), which ends with it. The
// hold table and the peer handler call every holder and read none of their parts.
#ifndef GPUMOVE_DAEMON_PEER_PATH_HOLDER_H_
#define GPUMOVE_DAEMON_PEER_PATH_HOLDER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/core/buffer_registry.h"
#include "daemon/core/engine.h"
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

// Reads the tails that runners' acknowledgements carry (AckTail: a move's last bytes still
// landing, as the runner's path described them). The path whose engine makes tails gives
// the hold table one (path CUDA IPC: the event the runner's copy records); the table
// passes tokens through unread.
class TailReader {
 public:
  virtual ~TailReader() = default;
  // Whether a look at `token` answers at once (this node has opened it before; opening
  // one may take a driver milliseconds).
  virtual bool Knows(const std::string& token) const = 0;
  // Waits until the tail of a move on `range` has landed: OK; DEADLINE_EXCEEDED at
  // `deadline` (absl::InfinitePast(): one look); another error when this node cannot
  // see it land (a token it cannot read). `arrived`: when the acknowledgement came (with
  // the tail's bytes, how long the reader may leave it alone first).
  virtual absl::Status Wait(const BufferUse& range, const AckTail& tail, absl::Time arrived,
                            absl::Time deadline) = 0;
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
