// The CUDA runtime's parts, shared by its files (cuda_*.cc) and by nothing outside them:
// the runtime behind GpuRuntime::Create when the toolkit was found at build time, the
// streams it lends to copies and the page-locked memory its gathers read descriptors from.
#ifndef GPUMOVE_DAEMON_GPU_CUDA_INTERNAL_H_
#define GPUMOVE_DAEMON_GPU_CUDA_INTERNAL_H_
#ifdef GPUMOVE_HAVE_CUDA

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/common/segment.h"
#include "daemon/gpu/gpu.h"
#ifdef GPUMOVE_HAVE_GATHER
#include "daemon/gpu/gather.h"
#endif

namespace gpumove {
namespace cuda_internal {

absl::Status CudaError(cudaError_t err, absl::string_view what);

#define CUDA_RETURN_IF_ERROR(call)                                    \
  do {                                                                \
    cudaError_t cuda_err_ = (call);                                   \
    if (cuda_err_ != cudaSuccess) return CudaError(cuda_err_, #call); \
  } while (0)

#ifdef GPUMOVE_HAVE_GATHER
// Mapped page-locked memory for gather descriptors, which the kernel reads in place
// (`mapped`: its address there): a gather's own, or a list's written at its Submit.
struct DescriptorRoom {
  GatherPiece* host = nullptr;
  GatherPiece* mapped = nullptr;
  uint64_t capacity = 0;  // Descriptors it holds.
};
// A room for at least `n` descriptors (a power of two, at least 4096).
absl::StatusOr<DescriptorRoom> NewDescriptorRoom(uint64_t n);
void FreeDescriptorRoom(const DescriptorRoom& r);

// A gather's rounds: descriptors [previous end, end) copy bytes up to `done`.
struct Round {
  uint64_t end;
  uint64_t done;
};
// A kept list's descriptors on one GPU (for `round_bytes` rounds), made by its first
// gather there and used by the next ones; freed when pushed out of the cache.
struct KeptDescriptors {
  int device = 0;
  uint64_t serial = 0, round_bytes = 0, bytes = 0;
  GatherPiece* pieces = nullptr;
  std::vector<Round> rounds;
  ~KeptDescriptors();
};
#endif

// A stream and the events a chunked copy waits on, for one device.
struct CopyStream {
  int device = 0;
  cudaStream_t stream = nullptr;
  std::array<cudaEvent_t, 2> done{};
#ifdef GPUMOVE_HAVE_GATHER
  // A gather's pieces, written where the kernel reads them; grown to the largest list
  // seen, kept with the stream.
  DescriptorRoom room;
  absl::Status Reserve(uint64_t n);
  // xxh3 block sums: mapped page-locked memory the kernel writes, grown likewise.
  uint64_t* sums = nullptr;
  uint64_t* device_sums = nullptr;  // Its address for the kernel.
  uint64_t sums_capacity = 0;
  absl::Status ReserveSums(uint64_t n);
  // A device bounce for copies of pieces to or from a host run (CudaRuntime::ThroughBounce),
  // grown to the largest run seen, kept with the stream.
  char* bounce = nullptr;
  uint64_t bounce_capacity = 0;
  absl::Status ReserveBounce(uint64_t n);
#endif
};

// Streams lent to one copy at a time and kept for the process's life: copies running at
// once never serialize on one stream, and a copy on a new thread does not pay for
// creating a stream and its events (they were per thread, made and destroyed with each
// staging pipeline's threads).
class StreamPool {
 public:
  // One on `device` (the current device), from the free list or new; of those free, the
  // last given back whose gather room holds `pieces` descriptors if one does (growing a
  // room costs a page-locked allocation).
  absl::StatusOr<CopyStream*> Take(int device, uint64_t pieces = 0);
  void Put(CopyStream* s);

 private:
  absl::Mutex mu_;
  std::vector<std::unique_ptr<CopyStream>> all_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int, std::vector<CopyStream*>> free_ ABSL_GUARDED_BY(mu_);
};

// A stream taken from the pool for one copy, given back when this goes.
class StreamLease {
 public:
  StreamLease(StreamPool* pool, CopyStream* s) : pool_(pool), s_(s) {}
  StreamLease(StreamLease&& o) noexcept : pool_(o.pool_), s_(std::exchange(o.s_, nullptr)) {}
  StreamLease& operator=(StreamLease&&) = delete;
  ~StreamLease() {
    if (s_ != nullptr) pool_->Put(s_);
  }
  CopyStream& operator*() const { return *s_; }

 private:
  StreamPool* pool_;
  CopyStream* s_;
};

// The runtime of a node with GPUs. Its methods live by job: memory and IPC handles
// (cuda_runtime.cc), copies (cuda_copy.cc), gathers and block sums (cuda_gather.cc),
// piece lists' descriptors (cuda_descriptors.cc), fences (cuda_fences.cc).
class CudaRuntime : public GpuRuntime {
 public:
  CudaRuntime(std::vector<GpuDevice> devices) : devices_(std::move(devices)) {}

  bool cuda_compiled() const override { return true; }
  std::string status() const override;
  const std::vector<GpuDevice>& devices() const override { return devices_; }

  absl::Status UseOnThisThread(int device) override;
  absl::StatusOr<void*> DeviceAlloc(int device, uint64_t bytes) override;
  absl::Status Zero(int device, void* ptr, uint64_t bytes) override;
  void DeviceFree(int device, void* ptr) override;
  absl::StatusOr<void*> PinnedAlloc(uint64_t bytes) override;
  void PinnedFree(void* ptr) override;
  absl::Status HostRegister(void* ptr, uint64_t bytes) override;
  void HostUnregister(void* ptr) override;

  absl::StatusOr<std::string> IpcExport(int device, void* base) override;
  absl::StatusOr<IpcMapping> IpcOpen(int device, const std::string& handle) override;
  void IpcClose(int device, void* base) override;

  absl::Status Copy(void* dst, int dst_device, const void* src, int src_device, uint64_t bytes,
                    uint64_t chunk, const CopyProgress& progress) override;
  absl::Status CopyPieces(char* dst, int dst_device, const char* src, int src_device,
                          const Segment* pieces, size_t n, uint64_t round_bytes,
                          const CopyProgress& progress, uint64_t list_serial = 0) override;
  absl::StatusOr<std::unique_ptr<CopyFence>> CopyPiecesFenced(
      char* dst, int dst_device, const char* src, int src_device, const Segment* pieces, size_t n,
      uint64_t round_bytes, const CopyProgress& progress, uint64_t list_serial = 0) override;
  absl::StatusOr<std::unique_ptr<CopyFence>> CopyFenced(void* dst, int dst_device, const void* src,
                                                        int src_device, uint64_t bytes,
                                                        uint64_t chunk,
                                                        const CopyProgress& progress) override;
#ifdef GPUMOVE_HAVE_GATHER
  void StagePieces(const std::shared_ptr<const void>& owner, const Segment* pieces,
                   size_t n) override;
#endif
  absl::Status Xxh3BlockSums(int device, const char* data, uint64_t blocks,
                             const std::function<void(const uint64_t* sums)>& use) override;

  bool KnowsIpcFence(const std::string& handle) override;
  absl::Status WaitIpcFence(int device, const std::string& handle, absl::Time deadline,
                            absl::Time quiet_until) override;

 private:
  // Interprocess events, reused (never destroyed: another process may hold them open).
  struct FenceEvent {
    int device = 0;
    cudaEvent_t event = nullptr;
    std::string handle;
  };
  class Fence : public CopyFence {
   public:
    Fence(CudaRuntime* owner, FenceEvent e, StreamLease stream, uint64_t pending,
          absl::AnyInvocable<void()> after = nullptr);
    ~Fence() override;
    const std::string& ipc_handle() const override { return e_.handle; }
    absl::Status Wait() override;
    uint64_t pending_bytes() const override { return pending_; }

   private:
    CudaRuntime* const owner_;
    FenceEvent e_;
    StreamLease stream_;  // Given back after the wait in the destructor.
    const uint64_t pending_;
    absl::AnyInvocable<void()> after_;  // Once the copy has ended (what it read let go).
  };

  // A fence behind what is queued on the leased stream (kept by the fence until it
  // passes), `pending` bytes at most still to land; `after` runs once it has passed.
  absl::StatusOr<std::unique_ptr<CopyFence>> FenceBehind(int device, StreamLease lease,
                                                         uint64_t pending,
                                                         absl::AnyInvocable<void()> after);
  // One on the current device (`device`), from the free list or new.
  absl::StatusOr<FenceEvent> TakeFence(int device);
  void PutFence(FenceEvent e);

  // Copy; with `fence`, returns once the last chunk is queued, with a fence behind it.
  absl::Status CopyOn(void* dst, int dst_device, const void* src, int src_device, uint64_t bytes,
                      uint64_t chunk, const CopyProgress& progress,
                      std::unique_ptr<CopyFence>* fence);
  // CopyPieces; with `fence`, a gather kernel's last round is only queued and *fence set
  // to one behind it (left null where the copy went to the end).
  absl::Status CopyPiecesOn(char* dst, int dst_device, const char* src, int src_device,
                            const Segment* pieces, size_t n, uint64_t round_bytes,
                            const CopyProgress& progress, uint64_t list_serial,
                            std::unique_ptr<CopyFence>* fence);

#ifdef GPUMOVE_HAVE_GATHER
  // Runs of host memory at most this long go through a device bounce (ThroughBounce).
  static constexpr uint64_t kBounceMax = uint64_t{64} << 20;

  // Pieces between device memory and a run of page-locked host memory (the host side of
  // each piece starts where the one before it ended, as in a staging slot) go as one DMA
  // copy of the run between the host and a device bounce, and one gather kernel between
  // the bounce and the pieces on the GPU: the copy engines carry the bytes over PCIe as in
  // a whole copy, not the kernel's own loads and stores, which slowed to half when two
  // such kernels ran at once (a staged move's gather and its peer's scatter on one GPU:
  // docs/performance/). nullopt: not such a copy, or no device memory for the bounce (the
  // caller copies the pieces as before).
  std::optional<absl::Status> ThroughBounce(char* dst, int dst_device, const char* src,
                                            int src_device, const Segment* pieces, size_t n,
                                            uint64_t round_bytes, const CopyProgress& progress);

  // The address a kernel on `kernel_device` uses for `p` (memory of `device`, or host
  // memory): null when it cannot reach it (another GPU without peer access, pageable
  // host memory).
  const char* KernelAddress(const char* p, int device, int kernel_device) const;

  // Piece lists written at their Submit where the gather kernels read them (StagePieces),
  // each in a room of mapped page-locked memory; rooms without a list are kept for the
  // next ones.
  struct StagedList {
    std::weak_ptr<const void> owner;
    const Segment* pieces = nullptr;
    size_t n = 0;
    uint64_t total = 0;
    DescriptorRoom room;
  };
  // Lists shorter than this are read by the move's thread as before (a short pass).
  static constexpr size_t kStageMin = 1024;
  // Page-locked bytes of staged lists and spare rooms together, at most.
  static constexpr uint64_t kStagedBytes = uint64_t{64} << 20;

  // The staged copy of these pieces, taken out, if their owner still holds them.
  std::optional<StagedList> TakeStaged(const Segment* pieces, size_t n);
  void GiveBackRoom(const DescriptorRoom& room);

  // A staged list's gather: one kernel reading the descriptors written at the Submit.
  absl::Status GatherStaged(int device, char* dst, const char* src, const StagedList& staged,
                            const CopyProgress& progress, absl::Time began,
                            std::unique_ptr<CopyFence>* fence);

  // At most this many lists' descriptors, and bytes of them, over all GPUs; the least
  // recently used go first.
  static constexpr size_t kKeptLists = 64;
  static constexpr uint64_t kKeptBytes = uint64_t{256} << 20;

  std::shared_ptr<const KeptDescriptors> FindKept(int device, uint64_t serial,
                                                  uint64_t round_bytes);
  void Keep(std::shared_ptr<const KeptDescriptors> k);

  // The pieces cut to at most kGatherPieceMax bytes and written as descriptors in batches
  // of up to kGatherBatch: each batch's kernel is queued as soon as it is written, so the
  // GPU copies one batch's bytes while this thread writes the next. Descriptors go to
  // mapped page-locked memory the kernel reads in place (no copy to the GPU) and which
  // holds one per piece; a longer piece that finds it full waits for the kernels queued so
  // far and grows it. Rounds of about `round_bytes` end on batch ends: the next round is
  // queued before the last is waited for, and progress (or a stop) is seen at each round's
  // end. A kept list (`list_serial` nonzero) copies its descriptors to the GPU and keeps
  // them there after its first whole gather: later ones only launch the kernels.
  absl::Status Gather(int device, char* dst, const char* src, const Segment* pieces, size_t n,
                      uint64_t round_bytes, const CopyProgress& progress, uint64_t list_serial,
                      std::unique_ptr<CopyFence>* fence = nullptr);
#endif

  // cuMemGetAddressRange, reached through the runtime (no link against libcuda).
  using AddressRangeFn = int (*)(unsigned long long*, size_t*, unsigned long long);
  // It, or null where the driver does not give it.
  static AddressRangeFn FindAddressRange();

  std::vector<GpuDevice> devices_;
  AddressRangeFn get_address_range_ = FindAddressRange();
  StreamPool streams_;
  absl::Mutex fences_mu_;
  absl::flat_hash_map<int, std::vector<FenceEvent>> free_fences_ ABSL_GUARDED_BY(fences_mu_);
#ifdef GPUMOVE_HAVE_GATHER
  absl::Mutex kept_mu_;
  std::vector<std::shared_ptr<const KeptDescriptors>> kept_ ABSL_GUARDED_BY(kept_mu_);
  absl::Mutex staged_mu_;
  std::vector<StagedList> staged_ ABSL_GUARDED_BY(staged_mu_);  // Oldest first.
  std::vector<DescriptorRoom> spare_ ABSL_GUARDED_BY(staged_mu_);
#endif
  absl::Mutex imported_mu_;
  absl::flat_hash_map<std::string, cudaEvent_t> imported_ ABSL_GUARDED_BY(imported_mu_);
};

}  // namespace cuda_internal
}  // namespace gpumove

#endif  // GPUMOVE_HAVE_CUDA
#endif  // GPUMOVE_DAEMON_GPU_CUDA_INTERNAL_H_
