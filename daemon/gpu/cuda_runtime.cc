// The CUDA runtime: compiled only when the toolkit was found at build time.
#ifdef GPUMOVE_HAVE_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <unistd.h>

#include <cstring>
#include <optional>
#include <thread>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "daemon/common/host_copy.h"
#include "daemon/common/log.h"
#include "daemon/common/xxh3_split.h"
#include "daemon/gpu/gpu.h"
#ifdef GPUMOVE_HAVE_GATHER
#include "daemon/gpu/gather.h"
#endif

namespace gpumove {
namespace {

#ifdef GPUMOVE_HAVE_GATHER
// Descriptors a gather writes before it queues their kernel: the CPU writes the next
// batch while the GPU copies this one's bytes, and a batch's kernel is large enough
// (4 KiB pieces: 32 MiB) that the pause between kernels is small.
constexpr uint64_t kGatherBatch = 8192;
#endif

absl::Status CudaError(cudaError_t err, absl::string_view what) {
  return absl::InternalError(
      absl::StrCat(what, ": ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
}

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
absl::StatusOr<DescriptorRoom> NewDescriptorRoom(uint64_t n) {
  uint64_t want = 4096;
  while (want < n) want *= 2;
  DescriptorRoom r;
  void* p = nullptr;
  CUDA_RETURN_IF_ERROR(
      cudaHostAlloc(&p, want * sizeof(GatherPiece), cudaHostAllocMapped | cudaHostAllocPortable));
  r.host = static_cast<GatherPiece*>(p);
  void* d = nullptr;
  if (cudaError_t err = cudaHostGetDevicePointer(&d, p, 0); err != cudaSuccess) {
    cudaFreeHost(p);
    return CudaError(err, "cudaHostGetDevicePointer");
  }
  r.mapped = static_cast<GatherPiece*>(d);
  r.capacity = want;
  return r;
}
void FreeDescriptorRoom(const DescriptorRoom& r) {
  if (r.host != nullptr) cudaFreeHost(r.host);
}
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
  absl::Status Reserve(uint64_t n) {
    if (n <= room.capacity) return absl::OkStatus();
    const uint64_t want = std::max(n, room.capacity * 2);
    FreeDescriptorRoom(room);
    room = DescriptorRoom{};
    auto grown = NewDescriptorRoom(want);
    if (!grown.ok()) return grown.status();
    room = *grown;
    return absl::OkStatus();
  }
  // xxh3 block sums: mapped page-locked memory the kernel writes, grown likewise.
  uint64_t* sums = nullptr;
  uint64_t* device_sums = nullptr;  // Its address for the kernel.
  uint64_t sums_capacity = 0;
  absl::Status ReserveSums(uint64_t n) {
    if (n <= sums_capacity) return absl::OkStatus();
    if (sums != nullptr) cudaFreeHost(sums);
    sums = device_sums = nullptr;
    sums_capacity = 0;
    CUDA_RETURN_IF_ERROR(
        cudaHostAlloc(&sums, n * sizeof(uint64_t), cudaHostAllocMapped | cudaHostAllocPortable));
    CUDA_RETURN_IF_ERROR(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_sums), sums, 0));
    sums_capacity = n;
    return absl::OkStatus();
  }
  // A device bounce for copies of pieces to or from a host run (CudaRuntime::ThroughBounce),
  // grown to the largest run seen, kept with the stream.
  char* bounce = nullptr;
  uint64_t bounce_capacity = 0;
  absl::Status ReserveBounce(uint64_t n) {
    if (n <= bounce_capacity) return absl::OkStatus();
    // The stream is idle: its last use was waited for before it came back to the pool.
    if (bounce != nullptr) cudaFree(bounce);
    bounce = nullptr;
    bounce_capacity = 0;
    const uint64_t want = (n + (uint64_t{1} << 20) - 1) & ~((uint64_t{1} << 20) - 1);
    CUDA_RETURN_IF_ERROR(cudaMalloc(&bounce, want));
    bounce_capacity = want;
    return absl::OkStatus();
  }
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
  absl::StatusOr<CopyStream*> Take(int device, uint64_t pieces = 0) {
    {
      absl::MutexLock lock(&mu_);
      auto& free = free_[device];
      if (!free.empty()) {
        auto it = free.end() - 1;
#ifdef GPUMOVE_HAVE_GATHER
        for (auto f = free.rbegin(); pieces > 0 && f != free.rend(); ++f) {
          if ((*f)->room.capacity >= pieces) {
            it = std::prev(f.base());
            break;
          }
        }
#endif
        CopyStream* s = *it;
        free.erase(it);
        return s;
      }
    }
    auto s = std::make_unique<CopyStream>();
    s->device = device;
    CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
    for (cudaEvent_t& e : s->done) {
      CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    absl::MutexLock lock(&mu_);
    all_.push_back(std::move(s));
    return all_.back().get();
  }
  void Put(CopyStream* s) {
    absl::MutexLock lock(&mu_);
    free_[s->device].push_back(s);
  }

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

  absl::Status UseOnThisThread(int device) override {
    // CUDA 12 and later make the primary context current here (and create it).
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    return absl::OkStatus();
  }

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
  absl::Status Zero(int device, void* ptr, uint64_t bytes) override {
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
    // Mapped: kernels (the gather of vectored moves) reach it as they reach cudaHostAlloc's.
    CUDA_RETURN_IF_ERROR(
        cudaHostRegister(ptr, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped));
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
      return absl::InvalidArgumentError(absl::StrCat(
          "cudaIpcOpenMemHandle: ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
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
    return CopyOn(dst, dst_device, src, src_device, bytes, chunk, progress, nullptr);
  }

  absl::Status CopyPieces(char* dst, int dst_device, const char* src, int src_device,
                          const Segment* pieces, size_t n, uint64_t round_bytes,
                          const CopyProgress& progress, uint64_t list_serial = 0) override {
    return CopyPiecesOn(dst, dst_device, src, src_device, pieces, n, round_bytes, progress,
                        list_serial, nullptr);
  }

  absl::StatusOr<std::unique_ptr<CopyFence>> CopyPiecesFenced(
      char* dst, int dst_device, const char* src, int src_device, const Segment* pieces, size_t n,
      uint64_t round_bytes, const CopyProgress& progress, uint64_t list_serial = 0) override {
    std::unique_ptr<CopyFence> fence;
    absl::Status st = CopyPiecesOn(dst, dst_device, src, src_device, pieces, n, round_bytes,
                                   progress, list_serial, &fence);
    if (!st.ok()) return st;
    if (fence == nullptr) fence = EndedCopyFence();  // Copied to the end.
    return fence;
  }

  // CopyPieces; with `fence`, a gather kernel's last round is only queued and *fence set
  // to one behind it (left null where the copy went to the end).
  absl::Status CopyPiecesOn(char* dst, int dst_device, const char* src, int src_device,
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
        return Gather(device, const_cast<char*>(d), s, pieces, n, round_bytes, progress,
                      list_serial, fence);
      }
    }
#endif
    if (src_device != kHostDevice || dst_device != kHostDevice) {
      VLOG(2) << "GPU copy of " << n << " pieces one by one (no gather kernel reaches both "
              << "ends)";
    }
    return GpuRuntime::CopyPieces(dst, dst_device, src, src_device, pieces, n, round_bytes,
                                  progress, list_serial);
  }

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
                                            uint64_t round_bytes, const CopyProgress& progress) {
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

  // A staged list is its pieces' bytes as they are: the kernel's descriptors are laid out
  // as pieces are.
  static_assert(sizeof(Segment) == sizeof(GatherPiece) && offsetof(Segment, src) == 0 &&
                offsetof(GatherPiece, src) == 0 && offsetof(Segment, dst) == 8 &&
                offsetof(GatherPiece, dst) == 8 && offsetof(Segment, length) == 16 &&
                offsetof(GatherPiece, length) == 16);
  void StagePieces(const std::shared_ptr<const void>& owner, const Segment* pieces,
                   size_t n) override {
    if (devices_.empty() || n < kStageMin || n * sizeof(GatherPiece) > kStagedBytes / 2) return;
    uint64_t total = 0, longest = 0;
    for (size_t i = 0; i < n; ++i) {
      total += pieces[i].length;
      longest = std::max(longest, pieces[i].length);
    }
    // Pieces the kernel takes in cuts: the move's thread writes their descriptors.
    if (longest > kGatherPieceMax) return;
    StagedList s;
    {
      absl::MutexLock lock(&staged_mu_);
      auto best = spare_.end();
      for (auto it = spare_.begin(); it != spare_.end(); ++it) {
        if (it->capacity >= n && (best == spare_.end() || it->capacity < best->capacity)) best = it;
      }
      if (best != spare_.end()) {
        s.room = *best;
        spare_.erase(best);
      }
    }
    if (s.room.host == nullptr) {
      auto room = NewDescriptorRoom(n);
      if (!room.ok()) {
        cudaGetLastError();
        return;
      }
      s.room = *room;
    }
    std::memcpy(s.room.host, pieces, n * sizeof(Segment));
    s.owner = owner;
    s.pieces = pieces;
    s.n = n;
    s.total = total;
    std::vector<DescriptorRoom> freed;  // Let go outside the lock.
    {
      absl::MutexLock lock(&staged_mu_);
      // Lists whose moves ended (or were refused) give their rooms back; past the cap,
      // spare rooms go first, then the oldest lists.
      uint64_t bytes = s.room.capacity * sizeof(GatherPiece);
      for (auto it = staged_.begin(); it != staged_.end();) {
        if (it->owner.expired()) {
          spare_.push_back(it->room);
          it = staged_.erase(it);
        } else {
          bytes += it->room.capacity * sizeof(GatherPiece);
          ++it;
        }
      }
      for (const DescriptorRoom& r : spare_) bytes += r.capacity * sizeof(GatherPiece);
      while (bytes > kStagedBytes && !spare_.empty()) {
        bytes -= spare_.front().capacity * sizeof(GatherPiece);
        freed.push_back(spare_.front());
        spare_.erase(spare_.begin());
      }
      while (bytes > kStagedBytes && !staged_.empty()) {
        bytes -= staged_.front().room.capacity * sizeof(GatherPiece);
        freed.push_back(staged_.front().room);
        staged_.erase(staged_.begin());
      }
      staged_.push_back(std::move(s));
    }
    for (const DescriptorRoom& r : freed) FreeDescriptorRoom(r);
  }

  // The staged copy of these pieces, taken out, if their owner still holds them.
  std::optional<StagedList> TakeStaged(const Segment* pieces, size_t n) {
    absl::MutexLock lock(&staged_mu_);
    for (auto it = staged_.begin(); it != staged_.end(); ++it) {
      if (it->pieces != pieces || it->n != n) continue;
      StagedList s = std::move(*it);
      staged_.erase(it);
      if (s.owner.lock() != nullptr) return s;
      spare_.push_back(s.room);  // Another list's, gone: this one only has its address.
      return std::nullopt;
    }
    return std::nullopt;
  }
  void GiveBackRoom(const DescriptorRoom& room) {
    absl::MutexLock lock(&staged_mu_);
    spare_.push_back(room);
  }

  // A staged list's gather: one kernel reading the descriptors written at the Submit.
  absl::Status GatherStaged(int device, char* dst, const char* src, const StagedList& staged,
                            const CopyProgress& progress, absl::Time began,
                            std::unique_ptr<CopyFence>* fence) {
    bool room_kept = false;  // By a fence: the kernel reads it until the fence passes.
    absl::Cleanup give_back = [&] {
      if (!room_kept) GiveBackRoom(staged.room);
    };
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    auto taken = streams_.Take(device);
    if (!taken.ok()) return taken.status();
    StreamLease lease(&streams_, *taken);
    CopyStream& s = *lease;
    const absl::Time queued = absl::Now();
    CUDA_RETURN_IF_ERROR(LaunchGather(staged.room.mapped, staged.n, src, dst, s.stream));
    if (fence != nullptr) {
      auto f = FenceBehind(device, std::move(lease), staged.total,
                           [this, room = staged.room] { GiveBackRoom(room); });
      if (!f.ok()) return f.status();
      room_kept = true;
      *fence = *std::move(f);
      VLOG(2) << "GPU gather of " << staged.n << " pieces (" << staged.total
              << " bytes, descriptors written at the Submit) on GPU " << device << ": queued in "
              << absl::ToDoubleMicroseconds(queued - began) << " us, a fence behind it";
      return absl::OkStatus();
    }
    CUDA_RETURN_IF_ERROR(cudaEventRecord(s.done[0], s.stream));
    CUDA_RETURN_IF_ERROR(cudaEventSynchronize(s.done[0]));
    if (progress) progress(staged.total);
    VLOG(2) << "GPU gather of " << staged.n << " pieces (" << staged.total
            << " bytes, descriptors written at the Submit) on GPU " << device << ": queued in "
            << absl::ToDoubleMicroseconds(queued - began) << " us, all landed "
            << absl::ToDoubleMicroseconds(absl::Now() - queued) << " us later";
    return absl::OkStatus();
  }
#endif

  absl::Status Xxh3BlockSums(int device, const char* data, uint64_t blocks,
                             const std::function<void(const uint64_t* sums)>& use) override {
#ifdef GPUMOVE_HAVE_GATHER
    if (reinterpret_cast<uintptr_t>(data) % 8 != 0) {
      return absl::UnimplementedError("device data not 8-byte aligned");
    }
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    auto taken = streams_.Take(device);
    if (!taken.ok()) return taken.status();
    StreamLease lease(&streams_, *taken);
    CopyStream& s = *lease;
    if (absl::Status st = s.ReserveSums(blocks * kXxh3Lanes); !st.ok()) return st;
    CUDA_RETURN_IF_ERROR(LaunchXxh3Sums(data, blocks, s.device_sums, s.stream));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s.stream));
    use(s.sums);
    return absl::OkStatus();
#else
    return GpuRuntime::Xxh3BlockSums(device, data, blocks, use);
#endif
  }

