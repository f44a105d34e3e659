// gpumove.peer.v1.PeerService: membership Hello and the receiving side of node-to-node moves.
#ifndef GPUMOVE_DAEMON_SERVER_PEER_SERVICE_H_
#define GPUMOVE_DAEMON_SERVER_PEER_SERVICE_H_

#include "daemon/cluster/cluster.h"
#include "daemon/cluster/holds.h"
#include "daemon/cluster/remote_ranges.h"
#include "daemon/gpu/ipc.h"
#include "daemon/path/mpi_engine.h"
#include "proto/gpumove/peer/v1/peer.grpc.pb.h"

namespace gpumove {

class PeerServiceImpl final : public peer::v1::PeerService::Service {
 public:
  // `mpi` may be null (not an MPI rank); `ipc` and `gpu` too (no CUDA IPC). `fences`:
  // offer CUDA IPC runners to wait for their copies' fences here.
  PeerServiceImpl(Cluster* cluster, HoldTable* holds, MpiEngine* mpi = nullptr,
                  IpcTable* ipc = nullptr, GpuRuntime* gpu = nullptr, bool fences = false)
      : cluster_(cluster), holds_(holds), mpi_(mpi), ipc_(ipc), gpu_(gpu), fences_(fences) {}

  grpc::Status Hello(grpc::ServerContext* context, const peer::v1::HelloRequest* request,
                     peer::v1::HelloResponse* response) override;
  grpc::Status PrepareRemote(grpc::ServerContext* context,
                             const peer::v1::PrepareRemoteRequest* request,
                             peer::v1::PrepareRemoteResponse* response) override;
  grpc::Status CompleteRemote(grpc::ServerContext* context,
                              const peer::v1::CompleteRemoteRequest* request,
                              peer::v1::CompleteRemoteResponse* response) override;
  grpc::Status PrepareRemoteBatch(grpc::ServerContext* context,
                                  const peer::v1::PrepareRemoteBatchRequest* request,
                                  peer::v1::PrepareRemoteBatchResponse* response) override;
  grpc::Status CompleteRemoteBatch(grpc::ServerContext* context,
                                   const peer::v1::CompleteRemoteBatchRequest* request,
                                   peer::v1::CompleteRemoteBatchResponse* response) override;
  grpc::Status StageChunk(grpc::ServerContext* context, const peer::v1::StageChunkRequest* request,
                          peer::v1::StageChunkResponse* response) override;
  grpc::Status TakeStageSlots(grpc::ServerContext* context,
                              const peer::v1::TakeStageSlotsRequest* request,
                              peer::v1::TakeStageSlotsResponse* response) override;
  grpc::Status StartMpi(grpc::ServerContext* context, const peer::v1::StartMpiRequest* request,
                        peer::v1::StartMpiResponse* response) override;
  grpc::Status StopMpi(grpc::ServerContext* context, const peer::v1::StopMpiRequest* request,
                       peer::v1::StopMpiResponse* response) override;

  // Whether serving the request cannot block (no MPI half to start or wait for, no
  // checksum to compute, no fence to wait for or open), so a thread that must not wait
  // may serve it.
  bool AnswersAtOnce(const peer::v1::PrepareRemoteRequest& request) const {
    return request.mpi_tag() == 0;
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
  grpc::Status StartHalf(const peer::v1::StartMpiRequest& request, bool patient);

  Cluster* const cluster_;
  HoldTable* const holds_;
  MpiEngine* const mpi_;
  IpcTable* const ipc_;
  GpuRuntime* const gpu_;
  const bool fences_;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_SERVER_PEER_SERVICE_H_
