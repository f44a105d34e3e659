// The CUDA runtime's copies: whole ranges in chunks on a leased stream, and piece lists,
// which go to a gather kernel where one reaches both ends (cuda_gather.cc).
#ifdef GPUMOVE_HAVE_CUDA

#include <algorithm>
#include <array>
#include <optional>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "daemon/common/host_copy.h"
#include "daemon/common/log.h"
#include "daemon/gpu/cuda_internal.h"

namespace gpumove {
namespace cuda_internal {

absl::Status CudaRuntime::Copy(void* dst, int dst_device, const void* src, int src_device,
                               uint64_t bytes, uint64_t chunk, const CopyProgress& progress) {
  return CopyOn(dst, dst_device, src, src_device, bytes, chunk, progress, nullptr);
}

absl::Status CudaRuntime::CopyPieces(char* dst, int dst_device, const char* src, int src_device,
                                     const Segment* pieces, size_t n, uint64_t round_bytes,
                                     const CopyProgress& progress, uint64_t list_serial) {
  return CopyPiecesOn(dst, dst_device, src, src_device, pieces, n, round_bytes, progress,
                      list_serial, nullptr);
}

absl::StatusOr<std::unique_ptr<CopyFence>> CudaRuntime::CopyPiecesFenced(
    char* dst, int dst_device, const char* src, int src_device, const Segment* pieces, size_t n,
    uint64_t round_bytes, const CopyProgress& progress, uint64_t list_serial) {
  std::unique_ptr<CopyFence> fence;
  absl::Status st = CopyPiecesOn(dst, dst_device, src, src_device, pieces, n, round_bytes, progress,
                                 list_serial, &fence);
  if (!st.ok()) return st;
  if (fence == nullptr) fence = EndedCopyFence();  // Copied to the end.
  return fence;
}

absl::StatusOr<std::unique_ptr<CopyFence>> CudaRuntime::CopyFenced(void* dst, int dst_device,
                                                                   const void* src, int src_device,
                                                                   uint64_t bytes, uint64_t chunk,
                                                                   const CopyProgress& progress) {
  if (dst_device == kHostDevice && src_device == kHostDevice) {
    return GpuRuntime::CopyFenced(dst, dst_device, src, src_device, bytes, chunk, progress);
  }
  std::unique_ptr<CopyFence> fence;
  absl::Status st = CopyOn(dst, dst_device, src, src_device, bytes, chunk, progress, &fence);
  if (!st.ok()) return st;
  return fence;
}

absl::Status CudaRuntime::CopyOn(void* dst, int dst_device, const void* src, int src_device,
                                 uint64_t bytes, uint64_t chunk, const CopyProgress& progress,
                                 std::unique_ptr<CopyFence>* fence) {
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
  auto taken = streams_.Take(device);
  if (!taken.ok()) return taken.status();
  StreamLease lease(&streams_, *taken);
  CopyStream& s = *lease;

  if (bytes <= chunk && fence == nullptr) {
    // One chunk: the copy and a wait for its stream, the same calls as the bare copy the
    // benchmarks compare with (no event to record and wait on).
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s.stream));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s.stream));
    if (progress) progress(bytes);
    return absl::OkStatus();
  }
  // Chunk k+1 is queued before chunk k is waited for, so the copy engine never idles.
  uint64_t issued = 0, landed = 0;
  int slot = 0;
  bool stop = false;
  auto issue = [&]() -> absl::Status {
    const uint64_t n = std::min(chunk, bytes - issued);
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(static_cast<char*>(dst) + issued,
                                         static_cast<const char*>(src) + issued, n,
                                         cudaMemcpyDefault, s.stream));
    // The last chunk of a fenced copy is never waited for here: the fence follows it.
    if (fence == nullptr || issued + n < bytes) {
      CUDA_RETURN_IF_ERROR(cudaEventRecord(s.done[slot], s.stream));
    }
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
    if (fence != nullptr && issued == bytes && !stop) {
      // All queued: the fence goes behind the last chunk, and the caller moves on.
      auto e = TakeFence(device);
      if (!e.ok()) return e.status();
      cudaError_t err = cudaEventRecord(e->event, s.stream);
      // The fence keeps the stream until the copy has ended: a copy queued behind it
      // on the same stream would wait for this one.
      // Behind it: every byte not yet seen to land (the chunk before the last has
      // only just started, its predecessor having ended).
      auto f = std::make_unique<Fence>(this, *std::move(e), std::move(lease), bytes - landed);
      if (err != cudaSuccess) return CudaError(err, "cudaEventRecord (fence)");
      *fence = std::move(f);
      return absl::OkStatus();
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

absl::Status CudaRuntime::CopyPiecesOn(char* dst, int dst_device, const char* src, int src_device,
                                       const Segment* pieces, size_t n, uint64_t round_bytes,
                                       const CopyProgress& progress, uint64_t list_serial,
                                       std::unique_ptr<CopyFence>* fence) {
#ifdef GPUMOVE_HAVE_GATHER
  if (src_device != kHostDevice || dst_device != kHostDevice) {
    // On the destination's GPU when it has one (its stores stay local; loads cross).
    const int device = dst_device != kHostDevice ? dst_device : src_device;
    // Before KernelAddress asks where host memory is mapped: on a thread that has made
    // no CUDA call yet (a staging pipeline's new helper) it found no mapping without a
    // current device, and the pieces went one copy each.
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    if ((src_device == kHostDevice) != (dst_device == kHostDevice) && list_serial == 0) {
      std::optional<absl::Status> bounced =
          ThroughBounce(dst, dst_device, src, src_device, pieces, n, round_bytes, progress);
      if (bounced.has_value()) return *bounced;
    }
    const char* s = KernelAddress(src, src_device, device);
    const char* d = KernelAddress(dst, dst_device, device);
    if (s != nullptr && d != nullptr) {
      return Gather(device, const_cast<char*>(d), s, pieces, n, round_bytes, progress, list_serial,
                    fence);
    }
  }
#endif
  if (src_device != kHostDevice || dst_device != kHostDevice) {
    VLOG(2) << "GPU copy of " << n << " pieces one by one (no gather kernel reaches both "
            << "ends)";
  }
  return GpuRuntime::CopyPieces(dst, dst_device, src, src_device, pieces, n, round_bytes, progress,
                                list_serial);
}

#ifdef GPUMOVE_HAVE_GATHER
std::optional<absl::Status> CudaRuntime::ThroughBounce(char* dst, int dst_device, const char* src,
                                                       int src_device, const Segment* pieces,
                                                       size_t n, uint64_t round_bytes,
                                                       const CopyProgress& progress) {
  const absl::Time entered = absl::Now();
  if (n < 2) return std::nullopt;
  const bool to_host = dst_device == kHostDevice;
  const int device = to_host ? src_device : dst_device;
  auto host_at = [to_host](const Segment& g) { return to_host ? g.dst : g.src; };
  const uint64_t first = host_at(pieces[0]);
  uint64_t end = first;
  for (size_t i = 0; i < n; ++i) {
    if (host_at(pieces[i]) != end) return std::nullopt;
    end += pieces[i].length;
  }
  const uint64_t run = end - first;
  // One round only: a rate cap's or progress's rounds go as before.
  if (run == 0 || run > kBounceMax || (round_bytes != 0 && round_bytes < run)) {
    return std::nullopt;
  }
  const char* host = to_host ? dst : src;
  // Page-locked (mapped) host memory only, as the gather kernel needs: pageable memory
  // goes as before.
  if (KernelAddress(host, kHostDevice, device) == nullptr) return std::nullopt;
  const char* gpu = to_host ? src : dst;
  const absl::Time began = absl::Now();
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  auto taken = streams_.Take(device);
  if (!taken.ok()) return taken.status();
  StreamLease lease(&streams_, *taken);
  CopyStream& s = *lease;
  if (!s.ReserveBounce(run).ok()) {
    cudaGetLastError();
    return std::nullopt;
  }
  std::vector<Segment> rebased(pieces, pieces + n);
  for (Segment& g : rebased) (to_host ? g.dst : g.src) -= first;
  absl::Status st;
  if (to_host) {
    st = Gather(device, s.bounce, gpu, rebased.data(), n, 0, nullptr, 0);
    if (!st.ok()) return st;
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst + first, s.bounce, run, cudaMemcpyDeviceToHost, s.stream));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s.stream));
    if (progress) progress(run);
  } else {
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(s.bounce, src + first, run, cudaMemcpyHostToDevice, s.stream));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s.stream));
    st = Gather(device, dst, s.bounce, rebased.data(), n, 0, progress, 0);
  }
  VLOG(2) << "GPU copy of " << n << " pieces " << (to_host ? "to" : "from") << " a host run of "
          << run << " bytes through a device bounce on GPU " << device << ": "
          << absl::ToDoubleMicroseconds(absl::Now() - began) << " us ("
          << absl::ToDoubleMicroseconds(began - entered) << " us to get there)";
  return st;
}

const char* CudaRuntime::KernelAddress(const char* p, int device, int kernel_device) const {
  if (device == kernel_device) return p;
  if (device != kHostDevice) {
    for (const GpuDevice& d : devices_) {
      if (d.index != kernel_device) continue;
      for (int peer : d.peer_access) {
        if (peer == device) return p;
      }
    }
    return nullptr;
  }
  cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  if (a.type != cudaMemoryTypeHost || a.devicePointer == nullptr) return nullptr;
  return static_cast<const char*>(a.devicePointer);
}
#endif

}  // namespace cuda_internal
}  // namespace gpumove

#endif  // GPUMOVE_HAVE_CUDA
