#include "daemon/gpu/gather.h"

#include "daemon/common/xxh3_split.h"

namespace gpumove {
namespace {

constexpr int kThreads = 256;

// A warp per piece, eight 16-byte loads in flight a lane before their stores (a thread
// block per piece with one load a thread kept too few bytes in flight for 4 KiB pieces),
// when both ends share their alignment (bytes before and after the aligned middle one at
// a time); else bytes, eight a lane at a time.
constexpr unsigned kWarp = 32;
constexpr int kUnroll = 8;
constexpr uint64_t kPiecesPerBlock = kThreads / kWarp;

__global__ void Gather(const GatherPiece* pieces, uint64_t n, const char* src, char* dst) {
  const uint64_t w = (static_cast<uint64_t>(blockIdx.x) * kThreads + threadIdx.x) / kWarp;
  if (w >= n) return;
  const unsigned lane = threadIdx.x % kWarp;
  const GatherPiece p = pieces[w];
  const char* s = src + p.src;
  char* d = dst + p.dst;
  uint64_t len = p.length;
  const uint64_t s_mis = reinterpret_cast<uintptr_t>(s) & 15;
  if (s_mis == (reinterpret_cast<uintptr_t>(d) & 15)) {
    const uint64_t head = s_mis == 0 ? 0 : (len < 16 - s_mis ? len : 16 - s_mis);
    if (lane < head) d[lane] = s[lane];
    s += head;
    d += head;
    len -= head;
    const uint64_t vectors = len / 16;
    const uint4* s4 = reinterpret_cast<const uint4*>(s);
    uint4* d4 = reinterpret_cast<uint4*>(d);
    uint64_t i = lane;
    for (; i + (kUnroll - 1) * kWarp < vectors; i += kUnroll * kWarp) {
      uint4 r[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) r[u] = s4[i + u * kWarp];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) d4[i + u * kWarp] = r[u];
    }
    for (; i < vectors; i += kWarp) d4[i] = s4[i];
    const uint64_t tail = len - vectors * 16;
    if (lane < tail) d[vectors * 16 + lane] = s[vectors * 16 + lane];
    return;
  }
  uint64_t i = lane;
  for (; i + (kUnroll - 1) * kWarp < len; i += kUnroll * kWarp) {
    char r[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) r[u] = s[i + u * kWarp];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) d[i + u * kWarp] = r[u];
  }
  for (; i < len; i += kWarp) d[i] = s[i];
}

struct StripeSecret {
  uint64_t w[kXxh3StripeWords];
};

// Eight threads a block, one a lane: lane i of stripe n adds its neighbour's word (lane
// i ^ 1, the next thread over: a shuffle) and the product of the halves of its own word
// xor the secret's word n + i. Consecutive threads read consecutive words.
__global__ void Xxh3Sums(const uint64_t* data, uint64_t blocks, uint64_t* out, StripeSecret s) {
  __shared__ uint64_t secret[kXxh3StripeWords];
  if (threadIdx.x < kXxh3StripeWords) secret[threadIdx.x] = s.w[threadIdx.x];
  __syncthreads();
  const uint64_t t = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const uint64_t b = t / kXxh3Lanes;
  const int lane = static_cast<int>(t % kXxh3Lanes);
  // Whole warps take part in the shuffles: threads past the end read block 0 and store
  // nothing.
  const uint64_t* block = data + (b < blocks ? b : 0) * (kXxh3Block / 8);
  uint64_t sum = 0;
#pragma unroll
  for (int n = 0; n < 16; ++n) {
    const uint64_t mine = block[n * kXxh3Lanes + lane];
    const uint64_t other = __shfl_xor_sync(0xffffffffu, mine, 1);
    const uint64_t key = mine ^ secret[n + lane];
    sum += other + (key & 0xffffffffull) * (key >> 32);
  }
  if (b < blocks) out[t] = sum;
}

}  // namespace

cudaError_t LaunchXxh3Sums(const char* data, uint64_t blocks, uint64_t* out,
                           cudaStream_t stream) {
  if (blocks == 0) return cudaSuccess;
  StripeSecret s;
  for (int w = 0; w < kXxh3StripeWords; ++w) s.w[w] = kXxh3StripeSecret[w];
  const uint64_t threads = blocks * kXxh3Lanes;
  const uint64_t grid = (threads + kThreads - 1) / kThreads;
  if (grid > (1ull << 31) - 1) return cudaErrorInvalidValue;
  Xxh3Sums<<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(
      reinterpret_cast<const uint64_t*>(data), blocks, out, s);
  return cudaGetLastError();
}

cudaError_t LaunchGather(const GatherPiece* pieces, uint64_t n, const char* src, char* dst,
                         cudaStream_t stream) {
  // Grids of at most 2^31 - 1 blocks.
  constexpr uint64_t kMaxPieces = ((1ull << 31) - 1) * kPiecesPerBlock;
  for (uint64_t first = 0; first < n; first += kMaxPieces) {
    const uint64_t count = n - first < kMaxPieces ? n - first : kMaxPieces;
    const uint64_t grid = (count + kPiecesPerBlock - 1) / kPiecesPerBlock;
    Gather<<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(pieces + first, count, src, dst);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace gpumove
