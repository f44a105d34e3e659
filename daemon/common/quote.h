// Client and peer input, quoted in messages and logs without echoing it unbounded.
//
//   return absl::NotFoundError(absl::StrCat("unknown buffer ", Quoted(id)));
//   // unknown buffer "b-12"; a 1 MiB id: "xxxx…" (1048576 bytes)
#ifndef GPUMOVE_DAEMON_COMMON_QUOTE_H_
#define GPUMOVE_DAEMON_COMMON_QUOTE_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace gpumove {

// Longest input Quoted shows whole.
inline constexpr size_t kQuotedMax = 64;
// Longest status message sent to a caller (ToGrpcStatus cuts longer ones).
inline constexpr size_t kMessageMax = 1024;

// `text` in double quotes, C-escaped; past kQuotedMax bytes, its head, "…" and its size.
std::string Quoted(absl::string_view text);

// `message` itself when it has at most `max` bytes; else its first bytes (not splitting a
// UTF-8 sequence) and how many were cut.
std::string Bounded(absl::string_view message, size_t max = kMessageMax);

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_COMMON_QUOTE_H_
