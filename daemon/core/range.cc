#include "daemon/core/range.h"

#include "absl/strings/str_cat.h"

namespace gpumove {

absl::StatusOr<uint64_t> ResolveRange(uint64_t size, uint64_t offset, uint64_t length) {
  if (offset > size || (offset == size && length == 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("offset ", offset, " is at or beyond the end of the buffer (size ", size,
                     ")"));
  }
  if (length == 0) return size - offset;
  uint64_t end = 0;
  if (__builtin_add_overflow(offset, length, &end)) {
    return absl::InvalidArgumentError(
        absl::StrCat("offset ", offset, " + length ", length, " overflows 64 bits"));
  }
  if (end > size) {
    return absl::InvalidArgumentError(absl::StrCat("range [", offset, ", ", end,
                                                   ") exceeds the buffer (size ", size, ")"));
  }
  return length;
}

}  // namespace gpumove
