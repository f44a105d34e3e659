// Fuzzes the checks of a peer's packed UCX worker addresses and remote keys: no input may
// crash or read out of bounds, and an address always fits the shape learned from itself.
#include <cstdint>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "daemon/path/ucx/ucx_wire_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  gpumove::CheckUcxRkey(bytes).IgnoreError();
  auto entries = gpumove::ParseUcxWorkerAddress(bytes);
  if (!entries.ok()) {
    if (gpumove::CheckUcxWorkerAddress(bytes).ok()) std::abort();  // Must agree.
    return 0;
  }
  gpumove::UcxAddressShape shape;
  if (!shape.Learn(bytes).ok()) std::abort();
  bool clean = true;
  for (const auto& e : *entries) clean = clean && e.endpoints == 0;
  // A worker's own address (no endpoint addresses) fits a shape learned from it.
  if (clean && !gpumove::CheckUcxWorkerAddress(bytes, &shape).ok()) std::abort();
  return 0;
}
