// The CUDA runtime's work done by the kernels of gather.cu: piece lists gathered in
// rounds of kernel launches (Gather), and xxh3 block sums of device memory.
#ifdef GPUMOVE_HAVE_CUDA

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/time/clock.h"
#include "daemon/common/log.h"
#include "daemon/common/status_macros.h"
#include "daemon/common/xxh3_split.h"
#include "daemon/gpu/cuda_internal.h"

namespace gpumove {
namespace cuda_internal {

#ifdef GPUMOVE_HAVE_GATHER
namespace {

// Descriptors a gather writes before it queues their kernel: the CPU writes the next
// batch while the GPU copies this one's bytes, and a batch's kernel is large enough
// (4 KiB pieces: 32 MiB) that the pause between kernels is small.
constexpr uint64_t kGatherBatch = 8192;

// A gather's rounds queued on its stream; those before `landed` seen to end (at most two
// outstanding: the events of s.done).
struct GatherRounds {
  CopyStream& s;
  const CopyProgress& progress;
  std::vector<Round> rounds;
  size_t landed = 0;
  bool stop = false;
  uint64_t k = 0, done = 0;  // Descriptors and bytes queued.
  bool whole = false;        // Every piece queued.

  absl::Status SeeLanded() {
    CUDA_RETURN_IF_ERROR(cudaEventSynchronize(s.done[landed % 2]));
    const uint64_t now = rounds[landed++].done;
    if (progress && !progress(now)) stop = true;
    return absl::OkStatus();
  }
  absl::Status Queued(Round r) {
    rounds.push_back(r);
    CUDA_RETURN_IF_ERROR(cudaEventRecord(s.done[(rounds.size() - 1) % 2], s.stream));
    return rounds.size() - landed < 2 ? absl::OkStatus() : SeeLanded();
  }
};

// A kept list's later gather: its rounds' kernels, on the descriptors already on the GPU.
absl::Status LaunchKept(const KeptDescriptors& kept, const char* src, char* dst, GatherRounds& g) {
  for (size_t r = 0; r < kept.rounds.size() && !g.stop; ++r) {
    const uint64_t begin = r == 0 ? 0 : kept.rounds[r - 1].end;
    CUDA_RETURN_IF_ERROR(
        LaunchGather(kept.pieces + begin, kept.rounds[r].end - begin, src, dst, g.s.stream));
    GPUMOVE_RETURN_IF_ERROR(g.Queued(kept.rounds[r]));
  }
  g.k = kept.rounds.back().end;
  g.done = g.rounds.back().done;
  g.whole = g.rounds.size() == kept.rounds.size();
  return absl::OkStatus();
}

// Room on the GPU for a kept list's first gather there to copy its `count` descriptors
// to; null where there is none.
std::shared_ptr<KeptDescriptors> NewKept(int device, uint64_t serial, uint64_t round_bytes,
                                         uint64_t count) {
  auto made = std::make_shared<KeptDescriptors>();
  made->device = device;
  made->serial = serial;
  made->round_bytes = round_bytes;
  made->bytes = count * sizeof(GatherPiece);
  void* room = nullptr;
  if (cudaMalloc(&room, made->bytes) == cudaSuccess) {
    made->pieces = static_cast<GatherPiece*>(room);
  } else {
    cudaGetLastError();  // Out of room: this gather goes as any other.
    made = nullptr;
  }
  return made;
}

// The pieces written as descriptors into the stream's room and their kernels queued, in
// batches and rounds (CudaRuntime::Gather); with `made`, the descriptors are copied to
// its room on the GPU and the kernels read them there.
absl::Status WriteAndLaunch(const Segment* pieces, size_t n, uint64_t round_bytes, const char* src,
                            char* dst, const KeptDescriptors* made, GatherRounds& g) {
  CopyStream& s = g.s;
  uint64_t& k = g.k;
  uint64_t& done = g.done;
  // Descriptors [k - at, k) are in the page-locked room from its start, [sent, k) not
  // yet queued.
  uint64_t at = 0, sent = 0, round = 0;
  auto send = [&]() -> absl::Status {
    if (sent == k) return absl::OkStatus();
    const GatherPiece* from = s.room.mapped + (sent - (k - at));
    if (made != nullptr) {
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(made->pieces + sent, s.room.host + (sent - (k - at)),
                                           (k - sent) * sizeof(GatherPiece), cudaMemcpyHostToDevice,
                                           s.stream));
      from = made->pieces + sent;
    }
    CUDA_RETURN_IF_ERROR(LaunchGather(from, k - sent, src, dst, s.stream));
    sent = k;
    return absl::OkStatus();
  };
  size_t i = 0;
  for (; i < n && !g.stop; ++i) {
    const Segment& p = pieces[i];
    const uint64_t need =
        p.length <= kGatherPieceMax ? 1 : (p.length + kGatherPieceMax - 1) / kGatherPieceMax;
    if (at + need > s.room.capacity) {
      // The room is full: what is in it is queued and waited for, then it is doubled
      // (or made to fit this piece).
      GPUMOVE_RETURN_IF_ERROR(send());
      CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s.stream));
      if (absl::Status st = s.Reserve(std::max<uint64_t>(need, s.room.capacity * 2)); !st.ok()) {
        return st;
      }
      at = 0;
    }
    if (need == 1) {
      s.room.host[at++] = GatherPiece{p.src, p.dst, p.length};
    } else {
      for (uint64_t off = 0; off < p.length; off += kGatherPieceMax) {
        s.room.host[at++] =
            GatherPiece{p.src + off, p.dst + off, std::min(kGatherPieceMax, p.length - off)};
      }
    }
    k += need;
    done += p.length;
    round += p.length;
    const bool round_ends = round >= round_bytes || i + 1 == n;
    if (round_ends || k - sent >= kGatherBatch) {
      GPUMOVE_RETURN_IF_ERROR(send());
    }
    if (round_ends) {
      round = 0;
      GPUMOVE_RETURN_IF_ERROR(g.Queued(Round{k, done}));
    }
  }
  g.whole = i == n && g.rounds.back().end == k;
  return absl::OkStatus();
}

}  // namespace

