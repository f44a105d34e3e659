// What deploy/gpu/raw_gather.cu and gather_variants.cu share: a CUDA call checked (the
// program ends on an error), and the raw gather kernel of the vectored benchmark's
// baseline (b): a thread block per block, 16-byte loads and stores, block indices already
// on the GPU.
#ifndef GPUMOVE_DEPLOY_GPU_RAW_GATHER_H_
#define GPUMOVE_DEPLOY_GPU_RAW_GATHER_H_

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CHECK(call)                                                    \
  do {                                                                 \
    cudaError_t e_ = (call);                                           \
    if (e_ != cudaSuccess) {                                           \
      std::fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                    \
    }                                                                  \
  } while (0)

__global__ void GatherBlocks(const unsigned long long* src_idx, const unsigned long long* dst_idx,
                             unsigned long long block, const char* src, char* dst) {
  const uint4* s = reinterpret_cast<const uint4*>(src + src_idx[blockIdx.x] * block);
  uint4* d = reinterpret_cast<uint4*>(dst + dst_idx[blockIdx.x] * block);
  for (unsigned long long i = threadIdx.x; i < block / 16; i += blockDim.x) d[i] = s[i];
}

#endif  // GPUMOVE_DEPLOY_GPU_RAW_GATHER_H_
