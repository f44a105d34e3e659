// CHECK_CUDA for the raw CUDA programs of deploy/gpu (built there with nvcc -I.): a failed
// CUDA call ends the program with its text.
#ifndef GPUMOVE_CLIENT_BENCH_CUDA_CHECK_H_
#define GPUMOVE_CLIENT_BENCH_CUDA_CHECK_H_

#ifdef GPUMOVE_HAVE_CUDA
#include <cuda_runtime.h>

#include <cstdlib>
#include <iostream>

#define CHECK_CUDA(x)                                                \
  do {                                                               \
    cudaError_t check_cuda_error = (x);                              \
    if (check_cuda_error != cudaSuccess) {                           \
      std::cerr << #x << ": " << cudaGetErrorString(check_cuda_error) \
                << "\n";                                             \
      std::exit(1);                                                  \
    }                                                                \
  } while (0)
#endif

#endif  // GPUMOVE_CLIENT_BENCH_CUDA_CHECK_H_
