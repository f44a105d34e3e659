#include "daemon/gpu/gather.h"

namespace gpumove {
namespace {

constexpr int kThreads = 256;

// A thread block per piece: 16-byte loads and stores when both ends share their
// alignment (bytes before and after the aligned middle one at a time), else bytes.
__global__ void Gather(const GatherPiece* pieces, const char* src, char* dst) {
  const GatherPiece p = pieces[blockIdx.x];
  const char* s = src + p.src;
  char* d = dst + p.dst;
  uint64_t len = p.length;
  const uint64_t s_mis = reinterpret_cast<uintptr_t>(s) & 15;
  if (s_mis == (reinterpret_cast<uintptr_t>(d) & 15)) {
    const uint64_t head = s_mis == 0 ? 0 : (len < 16 - s_mis ? len : 16 - s_mis);
    if (threadIdx.x < head) d[threadIdx.x] = s[threadIdx.x];
    s += head;
    d += head;
    len -= head;
    const uint64_t vectors = len / 16;
    const uint4* s4 = reinterpret_cast<const uint4*>(s);
    uint4* d4 = reinterpret_cast<uint4*>(d);
    for (uint64_t i = threadIdx.x; i < vectors; i += kThreads) d4[i] = s4[i];
    const uint64_t tail = len - vectors * 16;
    if (threadIdx.x < tail) d[vectors * 16 + threadIdx.x] = s[vectors * 16 + threadIdx.x];
    return;
  }
  for (uint64_t i = threadIdx.x; i < len; i += kThreads) d[i] = s[i];
}

}  // namespace

cudaError_t LaunchGather(const GatherPiece* pieces, uint64_t n, const char* src, char* dst,
                         cudaStream_t stream) {
  // Grids of at most 2^31 - 1 blocks.
  constexpr uint64_t kMaxGrid = (1ull << 31) - 1;
  for (uint64_t first = 0; first < n; first += kMaxGrid) {
    const uint64_t count = n - first < kMaxGrid ? n - first : kMaxGrid;
    Gather<<<static_cast<unsigned>(count), kThreads, 0, stream>>>(pieces + first, src, dst);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace gpumove