  absl::StatusOr<std::unique_ptr<CopyFence>> CopyFenced(void* dst, int dst_device, const void* src,
                                                        int src_device, uint64_t bytes,
                                                        uint64_t chunk,
                                                        const CopyProgress& progress) override {
    if (dst_device == kHostDevice && src_device == kHostDevice) {
      return GpuRuntime::CopyFenced(dst, dst_device, src, src_device, bytes, chunk, progress);
    }
    std::unique_ptr<CopyFence> fence;
    absl::Status st = CopyOn(dst, dst_device, src, src_device, bytes, chunk, progress, &fence);
    if (!st.ok()) return st;
    return fence;
  }

  bool KnowsIpcFence(const std::string& handle) override {
    absl::MutexLock lock(&imported_mu_);
    return imported_.contains(handle);
  }

  absl::Status WaitIpcFence(int device, const std::string& handle, absl::Time deadline,
                            absl::Time quiet_until) override {
    cudaIpcEventHandle_t h;
    if (handle.size() != sizeof(h.reserved)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a CUDA IPC event handle has ", sizeof(h.reserved), " bytes, not ", handle.size()));
    }
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    cudaEvent_t event = nullptr;
    {
      absl::MutexLock lock(&imported_mu_);
      auto it = imported_.find(handle);
      if (it != imported_.end()) {
        event = it->second;
      } else {
        std::memcpy(h.reserved, handle.data(), sizeof(h.reserved));
        cudaError_t err = cudaIpcOpenEventHandle(&event, h);
        if (err != cudaSuccess) {
          cudaGetLastError();
          return absl::InvalidArgumentError(absl::StrCat(
              "cudaIpcOpenEventHandle: ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
        }
        // Kept: the exporter reuses its fences, so a peer's handles are few. (An imported
        // event must not be used once its exporter destroyed it; ours never destroy theirs.)
        imported_.emplace(handle, event);
      }
    }
    // Until the copy could have ended, no driver call: a long sleep, then a spin (a
    // sleep's wake-up is tens of microseconds late).
    quiet_until = std::min(quiet_until, deadline);
    if (const absl::Duration rest = quiet_until - absl::Now(); rest > absl::Microseconds(300)) {
      absl::SleepFor(rest - absl::Microseconds(150));
    }
    while (absl::Now() < quiet_until) {
    }
    // Polled rather than synchronized: a copy whose process died must not hold this
    // thread past the deadline. A query every microsecond or so (not back to back: each
    // one is a driver call, and a tight loop of them slowed the copies of other streams).
    for (int i = 0;; ++i) {
      cudaError_t err = cudaEventQuery(event);
      if (err == cudaSuccess) return absl::OkStatus();
      if (err != cudaErrorNotReady) {
        cudaGetLastError();
        return CudaError(err, "cudaEventQuery on another process's fence");
      }
      const absl::Time now = absl::Now();
      if (now >= deadline) {
        return absl::DeadlineExceededError("the other process's copy did not end in time");
      }
      if (i > 1000) {
        std::this_thread::yield();
      } else {
        while (absl::Now() - now < absl::Microseconds(1)) {
        }
      }
    }
  }

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
          absl::AnyInvocable<void()> after = nullptr)
        : owner_(owner),
          e_(std::move(e)),
          stream_(std::move(stream)),
          pending_(pending),
          after_(std::move(after)) {}
    ~Fence() override {
      Wait().IgnoreError();
      owner_->PutFence(std::move(e_));
      if (after_) after_();
    }
    const std::string& ipc_handle() const override { return e_.handle; }
    absl::Status Wait() override {
      CUDA_RETURN_IF_ERROR(cudaEventSynchronize(e_.event));
      return absl::OkStatus();
    }
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
                                                         absl::AnyInvocable<void()> after) {
    const cudaStream_t stream = (*lease).stream;
    auto e = TakeFence(device);
    const cudaError_t err = e.ok() ? cudaEventRecord(e->event, stream) : cudaSuccess;
    if (!e.ok() || err != cudaSuccess) {
      // No fence: what is queued ends here, before the caller lets go of what it reads
      // (its stream, its descriptors); `after` is the caller's to do.
      cudaStreamSynchronize(stream);
      if (!e.ok()) return e.status();
      PutFence(*std::move(e));
      return CudaError(err, "cudaEventRecord (fence)");
    }
    return std::make_unique<Fence>(this, *std::move(e), std::move(lease), pending,
                                   std::move(after));
  }

