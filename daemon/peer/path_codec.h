// How a path's own part of the hold handshake travels: the moving side writes what its
// path asks of the holder into the hold request, and reads its path's offer from the
// holder's answer. One codec per path, in the path's module; the cluster calls every
// codec and reads none of their fields.
#ifndef GPUMOVE_DAEMON_PEER_PATH_CODEC_H_
#define GPUMOVE_DAEMON_PEER_PATH_CODEC_H_

#include <memory>

#include "daemon/cluster/cluster.h"
#include "daemon/core/engine.h"
#include "proto/gpumove/peer/v1/peer.pb.h"

namespace gpumove {

class PathCodec {
 public:
  virtual ~PathCodec() = default;
  // Writes `ask` into `request` when it is this path's (a move asks for one path only)
  // and `holder` can do what it asks. What the path knows of `holder` is its own view of
  // the holder's Hello blob (PeerView::path, read once when the Hello was accepted).
  virtual void EncodeAsk(const PathAsk& ask, const PeerView& holder,
                         peer::v1::PrepareRemoteRequest* request) const {}
  // Adds this path's offer in a hold's answer from `holder` to `hold` (whose common fields
  // are set), when it made one; `ask` is what the hold was asked for.
  virtual void DecodeOffer(const PeerView& holder, const RemoteAsk& ask,
                           const peer::v1::PrepareRemoteResponse& response,
                           RemoteHold* hold) const = 0;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_PEER_PATH_CODEC_H_
