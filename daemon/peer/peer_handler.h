// The peer protocol's logic, transport-neutral: membership Hello and the holding side of
// node-to-node moves, in absl::Status. Two thin adapters call it: the gRPC PeerService
// (peer_service.h) and the UCX active-message channel (daemon/path/ucx/ucx_peer_calls.h).
#ifndef GPUMOVE_DAEMON_PEER_PEER_HANDLER_H_
#define GPUMOVE_DAEMON_PEER_PEER_HANDLER_H_

#include "absl/status/status.h"
#include "daemon/cluster/cluster.h"
#include "daemon/peer/holds.h"
#include "daemon/peer/path_calls.h"
#include "daemon/peer/path_holder.h"
#include "daemon/peer/remote_ranges.h"
#include "proto/gpumove/peer/v1/peer.pb.h"

namespace gpumove {

// The tail an acknowledgement carries, as the hold table takes it.
inline AckTail TailOf(const peer::v1::CompleteRemoteRequest& request) {
  return AckTail{request.tail_token(), request.tail_bytes(), request.runner_waits_tail()};
}

class PeerHandler {
 public:
  // All must outlive the handler. `holders`: every path's holding side, asked in order
  // for its offer on each new hold; `path_calls` (null: none) the paths' own calls.
  PeerHandler(Cluster* cluster, HoldTable* holds, std::vector<PathHolder*> holders,
              const PathCalls* path_calls = nullptr)
      : cluster_(cluster), holds_(holds), holders_(std::move(holders)), path_calls_(path_calls) {}

  absl::Status Hello(const peer::v1::HelloRequest& request, peer::v1::HelloResponse* response);
  // One item of a PrepareRemoteBatch and of a CompleteRemoteBatch (the calls peers make).
  absl::Status PrepareRemote(const peer::v1::PrepareRemoteRequest& request,
                             peer::v1::PrepareRemoteResponse* response);
  absl::Status CompleteRemote(const peer::v1::CompleteRemoteRequest& request,
                              peer::v1::CompleteRemoteResponse* response);
  absl::Status PrepareRemoteBatch(const peer::v1::PrepareRemoteBatchRequest& request,
                                  peer::v1::PrepareRemoteBatchResponse* response);
  absl::Status CompleteRemoteBatch(const peer::v1::CompleteRemoteBatchRequest& request,
                                   peer::v1::CompleteRemoteBatchResponse* response);
  // A path's own call, served by the handler registered for it once the caller is found
  // to be a met peer and the call's names and body are within bounds.
  absl::Status PathCall(const peer::v1::PathCallRequest& request,
                        peer::v1::PathCallResponse* response);

  // Whether serving the request cannot block (no MPI half to start or wait for, no
  // checksum to compute, no tail to wait for or open), so a thread that must not wait
  // may serve it.
  bool AnswersAtOnce(const peer::v1::PrepareRemoteRequest& request) const {
    for (const PathHolder* h : holders_) {
      if (h->OfferBlocks(request)) return false;
    }
    return true;
  }
  bool AnswersAtOnce(const peer::v1::CompleteRemoteRequest& request) const {
    return !request.checksum() &&
           (request.tail_token().empty() ||
            holds_->AnswersTailAtOnce(TailOf(request), request.checksum())) &&
           !holds_->EndBlocks(request.from_node(), request.transfer_id());
  }
  // As its registration says (a call that is refused is refused at once).
  bool AnswersAtOnce(const peer::v1::PathCallRequest& request) const {
    const PathCalls::Entry* e =
        path_calls_ == nullptr ? nullptr : path_calls_->Find(request.path(), request.method());
    return e == nullptr || e->at_once;
  }

 private:
  Cluster* const cluster_;
  HoldTable* const holds_;
  const std::vector<PathHolder*> holders_;
  const PathCalls* const path_calls_;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_PEER_PEER_HANDLER_H_
