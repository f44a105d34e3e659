// The GPU runtime as the rest of the daemon sees it: which GPUs there are, device and
// pinned allocations, and copies between any two memories.
//
// This folder is the only place that includes CUDA headers. A build without the toolkit,
// or a machine without a GPU, gets a runtime with no devices whose copies are memcpy, so
// everything above runs unchanged on host memory.
#ifndef GPUMOVE_DAEMON_GPU_GPU_H_
#define GPUMOVE_DAEMON_GPU_GPU_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/common/segment.h"

namespace gpumove {

// Device argument meaning "host memory".
inline constexpr int kHostDevice = -1;

struct GpuDevice {
  int index = 0;
  std::string uuid;  // "GPU-..." as nvidia-smi prints it.
  std::string name;
  std::string pci_bus_id;
  uint64_t total_memory = 0;
  std::vector<int> peer_access;  // Devices this one reaches with peer copies.
};

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi prints a device's 16-byte UUID.
std::string FormatGpuUuid(const void* bytes16);

// Called after each chunk of a copy with the bytes copied so far; returning false stops
// the copy after the chunks already issued (the copy then returns CANCELLED).
using CopyProgress = std::function<bool(uint64_t bytes_done)>;

// The end of a copy left running on a GPU (GpuRuntime::CopyFenced): this process waits
// for it with Wait; another process on this host waits with GpuRuntime::WaitIpcFence on
// ipc_handle(), so the node that owns the destination can see the bytes land itself
// instead of being told after the fact.
class CopyFence {
 public:
  // Waits for the copy first (the fence's event goes back to be reused).
  virtual ~CopyFence() = default;
  // cudaIpcEventHandle_t's 64 bytes; empty when the copy already ended (nothing to wait).
  virtual const std::string& ipc_handle() const = 0;
  // Returns once every byte has landed; INTERNAL carries the CUDA error text.
  virtual absl::Status Wait() = 0;
  // Bytes the copy still had to move when the fence was made (at most): the waiting node
  // need not look sooner than the fastest copy of them takes. 0: not known.
  virtual uint64_t pending_bytes() const { return 0; }
};

// A fence for a copy that has already ended (no handle; Wait returns at once).
std::unique_ptr<CopyFence> EndedCopyFence();

class GpuRuntime {
 public:
  // Probes CUDA once. Never fails: without CUDA or a GPU the runtime has no devices and
  // status() says why.
  static std::unique_ptr<GpuRuntime> Create();
  // A runtime with no devices (what a CUDA-less build always gets).
  static std::unique_ptr<GpuRuntime> CreateHostOnly(std::string why);

  virtual ~GpuRuntime() = default;

  // Whether CUDA support is compiled into this binary.
  virtual bool cuda_compiled() const = 0;
  // One line for operators: the devices found, or why there are none.
  virtual std::string status() const = 0;
  virtual const std::vector<GpuDevice>& devices() const = 0;

  // Makes `device`'s (primary) context current on the calling thread, for libraries that
  // take device memory on threads of their own (UCX's progress thread). Host-only: nothing.
  virtual absl::Status UseOnThisThread(int device) { return absl::OkStatus(); }

  virtual absl::StatusOr<void*> DeviceAlloc(int device, uint64_t bytes) = 0;
  virtual void DeviceFree(int device, void* ptr) = 0;
  // Page-locked host memory registered with the driver; UNAVAILABLE without a GPU.
  virtual absl::StatusOr<void*> PinnedAlloc(uint64_t bytes) = 0;
  virtual void PinnedFree(void* ptr) = 0;
  // Page-locks and registers existing host memory (shared memory a pool got elsewhere)
  // with the driver, as PinnedAlloc's is; UNAVAILABLE without a GPU.
  virtual absl::Status HostRegister(void* ptr, uint64_t bytes) {
    return absl::UnavailableError("no CUDA driver to pin memory with");
  }
  virtual void HostUnregister(void* ptr) {}

  // Sets `bytes` at `ptr` (on `device`, or kHostDevice) to zero, returning when done: a
  // buffer handed to one tenant never shows another's old bytes. This runtime: host memory
  // only (FAILED_PRECONDITION for a device).
  virtual absl::Status Zero(int device, void* ptr, uint64_t bytes);

  // Copies `bytes` from src (on src_device, or kHostDevice) to dst, `chunk` bytes at a
  // time with up to two chunks in flight, calling `progress` after each. Returns when
  // every byte has landed in dst. INTERNAL carries the CUDA error text.
  virtual absl::Status Copy(void* dst, int dst_device, const void* src, int src_device,
                            uint64_t bytes, uint64_t chunk, const CopyProgress& progress) = 0;

