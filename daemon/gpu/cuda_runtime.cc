// The CUDA runtime: compiled only when the toolkit was found at build time. Here are its
// creation (GpuRuntime::Create), device and page-locked memory, and CUDA IPC handles.
#ifdef GPUMOVE_HAVE_CUDA

#include <cuda_runtime.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "daemon/gpu/cuda_internal.h"
#include "daemon/gpu/gpu.h"

namespace gpumove {
namespace cuda_internal {

std::string CudaRuntime::status() const {
  std::vector<std::string> names;
  for (const GpuDevice& d : devices_) names.push_back(absl::StrCat(d.index, ":", d.name));
  return absl::StrCat(devices_.size(), " GPU(s): ", absl::StrJoin(names, ", "));
}

absl::Status CudaRuntime::UseOnThisThread(int device) {
  // CUDA 12 and later make the primary context current here (and create it).
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  return absl::OkStatus();
}

absl::StatusOr<void*> CudaRuntime::DeviceAlloc(int device, uint64_t bytes) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  void* ptr = nullptr;
  cudaError_t err = cudaMalloc(&ptr, bytes);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrCat("cudaMalloc of ", bytes, " bytes on GPU ", device, ": out of memory"));
  }
  if (err != cudaSuccess) return CudaError(err, "cudaMalloc");
  return ptr;
}

absl::Status CudaRuntime::Zero(int device, void* ptr, uint64_t bytes) {
  if (device == kHostDevice) return GpuRuntime::Zero(device, ptr, bytes);
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  cudaStream_t stream = nullptr;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaError_t err = cudaMemsetAsync(ptr, 0, bytes, stream);
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
  if (err != cudaSuccess) return CudaError(err, "cudaMemsetAsync");
  return absl::OkStatus();
}

void CudaRuntime::DeviceFree(int device, void* ptr) {
  cudaSetDevice(device);
  cudaFree(ptr);
}

absl::StatusOr<void*> CudaRuntime::PinnedAlloc(uint64_t bytes) {
  void* ptr = nullptr;
  CUDA_RETURN_IF_ERROR(cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable));
  return ptr;
}

void CudaRuntime::PinnedFree(void* ptr) { cudaFreeHost(ptr); }

absl::Status CudaRuntime::HostRegister(void* ptr, uint64_t bytes) {
  // Mapped: kernels (the gather of vectored moves) reach it as they reach cudaHostAlloc's.
  CUDA_RETURN_IF_ERROR(
      cudaHostRegister(ptr, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped));
  return absl::OkStatus();
}

void CudaRuntime::HostUnregister(void* ptr) { cudaHostUnregister(ptr); }

absl::StatusOr<std::string> CudaRuntime::IpcExport(int device, void* base) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  cudaIpcMemHandle_t handle;
  CUDA_RETURN_IF_ERROR(cudaIpcGetMemHandle(&handle, base));
  return std::string(handle.reserved, sizeof(handle.reserved));
}

absl::StatusOr<GpuRuntime::IpcMapping> CudaRuntime::IpcOpen(int device, const std::string& handle) {
  cudaIpcMemHandle_t h;
  if (handle.size() != sizeof(h.reserved)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a CUDA IPC handle has ", sizeof(h.reserved), " bytes, not ", handle.size()));
  }
  std::memcpy(h.reserved, handle.data(), sizeof(h.reserved));
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  void* ptr = nullptr;
  cudaError_t err = cudaIpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess);
  if (err != cudaSuccess) {
    cudaGetLastError();  // Not sticky: clear it.
    return absl::InvalidArgumentError(absl::StrCat("cudaIpcOpenMemHandle: ", cudaGetErrorName(err),
                                                   ": ", cudaGetErrorString(err)));
  }
  IpcMapping m;
  m.base = static_cast<char*>(ptr);
  // The allocation's size, from the driver: offsets and lengths are checked against it.
  size_t size = 0;
  if (get_address_range_ != nullptr) {
    unsigned long long base = 0;
    if (get_address_range_(&base, &size, reinterpret_cast<unsigned long long>(ptr)) != 0 ||
        base != reinterpret_cast<unsigned long long>(ptr)) {
      size = 0;
    }
  }
  if (size == 0) {
    cudaIpcCloseMemHandle(ptr);
    return absl::InternalError("cannot learn the size of the mapped allocation");
  }
  m.size = size;
  return m;
}

void CudaRuntime::IpcClose(int device, void* base) {
  cudaSetDevice(device);
  cudaIpcCloseMemHandle(base);
}

CudaRuntime::AddressRangeFn CudaRuntime::FindAddressRange() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found;
  if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault,
                                       &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    return static_cast<AddressRangeFn>(nullptr);
  }
  return reinterpret_cast<AddressRangeFn>(fn);
}

}  // namespace cuda_internal

std::unique_ptr<GpuRuntime> GpuRuntime::Create() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    // Without a driver CUDA says "CUDA driver version is insufficient for CUDA runtime
    // version", which sends people after the wrong fix.
    if ((err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice) &&
        access("/proc/driver/nvidia/version", F_OK) != 0) {
      return CreateHostOnly("no NVIDIA driver found (no /proc/driver/nvidia)");
    }
    return CreateHostOnly(absl::StrCat("cudaGetDeviceCount: ", cudaGetErrorString(err)));
  }
  if (count == 0) return CreateHostOnly("the NVIDIA driver sees no GPU");
  std::vector<GpuDevice> devices;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    GpuDevice d;
    d.index = i;
    d.name = prop.name;
    d.uuid = FormatGpuUuid(prop.uuid.bytes);
    d.total_memory = prop.totalGlobalMem;
    d.pci_bus_id =
        absl::StrFormat("%08x:%02x:%02x.0", prop.pciDomainID, prop.pciBusID, prop.pciDeviceID);
    for (int j = 0; j < count; ++j) {
      int can = 0;
      if (j == i || cudaDeviceCanAccessPeer(&can, i, j) != cudaSuccess || !can) continue;
      cudaSetDevice(i);
      cudaError_t e = cudaDeviceEnablePeerAccess(j, 0);
      if (e == cudaSuccess || e == cudaErrorPeerAccessAlreadyEnabled) d.peer_access.push_back(j);
      cudaGetLastError();
    }
    devices.push_back(std::move(d));
  }
  if (devices.empty()) return CreateHostOnly("no CUDA device answered cudaGetDeviceProperties");
  return std::make_unique<cuda_internal::CudaRuntime>(std::move(devices));
}

}  // namespace gpumove

#endif  // GPUMOVE_HAVE_CUDA
