// gpumove.peer.v1.PeerService over gRPC: a thin adapter onto the transport-neutral
// PeerHandler.
#ifndef GPUMOVE_DAEMON_SERVER_PEER_SERVICE_H_
#define GPUMOVE_DAEMON_SERVER_PEER_SERVICE_H_

#include "daemon/server/convert.h"
#include "daemon/server/peer_handler.h"
#include "proto/gpumove/peer/v1/peer.grpc.pb.h"

namespace gpumove {

class PeerServiceImpl final : public peer::v1::PeerService::Service {
 public:
  // `handler` must outlive the service.
  explicit PeerServiceImpl(PeerHandler* handler) : handler_(handler) {}

  grpc::Status Hello(grpc::ServerContext*, const peer::v1::HelloRequest* request,
                     peer::v1::HelloResponse* response) override {
    return ToGrpcStatus(handler_->Hello(*request, response));
  }
  grpc::Status PrepareRemote(grpc::ServerContext*, const peer::v1::PrepareRemoteRequest* request,
                             peer::v1::PrepareRemoteResponse* response) override {
    return ToGrpcStatus(handler_->PrepareRemote(*request, response));
  }
  grpc::Status CompleteRemote(grpc::ServerContext*, const peer::v1::CompleteRemoteRequest* request,
                              peer::v1::CompleteRemoteResponse* response) override {
    return ToGrpcStatus(handler_->CompleteRemote(*request, response));
  }
  grpc::Status PrepareRemoteBatch(grpc::ServerContext*,
                                  const peer::v1::PrepareRemoteBatchRequest* request,
                                  peer::v1::PrepareRemoteBatchResponse* response) override {
    return ToGrpcStatus(handler_->PrepareRemoteBatch(*request, response));
  }
  grpc::Status CompleteRemoteBatch(grpc::ServerContext*,
                                   const peer::v1::CompleteRemoteBatchRequest* request,
                                   peer::v1::CompleteRemoteBatchResponse* response) override {
    return ToGrpcStatus(handler_->CompleteRemoteBatch(*request, response));
  }
  grpc::Status StageChunk(grpc::ServerContext*, const peer::v1::StageChunkRequest* request,
                          peer::v1::StageChunkResponse* response) override {
    return ToGrpcStatus(handler_->StageChunk(*request, response));
  }
  grpc::Status TakeStageSlots(grpc::ServerContext*, const peer::v1::TakeStageSlotsRequest* request,
                              peer::v1::TakeStageSlotsResponse* response) override {
    return ToGrpcStatus(handler_->TakeStageSlots(*request, response));
  }
  grpc::Status StartMpi(grpc::ServerContext*, const peer::v1::StartMpiRequest* request,
                        peer::v1::StartMpiResponse* response) override {
    return ToGrpcStatus(handler_->StartMpi(*request, response));
  }
  grpc::Status StopMpi(grpc::ServerContext*, const peer::v1::StopMpiRequest* request,
                       peer::v1::StopMpiResponse* response) override {
    return ToGrpcStatus(handler_->StopMpi(*request, response));
  }

 private:
  PeerHandler* const handler_;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_SERVER_PEER_SERVICE_H_
