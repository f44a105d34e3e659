// Where the CUDA runtime's gathers read their descriptors: rooms of mapped page-locked
// memory, piece lists written into them at their Submit (StagePieces), and kept lists'
// descriptors left on the GPU for their next gathers.
#ifdef GPUMOVE_HAVE_CUDA

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "daemon/gpu/cuda_internal.h"

namespace gpumove {
namespace cuda_internal {

#ifdef GPUMOVE_HAVE_GATHER
absl::StatusOr<DescriptorRoom> NewDescriptorRoom(uint64_t n) {
  uint64_t want = 4096;
  while (want < n) want *= 2;
  DescriptorRoom r;
  void* p = nullptr;
  CUDA_RETURN_IF_ERROR(
      cudaHostAlloc(&p, want * sizeof(GatherPiece), cudaHostAllocMapped | cudaHostAllocPortable));
  r.host = static_cast<GatherPiece*>(p);
  void* d = nullptr;
  if (cudaError_t err = cudaHostGetDevicePointer(&d, p, 0); err != cudaSuccess) {
    cudaFreeHost(p);
    return CudaError(err, "cudaHostGetDevicePointer");
  }
  r.mapped = static_cast<GatherPiece*>(d);
  r.capacity = want;
  return r;
}

void FreeDescriptorRoom(const DescriptorRoom& r) {
  if (r.host != nullptr) cudaFreeHost(r.host);
}

KeptDescriptors::~KeptDescriptors() {
  if (pieces == nullptr) return;
  int current = 0;
  cudaGetDevice(&current);
  cudaSetDevice(device);
  cudaFree(pieces);
  cudaSetDevice(current);
}

// A staged list is its pieces' bytes as they are: the kernel's descriptors are laid out
// as pieces are.
static_assert(sizeof(Segment) == sizeof(GatherPiece) && offsetof(Segment, src) == 0 &&
              offsetof(GatherPiece, src) == 0 && offsetof(Segment, dst) == 8 &&
              offsetof(GatherPiece, dst) == 8 && offsetof(Segment, length) == 16 &&
              offsetof(GatherPiece, length) == 16);

void CudaRuntime::StagePieces(const std::shared_ptr<const void>& owner, const Segment* pieces,
                              size_t n) {
  if (devices_.empty() || n < kStageMin || n * sizeof(GatherPiece) > kStagedBytes / 2) return;
  uint64_t total = 0, longest = 0;
  for (size_t i = 0; i < n; ++i) {
    total += pieces[i].length;
    longest = std::max(longest, pieces[i].length);
  }
  // Pieces the kernel takes in cuts: the move's thread writes their descriptors.
  if (longest > kGatherPieceMax) return;
  StagedList s;
  {
    absl::MutexLock lock(&staged_mu_);
    auto best = spare_.end();
    for (auto it = spare_.begin(); it != spare_.end(); ++it) {
      if (it->capacity >= n && (best == spare_.end() || it->capacity < best->capacity)) best = it;
    }
    if (best != spare_.end()) {
      s.room = *best;
      spare_.erase(best);
    }
  }
  if (s.room.host == nullptr) {
    auto room = NewDescriptorRoom(n);
    if (!room.ok()) {
      cudaGetLastError();
      return;
    }
    s.room = *room;
  }
  std::memcpy(s.room.host, pieces, n * sizeof(Segment));
  s.owner = owner;
  s.pieces = pieces;
  s.n = n;
  s.total = total;
  std::vector<DescriptorRoom> freed;  // Let go outside the lock.
  {
    absl::MutexLock lock(&staged_mu_);
    // Lists whose moves ended (or were refused) give their rooms back; past the cap,
    // spare rooms go first, then the oldest lists.
    uint64_t bytes = s.room.capacity * sizeof(GatherPiece);
    for (auto it = staged_.begin(); it != staged_.end();) {
      if (it->owner.expired()) {
        spare_.push_back(it->room);
        it = staged_.erase(it);
      } else {
        bytes += it->room.capacity * sizeof(GatherPiece);
        ++it;
      }
    }
    for (const DescriptorRoom& r : spare_) bytes += r.capacity * sizeof(GatherPiece);
    while (bytes > kStagedBytes && !spare_.empty()) {
      bytes -= spare_.front().capacity * sizeof(GatherPiece);
      freed.push_back(spare_.front());
      spare_.erase(spare_.begin());
    }
    while (bytes > kStagedBytes && !staged_.empty()) {
      bytes -= staged_.front().room.capacity * sizeof(GatherPiece);
      freed.push_back(staged_.front().room);
      staged_.erase(staged_.begin());
    }
    staged_.push_back(std::move(s));
  }
  for (const DescriptorRoom& r : freed) FreeDescriptorRoom(r);
}

std::optional<CudaRuntime::StagedList> CudaRuntime::TakeStaged(const Segment* pieces, size_t n) {
  absl::MutexLock lock(&staged_mu_);
  for (auto it = staged_.begin(); it != staged_.end(); ++it) {
    if (it->pieces != pieces || it->n != n) continue;
    StagedList s = std::move(*it);
    staged_.erase(it);
    if (s.owner.lock() != nullptr) return s;
    spare_.push_back(s.room);  // Another list's, gone: this one only has its address.
    return std::nullopt;
  }
  return std::nullopt;
}

void CudaRuntime::GiveBackRoom(const DescriptorRoom& room) {
  absl::MutexLock lock(&staged_mu_);
  spare_.push_back(room);
}

std::shared_ptr<const KeptDescriptors> CudaRuntime::FindKept(int device, uint64_t serial,
                                                             uint64_t round_bytes) {
  absl::MutexLock lock(&kept_mu_);
  for (auto it = kept_.begin(); it != kept_.end(); ++it) {
    if ((*it)->device == device && (*it)->serial == serial && (*it)->round_bytes == round_bytes) {
      auto found = *it;
      kept_.erase(it);
      kept_.push_back(found);  // Most recently used last.
      return found;
    }
  }
  return nullptr;
}

void CudaRuntime::Keep(std::shared_ptr<const KeptDescriptors> k) {
  std::vector<std::shared_ptr<const KeptDescriptors>> dropped;  // Freed outside the lock.
  absl::MutexLock lock(&kept_mu_);
  uint64_t bytes = k->bytes;
  for (const auto& e : kept_) bytes += e->bytes;
  while (!kept_.empty() && (kept_.size() >= kKeptLists || bytes > kKeptBytes)) {
    bytes -= kept_.front()->bytes;
    dropped.push_back(std::move(kept_.front()));
    kept_.erase(kept_.begin());
  }
  if (k->bytes <= kKeptBytes) kept_.push_back(std::move(k));
}
#endif

}  // namespace cuda_internal
}  // namespace gpumove

#endif  // GPUMOVE_HAVE_CUDA