  // One on the current device (`device`), from the free list or new.
  absl::StatusOr<FenceEvent> TakeFence(int device) {
    {
      absl::MutexLock lock(&fences_mu_);
      auto& free = free_fences_[device];
      if (!free.empty()) {
        FenceEvent e = std::move(free.back());
        free.pop_back();
        return e;
      }
    }
    FenceEvent e;
    e.device = device;
    CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&e.event, cudaEventDisableTiming | cudaEventInterprocess));
    cudaIpcEventHandle_t h;
    CUDA_RETURN_IF_ERROR(cudaIpcGetEventHandle(&h, e.event));
    e.handle.assign(h.reserved, sizeof(h.reserved));
    return e;
  }
  void PutFence(FenceEvent e) {
    absl::MutexLock lock(&fences_mu_);
    free_fences_[e.device].push_back(std::move(e));
  }

  // Copy; with `fence`, returns once the last chunk is queued, with a fence behind it.
  absl::Status CopyOn(void* dst, int dst_device, const void* src, int src_device, uint64_t bytes,
                      uint64_t chunk, const CopyProgress& progress,
                      std::unique_ptr<CopyFence>* fence) {
    if (chunk == 0) chunk = bytes;
    if (dst_device == kHostDevice && src_device == kHostDevice) {
      uint64_t done = 0;
      while (done < bytes) {
        const uint64_t n = std::min(chunk, bytes - done);
        HostCopy(static_cast<char*>(dst) + done, static_cast<const char*>(src) + done, n);
        done += n;
        if (progress && !progress(done) && done < bytes)
          return absl::CancelledError("copy stopped");
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

#ifdef GPUMOVE_HAVE_GATHER
  // The address a kernel on `kernel_device` uses for `p` (memory of `device`, or host
  // memory): null when it cannot reach it (another GPU without peer access, pageable
  // host memory).
  const char* KernelAddress(const char* p, int device, int kernel_device) const {
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
    ~KeptDescriptors() {
      if (pieces == nullptr) return;
      int current = 0;
      cudaGetDevice(&current);
      cudaSetDevice(device);
      cudaFree(pieces);
      cudaSetDevice(current);
    }
  };
  // At most this many lists' descriptors, and bytes of them, over all GPUs; the least
  // recently used go first.
  static constexpr size_t kKeptLists = 64;
  static constexpr uint64_t kKeptBytes = uint64_t{256} << 20;

  std::shared_ptr<const KeptDescriptors> FindKept(int device, uint64_t serial,
                                                  uint64_t round_bytes) {
    absl::MutexLock lock(&kept_mu_);
    for (auto it = kept_.begin(); it != kept_.end(); ++it) {
      if ((*it)->device == device && (*it)->serial == serial && (*it)->round_bytes == round_bytes) {
        auto found = *it;
        kept_.erase(it);
        kept_.push_back(found);  // Most recently used last.
        return found;
      }
    }
    return nullptr;
  }
  void Keep(std::shared_ptr<const KeptDescriptors> k) {
    std::vector<std::shared_ptr<const KeptDescriptors>> dropped;  // Freed outside the lock.
    absl::MutexLock lock(&kept_mu_);
    uint64_t bytes = k->bytes;
    for (const auto& e : kept_) bytes += e->bytes;
    while (!kept_.empty() && (kept_.size() >= kKeptLists || bytes > kKeptBytes)) {
      bytes -= kept_.front()->bytes;
      dropped.push_back(std::move(kept_.front()));
      kept_.erase(kept_.begin());
    }
    if (k->bytes <= kKeptBytes) kept_.push_back(std::move(k));
  }

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
                      std::unique_ptr<CopyFence>* fence = nullptr) {
    const absl::Time began = absl::Now();
    if (n == 0) {
      if (progress) progress(0);
      return absl::OkStatus();
    }
    if (round_bytes == 0) round_bytes = UINT64_MAX;
    if (list_serial == 0 && n >= kStageMin) {
      std::optional<StagedList> staged = TakeStaged(pieces, n);
      if (staged.has_value()) {
        // One round: the kernel alone. More (a rate cap, pinned memory's rounds): as any
        // other list, since rounds need the pieces' bytes.
        if (staged->total <= round_bytes) {
          return GatherStaged(device, dst, src, *staged, progress, began, fence);
        }
        GiveBackRoom(staged->room);
      }
    }
    std::shared_ptr<const KeptDescriptors> kept =
        list_serial != 0 ? FindKept(device, list_serial, round_bytes) : nullptr;
    const bool reused = kept != nullptr;
    // A kept list's first gather counts its descriptors for their room on the GPU.
    uint64_t count = 0;
    if (list_serial != 0 && !reused) {
      for (size_t i = 0; i < n; ++i)
        count += (pieces[i].length + kGatherPieceMax - 1) / kGatherPieceMax;
    }
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    auto taken = streams_.Take(device, reused ? 0 : n);
    if (!taken.ok()) return taken.status();
    StreamLease lease(&streams_, *taken);
    CopyStream& s = *lease;
    if (!reused) {
      if (absl::Status st = s.Reserve(n); !st.ok()) return st;
    }
    // Rounds queued; those before `landed` seen to end (at most two outstanding: the
    // events of s.done).
    std::vector<Round> rounds;
    size_t landed = 0;
    bool stop = false;
    auto see_landed = [&]() -> absl::Status {
      CUDA_RETURN_IF_ERROR(cudaEventSynchronize(s.done[landed % 2]));
      const uint64_t now = rounds[landed++].done;
      if (progress && !progress(now)) stop = true;
      return absl::OkStatus();
    };
    auto round_queued = [&](Round r) -> absl::Status {
      rounds.push_back(r);
      CUDA_RETURN_IF_ERROR(cudaEventRecord(s.done[(rounds.size() - 1) % 2], s.stream));
      return rounds.size() - landed < 2 ? absl::OkStatus() : see_landed();
    };
    std::shared_ptr<KeptDescriptors> made;  // A kept list's first gather on this GPU.
    uint64_t k = 0, done = 0;               // Descriptors and bytes queued.
    bool whole = false;                     // Every piece queued.
    if (reused) {
      for (size_t r = 0; r < kept->rounds.size() && !stop; ++r) {
        const uint64_t begin = r == 0 ? 0 : kept->rounds[r - 1].end;
        CUDA_RETURN_IF_ERROR(
            LaunchGather(kept->pieces + begin, kept->rounds[r].end - begin, src, dst, s.stream));
        if (absl::Status st = round_queued(kept->rounds[r]); !st.ok()) return st;
      }
      k = kept->rounds.back().end;
      done = rounds.back().done;
      whole = rounds.size() == kept->rounds.size();
    } else {
      if (list_serial != 0) {
        made = std::make_shared<KeptDescriptors>();
        made->device = device;
        made->serial = list_serial;
        made->round_bytes = round_bytes;
        made->bytes = count * sizeof(GatherPiece);
        void* room = nullptr;
        if (cudaMalloc(&room, made->bytes) == cudaSuccess) {
          made->pieces = static_cast<GatherPiece*>(room);
        } else {
          cudaGetLastError();  // Out of room: this gather goes as any other.
          made = nullptr;
        }
      }
      // Descriptors [k - at, k) are in the page-locked room from its start, [sent, k) not
      // yet queued.
      uint64_t at = 0, sent = 0, round = 0;
      auto send = [&]() -> absl::Status {
        if (sent == k) return absl::OkStatus();
        const GatherPiece* from = s.room.mapped + (sent - (k - at));
        if (made != nullptr) {
          CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(made->pieces + sent, s.room.host + (sent - (k - at)),
                                               (k - sent) * sizeof(GatherPiece),
                                               cudaMemcpyHostToDevice, s.stream));
          from = made->pieces + sent;
        }
        CUDA_RETURN_IF_ERROR(LaunchGather(from, k - sent, src, dst, s.stream));
        sent = k;
        return absl::OkStatus();
      };
      size_t i = 0;
      for (; i < n && !stop; ++i) {
        const Segment& g = pieces[i];
        const uint64_t need =
            g.length <= kGatherPieceMax ? 1 : (g.length + kGatherPieceMax - 1) / kGatherPieceMax;
        if (at + need > s.room.capacity) {
          // The room is full: what is in it is queued and waited for, then it is doubled
          // (or made to fit this piece).
          if (absl::Status st = send(); !st.ok()) return st;
          CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s.stream));
          if (absl::Status st = s.Reserve(std::max<uint64_t>(need, s.room.capacity * 2));
              !st.ok()) {
            return st;
          }
          at = 0;
        }
        if (need == 1) {
          s.room.host[at++] = GatherPiece{g.src, g.dst, g.length};
        } else {
          for (uint64_t off = 0; off < g.length; off += kGatherPieceMax) {
            s.room.host[at++] =
                GatherPiece{g.src + off, g.dst + off, std::min(kGatherPieceMax, g.length - off)};
          }
        }
        k += need;
        done += g.length;
        round += g.length;
        const bool round_ends = round >= round_bytes || i + 1 == n;
        if (round_ends || k - sent >= kGatherBatch) {
          if (absl::Status st = send(); !st.ok()) return st;
        }
        if (round_ends) {
          round = 0;
          if (absl::Status st = round_queued(Round{k, done}); !st.ok()) return st;
        }
      }
      whole = i == n && rounds.back().end == k;
    }
    const absl::Time written = absl::Now();
    // Fenced: the last round is left running behind the fence (not a prepared list's
    // first gather: its descriptors are kept only once seen to land).
    const bool fenced = fence != nullptr && whole && made == nullptr;
    while (landed + (fenced ? 1 : 0) < rounds.size()) {
      CUDA_RETURN_IF_ERROR(cudaEventSynchronize(s.done[landed % 2]));
      const uint64_t now = rounds[landed++].done;
      if (progress) progress(now);
    }
    if (fenced) {
      const uint64_t before = landed == 0 ? 0 : rounds[landed - 1].done;
      auto f = FenceBehind(device, std::move(lease), done - before, nullptr);
      if (!f.ok()) return f.status();
      *fence = *std::move(f);
      VLOG(2) << "GPU gather of " << n << " pieces (" << k << " descriptors"
              << (reused ? ", kept on the GPU" : "") << ", " << rounds.size() << " rounds, " << done
              << " bytes) on GPU " << device << ": written and queued in "
              << absl::ToDoubleMicroseconds(written - began) << " us, a fence behind it";
      return absl::OkStatus();
    }
    // The descriptors have landed (the stream passed the kernels that read them): other
    // gathers of the list may use them from now on; not those of a stopped gather (it did
    // not write them all).
    if (made != nullptr && whole) {
      made->rounds = rounds;
      Keep(std::move(made));
    }
    VLOG(2) << "GPU gather of " << n << " pieces (" << k << " descriptors"
            << (reused ? ", kept on the GPU" : "") << ", " << rounds.size() << " rounds, " << done
            << " bytes) on GPU " << device << ": written and queued in "
            << absl::ToDoubleMicroseconds(written - began) << " us, all landed "
            << absl::ToDoubleMicroseconds(absl::Now() - written) << " us later";
    if (!whole) return absl::CancelledError("copy stopped");
    return absl::OkStatus();
  }
#endif

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

}  // namespace

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
  return std::make_unique<CudaRuntime>(std::move(devices));
}

}  // namespace gpumove

#endif  // GPUMOVE_HAVE_CUDA
