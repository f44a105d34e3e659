#include "daemon/path/cuda_ipc/cuda_ipc_engine.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace gpumove {
namespace {

// A move's tail: the fence of the copy left running (its token: the fence's CUDA IPC
// event handle, which the other node's IpcTailReader opens), keeping the mapping its copy
// writes through open until the copy has ended (the peer may be forgotten meanwhile).
class MappedFence : public MoveTail {
 public:
  MappedFence(std::shared_ptr<const IpcTable::Mapping> mapping, std::unique_ptr<CopyFence> fence)
      : mapping_(std::move(mapping)), fence_(std::move(fence)) {}
  const std::string& token() const override { return fence_->ipc_handle(); }
  absl::Status Wait() override { return fence_->Wait(); }
  uint64_t pending_bytes() const override { return fence_->pending_bytes(); }

 private:
  std::shared_ptr<const IpcTable::Mapping> mapping_;
  std::unique_ptr<CopyFence> fence_;  // Destroyed (waited for) before the mapping goes.
};

}  // namespace

int CudaIpcEngine::MapDevice(const CudaIpcOffer& remote, const Endpoint& local) const {
  // The remote range's GPU, as this process numbers it (when it sees that GPU).
  int physical = -1;
  for (const GpuDevice& d : gpu_->devices()) {
    if (d.uuid == remote.device_uuid) physical = d.index;
  }
  if (local.kind != MemoryKind::kDevice) return physical;
  // On the local end's GPU, which issues the copy, when it reaches the remote GPU with
  // peer copies: copies into a mapping made on the other GPU's context ran slower.
  if (physical < 0 || physical == local.device) return local.device;
  for (const GpuDevice& d : gpu_->devices()) {
    if (d.index != local.device) continue;
    for (int peer : d.peer_access) {
      if (peer == physical) return local.device;
    }
  }
  return physical;
}

absl::Status CudaIpcEngine::CanServe(const Endpoint& src, const Endpoint& dst) const {
  if ((src.remote == nullptr) == (dst.remote == nullptr)) {
    return absl::FailedPreconditionError("CUDA IPC moves need exactly one end on another node");
  }
  const RemoteHold& remote = src.remote != nullptr ? *src.remote : *dst.remote;
  const Endpoint& local = src.remote != nullptr ? dst : src;
  if (!remote.same_host) {
    return absl::FailedPreconditionError(
        absl::StrCat("node ", remote.node, " runs on another host"));
  }
  if (remote.kind != MemoryKind::kDevice || local.kind != MemoryKind::kDevice) {
    return absl::FailedPreconditionError("CUDA IPC moves device memory to device memory");
  }
  const CudaIpcOffer* offer = remote.offer<CudaIpcOffer>();
  if (offer == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("node ", remote.node, " does not share this range over CUDA IPC"));
  }
  if (MapDevice(*offer, local) < 0) {
    return absl::FailedPreconditionError("no GPU of this node can map the remote range");
  }
  return absl::OkStatus();
}

absl::Status CudaIpcEngine::Move(const Endpoint& src, const Endpoint& dst, uint64_t length,
                                 MoveControl& control) {
  if (control.cancelled()) return absl::CancelledError("cancelled");
  const bool push = dst.remote != nullptr;
  const Endpoint& local = push ? src : dst;
  int device = -1;
  std::shared_ptr<const IpcTable::Mapping> mapping;
  auto mapped = MapRemote(push ? *dst.remote : *src.remote, local, length, &device, &mapping);
  if (!mapped.ok()) return mapped.status();
  char* far = *mapped;
  auto progress = control.Reporter();
  // Progress, cancel and a rate cap act between chunks. Chunk boundaries cost copies into
  // an IPC mapping more than local ones, so without a cap a move up to 1 GiB is one copy
  // (milliseconds over NVLink: a cancel still lands soon), bigger ones go in 1 GiB chunks;
  // under a cap, chunk_-sized ones, each paced and none left running.
  const bool paced = control.rate_limit() > 0;
  const uint64_t chunk =
      paced ? chunk_ : std::clamp<uint64_t>(length, chunk_, std::max<uint64_t>(chunk_, kMaxChunk));
  void* to = push ? static_cast<void*>(far) : dst.data;
  const void* from = push ? static_cast<const void*>(src.data) : far;
  const int to_device = push ? device : dst.device;
  const int from_device = push ? src.device : device;
  if (paced || length < min_fenced_ || !control.AcceptsTail()) {
    return gpu_->Copy(to, to_device, from, from_device, length, chunk, progress);
  }
  // The copy's last chunk runs on while the other node is told, so the acknowledgement's
  // round trip overlaps the copy: that node acknowledges at once and lets its range go
  // when it sees the fence pass; the scheduler waits for the fence here before the move
  // is done.
  auto fence = gpu_->CopyFenced(to, to_device, from, from_device, length, chunk, progress);
  if (!fence.ok()) return fence.status();
  control.KeepRunning(std::make_unique<MappedFence>(mapping, *std::move(fence)));
  return absl::OkStatus();
}

