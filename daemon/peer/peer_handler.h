// The peer protocol's logic, transport-neutral: membership Hello and the holding side of
// node-to-node moves, in absl::Status. Two thin adapters call it: the gRPC PeerService
// (peer_service.h) and the UCX active-message channel (peer_calls.h).
#ifndef GPUMOVE_DAEMON_PEER_PEER_HANDLER_H_
#define GPUMOVE_DAEMON_PEER_PEER_HANDLER_H_

#include "absl/status/status.h"
#include "daemon/cluster/cluster.h"
#include "daemon/path/mpi/mpi_holder.h"
#include "daemon/path/ucx/stage_holder.h"
#include "daemon/peer/holds.h"
#include "daemon/peer/path_holder.h"
#include "daemon/peer/remote_ranges.h"
#include "proto/gpumove/peer/v1/peer.pb.h"

namespace gpumove {

class PeerHandler {
 public:
  // All must outlive the handler. `holders`: every path's holding side, asked in order
  // for its offer on each new hold; `stage` and `mpi` (null: none here) also serve their
  // paths' own calls.
  PeerHandler(Cluster* cluster, HoldTable* holds, std::vector<PathHolder*> holders,
              StageHolder* stage = nullptr, MpiHolder* mpi = nullptr)
      : cluster_(cluster), holds_(holds), holders_(std::move(holders)), stage_(stage), mpi_(mpi) {}

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
  absl::Status StageChunk(const peer::v1::StageChunkRequest& request,
                          peer::v1::StageChunkResponse* response);
  absl::Status TakeStageSlots(const peer::v1::TakeStageSlotsRequest& request,
                              peer::v1::TakeStageSlotsResponse* response);
  absl::Status StartMpi(const peer::v1::StartMpiRequest& request,
                        peer::v1::StartMpiResponse* response);
  absl::Status StopMpi(const peer::v1::StopMpiRequest& request,
                       peer::v1::StopMpiResponse* response);

  // Whether serving the request cannot block (no MPI half to start or wait for, no
  // checksum to compute, no fence to wait for or open), so a thread that must not wait
  // may serve it.
  bool AnswersAtOnce(const peer::v1::PrepareRemoteRequest& request) const {
    for (const PathHolder* h : holders_) {
      if (h->OfferBlocks(request)) return false;
    }
    return true;
  }
  bool AnswersAtOnce(const peer::v1::CompleteRemoteRequest& request) const {
    return !request.checksum() &&
           (request.fence().empty() ||
            holds_->AnswersFenceAtOnce(
                AckFence{request.fence(), request.fence_bytes(), request.runner_waits_fence()},
                request.checksum())) &&
           !holds_->EndBlocks(request.from_node(), request.transfer_id());
  }

 private:
  // FAILED_PRECONDITION for a staging call on a hold that is not staged; NOT_FOUND when
  // there is no such hold.
  absl::Status NotStaged(const std::string& from_node, const std::string& transfer_id) const;

  Cluster* const cluster_;
  HoldTable* const holds_;
  const std::vector<PathHolder*> holders_;
  StageHolder* const stage_;
  MpiHolder* const mpi_;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_PEER_PEER_HANDLER_H_
