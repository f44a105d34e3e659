#include "daemon/path/local/local_engine.h"

#include <memory>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "absl/strings/str_cat.h"

namespace gpumove {
namespace {

// Progress and cancel are checked between chunks: small enough to cancel promptly, large
// enough that the per-chunk cost vanishes.
constexpr uint64_t kHostChunk = 16ull << 20;
constexpr uint64_t kDeviceChunk = 64ull << 20;

bool KnownDevice(GpuRuntime* gpu, int device) {
  for (const GpuDevice& d : gpu->devices()) {
    if (d.index == device) return true;
  }
  return false;
}

}  // namespace

absl::Status LocalEngine::CanServe(const Endpoint& src, const Endpoint& dst) const {
  if (src.remote != nullptr || dst.remote != nullptr) {
    return absl::FailedPreconditionError("LOCAL moves stay inside one node");
  }
  for (const Endpoint* e : {&src, &dst}) {
    if (e->kind == MemoryKind::kDevice && !KnownDevice(gpu_, e->device)) {
      return absl::FailedPreconditionError(absl::StrCat("GPU ", e->device, " is not on this node"));
    }
  }
  return absl::OkStatus();
}

absl::Status LocalEngine::Move(const Endpoint& src, const Endpoint& dst, uint64_t length,
                               MoveControl& control) {
  const bool device = src.kind == MemoryKind::kDevice || dst.kind == MemoryKind::kDevice;
  const int src_device = src.kind == MemoryKind::kDevice ? src.device : kHostDevice;
  const int dst_device = dst.kind == MemoryKind::kDevice ? dst.device : kHostDevice;
  if (control.cancelled()) return absl::CancelledError("cancelled");
  return gpu_->Copy(dst.data, dst_device, src.data, src_device, length,
                    device ? kDeviceChunk : kHostChunk, control.Reporter());
}

absl::StatusOr<uint64_t> HashRange(GpuRuntime* gpu, const Endpoint& e, uint64_t length) {
  if (e.kind != MemoryKind::kDevice) return XXH3_64bits(e.data, length);
  constexpr uint64_t kBounce = 8ull << 20;
  std::unique_ptr<char[]> bounce(new char[std::min(length, kBounce)]);
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(),
                                                                 &XXH3_freeState);
  XXH3_64bits_reset(state.get());
  for (uint64_t done = 0; done < length;) {
    const uint64_t n = std::min(kBounce, length - done);
    absl::Status st = gpu->Copy(bounce.get(), kHostDevice, e.data + done, e.device, n, n, nullptr);
    if (!st.ok()) return st;
    XXH3_64bits_update(state.get(), bounce.get(), n);
    done += n;
  }
  return XXH3_64bits_digest(state.get());
}

}  // namespace gpumove