absl::StatusOr<char*> CudaIpcEngine::MapRemote(const RemoteHold& remote, const Endpoint& local,
                                               uint64_t length, int* device,
                                               std::shared_ptr<const IpcTable::Mapping>* mapping) {
  const CudaIpcOffer* offer = remote.offer<CudaIpcOffer>();
  if (offer == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("node ", remote.node, " offers no CUDA IPC handle for this range"));
  }
  *device = MapDevice(*offer, local);
  auto opened = ipc_->Open(*device, offer->handle);
  if (!opened.ok()) {
    return absl::Status(
        opened.status().code(),
        absl::StrCat("mapping node ", remote.node, "'s memory: ", opened.status().message()));
  }
  if (offer->offset > (*opened)->size || length > (*opened)->size - offer->offset) {
    return absl::InternalError("the remote range runs past the allocation it is in");
  }
  {
    // Kept for the peer's life: opening costs milliseconds.
    absl::MutexLock lock(&mu_);
    auto& held = held_[remote.peer()];
    if (std::find(held.begin(), held.end(), *opened) == held.end()) held.push_back(*opened);
  }
  *mapping = *std::move(opened);
  return (*mapping)->base + offer->offset;
}

absl::Status CudaIpcEngine::MovePieces(const Endpoint& src, const Endpoint& dst,
                                       const Segments& pieces, MoveControl& control) {
  if (control.cancelled()) return absl::CancelledError("cancelled");
  const bool push = dst.remote != nullptr;
  const RemoteHold& remote = push ? *dst.remote : *src.remote;
  const Endpoint& local = push ? src : dst;
  // The pieces lie in the held ranges: the remote one is mapped whole.
  if ((push ? pieces.dst_hi : pieces.src_hi) > remote.length) {
    return absl::InternalError("a piece runs past the range the other node holds");
  }
  int device = -1;
  std::shared_ptr<const IpcTable::Mapping> mapping;
  auto far = MapRemote(remote, local, remote.length, &device, &mapping);
  if (!far.ok()) return far.status();
  char* to = push ? *far : dst.data;
  const char* from = push ? src.data : *far;
  // Rounds as Move's chunks: without a cap, up to 1 GiB each (each round is a kernel
  // launched, drained and waited for); under a cap, chunk_-sized ones.
  const bool paced = control.rate_limit() > 0;
  const uint64_t round = paced ? chunk_ : std::max(chunk_, kMaxChunk);
  const int to_device = push ? device : dst.device;
  const int from_device = push ? src.device : device;
  if (paced || pieces.total < min_fenced_ || !control.AcceptsTail()) {
    return gpu_->CopyPieces(to, to_device, from, from_device, pieces.list.data(),
                            pieces.list.size(), round, control.Reporter(), pieces.serial);
  }
  // As Move: the last round's kernel runs on behind a fence while the other node is told.
  auto fence = gpu_->CopyPiecesFenced(to, to_device, from, from_device, pieces.list.data(),
                                      pieces.list.size(), round, control.Reporter(), pieces.serial);
  if (!fence.ok()) return fence.status();
  control.KeepRunning(std::make_unique<MappedFence>(mapping, *std::move(fence)));
  return absl::OkStatus();
}

void CudaIpcEngine::Forget(const std::string& node, uint64_t incarnation) {
  std::vector<std::shared_ptr<const IpcTable::Mapping>> dropped;
  absl::MutexLock lock(&mu_);
  auto it = held_.find(PeerId{node, incarnation});
  if (it == held_.end()) return;
  dropped = std::move(it->second);
  held_.erase(it);
  // `dropped` outlives the lock: closing takes the table's own lock, not ours.
}

}  // namespace gpumove
