// Helper for tests/gpu_ipc_test: a client process that lends part of its own GPU memory
// to a daemon (Import with its pid as owner), prints the buffer id and waits to be killed.
//   gpu_ipc_client ADDRESS SIZE BYTE
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "client/gpumove_client.h"
#include "daemon/gpu/gpu.h"

#ifdef GPUMOVE_HAVE_CUDA
#include <cuda_runtime.h>
#endif

int main(int argc, char** argv) {
#ifdef GPUMOVE_HAVE_CUDA
  if (argc != 4) return 2;
  const size_t size = std::strtoull(argv[2], nullptr, 10);
  void* mem = nullptr;
  if (cudaMalloc(&mem, size) != cudaSuccess) return 3;
  cudaMemset(mem, std::atoi(argv[3]), size);
  cudaDeviceSynchronize();
  cudaIpcMemHandle_t handle;
  if (cudaIpcGetMemHandle(&handle, mem) != cudaSuccess) return 4;
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  const std::string uuid = gpumove::FormatGpuUuid(prop.uuid.bytes);
  auto client = gpumove::Client::Connect(argv[1]);
  if (!client.ok()) return 5;
  gpumove::v1::ImportRequest request;
  request.set_cuda_ipc_handle(std::string(handle.reserved, sizeof(handle.reserved)));
  request.set_size(size);
  request.set_device_uuid(uuid);
  request.set_owner_pid(getpid());
  request.set_label("child");
  auto buffer = (*client)->Import(request);
  if (!buffer.ok()) {
    std::fprintf(stderr, "import: %s\n", buffer.status().ToString().c_str());
    return 6;
  }
  std::printf("%s\n", buffer->id().c_str());
  std::fflush(stdout);
  pause();
#endif
  return 0;
}
