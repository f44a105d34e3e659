#include "daemon/memory/pool.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/common/bytes.h"
#include "daemon/common/log.h"

namespace gpumove {

const char* MemoryKindName(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kHost:
      return "HOST";
    case MemoryKind::kPinnedHost:
      return "PINNED_HOST";
    case MemoryKind::kDevice:
      return "DEVICE";
    case MemoryKind::kFile:
      return "FILE";
  }
  return "?";
}

absl::StatusOr<std::unique_ptr<Pool>> Pool::Create(MemoryKind kind, int device,
                                                   uint64_t capacity, GpuRuntime* gpu,
                                                   HostMemorySource* shared) {
  capacity = (capacity + kBufferAlignment - 1) & ~(kBufferAlignment - 1);
  char* base = nullptr;
  bool locked = false;
  HostMemorySource* source = nullptr;
  bool cuda_registered = false;
  if (kind == MemoryKind::kDevice) {
    auto ptr = gpu->DeviceAlloc(device, capacity);
    if (!ptr.ok()) return ptr.status();
    base = static_cast<char*>(*ptr);
    locked = true;
  } else if (kind == MemoryKind::kPinnedHost && !gpu->devices().empty()) {
    // Shared memory registered with the driver when there is a source (daemons on this
    // host then reach the bounce buffers with one memcpy), else the driver's own.
    if (shared != nullptr) {
      auto ptr = shared->Allocate(capacity);
      absl::Status st = ptr.ok() ? gpu->HostRegister(*ptr, capacity) : ptr.status();
      if (st.ok()) {
        base = static_cast<char*>(*ptr);
        source = shared;
        cuda_registered = true;
      } else {
        if (ptr.ok()) shared->Free(*ptr);
        LOG(WARNING) << "PINNED_HOST pool: not in shared memory (" << st
                     << "); cudaHostAlloc instead";
      }
    }
    if (base == nullptr) {
      auto ptr = gpu->PinnedAlloc(capacity);
      if (!ptr.ok()) return ptr.status();
      base = static_cast<char*>(*ptr);
    }
    locked = true;
  } else {
    if (shared != nullptr) {
      auto ptr = shared->Allocate(capacity);
      if (ptr.ok()) {
        base = static_cast<char*>(*ptr);
        source = shared;
      } else {
        LOG(WARNING) << MemoryKindName(kind) << " pool: no shared memory (" << ptr.status()
                     << "); private memory instead, moves with daemons on this host copy "
                        "across processes";
      }
    }
    if (base == nullptr) {
      // Faulted in now, so the first move into a buffer runs at memory speed, not at
      // page-fault speed.
      void* ptr = mmap(nullptr, capacity, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
      if (ptr == MAP_FAILED) {
        return absl::ResourceExhaustedError(
            absl::StrCat("mmap of ", capacity, " bytes: ", strerror(errno)));
      }
      base = static_cast<char*>(ptr);
    }
    if (kind == MemoryKind::kPinnedHost) {
      // Without a CUDA driver "pinned" means page-locked by the kernel.
      locked = mlock(base, capacity) == 0;
      if (!locked) {
        LOG(WARNING) << "PINNED_HOST pool: mlock of " << capacity << " bytes failed ("
                     << strerror(errno) << "); the pool is pageable";
      }
    }
  }
  auto pool =
      std::unique_ptr<Pool>(new Pool(kind, device, base, capacity, locked, gpu, source));
  pool->cuda_registered_ = cuda_registered;
  return pool;
}

Pool::Pool(MemoryKind kind, int device, char* base, uint64_t capacity, bool locked,
           GpuRuntime* gpu, HostMemorySource* source)
    : kind_(kind),
      device_(kind == MemoryKind::kDevice ? device : kHostDevice),
      base_(base),
      mapped_(capacity),
      locked_(locked),
      gpu_(gpu),
      source_(source),
      allocator_(capacity, kBufferAlignment) {}

Pool::~Pool() {
  if (kind_ == MemoryKind::kDevice) {
    gpu_->DeviceFree(device_, base_);
  } else if (source_ != nullptr) {
    if (cuda_registered_) {
      gpu_->HostUnregister(base_);
    } else if (locked_) {
      munlock(base_, mapped_);
    }
    source_->Free(base_);
  } else if (kind_ == MemoryKind::kPinnedHost && !gpu_->devices().empty()) {
    gpu_->PinnedFree(base_);
  } else {
    munmap(base_, mapped_);
  }
}

absl::StatusOr<char*> Pool::Allocate(uint64_t size) {
  absl::MutexLock lock(&mu_);
  auto offset = allocator_.Allocate(size);
  if (!offset.ok()) {
    return absl::Status(offset.status().code(),
                        absl::StrCat(MemoryKindName(kind_),
                                     device_ == kHostDevice ? "" : absl::StrCat(" ", device_),
                                     " pool: ", offset.status().message()));
  }
  return base_ + *offset;
}

void Pool::Free(char* ptr) {
  absl::MutexLock lock(&mu_);
  absl::Status st = allocator_.Free(static_cast<uint64_t>(ptr - base_));
  if (!st.ok()) LOG(ERROR) << "pool free: " << st;
}

PoolStats Pool::Stats() const {
  absl::MutexLock lock(&mu_);
  return PoolStats{kind_,
                   device_,
                   allocator_.capacity(),
                   allocator_.free_bytes(),
                   allocator_.largest_free(),
                   allocator_.allocations(),
                   locked_};
}

absl::StatusOr<std::unique_ptr<PoolSet>> PoolSet::Create(const PoolSizes& sizes,
                                                         const std::vector<int>& devices,
                                                         GpuRuntime* gpu,
                                                         HostMemorySource* shared) {
  auto set = std::make_unique<PoolSet>();
  auto add = [&](MemoryKind kind, int device, uint64_t size) -> absl::Status {
    if (size == 0) return absl::OkStatus();
    // Host pools are faulted in (and pinned ones locked) now, which takes a while for big
    // ones on a small machine: say so, so that a quiet start is not taken for a hang.
    const absl::Time start = absl::Now();
    LOG(INFO) << "setting up the " << MemoryKindName(kind) << " pool"
              << (kind == MemoryKind::kDevice ? absl::StrCat(" of GPU ", device) : "") << ": "
              << FormatBytes(size) << (kind == MemoryKind::kDevice ? "" : ", faulting its pages in")
              << "...";
    auto pool = Pool::Create(kind, device, size, gpu, shared);
    if (pool.ok()) {
      LOG(INFO) << MemoryKindName(kind) << " pool ready in "
                << absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(1)));
    }
    if (!pool.ok()) {
      return absl::Status(pool.status().code(),
                          absl::StrCat("creating the ", MemoryKindName(kind), " pool of ", size,
                                       " bytes: ", pool.status().message()));
    }
    set->pools_.push_back(*std::move(pool));
    return absl::OkStatus();
  };
  if (auto st = add(MemoryKind::kHost, kHostDevice, sizes.host); !st.ok()) return st;
  if (auto st = add(MemoryKind::kPinnedHost, kHostDevice, sizes.pinned); !st.ok()) return st;
  for (int device : devices) {
    if (auto st = add(MemoryKind::kDevice, device, sizes.device); !st.ok()) return st;
  }
  return set;
}

Pool* PoolSet::Find(MemoryKind kind, int device) const {
  for (const auto& pool : pools_) {
    if (pool->kind() != kind) continue;
    if (kind != MemoryKind::kDevice || pool->device() == device) return pool.get();
  }
  return nullptr;
}

}  // namespace gpumove
