#include "daemon/path/local/local_engine.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/common/log.h"
#include "daemon/common/status_macros.h"
#include "daemon/common/xxh3_split.h"

namespace gpumove {
namespace {

// Progress and cancel are checked between chunks: small enough to cancel promptly, large
// enough that the per-chunk cost vanishes. Chunks are sized by time, not bytes: a chunk
// between GPU memory and host memory runs about a millisecond, and so does one between
// two GPU memories (HBM or NVLink, tens of times faster), where a 64 MiB chunk would be
// tens of microseconds and each chunk's launch, tail and wait a large part of it. Under a
// rate cap (paced between chunks) GPU-to-GPU chunks stay at kDeviceChunk.
constexpr uint64_t kHostChunk = 16ull << 20;
constexpr uint64_t kDeviceChunk = 64ull << 20;
constexpr uint64_t kDeviceToDeviceChunk = 1ull << 30;

uint64_t ChunkOf(const Endpoint& src, const Endpoint& dst, const MoveControl& control) {
  const bool s = src.kind == MemoryKind::kDevice, d = dst.kind == MemoryKind::kDevice;
  if (s && d && control.rate_limit() == 0) return kDeviceToDeviceChunk;
  return s || d ? kDeviceChunk : kHostChunk;
}

bool KnownDevice(GpuRuntime* gpu, int device) {
  for (const GpuDevice& d : gpu->devices()) {
    if (d.index == device) return true;
  }
  return false;
}

}  // namespace

absl::Status LocalEngine::CanServe(const Endpoint& src, const Endpoint& dst) const {
  if (src.remote != nullptr || dst.remote != nullptr) {
    return absl::FailedPreconditionError("LOCAL moves stay inside one node");
  }
  for (const Endpoint* e : {&src, &dst}) {
    if (e->kind == MemoryKind::kDevice && !KnownDevice(gpu_, e->device)) {
      return absl::FailedPreconditionError(absl::StrCat("GPU ", e->device, " is not on this node"));
    }
  }
  return absl::OkStatus();
}

absl::Status LocalEngine::Move(const Endpoint& src, const Endpoint& dst, uint64_t length,
                               MoveControl& control) {
  const int src_device = src.kind == MemoryKind::kDevice ? src.device : kHostDevice;
  const int dst_device = dst.kind == MemoryKind::kDevice ? dst.device : kHostDevice;
  if (control.cancelled()) return absl::CancelledError("cancelled");
  return gpu_->Copy(dst.data, dst_device, src.data, src_device, length, ChunkOf(src, dst, control),
                    control.Reporter());
}

absl::Status LocalEngine::MovePieces(const Endpoint& src, const Endpoint& dst,
                                     const Segments& pieces, MoveControl& control) {
  const bool device = src.kind == MemoryKind::kDevice || dst.kind == MemoryKind::kDevice;
  const int src_device = src.kind == MemoryKind::kDevice ? src.device : kHostDevice;
  const int dst_device = dst.kind == MemoryKind::kDevice ? dst.device : kHostDevice;
  const std::vector<Segment>& list = pieces.list;
  if (device) {
    // A gather kernel per round where one GPU reaches both ends, else piece by piece.
    if (control.cancelled()) return absl::CancelledError("cancelled");
    const absl::Time began = absl::Now();
    absl::Status st =
        gpu_->CopyPieces(dst.data, dst_device, src.data, src_device, list.data(), list.size(),
                         ChunkOf(src, dst, control), control.Reporter(), pieces.serial);
    VLOG(2) << "LOCAL move of " << list.size() << " pieces (" << pieces.total
            << " bytes) with GPU memory: " << absl::ToDoubleMicroseconds(absl::Now() - began)
            << " us, " << st;
    return st;
  }
  // Rounds of about a chunk of bytes each: progress and cancel between rounds, each
  // round's pieces split over the copy threads by bytes.
  const uint64_t round_bytes = kHostChunk;
  const int threads =
      static_cast<int>(std::clamp<unsigned>(std::thread::hardware_concurrency(), 1, 8));
  uint64_t done = 0;
  for (size_t begin = 0; begin < list.size();) {
    if (control.cancelled()) return absl::CancelledError("cancelled");
    uint64_t bytes = 0;
    const size_t end = RoundEnd(list, begin, round_bytes, &bytes);
    CopyPieces(dst.data, src.data, list, begin, end, bytes, threads);
    done += bytes;
    begin = end;
    if (!control.Reporter()(done) && begin < list.size()) {
      return absl::CancelledError("cancelled");
    }
  }
  return absl::OkStatus();
}

namespace {

// xxh3-64 of device bytes: the parts (offsets from e.data, in order) gathered by the GPU,
// one kernel a fill, into one of two page-locked bounces while a helper thread hashes the
// other (the copy of fill k overlaps the hash of fill k - 1).
absl::StatusOr<uint64_t> HashDevice(GpuRuntime* gpu, const Endpoint& e,
                                    const std::vector<Segment>& parts, bool source) {
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(),
                                                                 &XXH3_freeState);
  XXH3_64bits_reset(state.get());
  constexpr uint64_t kBounce = 8ull << 20;
  char* bounce[2] = {nullptr, nullptr};
  std::unique_ptr<char[]> plain[2];
  void* pinned[2] = {nullptr, nullptr};
  absl::Cleanup free_pinned = [&] {
    for (void* p : pinned) {
      if (p != nullptr) gpu->PinnedFree(p);
    }
  };
  for (int i = 0; i < 2; ++i) {
    auto p = gpu->PinnedAlloc(kBounce);
    if (p.ok()) {
      pinned[i] = *p;
      bounce[i] = static_cast<char*>(*p);
    } else {
      plain[i].reset(new char[kBounce]);
      bounce[i] = plain[i].get();
    }
  }
  std::thread hashing;  // Of the fill before the one being copied.
  absl::Cleanup join = [&] {
    if (hashing.joinable()) hashing.join();
  };
  std::vector<Segment> fill;
  uint64_t filled = 0;
  size_t fills = 0;
  auto flush = [&]() -> absl::Status {
    if (fill.empty()) return absl::OkStatus();
    char* into = bounce[fills % 2];
    absl::Status st = gpu->CopyPieces(into, kHostDevice, e.data, e.device, fill.data(), fill.size(),
                                      kBounce, nullptr);
    if (hashing.joinable()) hashing.join();
    if (!st.ok()) return st;
    hashing = std::thread([&state, into, n = filled] { XXH3_64bits_update(state.get(), into, n); });
    ++fills;
    fill.clear();
    filled = 0;
    return absl::OkStatus();
  };
  for (const Segment& p : parts) {
    const uint64_t at = source ? p.src : p.dst;
    for (uint64_t off = 0; off < p.length;) {
      const uint64_t n = std::min(kBounce - filled, p.length - off);
      fill.push_back(Segment{at + off, filled, n});
      filled += n;
      off += n;
      if (filled == kBounce) {
        GPUMOVE_RETURN_IF_ERROR(flush());
      }
    }
  }
  GPUMOVE_RETURN_IF_ERROR(flush());
  if (hashing.joinable()) hashing.join();
  return XXH3_64bits_digest(state.get());
}

// xxh3-64 of a stream of `total` device bytes on `device`, on that GPU: the sums of its
// 1 KiB blocks computed there, a round of kGpuHashRound bytes at a time (`bytes_at`
// makes stream bytes [r0, r0 + n) addressable on the GPU: in place, or gathered), the
// scrambles between blocks and the end here (daemon/common/xxh3_split.h). UNIMPLEMENTED
// where the runtime cannot (or the bytes are not 8-byte aligned).
constexpr uint64_t kGpuHashRound = 64 << 20;
absl::StatusOr<uint64_t> HashStreamOnGpu(
    GpuRuntime* gpu, int device, uint64_t total,
    const std::function<absl::StatusOr<const char*>(uint64_t r0, uint64_t n)>& bytes_at) {
  static_assert(kGpuHashRound % kXxh3Block == 0);
  const uint64_t full = (total - 1) / kXxh3Block;
  Xxh3Long h;
  std::string end;  // The stream's last bytes so far (at most kEnd).
  constexpr uint64_t kEnd = 2 * kXxh3Block;
  char last[kEnd];
  for (uint64_t r0 = 0; r0 < total; r0 += kGpuHashRound) {
    const uint64_t n = std::min(kGpuHashRound, total - r0);
    absl::StatusOr<const char*> at = bytes_at(r0, n);
    if (!at.ok()) return at.status();
    const uint64_t first = r0 / kXxh3Block, past = std::min((r0 + n) / kXxh3Block, full);
    if (past > first) {
      absl::Status st = gpu->Xxh3BlockSums(device, *at, past - first, [&](const uint64_t* sums) {
        h.AddBlocks(sums, past - first);
      });
      if (!st.ok()) return st;
    }
    const uint64_t keep = std::min(n, kEnd);
    if (absl::Status st = gpu->Copy(last, kHostDevice, *at + n - keep, device, keep, keep, nullptr);
        !st.ok()) {
      return st;
    }
    end.append(last, keep);
    if (end.size() > kEnd) end.erase(0, end.size() - kEnd);
  }
  bool ok = false;
  const uint64_t hash = h.Finish(total, end.data(), end.size(), &ok);
  if (!ok) return absl::InternalError("the split xxh3 could not finish");
  return hash;
}

// The pieces' bytes (their `source` or destination sides at `e`) on the GPU: each round
// gathered into device scratch by the copy kernel, then hashed there.
absl::StatusOr<uint64_t> HashPiecesOnGpu(GpuRuntime* gpu, const Endpoint& e, const Segments& pieces,
                                         bool source) {
  const uint64_t bytes = std::min(pieces.total, kGpuHashRound);
  absl::StatusOr<void*> scratch = gpu->DeviceAlloc(e.device, bytes);
  if (!scratch.ok()) return absl::UnimplementedError("no device memory to gather pieces into");
  absl::Cleanup free_scratch = [&] { gpu->DeviceFree(e.device, *scratch); };
  char* into = static_cast<char*>(*scratch);
  size_t next = 0;        // The next piece,
  uint64_t in_piece = 0;  // and how much of it went into earlier rounds.
  std::vector<Segment> round;
  return HashStreamOnGpu(
      gpu, e.device, pieces.total, [&](uint64_t, uint64_t n) -> absl::StatusOr<const char*> {
        round.clear();
        for (uint64_t filled = 0; filled < n;) {
          const Segment& p = pieces.list[next];
          const uint64_t take = std::min(p.length - in_piece, n - filled);
          round.push_back(Segment{(source ? p.src : p.dst) + in_piece, filled, take});
          filled += take;
          in_piece += take;
          if (in_piece == p.length) {
            ++next;
            in_piece = 0;
          }
        }
        absl::Status st = gpu->CopyPieces(into, e.device, e.data, e.device, round.data(),
                                          round.size(), n, nullptr);
        if (!st.ok()) return st;
        return into;
      });
}

}  // namespace

