// gpumove.peer.v1.PeerService over gRPC: a thin adapter onto the transport-neutral
// PeerHandler, which checks each call's stamp first when the cluster has a secret.
#ifndef GPUMOVE_DAEMON_PEER_PEER_SERVICE_H_
#define GPUMOVE_DAEMON_PEER_PEER_SERVICE_H_

#include "daemon/cluster/peer_auth.h"
#include "daemon/common/grpc_status.h"
#include "daemon/peer/peer_handler.h"
#include "daemon/peer/remote_ranges.h"
#include "proto/gpumove/peer/v1/peer.grpc.pb.h"

namespace gpumove {

class PeerServiceImpl final : public peer::v1::PeerService::Service {
 public:
  // `handler` (and `auth`) must outlive the service. `auth` null: calls are taken without
  // credentials, unless `closed`, when every call is refused (a daemon whose clients need
  // credentials takes no peers without a cluster secret).
  PeerServiceImpl(PeerHandler* handler, PeerAuth* auth = nullptr, bool closed = false)
      : handler_(handler), auth_(auth), closed_(closed) {}

  grpc::Status Hello(grpc::ServerContext* context, const peer::v1::HelloRequest* request,
                     peer::v1::HelloResponse* response) override {
    return Serve(context, kHelloMethod, *request, response, &PeerHandler::Hello);
  }

  grpc::Status PrepareRemoteBatch(grpc::ServerContext* context,
                                  const peer::v1::PrepareRemoteBatchRequest* request,
                                  peer::v1::PrepareRemoteBatchResponse* response) override {
    return Serve(context, static_cast<uint32_t>(PeerMethod::kPrepareRemoteBatch), *request,
                 response, &PeerHandler::PrepareRemoteBatch);
  }
  grpc::Status CompleteRemoteBatch(grpc::ServerContext* context,
                                   const peer::v1::CompleteRemoteBatchRequest* request,
                                   peer::v1::CompleteRemoteBatchResponse* response) override {
    return Serve(context, static_cast<uint32_t>(PeerMethod::kCompleteRemoteBatch), *request,
                 response, &PeerHandler::CompleteRemoteBatch);
  }
  grpc::Status PathCall(grpc::ServerContext* context, const peer::v1::PathCallRequest* request,
                        peer::v1::PathCallResponse* response) override {
    return Serve(context, static_cast<uint32_t>(PeerMethod::kPathCall), *request, response,
                 &PeerHandler::PathCall);
  }

 private:
  template <class Request, class Response>
  grpc::Status Serve(grpc::ServerContext* context, uint32_t method, const Request& request,
                     Response* response,
                     absl::Status (PeerHandler::*serve)(const Request&, Response*)) {
    if (auth_ == nullptr) {
      if (closed_) {
        return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                            "this node takes no peers: its clients need credentials and it has "
                            "no --cluster_secret_file");
      }
      return ToGrpcStatus((handler_->*serve)(request, response));
    }
    auto it = context->client_metadata().find(kPeerStampKey);
    auto caller = auth_->Check(method, request.SerializeAsString(),
                               it == context->client_metadata().end()
                                   ? absl::string_view()
                                   : absl::string_view(it->second.data(), it->second.size()));
    if (!caller.ok()) return ToGrpcStatus(caller.status());
    const absl::Status st = (handler_->*serve)(request, response);
    if (st.ok()) {
      context->AddTrailingMetadata(kPeerReplyKey,
                                   auth_->SignReply(caller->mac, response->SerializeAsString()));
    }
    return ToGrpcStatus(st);
  }

  PeerHandler* const handler_;
  PeerAuth* const auth_;
  const bool closed_;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_PEER_PEER_SERVICE_H_
