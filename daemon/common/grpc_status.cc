#include "daemon/common/grpc_status.h"

#include "daemon/common/quote.h"

namespace gpumove {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl and gRPC share the canonical code numbering. A message quoting a caller's input
  // is cut, so that a huge id does not come back whole.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), Bounded(status.message()));
}

}  // namespace gpumove
