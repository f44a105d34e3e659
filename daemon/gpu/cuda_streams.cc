// The streams the CUDA runtime lends to copies (StreamPool), and what each keeps for the
// gathers run on it (descriptor room, sums, device bounce).
#ifdef GPUMOVE_HAVE_CUDA

#include <algorithm>
#include <iterator>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/gpu/cuda_internal.h"

namespace gpumove {
namespace cuda_internal {

absl::Status CudaError(cudaError_t err, absl::string_view what) {
  return absl::InternalError(
      absl::StrCat(what, ": ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
}

#ifdef GPUMOVE_HAVE_GATHER
absl::Status CopyStream::Reserve(uint64_t n) {
  if (n <= room.capacity) return absl::OkStatus();
  const uint64_t want = std::max(n, room.capacity * 2);
  FreeDescriptorRoom(room);
  room = DescriptorRoom{};
  auto grown = NewDescriptorRoom(want);
  if (!grown.ok()) return grown.status();
  room = *grown;
  return absl::OkStatus();
}

absl::Status CopyStream::ReserveSums(uint64_t n) {
  if (n <= sums_capacity) return absl::OkStatus();
  if (sums != nullptr) cudaFreeHost(sums);
  sums = device_sums = nullptr;
  sums_capacity = 0;
  CUDA_RETURN_IF_ERROR(
      cudaHostAlloc(&sums, n * sizeof(uint64_t), cudaHostAllocMapped | cudaHostAllocPortable));
  CUDA_RETURN_IF_ERROR(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_sums), sums, 0));
  sums_capacity = n;
  return absl::OkStatus();
}

absl::Status CopyStream::ReserveBounce(uint64_t n) {
  if (n <= bounce_capacity) return absl::OkStatus();
  // The stream is idle: its last use was waited for before it came back to the pool.
  if (bounce != nullptr) cudaFree(bounce);
  bounce = nullptr;
  bounce_capacity = 0;
  const uint64_t want = (n + (uint64_t{1} << 20) - 1) & ~((uint64_t{1} << 20) - 1);
  CUDA_RETURN_IF_ERROR(cudaMalloc(&bounce, want));
  bounce_capacity = want;
  return absl::OkStatus();
}
#endif

absl::StatusOr<CopyStream*> StreamPool::Take(int device, uint64_t pieces) {
  {
    absl::MutexLock lock(&mu_);
    auto& free = free_[device];
    if (!free.empty()) {
      auto it = free.end() - 1;
#ifdef GPUMOVE_HAVE_GATHER
      for (auto f = free.rbegin(); pieces > 0 && f != free.rend(); ++f) {
        if ((*f)->room.capacity >= pieces) {
          it = std::prev(f.base());
          break;
        }
      }
#endif
      CopyStream* s = *it;
      free.erase(it);
      return s;
    }
  }
  auto s = std::make_unique<CopyStream>();
  s->device = device;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
  for (cudaEvent_t& e : s->done) {
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  absl::MutexLock lock(&mu_);
  all_.push_back(std::move(s));
  return all_.back().get();
}

void StreamPool::Put(CopyStream* s) {
  absl::MutexLock lock(&mu_);
  free_[s->device].push_back(s);
}

}  // namespace cuda_internal
}  // namespace gpumove

#endif  // GPUMOVE_HAVE_CUDA