absl::Status CudaRuntime::Gather(int device, char* dst, const char* src, const Segment* pieces,
                                 size_t n, uint64_t round_bytes, const CopyProgress& progress,
                                 uint64_t list_serial, std::unique_ptr<CopyFence>* fence) {
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
    GPUMOVE_RETURN_IF_ERROR(s.Reserve(n));
  }
  GatherRounds g{s, progress};
  std::shared_ptr<KeptDescriptors> made;  // A kept list's first gather on this GPU.
  if (reused) {
    GPUMOVE_RETURN_IF_ERROR(LaunchKept(*kept, src, dst, g));
  } else {
    if (list_serial != 0) made = NewKept(device, list_serial, round_bytes, count);
    if (absl::Status st = WriteAndLaunch(pieces, n, round_bytes, src, dst, made.get(), g);
        !st.ok()) {
      return st;
    }
  }
  const absl::Time written = absl::Now();
  // Fenced: the last round is left running behind the fence (not a prepared list's
  // first gather: its descriptors are kept only once seen to land).
  const bool fenced = fence != nullptr && g.whole && made == nullptr;
  while (g.landed + (fenced ? 1 : 0) < g.rounds.size()) {
    CUDA_RETURN_IF_ERROR(cudaEventSynchronize(s.done[g.landed % 2]));
    const uint64_t now = g.rounds[g.landed++].done;
    if (progress) progress(now);
  }
  if (fenced) {
    const uint64_t before = g.landed == 0 ? 0 : g.rounds[g.landed - 1].done;
    auto f = FenceBehind(device, std::move(lease), g.done - before, nullptr);
    if (!f.ok()) return f.status();
    *fence = *std::move(f);
    VLOG(2) << "GPU gather of " << n << " pieces (" << g.k << " descriptors"
            << (reused ? ", kept on the GPU" : "") << ", " << g.rounds.size() << " rounds, "
            << g.done << " bytes) on GPU " << device << ": written and queued in "
            << absl::ToDoubleMicroseconds(written - began) << " us, a fence behind it";
    return absl::OkStatus();
  }
  // The descriptors have landed (the stream passed the kernels that read them): other
  // gathers of the list may use them from now on; not those of a stopped gather (it did
  // not write them all).
  if (made != nullptr && g.whole) {
    made->rounds = g.rounds;
    Keep(std::move(made));
  }
  VLOG(2) << "GPU gather of " << n << " pieces (" << g.k << " descriptors"
          << (reused ? ", kept on the GPU" : "") << ", " << g.rounds.size() << " rounds, " << g.done
          << " bytes) on GPU " << device << ": written and queued in "
          << absl::ToDoubleMicroseconds(written - began) << " us, all landed "
          << absl::ToDoubleMicroseconds(absl::Now() - written) << " us later";
  if (!g.whole) return absl::CancelledError("copy stopped");
  return absl::OkStatus();
}

absl::Status CudaRuntime::GatherStaged(int device, char* dst, const char* src,
                                       const StagedList& staged, const CopyProgress& progress,
                                       absl::Time began, std::unique_ptr<CopyFence>* fence) {
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

absl::Status CudaRuntime::Xxh3BlockSums(int device, const char* data, uint64_t blocks,
                                        const std::function<void(const uint64_t* sums)>& use) {
#ifdef GPUMOVE_HAVE_GATHER
  if (reinterpret_cast<uintptr_t>(data) % 8 != 0) {
    return absl::UnimplementedError("device data not 8-byte aligned");
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  auto taken = streams_.Take(device);
  if (!taken.ok()) return taken.status();
  StreamLease lease(&streams_, *taken);
  CopyStream& s = *lease;
  GPUMOVE_RETURN_IF_ERROR(s.ReserveSums(blocks * kXxh3Lanes));
  CUDA_RETURN_IF_ERROR(LaunchXxh3Sums(data, blocks, s.device_sums, s.stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s.stream));
  use(s.sums);
  return absl::OkStatus();
#else
  return GpuRuntime::Xxh3BlockSums(device, data, blocks, use);
#endif
}

}  // namespace cuda_internal
}  // namespace gpumove

#endif  // GPUMOVE_HAVE_CUDA
