// Checks a byte range against a buffer before anything touches memory.
#ifndef GPUMOVE_DAEMON_CORE_RANGE_H_
#define GPUMOVE_DAEMON_CORE_RANGE_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace gpumove {

// The length of [offset, offset+length) inside a buffer of `size` bytes; length 0 means
// "to the end". INVALID_ARGUMENT when the range is empty, leaves the buffer, or
// offset+length overflows.
absl::StatusOr<uint64_t> ResolveRange(uint64_t size, uint64_t offset, uint64_t length);

// Whether [a, a+a_len) and [b, b+b_len) share a byte.
inline bool RangesOverlap(uint64_t a, uint64_t a_len, uint64_t b, uint64_t b_len) {
  return a < b + b_len && b < a + a_len;
}

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_CORE_RANGE_H_
