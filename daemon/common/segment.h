// One piece of a vectored move: `length` bytes from `src` to `dst`, offsets from the
// starts of the move's source and destination ranges. Shared by the scheduler (which
// checks lists of them, daemon/core/segments.h) and the copies that move them.
#ifndef GPUMOVE_DAEMON_COMMON_SEGMENT_H_
#define GPUMOVE_DAEMON_COMMON_SEGMENT_H_

#include <cstdint>

namespace gpumove {

struct Segment {
  uint64_t src = 0;
  uint64_t dst = 0;
  uint64_t length = 0;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_COMMON_SEGMENT_H_
