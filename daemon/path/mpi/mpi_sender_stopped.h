// What a receive returns when the sender's zero-byte "stopped" message came instead of
// bytes: shared by the MPI engine's runner, passive and vectored parts.
#ifndef GPUMOVE_DAEMON_PATH_MPI_SENDER_STOPPED_H_
#define GPUMOVE_DAEMON_PATH_MPI_SENDER_STOPPED_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace gpumove {

// A receive that got the sender's zero-byte "stopped" message.
inline constexpr absl::string_view kSenderStopped = "the sender stopped before the end";

inline bool IsSenderStopped(const absl::Status& s) {
  return s.code() == absl::StatusCode::kAborted && s.message() == kSenderStopped;
}

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_PATH_MPI_SENDER_STOPPED_H_
