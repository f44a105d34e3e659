// Offset allocator over one contiguous range: best-fit, aligned, coalescing on free.
//
// It hands out offsets, not pointers, so the same code carves host, pinned and device
// memory. Not thread-safe: the owning Pool serializes calls.
#ifndef GPUMOVE_DAEMON_MEMORY_ALLOCATOR_H_
#define GPUMOVE_DAEMON_MEMORY_ALLOCATOR_H_

#include <cstdint>
#include <map>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace gpumove {

class Allocator {
 public:
  // `alignment` must be a power of two; every offset returned is a multiple of it and
  // every block is rounded up to it.
  Allocator(uint64_t capacity, uint64_t alignment);

  // The offset of a free block of at least `size` bytes. INVALID_ARGUMENT for 0 or more
  // than the capacity, RESOURCE_EXHAUSTED when no free block is big enough.
  absl::StatusOr<uint64_t> Allocate(uint64_t size);
  // Returns a block from Allocate; merges it with free neighbours. INVALID_ARGUMENT for an
  // offset that is not an allocated block (nothing changes).
  absl::Status Free(uint64_t offset);

  uint64_t capacity() const { return capacity_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t free_bytes() const { return free_bytes_; }
  uint64_t largest_free() const;
  size_t allocations() const { return allocated_.size(); }
  size_t free_blocks() const { return free_by_offset_.size(); }

 private:
  void InsertFree(uint64_t offset, uint64_t size);
  void EraseFree(std::map<uint64_t, uint64_t>::iterator it);

  const uint64_t capacity_;
  const uint64_t alignment_;
  uint64_t free_bytes_;
  std::map<uint64_t, uint64_t> free_by_offset_;            // offset -> size
  std::set<std::pair<uint64_t, uint64_t>> free_by_size_;   // (size, offset)
  absl::flat_hash_map<uint64_t, uint64_t> allocated_;      // offset -> rounded size
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_MEMORY_ALLOCATOR_H_
