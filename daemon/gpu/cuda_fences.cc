// The CUDA runtime's fences: interprocess events recorded behind a copy left running, so
// that this process or another one (through the event's IPC handle) can wait for it.
#ifdef GPUMOVE_HAVE_CUDA

#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/gpu/cuda_internal.h"

namespace gpumove {
namespace cuda_internal {

CudaRuntime::Fence::Fence(CudaRuntime* owner, FenceEvent e, StreamLease stream, uint64_t pending,
                          absl::AnyInvocable<void()> after)
    : owner_(owner),
      e_(std::move(e)),
      stream_(std::move(stream)),
      pending_(pending),
      after_(std::move(after)) {}

CudaRuntime::Fence::~Fence() {
  Wait().IgnoreError();
  owner_->PutFence(std::move(e_));
  if (after_) after_();
}

absl::Status CudaRuntime::Fence::Wait() {
  CUDA_RETURN_IF_ERROR(cudaEventSynchronize(e_.event));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CopyFence>> CudaRuntime::FenceBehind(
    int device, StreamLease lease, uint64_t pending, absl::AnyInvocable<void()> after) {
  const cudaStream_t stream = (*lease).stream;
  auto e = TakeFence(device);
  const cudaError_t err = e.ok() ? cudaEventRecord(e->event, stream) : cudaSuccess;
  if (!e.ok() || err != cudaSuccess) {
    // No fence: what is queued ends here, before the caller lets go of what it reads
    // (its stream, its descriptors); `after` is the caller's to do.
    cudaStreamSynchronize(stream);
    if (!e.ok()) return e.status();
    PutFence(*std::move(e));
    return CudaError(err, "cudaEventRecord (fence)");
  }
  return std::make_unique<Fence>(this, *std::move(e), std::move(lease), pending, std::move(after));
}

absl::StatusOr<CudaRuntime::FenceEvent> CudaRuntime::TakeFence(int device) {
  {
    absl::MutexLock lock(&fences_mu_);
    auto& free = free_fences_[device];
    if (!free.empty()) {
      FenceEvent e = std::move(free.back());
      free.pop_back();
      return e;
    }
  }
  FenceEvent e;
  e.device = device;
  CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&e.event, cudaEventDisableTiming | cudaEventInterprocess));
  cudaIpcEventHandle_t h;
  CUDA_RETURN_IF_ERROR(cudaIpcGetEventHandle(&h, e.event));
  e.handle.assign(h.reserved, sizeof(h.reserved));
  return e;
}

void CudaRuntime::PutFence(FenceEvent e) {
  absl::MutexLock lock(&fences_mu_);
  free_fences_[e.device].push_back(std::move(e));
}

bool CudaRuntime::KnowsIpcFence(const std::string& handle) {
  absl::MutexLock lock(&imported_mu_);
  return imported_.contains(handle);
}

absl::Status CudaRuntime::WaitIpcFence(int device, const std::string& handle, absl::Time deadline,
                                       absl::Time quiet_until) {
  cudaIpcEventHandle_t h;
  if (handle.size() != sizeof(h.reserved)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a CUDA IPC event handle has ", sizeof(h.reserved), " bytes, not ", handle.size()));
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  cudaEvent_t event = nullptr;
  {
    absl::MutexLock lock(&imported_mu_);
    auto it = imported_.find(handle);
    if (it != imported_.end()) {
      event = it->second;
    } else {
      std::memcpy(h.reserved, handle.data(), sizeof(h.reserved));
      cudaError_t err = cudaIpcOpenEventHandle(&event, h);
      if (err != cudaSuccess) {
        cudaGetLastError();
        return absl::InvalidArgumentError(absl::StrCat(
            "cudaIpcOpenEventHandle: ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
      }
      // Kept: the exporter reuses its fences, so a peer's handles are few. (An imported
      // event must not be used once its exporter destroyed it; ours never destroy theirs.)
      imported_.emplace(handle, event);
    }
  }
  // Until the copy could have ended, no driver call: a long sleep, then a spin (a
  // sleep's wake-up is tens of microseconds late).
  quiet_until = std::min(quiet_until, deadline);
  if (const absl::Duration rest = quiet_until - absl::Now(); rest > absl::Microseconds(300)) {
    absl::SleepFor(rest - absl::Microseconds(150));
  }
  while (absl::Now() < quiet_until) {
  }
  // Polled rather than synchronized: a copy whose process died must not hold this
  // thread past the deadline. A query every microsecond or so (not back to back: each
  // one is a driver call, and a tight loop of them slowed the copies of other streams).
  for (int i = 0;; ++i) {
    cudaError_t err = cudaEventQuery(event);
    if (err == cudaSuccess) return absl::OkStatus();
    if (err != cudaErrorNotReady) {
      cudaGetLastError();
      return CudaError(err, "cudaEventQuery on another process's fence");
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError("the other process's copy did not end in time");
    }
    if (i > 1000) {
      std::this_thread::yield();
    } else {
      while (absl::Now() - now < absl::Microseconds(1)) {
      }
    }
  }
}

}  // namespace cuda_internal
}  // namespace gpumove

#endif  // GPUMOVE_HAVE_CUDA
