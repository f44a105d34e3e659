#include "daemon/path/ucx_engine.h"

#include "absl/strings/str_cat.h"

namespace gpumove {

std::string UcxEngine::PeerKey(const std::string& node, uint64_t incarnation) {
  return absl::StrCat(node, "#", incarnation);
}

absl::Status UcxEngine::CanServe(const Endpoint& src, const Endpoint& dst) const {
  if ((src.remote == nullptr) == (dst.remote == nullptr)) {
    return absl::FailedPreconditionError("UCX moves need exactly one end on another node");
  }
  const RemoteHold& remote = src.remote != nullptr ? *src.remote : *dst.remote;
  if (remote.ucx_worker_address.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("node ", remote.node, " has no UCX engine"));
  }
  if (remote.ucx_rkey.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the remote buffer's pool on ", remote.node, " is not registered with UCX"));
  }
  if (remote.kind == MemoryKind::kDevice && !transport_->cuda_aware()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device memory on ", remote.node,
        " over a UCX that is not CUDA-aware needs staging on that side, not built yet"));
  }
  const Endpoint& local = src.remote != nullptr ? dst : src;
  if (local.kind == MemoryKind::kDevice && !transport_->cuda_aware() && pinned_ == nullptr) {
    return absl::FailedPreconditionError(
        "staging device memory needs a pinned pool on this node (--pinned_pool_size)");
  }
  return absl::OkStatus();
}

absl::Status UcxEngine::Move(const Endpoint& src, const Endpoint& dst, uint64_t length,
                             MoveControl& control) {
  const bool push = dst.remote != nullptr;
  const RemoteHold& hold = push ? *dst.remote : *src.remote;
  RemoteRange remote;
  remote.peer_key = PeerKey(hold.node, hold.incarnation);
  remote.worker_address = hold.ucx_worker_address;
  remote.rkey = hold.ucx_rkey;
  remote.address = hold.address;
  remote.peer_error_handling = !hold.same_host;
  auto progress = [&control](uint64_t done) {
    control.Progress(done);
    return !control.cancelled();
  };
  if (control.cancelled()) return absl::CancelledError("cancelled");
  const Endpoint& local = push ? src : dst;
  if (local.kind != MemoryKind::kDevice || transport_->cuda_aware()) {
    return push ? transport_->Put(remote, src.data, length, progress)
                : transport_->Get(remote, dst.data, length, progress);
  }
  // Device memory and a UCX that cannot take it: through pinned bounce buffers.
  auto ring = BounceRing::Take(pinned_, staging_);
  if (!ring.ok()) return ring.status();
  auto at = [&remote](uint64_t offset) {
    RemoteRange r = remote;
    r.address += offset;
    return r;
  };
  if (push) {
    return StageOut(
        gpu_, src.data, src.device, length, *ring,
        [&](const char* host, uint64_t offset, uint64_t n) {
          return transport_->Put(at(offset), host, n, nullptr);
        },
        progress);
  }
  return StageIn(
      gpu_, dst.data, dst.device, length, *ring,
      [&](char* host, uint64_t offset, uint64_t n) {
        return transport_->Get(at(offset), host, n, nullptr);
      },
      progress);
}

}  // namespace gpumove
