// The gather/scatter copy kernel of vectored moves: one launch copies many pieces, each
// from src + piece.src to dst + piece.dst, where src and dst are addresses the kernel's
// device reaches (its own memory, or mapped page-locked host memory).
#ifndef GPUMOVE_DAEMON_GPU_GATHER_H_
#define GPUMOVE_DAEMON_GPU_GATHER_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace gpumove {

// A piece as the kernel takes it: at most kGatherPieceMax bytes (longer pieces are cut).
struct GatherPiece {
  uint64_t src;
  uint64_t dst;
  uint64_t length;
};
inline constexpr uint64_t kGatherPieceMax = 64 << 10;

// Queues the copy of `n` pieces (`pieces` in device memory) on `stream`.
cudaError_t LaunchGather(const GatherPiece* pieces, uint64_t n, const char* src, char* dst,
                         cudaStream_t stream);

// Queues the xxh3 block sums (daemon/common/xxh3_split.h) of `blocks` 1 KiB blocks at
// `data` (8-byte aligned) into out[8 * b + lane] on `stream`; `out` is an address the
// kernel's device reaches (its memory, or mapped page-locked host memory).
cudaError_t LaunchXxh3Sums(const char* data, uint64_t blocks, uint64_t* out,
                           cudaStream_t stream);

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_GPU_GATHER_H_