  // Copies `n` pieces, each from src + piece.src to dst + piece.dst, calling `progress`
  // with the bytes done after about every `round_bytes` (false stops the copy there:
  // CANCELLED). Returns when every byte has landed. This runtime copies piece by piece;
  // CUDA's runs one gather kernel per round when one GPU reaches both ends (its own
  // memory, a peer GPU's, page-locked host memory). `list_serial` nonzero names a list
  // that comes again and again (a prepared piece list; never reused for another list):
  // CUDA's keeps its kernel descriptors on the GPU for the next move of it.
  virtual absl::Status CopyPieces(char* dst, int dst_device, const char* src, int src_device,
                                  const Segment* pieces, size_t n, uint64_t round_bytes,
                                  const CopyProgress& progress, uint64_t list_serial = 0);
  // Pieces with GPU memory at one end or both that CopyPieces copied one call each (no
  // gather kernel reached both ends: pageable host memory, GPUs without peer access).
  uint64_t pieces_copied_one_by_one() const {
    return pieces_one_by_one_.load(std::memory_order_relaxed);
  }
  // A list about to be moved with GPU memory, handed over by the thread that made it
  // (while the list is in its cache): CUDA's writes it where its gather kernels read it
  // (mapped page-locked memory), so that the first CopyPieces of these `n` pieces at
  // `pieces` only launches a kernel instead of reading the list on the thread that runs the
  // move. `owner` holds the list: the copy is used only while it lives, and let go when it
  // goes. This runtime: nothing.
  virtual void StagePieces(const std::shared_ptr<const void>& owner, const Segment* pieces,
                           size_t n) {}

  // The xxh3 block sums (daemon/common/xxh3_split.h) of `blocks` 1 KiB blocks of device
  // memory at `data` (on `device`, 8-byte aligned), computed on that GPU into page-locked
  // memory kept for the next time, and handed to `use` (8 words a block) before this
  // returns. UNIMPLEMENTED where the runtime has no kernel for it (the caller hashes on
  // the CPU).
  virtual absl::Status Xxh3BlockSums(int device, const char* data, uint64_t blocks,
                                     const std::function<void(const uint64_t* sums)>& use) {
    return absl::UnimplementedError("no GPU hashing in this runtime");
  }

  // Copy, but the last chunk is only queued: returns with a fence behind it. Progress is
  // reported for the chunks before it. A copy that stopped early returns CANCELLED as Copy
  // does (after waiting). Runtimes without interprocess events copy to the end and return
  // a fence with no handle.
  virtual absl::StatusOr<std::unique_ptr<CopyFence>> CopyFenced(void* dst, int dst_device,
                                                                const void* src, int src_device,
                                                                uint64_t bytes, uint64_t chunk,
                                                                const CopyProgress& progress);
  // CopyPieces, but the last round is only queued: returns with a fence behind it, as
  // CopyFenced does. CUDA's fences its gather kernels; a copy it cannot leave running (one
  // through a device bounce, host memory at both ends, a prepared list's first gather,
  // whose descriptors are kept only once they are seen to land) and other runtimes copy to
  // the end and return a fence with no handle.
  virtual absl::StatusOr<std::unique_ptr<CopyFence>> CopyPiecesFenced(
      char* dst, int dst_device, const char* src, int src_device, const Segment* pieces, size_t n,
      uint64_t round_bytes, const CopyProgress& progress, uint64_t list_serial = 0);
  // Waits, polling, until the copy behind another process's fence (its ipc_handle, made
  // on this host) has ended. INVALID_ARGUMENT for a handle the driver refuses,
  // DEADLINE_EXCEEDED when it has not ended by `deadline`, FAILED_PRECONDITION without a GPU.
  // No query reaches the driver before `quiet_until` (when the copy cannot have ended yet).
  virtual absl::Status WaitIpcFence(int device, const std::string& handle, absl::Time deadline,
                                    absl::Time quiet_until = absl::InfinitePast()) {
    return absl::FailedPreconditionError("waiting for another process's copy needs a GPU");
  }
  // Whether WaitIpcFence has opened `handle` before: a look at it is then one driver query
  // (opening one takes the driver much longer).
  virtual bool KnowsIpcFence(const std::string& handle) { return false; }

  // CUDA IPC. The handle (cudaIpcMemHandle_t's 64 bytes) of the allocation starting at
  // `base` on `device`, for other processes on this host to map.
  virtual absl::StatusOr<std::string> IpcExport(int device, void* base) {
    return absl::FailedPreconditionError("CUDA IPC needs a GPU");
  }
  // Maps another process's allocation on `device`: its first byte here and its size.
  // INVALID_ARGUMENT for a handle the driver refuses (malformed, stale, from a process
  // that is gone).
  struct IpcMapping {
    char* base = nullptr;
    uint64_t size = 0;
  };
  virtual absl::StatusOr<IpcMapping> IpcOpen(int device, const std::string& handle) {
    return absl::FailedPreconditionError("CUDA IPC needs a GPU");
  }
  virtual void IpcClose(int device, void* base) {}

 private:
  std::atomic<uint64_t> pieces_one_by_one_{0};
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_GPU_GPU_H_
