// The buffers of one daemon: allocation from pools, ownership, leases, and uses that
// keep a buffer alive while a transfer, read or write is on it.
#ifndef GPUMOVE_DAEMON_CORE_BUFFER_REGISTRY_H_
#define GPUMOVE_DAEMON_CORE_BUFFER_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/core/file_region.h"
#include "daemon/core/quotas.h"
#include "daemon/memory/pool.h"

namespace gpumove {

// The owner an administrator acts as: it sees and uses every owner's buffers and
// transfers, and what it makes belongs to the administrators. No tenant is named so.
inline constexpr char kAnyOwner[] = "*";
// Whether a caller acting as `owner` may see what `has` owns.
inline bool OwnerSees(const std::string& owner, const std::string& has) {
  return owner == has || owner == kAnyOwner;
}

struct BufferInfo {
  std::string id;
  uint64_t size = 0;
  MemoryKind kind = MemoryKind::kHost;
  int device = kHostDevice;
  std::string owner;
  std::string label;
  absl::Time create_time;
  std::optional<absl::Time> lease_expire_time;  // Unset: no lease.
  absl::Duration lease_ttl;
  uint32_t active_uses = 0;
  // Memory a client process lent us (CUDA IPC import), not from a pool; released with
  // the buffer, or when process `owner_pid` (when not 0) exits.
  bool imported = false;
  int owner_pid = 0;
  // In a device allocation of its own (not a pool), so Export may hand its CUDA IPC
  // handle to its owner.
  bool exportable = false;
  // kFile: the region of the file it names.
  std::shared_ptr<const FileRegion> file;
};

struct AllocateOptions {
  uint64_t size = 0;
  MemoryKind kind = MemoryKind::kHost;
  int device = 0;  // For kDevice.
  absl::Duration lease_ttl = absl::ZeroDuration();  // Zero: the registry's default.
  std::string label;
  std::string owner;
  // kDevice only: an allocation of its own (SetOwnMemory) instead of the pool.
  bool exportable = false;
};

// Device memory of one buffer alone (daemon/gpu/own_memory.h): freed when `keepalive` goes.
struct OwnMemory {
  char* data = nullptr;
  std::shared_ptr<const void> keepalive;
};

// A buffer over memory that is not ours (a client's allocation mapped into the daemon).
struct AdoptOptions {
  char* data = nullptr;
  uint64_t size = 0;
  MemoryKind kind = MemoryKind::kDevice;
  int device = 0;
  // Kept until the buffer is freed (the mapping: dropping it unmaps the memory).
  std::shared_ptr<const void> keepalive;
  absl::Duration lease_ttl = absl::ZeroDuration();
  std::string label;
  std::string owner;
  int owner_pid = 0;  // 0: not tied to a process.
};

// A buffer over a region of an open file (kind kFile); its size is the region's length.
struct FileBufferOptions {
  std::shared_ptr<const FileRegion> file;
  absl::Duration lease_ttl = absl::ZeroDuration();
  std::string label;
  std::string owner;
};

class BufferRegistry;

// A checked range of a buffer, held in use: the buffer is not freed while a BufferUse
// on it exists. Movable, not copyable.
class BufferUse {
 public:
  BufferUse() = default;
  BufferUse(BufferUse&& other) noexcept { *this = std::move(other); }
  BufferUse& operator=(BufferUse&& other) noexcept;
  ~BufferUse() { Reset(); }

  // Ends the use now.
  void Reset();
  // Says the use is ending on its own, soon: what it waits for (a peer's GPU copy into or
  // out of the range) was queued for good. A Release of the buffer waits for uses that
  // are all ending instead of refusing.
  void MarkEnding();

  bool valid() const { return entry_ != nullptr; }
  char* data() const { return data_; }  // First byte of the range.
  uint64_t offset() const { return offset_; }
  uint64_t length() const { return length_; }
  MemoryKind kind() const;
  int device() const;
  // Not in one of this node's pools: lent by a client (Import), or an allocation of its own
  // (exportable). Paths that need pool memory (UCX's registered pools) stage it.
  bool outside_pools() const;
  const std::string& buffer_id() const;
  // kFile: the file region (data() is then null; the range starts offset() bytes into
  // it). Null for memory.
  const FileRegion* file() const;

 private:
  friend class BufferRegistry;
  BufferRegistry* registry_ = nullptr;
  std::shared_ptr<void> entry_;  // BufferRegistry::Entry, type-erased.
  char* data_ = nullptr;
  uint64_t offset_ = 0;
  uint64_t length_ = 0;
  bool ending_ = false;
};

class BufferRegistry {
 public:
  // `pools` must outlive the registry. A zero `default_lease` means buffers without an
  // explicit TTL have no lease.
  BufferRegistry(PoolSet* pools, absl::Duration default_lease);
  ~BufferRegistry();
  BufferRegistry(const BufferRegistry&) = delete;
  BufferRegistry& operator=(const BufferRegistry&) = delete;

