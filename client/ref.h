// Buffer references as people type them: "[node/]buffer_id[@offset]".
#ifndef GPUMOVE_CLIENT_REF_H_
#define GPUMOVE_CLIENT_REF_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/gpumove/v1/gpumove.pb.h"

namespace gpumove {

// "b-1f2e", "node-a/b-1f2e", "b-1f2e@4096", "node-a/b-1f2e@64MiB". The offset takes size
// suffixes. INVALID_ARGUMENT for anything else (empty parts, extra '/' or '@', bad offset).
absl::StatusOr<v1::BufferRef> ParseBufferRef(absl::string_view text);

// The inverse, for messages: "node/id@offset+length".
std::string FormatBufferRef(const v1::BufferRef& ref);

}  // namespace gpumove

#endif  // GPUMOVE_CLIENT_REF_H_
