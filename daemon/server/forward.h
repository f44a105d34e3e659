// Forwarding a unary call to the node it belongs to, with the caller's deadline and
// cancellation carried over.
#ifndef GPUMOVE_DAEMON_SERVER_FORWARD_H_
#define GPUMOVE_DAEMON_SERVER_FORWARD_H_

#include <grpcpp/grpcpp.h>

namespace gpumove {

template <typename Stub, typename Request, typename Response>
grpc::Status ForwardUnary(
    Stub& stub, grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*),
    grpc::ServerContext* context, const Request& request, Response* response) {
  auto client = grpc::ClientContext::FromServerContext(*context);
  return (stub.*method)(client.get(), request, response);
}

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_SERVER_FORWARD_H_