  // Pool allocations are counted against their owner's quota in `quotas` (which must
  // outlive the registry) from now on. Before the first Allocate.
  void SetQuotas(Quotas* quotas) { quotas_ = quotas; }
  // Where exportable buffers' memory comes from (none: FAILED_PRECONDITION). Before the
  // first Allocate.
  using OwnMemoryMaker = std::function<absl::StatusOr<OwnMemory>(int device, uint64_t size)>;
  void SetOwnMemory(OwnMemoryMaker make) { own_memory_ = std::move(make); }
  // Zeroes each pool allocation before it is handed out, so no tenant reads what another
  // left (none: not zeroed). Before the first Allocate.
  using Scrubber =
      std::function<absl::Status(char* data, MemoryKind kind, int device, uint64_t size)>;
  void SetScrub(Scrubber zero) { scrub_ = std::move(zero); }

  // INVALID_ARGUMENT (size 0, bigger than the pool, negative TTL), FAILED_PRECONDITION
  // (no such pool here, e.g. DEVICE without GPUs), RESOURCE_EXHAUSTED (pool full, or the
  // owner's quota).
  absl::StatusOr<BufferInfo> Allocate(const AllocateOptions& options);
  // Registers memory we did not allocate. INVALID_ARGUMENT (no memory, size 0, negative
  // TTL, an owner process this daemon cannot see).
  absl::StatusOr<BufferInfo> Adopt(AdoptOptions options);
  // Registers a file region (kind kFile). INVALID_ARGUMENT (no region, length 0, negative
  // TTL).
  absl::StatusOr<BufferInfo> AdoptFile(FileBufferOptions options);
  // NOT_FOUND, FAILED_PRECONDITION while in use. Uses that are all ending
  // (BufferUse::MarkEnding) are waited for, up to `ending_wait`.
  absl::Status Release(const std::string& owner, const std::string& id,
                       absl::Duration ending_wait = absl::Seconds(10));
  absl::StatusOr<BufferInfo> Get(const std::string& owner, const std::string& id) const;
  std::vector<BufferInfo> List(const std::string& owner) const;
  // Restarts the lease clock; a zero ttl keeps the current TTL. FAILED_PRECONDITION for a
  // buffer without a lease.
  absl::StatusOr<BufferInfo> RenewLease(const std::string& owner, const std::string& id,
                                        absl::Duration ttl);
  // Checks [offset, offset+length) (length 0: to the end) and holds the buffer in use.
  // A FILE buffer is FAILED_PRECONDITION unless `files` (the caller reaches it through
  // BufferUse::file(), not data()).
  absl::StatusOr<BufferUse> Acquire(const std::string& owner, const std::string& id,
                                    uint64_t offset, uint64_t length, bool files = false);

  // Frees the buffers whose lease ran out by `now`, and imported ones whose owner
  // process exited (those in use are freed when their last use ends). Returns how many.
  int ExpireLeases(absl::Time now);
  // Calls ExpireLeases every `period` on a thread of its own until the registry dies.
  void StartLeaseReaper(absl::Duration period);

  size_t size() const;

 private:
  friend class BufferUse;
  struct Entry {
    BufferInfo info;
    Pool* pool = nullptr;  // Null for adopted memory.
    Quotas* quotas = nullptr;  // Where its bytes are counted, if anywhere (until freed).
    char* ptr = nullptr;
    std::shared_ptr<const void> keepalive;
    uint64_t owner_start = 0;  // The owner process's start time (pid reuse check).
    bool doomed = false;  // Released from the map; free when the last use ends.
    uint32_t ending_uses = 0;  // Of info.active_uses, those marked ending.
  };
  static void Free(Entry& entry);
  absl::StatusOr<BufferInfo> AllocateOwn(const AllocateOptions& options);
  // Gives the entry its id, creation time and lease, and makes it findable.
  BufferInfo Insert(std::shared_ptr<Entry> entry, absl::Duration lease_ttl);

  void EndUse(Entry* entry, bool ending);
  void MarkEnding(Entry* entry);
  std::shared_ptr<Entry> FindLocked(const std::string& owner, const std::string& id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  PoolSet* const pools_;
  const absl::Duration default_lease_;
  Quotas* quotas_ = nullptr;
  OwnMemoryMaker own_memory_;
  Scrubber scrub_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Entry>> buffers_ ABSL_GUARDED_BY(mu_);
  absl::BitGen rng_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread reaper_;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_CORE_BUFFER_REGISTRY_H_
