// Fuzzes the parsing of buffer references as gpumovectl takes them ([node/]id[@offset]):
// no input may crash, and what parses formats back to
// text that parses the same.
#include <cstdint>
#include <cstdlib>

#include "client/ref.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  auto ref = gpumove::ParseBufferRef(text);
  if (!ref.ok()) return 0;
  const std::string again = gpumove::FormatBufferRef(*ref);
  auto reparsed = gpumove::ParseBufferRef(again);
  if (!reparsed.ok() || reparsed->node() != ref->node() ||
      reparsed->buffer_id() != ref->buffer_id() || reparsed->offset() != ref->offset()) {
    std::abort();
  }
  return 0;
}
