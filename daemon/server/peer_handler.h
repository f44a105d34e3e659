// The peer protocol's logic, transport-neutral: membership Hello and the holding side of
// node-to-node moves, in absl::Status. Two thin adapters call it: the gRPC PeerService
// (peer_service.h) and the UCX active-message channel (peer_calls.h).
#ifndef GPUMOVE_DAEMON_SERVER_PEER_HANDLER_H_
#define GPUMOVE_DAEMON_SERVER_PEER_HANDLER_H_

#include "absl/status/status.h"
#include "daemon/cluster/cluster.h"
#include "daemon/cluster/holds.h"
#include "daemon/cluster/remote_ranges.h"
#include "daemon/gpu/ipc.h"
#include "daemon/path/mpi_engine.h"
#include "proto/gpumove/peer/v1/peer.pb.h"

namespace gpumove {

class PeerHandler {
 public:
  // `mpi` may be null (not an MPI rank); `ipc` and `gpu` too (no CUDA IPC). `fences`:
  // offer CUDA IPC runners to wait for their copies' fences here.
  PeerHandler(Cluster* cluster, HoldTable* holds, MpiEngine* mpi = nullptr, IpcTable* ipc = nullptr,
              GpuRuntime* gpu = nullptr, bool fences = false)
      : cluster_(cluster), holds_(holds), mpi_(mpi), ipc_(ipc), gpu_(gpu), fences_(fences) {}

  absl::Status Hello(const peer::v1::HelloRequest& request, peer::v1::HelloResponse* response);
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
    return request.mpi().tag() == 0;
  }
  bool AnswersAtOnce(const peer::v1::CompleteRemoteRequest& request) const {
    return !request.checksum() &&
           (request.fence().empty() ||
            holds_->AnswersFenceAtOnce(
                AckFence{request.fence(), request.fence_bytes(), request.runner_waits_fence()},
                request.checksum())) &&
           !holds_->HasHalf(request.from_node(), request.transfer_id());
  }

 private:
  // Starts this node's MPI half of a held range (StartMpi, or with the hold).
  absl::Status StartHalf(const peer::v1::StartMpiRequest& request, bool patient);

  Cluster* const cluster_;
  HoldTable* const holds_;
  MpiEngine* const mpi_;
  IpcTable* const ipc_;
  GpuRuntime* const gpu_;
  const bool fences_;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_SERVER_PEER_HANDLER_H_
