// Byte sizes as people write them: "4096", "4KiB", "64MiB", "1GiB", "2GB".
#ifndef GPUMOVE_DAEMON_COMMON_BYTES_H_
#define GPUMOVE_DAEMON_COMMON_BYTES_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gpumove {

// Parses a size with an optional suffix: B, K/KiB, M/MiB, G/GiB, T/TiB (powers of 1024)
// or KB, MB, GB, TB (powers of 1000). INVALID_ARGUMENT on garbage or overflow.
absl::StatusOr<uint64_t> ParseBytes(absl::string_view text);

// "1.5 GiB", "512 KiB", "17 B".
std::string FormatBytes(uint64_t bytes);

// A flag type carrying a byte size, so --pool_size=1GiB works.
struct ByteSize {
  uint64_t bytes = 0;
};
bool AbslParseFlag(absl::string_view text, ByteSize* size, std::string* error);
std::string AbslUnparseFlag(ByteSize size);

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_COMMON_BYTES_H_
