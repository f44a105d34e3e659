#include "daemon/path/local/local_engine.h"

#include <algorithm>
#include <memory>
#include <thread>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"

namespace gpumove {
namespace {

// Progress and cancel are checked between chunks: small enough to cancel promptly, large
// enough that the per-chunk cost vanishes.
constexpr uint64_t kHostChunk = 16ull << 20;
constexpr uint64_t kDeviceChunk = 64ull << 20;

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
  const bool device = src.kind == MemoryKind::kDevice || dst.kind == MemoryKind::kDevice;
  const int src_device = src.kind == MemoryKind::kDevice ? src.device : kHostDevice;
  const int dst_device = dst.kind == MemoryKind::kDevice ? dst.device : kHostDevice;
  if (control.cancelled()) return absl::CancelledError("cancelled");
  return gpu_->Copy(dst.data, dst_device, src.data, src_device, length,
                    device ? kDeviceChunk : kHostChunk, control.Reporter());
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
    return gpu_->CopyPieces(dst.data, dst_device, src.data, src_device, list.data(), list.size(),
                            kDeviceChunk, control.Reporter());
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

absl::StatusOr<uint64_t> HashPieces(GpuRuntime* gpu, const Endpoint& e, const Segments& pieces,
                                    bool source) {
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(),
                                                                 &XXH3_freeState);
  XXH3_64bits_reset(state.get());
  if (e.kind != MemoryKind::kDevice) {
    for (const Segment& p : pieces.list) {
      XXH3_64bits_update(state.get(), e.data + (source ? p.src : p.dst), p.length);
    }
    return XXH3_64bits_digest(state.get());
  }
  // Device memory: the pieces gathered into a page-locked bounce (one kernel per fill),
  // hashed there in list order.
  constexpr uint64_t kBounce = 8ull << 20;
  auto pinned = gpu->PinnedAlloc(kBounce);
  std::unique_ptr<char[]> plain;
  char* bounce = nullptr;
  if (pinned.ok()) {
    bounce = static_cast<char*>(*pinned);
  } else {
    plain.reset(new char[kBounce]);
    bounce = plain.get();
  }
  absl::Cleanup free_pinned = [&] {
    if (pinned.ok()) gpu->PinnedFree(*pinned);
  };
  std::vector<Segment> fill;
  uint64_t filled = 0;
  auto flush = [&]() -> absl::Status {
    if (fill.empty()) return absl::OkStatus();
    absl::Status st = gpu->CopyPieces(bounce, kHostDevice, e.data, e.device, fill.data(),
                                      fill.size(), kBounce, nullptr);
    if (!st.ok()) return st;
    XXH3_64bits_update(state.get(), bounce, filled);
    fill.clear();
    filled = 0;
    return absl::OkStatus();
  };
  for (const Segment& p : pieces.list) {
    const uint64_t at = source ? p.src : p.dst;
    for (uint64_t off = 0; off < p.length;) {
      const uint64_t n = std::min(kBounce - filled, p.length - off);
      fill.push_back(Segment{at + off, filled, n});
      filled += n;
      off += n;
      if (filled == kBounce) {
        if (absl::Status st = flush(); !st.ok()) return st;
      }
    }
  }
  if (absl::Status st = flush(); !st.ok()) return st;
  return XXH3_64bits_digest(state.get());
}

absl::StatusOr<uint64_t> HashRange(GpuRuntime* gpu, const Endpoint& e, uint64_t length) {
  if (e.kind != MemoryKind::kDevice) return XXH3_64bits(e.data, length);
  constexpr uint64_t kBounce = 8ull << 20;
  std::unique_ptr<char[]> bounce(new char[std::min(length, kBounce)]);
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(),
                                                                 &XXH3_freeState);
  XXH3_64bits_reset(state.get());
  for (uint64_t done = 0; done < length;) {
    const uint64_t n = std::min(kBounce, length - done);
    absl::Status st = gpu->Copy(bounce.get(), kHostDevice, e.data + done, e.device, n, n, nullptr);
    if (!st.ok()) return st;
    XXH3_64bits_update(state.get(), bounce.get(), n);
    done += n;
  }
  return XXH3_64bits_digest(state.get());
}

}  // namespace gpumove
