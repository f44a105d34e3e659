// Bounds on every string a client sends: a request whose label, idempotency key, id, node
// name or token is longer than its limit is INVALID_ARGUMENT before anything reads it, so
// nothing a tenant sends is kept (labels and idempotency keys are kept for the life of a
// buffer or transfer) or echoed unbounded. One walk over the request's set fields, by
// reflection, so a field added to the API later is bounded too. Bytes fields (data, notify
// text, CUDA IPC handles) have their own limits where they are read.
#ifndef GPUMOVE_DAEMON_SERVER_FIELD_LIMITS_H_
#define GPUMOVE_DAEMON_SERVER_FIELD_LIMITS_H_

#include <cstddef>

#include "absl/status/status.h"
#include "google/protobuf/message.h"

namespace gpumove {

inline constexpr size_t kMaxLabelBytes = 256;
inline constexpr size_t kMaxIdempotencyKeyBytes = 256;
// Any other string field (ids, node names, page tokens, states' names).
inline constexpr size_t kMaxStringFieldBytes = 1024;

// OK when every string field of `request`, at any depth, is within its limit;
// INVALID_ARGUMENT naming the first that is not (its path, its size and the limit).
absl::Status CheckStringFields(const google::protobuf::Message& request);

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_SERVER_FIELD_LIMITS_H_
