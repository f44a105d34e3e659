// Pools: memory a daemon owns, allocated once at start and carved into buffers.
//
// One pool per GPU (DEVICE), one of page-locked host memory (PINNED_HOST) and one of
// pageable host memory (HOST). A pool never grows: when it is full, Allocate says so.
#ifndef GPUMOVE_DAEMON_MEMORY_POOL_H_
#define GPUMOVE_DAEMON_MEMORY_POOL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/gpu/gpu.h"
#include "daemon/memory/allocator.h"

namespace gpumove {

// kFile: a region of a file (a FILE buffer, daemon/core/file_region.h), never a pool's.
enum class MemoryKind { kHost, kPinnedHost, kDevice, kFile };

const char* MemoryKindName(MemoryKind kind);

// Every buffer starts on this boundary (a page: what RDMA registration and DMA engines
// like best).
inline constexpr uint64_t kBufferAlignment = 4096;

struct PoolStats {
  MemoryKind kind;
  int device;
  uint64_t capacity;
  uint64_t free;
  uint64_t largest_free;
  size_t buffers;
  bool locked;
};

// Where host pools may get their memory instead of an anonymous mmap: a network stack that
// can share it with other processes on the host (UCX's shared-memory allocators), so that
// moves between daemons on one host are a single memcpy. Must outlive the pools.
class HostMemorySource {
 public:
  virtual ~HostMemorySource() = default;
  // `length` bytes, page-aligned, every page faulted in.
  virtual absl::StatusOr<void*> Allocate(uint64_t length) = 0;
  virtual void Free(void* base) = 0;
};

class Pool {
 public:
  // Allocates the pool's memory. `gpu` must outlive the pool. Host pools not pinned by the
  // CUDA driver come from `shared` when it is given and can serve them.
  static absl::StatusOr<std::unique_ptr<Pool>> Create(MemoryKind kind, int device,
                                                      uint64_t capacity, GpuRuntime* gpu,
                                                      HostMemorySource* shared = nullptr);
  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  // A block of at least `size` bytes; INVALID_ARGUMENT beyond the capacity,
  // RESOURCE_EXHAUSTED when full.
  absl::StatusOr<char*> Allocate(uint64_t size) ABSL_LOCKS_EXCLUDED(mu_);
  void Free(char* ptr) ABSL_LOCKS_EXCLUDED(mu_);

  MemoryKind kind() const { return kind_; }
  int device() const { return device_; }  // kHostDevice for host pools.
  bool locked() const { return locked_; }
  // Whether the memory came from a HostMemorySource (shared with peers on this host).
  bool shared() const { return source_ != nullptr; }
  // The whole region, for registering it with a network stack once.
  char* base() const { return base_; }
  uint64_t capacity() const { return mapped_; }
  PoolStats Stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  Pool(MemoryKind kind, int device, char* base, uint64_t capacity, bool locked,
       GpuRuntime* gpu, HostMemorySource* source);

  const MemoryKind kind_;
  const int device_;
  char* const base_;
  const uint64_t mapped_;
  const bool locked_;
  GpuRuntime* const gpu_;
  HostMemorySource* const source_;  // Where the memory came from, when not mmap.
  bool cuda_registered_ = false;    // source_ memory pinned with cudaHostRegister.
  mutable absl::Mutex mu_;
  Allocator allocator_ ABSL_GUARDED_BY(mu_);
};

struct PoolSizes {
  uint64_t host = 1ull << 30;
  uint64_t pinned = 256ull << 20;
  uint64_t device = 1ull << 30;  // Per GPU.
};

// All pools of a daemon.
class PoolSet {
 public:
  // Creates the host pools and one device pool per GPU in `devices` (indexes). A size of
  // 0 leaves that pool out.
  static absl::StatusOr<std::unique_ptr<PoolSet>> Create(const PoolSizes& sizes,
                                                         const std::vector<int>& devices,
                                                         GpuRuntime* gpu,
                                                         HostMemorySource* shared = nullptr);

  // The pool for (kind, device); device is ignored for host kinds. NOT_FOUND-free:
  // returns nullptr when there is none.
  Pool* Find(MemoryKind kind, int device) const;
  const std::vector<std::unique_ptr<Pool>>& pools() const { return pools_; }

 private:
  std::vector<std::unique_ptr<Pool>> pools_;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_MEMORY_POOL_H_
