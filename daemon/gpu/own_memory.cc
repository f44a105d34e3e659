#include "daemon/gpu/own_memory.h"

#include "absl/strings/str_cat.h"

namespace gpumove {

absl::StatusOr<OwnDeviceMemory::Allocation> OwnDeviceMemory::Allocate(int device, uint64_t size) {
  bool known = false;
  for (const GpuDevice& d : gpu_->devices()) known |= d.index == device;
  if (!known) return absl::InvalidArgumentError(absl::StrCat("no GPU ", device, " here"));
  if (size == 0) return absl::InvalidArgumentError("size must be greater than 0");
  if (size > limit_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "an exportable buffer of ", size, " bytes is over this node's limit for them (",
        limit_, " bytes per GPU, --exportable_bytes_per_gpu)"));
  }
  const uint64_t rounded = (size + kGranule - 1) / kGranule * kGranule;
  {
    absl::MutexLock lock(&mu_);
    uint64_t& used = used_[device];
    if (rounded > limit_ - used) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "exportable buffers on GPU ", device, " use ", used, " of ", limit_,
          " bytes (--exportable_bytes_per_gpu; each takes whole 2 MiB granules)"));
    }
    used += rounded;
  }
  auto unreserve = [&] {
    absl::MutexLock lock(&mu_);
    used_[device] -= rounded;
  };
  auto ptr = gpu_->DeviceAlloc(device, rounded);
  if (!ptr.ok()) {
    unreserve();
    return ptr.status();
  }
  char* data = static_cast<char*>(*ptr);
  // Zeroed, padding included: the handle maps every granule, and the driver's memory may
  // hold what an earlier buffer of another tenant left.
  absl::Status st = gpu_->Zero(device, data, rounded);
  if (st.ok()) st = ipc_->Export(device, data, rounded, IpcTable::Scope::kOneBuffer);
  if (!st.ok()) {
    gpu_->DeviceFree(device, data);
    unreserve();
    return st;
  }
  Allocation a;
  a.data = data;
  a.keepalive = std::shared_ptr<const void>(
      data, [this, device, rounded](const void* p) {
        Free(device, static_cast<char*>(const_cast<void*>(p)), rounded);
      });
  return a;
}

void OwnDeviceMemory::Free(int device, char* data, uint64_t rounded) {
  ipc_->Unexport(data);
  gpu_->DeviceFree(device, data);
  absl::MutexLock lock(&mu_);
  used_[device] -= rounded;
}

uint64_t OwnDeviceMemory::used(int device) const {
  absl::MutexLock lock(&mu_);
  auto it = used_.find(device);
  return it == used_.end() ? 0 : it->second;
}

}  // namespace gpumove
