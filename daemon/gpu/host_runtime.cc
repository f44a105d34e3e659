// The runtime without a GPU: no devices, copies are memcpy.
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/common/host_copy.h"
#include "daemon/gpu/gpu.h"

namespace gpumove {
namespace {

class HostOnlyRuntime : public GpuRuntime {
 public:
  explicit HostOnlyRuntime(std::string why) : why_(std::move(why)) {}

  bool cuda_compiled() const override {
#ifdef GPUMOVE_HAVE_CUDA
    return true;
#else
    return false;
#endif
  }
  std::string status() const override { return absl::StrCat("no GPU: ", why_, "; host pools only"); }
  const std::vector<GpuDevice>& devices() const override { return devices_; }

  absl::StatusOr<void*> DeviceAlloc(int device, uint64_t) override {
    return absl::FailedPreconditionError(absl::StrCat("no GPU ", device, " on this node: ", why_));
  }
  void DeviceFree(int, void*) override {}
  absl::StatusOr<void*> PinnedAlloc(uint64_t) override {
    return absl::UnavailableError("no CUDA driver to pin memory with");
  }
  void PinnedFree(void*) override {}

  absl::Status Copy(void* dst, int dst_device, const void* src, int src_device, uint64_t bytes,
                    uint64_t chunk, const CopyProgress& progress) override {
    if (dst_device != kHostDevice || src_device != kHostDevice) {
      return absl::FailedPreconditionError("device copy requested on a node without GPUs");
    }
    if (chunk == 0) chunk = bytes;
    uint64_t done = 0;
    while (done < bytes) {
      const uint64_t n = std::min(chunk, bytes - done);
      HostCopy(static_cast<char*>(dst) + done, static_cast<const char*>(src) + done, n);
      done += n;
      if (progress && !progress(done) && done < bytes) {
        return absl::CancelledError("copy stopped");
      }
    }
    return absl::OkStatus();
  }

 private:
  std::string why_;
  std::vector<GpuDevice> devices_;
};

}  // namespace

std::string FormatGpuUuid(const void* bytes16) {
  const auto* b = static_cast<const unsigned char*>(bytes16);
  return absl::StrFormat(
      "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
      b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

namespace {

// A copy that already ended.
class DoneFence : public CopyFence {
 public:
  const std::string& ipc_handle() const override { return handle_; }
  absl::Status Wait() override { return absl::OkStatus(); }

 private:
  std::string handle_;
};

}  // namespace

std::unique_ptr<CopyFence> EndedCopyFence() { return std::make_unique<DoneFence>(); }

absl::StatusOr<std::unique_ptr<CopyFence>> GpuRuntime::CopyFenced(void* dst, int dst_device,
                                                                  const void* src, int src_device,
                                                                  uint64_t bytes, uint64_t chunk,
                                                                  const CopyProgress& progress) {
  absl::Status st = Copy(dst, dst_device, src, src_device, bytes, chunk, progress);
  if (!st.ok()) return st;
  return EndedCopyFence();
}

absl::StatusOr<std::unique_ptr<CopyFence>> GpuRuntime::CopyPiecesFenced(
    char* dst, int dst_device, const char* src, int src_device, const Segment* pieces, size_t n,
    uint64_t round_bytes, const CopyProgress& progress, uint64_t list_serial) {
  absl::Status st =
      CopyPieces(dst, dst_device, src, src_device, pieces, n, round_bytes, progress, list_serial);
  if (!st.ok()) return st;
  return EndedCopyFence();
}

absl::Status GpuRuntime::Zero(int device, void* ptr, uint64_t bytes) {
  if (device != kHostDevice) {
    return absl::FailedPreconditionError(
        absl::StrCat("zeroing memory of GPU ", device, " needs the CUDA runtime"));
  }
  std::memset(ptr, 0, bytes);
  return absl::OkStatus();
}

absl::Status GpuRuntime::CopyPieces(char* dst, int dst_device, const char* src, int src_device,
                                    const Segment* pieces, size_t n, uint64_t round_bytes,
                                    const CopyProgress& progress, uint64_t /*list_serial*/) {
  if (src_device != kHostDevice || dst_device != kHostDevice) {
    pieces_one_by_one_.fetch_add(n, std::memory_order_relaxed);
  }
  uint64_t done = 0, round = 0;
  for (size_t i = 0; i < n; ++i) {
    const Segment& p = pieces[i];
    absl::Status st = Copy(dst + p.dst, dst_device, src + p.src, src_device, p.length, p.length,
                           nullptr);
    if (!st.ok()) return st;
    done += p.length;
    round += p.length;
    if (round >= round_bytes && i + 1 < n) {
      round = 0;
      if (progress && !progress(done)) return absl::CancelledError("copy stopped");
    }
  }
  if (progress) progress(done);
  return absl::OkStatus();
}

std::unique_ptr<GpuRuntime> GpuRuntime::CreateHostOnly(std::string why) {
  return std::make_unique<HostOnlyRuntime>(std::move(why));
}

#ifndef GPUMOVE_HAVE_CUDA
std::unique_ptr<GpuRuntime> GpuRuntime::Create() {
  return CreateHostOnly("built without the CUDA toolkit");
}
#endif

}  // namespace gpumove
