// The CUDA runtime: compiled only when the toolkit was found at build time.
#ifdef GPUMOVE_HAVE_CUDA

#include <cuda_runtime.h>

#include <array>
#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "daemon/common/host_copy.h"
#include "daemon/gpu/gpu.h"

namespace gpumove {
namespace {

absl::Status CudaError(cudaError_t err, absl::string_view what) {
  return absl::InternalError(
      absl::StrCat(what, ": ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
}

#define CUDA_RETURN_IF_ERROR(call)                       \
  do {                                                   \
    cudaError_t cuda_err_ = (call);                      \
    if (cuda_err_ != cudaSuccess) return CudaError(cuda_err_, #call); \
  } while (0)

// Streams and events are per thread and per device, created on first use and kept for
// the thread's life: copies on different threads never serialize on one stream.
struct ThreadStreams {
  struct PerDevice {
    cudaStream_t stream = nullptr;
    std::array<cudaEvent_t, 2> done{};
  };
  std::map<int, PerDevice> devices;
  ~ThreadStreams() {
    for (auto& [device, d] : devices) {
      cudaSetDevice(device);
      for (cudaEvent_t e : d.done) cudaEventDestroy(e);
      cudaStreamDestroy(d.stream);
    }
  }
};

absl::StatusOr<ThreadStreams::PerDevice*> StreamsFor(int device) {
  thread_local ThreadStreams streams;
  auto it = streams.devices.find(device);
  if (it != streams.devices.end()) return &it->second;
  ThreadStreams::PerDevice d;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking));
  for (cudaEvent_t& e : d.done) {
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  return &streams.devices.emplace(device, d).first->second;
}

class CudaRuntime : public GpuRuntime {
 public:
  CudaRuntime(std::vector<GpuDevice> devices) : devices_(std::move(devices)) {}

  bool cuda_compiled() const override { return true; }
  std::string status() const override {
    std::vector<std::string> names;
    for (const GpuDevice& d : devices_) names.push_back(absl::StrCat(d.index, ":", d.name));
    return absl::StrCat(devices_.size(), " GPU(s): ", absl::StrJoin(names, ", "));
  }
  const std::vector<GpuDevice>& devices() const override { return devices_; }

  absl::StatusOr<void*> DeviceAlloc(int device, uint64_t bytes) override {
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
  void DeviceFree(int device, void* ptr) override {
    cudaSetDevice(device);
    cudaFree(ptr);
  }
  absl::StatusOr<void*> PinnedAlloc(uint64_t bytes) override {
    void* ptr = nullptr;
    CUDA_RETURN_IF_ERROR(cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable));
    return ptr;
  }
  void PinnedFree(void* ptr) override { cudaFreeHost(ptr); }
  absl::Status HostRegister(void* ptr, uint64_t bytes) override {
    CUDA_RETURN_IF_ERROR(cudaHostRegister(ptr, bytes, cudaHostRegisterPortable));
    return absl::OkStatus();
  }
  void HostUnregister(void* ptr) override { cudaHostUnregister(ptr); }

  absl::StatusOr<std::string> IpcExport(int device, void* base) override {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    cudaIpcMemHandle_t handle;
    CUDA_RETURN_IF_ERROR(cudaIpcGetMemHandle(&handle, base));
    return std::string(handle.reserved, sizeof(handle.reserved));
  }

  absl::StatusOr<IpcMapping> IpcOpen(int device, const std::string& handle) override {
    cudaIpcMemHandle_t h;
    if (handle.size() != sizeof(h.reserved)) {
      return absl::InvalidArgumentError(absl::StrCat("a CUDA IPC handle has ", sizeof(h.reserved),
                                                     " bytes, not ", handle.size()));
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

  void IpcClose(int device, void* base) override {
    cudaSetDevice(device);
    cudaIpcCloseMemHandle(base);
  }

  absl::Status Copy(void* dst, int dst_device, const void* src, int src_device, uint64_t bytes,
                    uint64_t chunk, const CopyProgress& progress) override {
    if (chunk == 0) chunk = bytes;
    if (dst_device == kHostDevice && src_device == kHostDevice) {
      uint64_t done = 0;
      while (done < bytes) {
        const uint64_t n = std::min(chunk, bytes - done);
        HostCopy(static_cast<char*>(dst) + done, static_cast<const char*>(src) + done, n);
        done += n;
        if (progress && !progress(done) && done < bytes) return absl::CancelledError("copy stopped");
      }
      return absl::OkStatus();
    }
    // Issue on the source GPU when there is one: for peer copies that is the side whose
    // copy engines push over NVLink.
    const int device = src_device != kHostDevice ? src_device : dst_device;
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    auto streams = StreamsFor(device);
    if (!streams.ok()) return streams.status();
    ThreadStreams::PerDevice& s = **streams;

    // Chunk k+1 is queued before chunk k is waited for, so the copy engine never idles.
    uint64_t issued = 0, landed = 0;
    int slot = 0;
    bool stop = false;
    auto issue = [&]() -> absl::Status {
      const uint64_t n = std::min(chunk, bytes - issued);
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(static_cast<char*>(dst) + issued,
                                           static_cast<const char*>(src) + issued, n,
                                           cudaMemcpyDefault, s.stream));
      CUDA_RETURN_IF_ERROR(cudaEventRecord(s.done[slot], s.stream));
      slot ^= 1;
      issued += n;
      return absl::OkStatus();
    };
    std::array<uint64_t, 2> slot_end{};
    slot_end[slot] = std::min(chunk, bytes);
    if (auto st = issue(); !st.ok()) return st;
    int wait_slot = 0;
    while (landed < bytes) {
      if (issued < bytes && !stop) {
        slot_end[slot] = issued + std::min(chunk, bytes - issued);
        if (auto st = issue(); !st.ok()) return st;
      }
      CUDA_RETURN_IF_ERROR(cudaEventSynchronize(s.done[wait_slot]));
      landed = slot_end[wait_slot];
      wait_slot ^= 1;
      if (progress && !progress(landed) && landed < bytes) stop = true;
      if (stop && landed == issued) break;
    }
    if (landed < bytes) return absl::CancelledError("copy stopped");
    return absl::OkStatus();
  }

 private:
  std::vector<GpuDevice> devices_;
  // cuMemGetAddressRange, reached through the runtime (no link against libcuda).
  using AddressRangeFn = int (*)(unsigned long long*, size_t*, unsigned long long);
  AddressRangeFn get_address_range_ = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return static_cast<AddressRangeFn>(nullptr);
    }
    return reinterpret_cast<AddressRangeFn>(fn);
  }();
};

}  // namespace

std::unique_ptr<GpuRuntime> GpuRuntime::Create() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return CreateHostOnly(absl::StrCat("cudaGetDeviceCount: ", cudaGetErrorString(err)));
  }
  if (count == 0) return CreateHostOnly("cudaGetDeviceCount found 0 devices");
  std::vector<GpuDevice> devices;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    GpuDevice d;
    d.index = i;
    d.name = prop.name;
    d.uuid = FormatGpuUuid(prop.uuid.bytes);
    d.total_memory = prop.totalGlobalMem;
    d.pci_bus_id = absl::StrFormat("%08x:%02x:%02x.0", prop.pciDomainID, prop.pciBusID,
                                   prop.pciDeviceID);
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
  return std::make_unique<CudaRuntime>(std::move(devices));
}

}  // namespace gpumove

#endif  // GPUMOVE_HAVE_CUDA
