// Byte ranges of buffers: what a move names, checked before anything touches memory.
#ifndef GPUMOVE_DAEMON_CORE_RANGE_H_
#define GPUMOVE_DAEMON_CORE_RANGE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace gpumove {

// Bytes of one buffer on one node, as a move names them.
struct RangeSpec {
  std::string node;  // Empty: this node.
  std::string buffer_id;
  uint64_t offset = 0;
  uint64_t length = 0;  // 0: to the end (destination: the source's length).
};

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
