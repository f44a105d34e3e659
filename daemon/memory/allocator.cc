#include "daemon/memory/allocator.h"

#include "absl/strings/str_cat.h"

namespace gpumove {

Allocator::Allocator(uint64_t capacity, uint64_t alignment)
    : capacity_(capacity & ~(alignment - 1)), alignment_(alignment), free_bytes_(0) {
  if (capacity_ > 0) InsertFree(0, capacity_);
}

absl::StatusOr<uint64_t> Allocator::Allocate(uint64_t size) {
  if (size == 0) return absl::InvalidArgumentError("size must be greater than 0");
  if (size > capacity_) {
    return absl::InvalidArgumentError(
        absl::StrCat("size ", size, " exceeds the pool's capacity of ", capacity_, " bytes"));
  }
  const uint64_t rounded = (size + alignment_ - 1) & ~(alignment_ - 1);
  auto best = free_by_size_.lower_bound({rounded, 0});
  if (best == free_by_size_.end()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "no free block of ", rounded, " bytes (", free_bytes_, " bytes free, largest block ",
        largest_free(), ")"));
  }
  const auto [block_size, offset] = *best;
  EraseFree(free_by_offset_.find(offset));
  if (block_size > rounded) InsertFree(offset + rounded, block_size - rounded);
  allocated_[offset] = rounded;
  return offset;
}

absl::Status Allocator::Free(uint64_t offset) {
  auto it = allocated_.find(offset);
  if (it == allocated_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("offset ", offset, " is not allocated"));
  }
  uint64_t start = offset;
  uint64_t size = it->second;
  allocated_.erase(it);
  auto next = free_by_offset_.lower_bound(start);
  if (next != free_by_offset_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      size += prev->second;
      EraseFree(prev);
    }
  }
  next = free_by_offset_.lower_bound(start + size);
  if (next != free_by_offset_.end() && next->first == start + size) {
    size += next->second;
    EraseFree(next);
  }
  InsertFree(start, size);
  return absl::OkStatus();
}

uint64_t Allocator::largest_free() const {
  return free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
}

void Allocator::InsertFree(uint64_t offset, uint64_t size) {
  free_by_offset_.emplace(offset, size);
  free_by_size_.emplace(size, offset);
  free_bytes_ += size;
}

void Allocator::EraseFree(std::map<uint64_t, uint64_t>::iterator it) {
  free_by_size_.erase({it->second, it->first});
  free_bytes_ -= it->second;
  free_by_offset_.erase(it);
}

}  // namespace gpumove