absl::StatusOr<uint64_t> HashPieces(GpuRuntime* gpu, const Endpoint& e, const Segments& pieces,
                                    bool source) {
  if (e.kind != MemoryKind::kDevice) {
    std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(),
                                                                   &XXH3_freeState);
    XXH3_64bits_reset(state.get());
    for (const Segment& p : pieces.list) {
      XXH3_64bits_update(state.get(), e.data + (source ? p.src : p.dst), p.length);
    }
    return XXH3_64bits_digest(state.get());
  }
  if (pieces.total >= kGpuHashMin) {
    auto h = HashPiecesOnGpu(gpu, e, pieces, source);
    if (h.ok() || h.status().code() != absl::StatusCode::kUnimplemented) return h;
  }
  return HashDevice(gpu, e, pieces.list, source);
}

absl::StatusOr<uint64_t> HashRange(GpuRuntime* gpu, const Endpoint& e, uint64_t length) {
  if (e.kind != MemoryKind::kDevice) return XXH3_64bits(e.data, length);
  if (length >= kGpuHashMin) {
    auto h = HashStreamOnGpu(
        gpu, e.device, length,
        [&](uint64_t r0, uint64_t) -> absl::StatusOr<const char*> { return e.data + r0; });
    if (h.ok() || h.status().code() != absl::StatusCode::kUnimplemented) return h;
  }
  return HashDevice(gpu, e, {Segment{0, 0, length}}, /*source=*/true);
}

}  // namespace gpumove
