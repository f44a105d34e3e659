// The one conversion of an absl::Status to a grpc::Status, at each gRPC edge (services and
// the peer service alike): same code, the message cut to a bound.
#ifndef GPUMOVE_DAEMON_COMMON_GRPC_STATUS_H_
#define GPUMOVE_DAEMON_COMMON_GRPC_STATUS_H_

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"

namespace gpumove {

grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_COMMON_GRPC_STATUS_H_
