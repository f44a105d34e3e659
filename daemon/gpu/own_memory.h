// Device memory for one buffer in a CUDA allocation of its own, so that its CUDA IPC handle
// (Export) opens that buffer and nothing else. A device pool is one allocation holding
// every tenant's buffers: its handle would open all of them, so it goes only to peer
// daemons. Allocations are rounded up to the driver's 2 MiB granule (a handle maps whole
// granules), zeroed, counted against a per-GPU limit, and exported for as long as they
// live.
#ifndef GPUMOVE_DAEMON_GPU_OWN_MEMORY_H_
#define GPUMOVE_DAEMON_GPU_OWN_MEMORY_H_

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/gpu/gpu.h"
#include "daemon/gpu/ipc.h"

namespace gpumove {

class OwnDeviceMemory {
 public:
  // What one handle maps: whole granules.
  static constexpr uint64_t kGranule = uint64_t{2} << 20;

  // `gpu` and `ipc` must outlive this and every allocation it hands out. At most
  // `limit_per_gpu` bytes (after rounding) live on each GPU at once.
  OwnDeviceMemory(GpuRuntime* gpu, IpcTable* ipc, uint64_t limit_per_gpu)
      : gpu_(gpu), ipc_(ipc), limit_(limit_per_gpu) {}

  struct Allocation {
    char* data = nullptr;
    // Frees the memory (and stops exporting it) when the last copy goes.
    std::shared_ptr<const void> keepalive;
  };
  // INVALID_ARGUMENT for size 0 or a GPU this runtime lacks; RESOURCE_EXHAUSTED past the
  // limit or when the driver has no memory; the driver's error otherwise.
  absl::StatusOr<Allocation> Allocate(int device, uint64_t size);

  uint64_t limit_per_gpu() const { return limit_; }
  uint64_t used(int device) const;

 private:
  void Free(int device, char* data, uint64_t rounded);

  GpuRuntime* const gpu_;
  IpcTable* const ipc_;
  const uint64_t limit_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<int, uint64_t> used_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_GPU_OWN_MEMORY_H_
