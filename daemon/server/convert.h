// Translation between the daemon's types and gpumove.v1 messages, and the one place
// absl::Status becomes grpc::Status.
#ifndef GPUMOVE_DAEMON_SERVER_CONVERT_H_
#define GPUMOVE_DAEMON_SERVER_CONVERT_H_

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/common/grpc_status.h"
#include "daemon/core/buffer_registry.h"
#include "daemon/core/transfer_scheduler.h"
#include "daemon/peer/kinds.h"
#include "proto/gpumove/v1/gpumove.pb.h"

namespace gpumove {

v1::TransferState ToProto(TransferState state);
absl::StatusOr<TransferState> FromProto(v1::TransferState state);
// PRIORITY_UNSPECIFIED is normal; INVALID_ARGUMENT for a value the API does not define.
v1::Priority ToProto(Priority p);
absl::StatusOr<Priority> FromProto(v1::Priority p);

// Durations from the wire: INVALID_ARGUMENT when negative or malformed.
absl::StatusOr<absl::Duration> FromProto(const google::protobuf::Duration& d);
void ToProto(absl::Time t, google::protobuf::Timestamp* out);

RangeSpec FromProto(const v1::BufferRef& ref);
void ToProto(const RangeSpec& range, v1::BufferRef* out);

void ToProto(const BufferInfo& info, const std::string& node, v1::Buffer* out);
void ToProto(const TransferSnapshot& t, v1::Transfer* out);

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_SERVER_CONVERT_H_
