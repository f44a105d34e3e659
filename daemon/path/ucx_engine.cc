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
  for (const Endpoint* e : {&src, &dst}) {
    if (e->kind == MemoryKind::kDevice && !transport_->cuda_aware()) {
      return absl::FailedPreconditionError(
          "device memory over UCX needs a CUDA-aware UCX or the staging pipeline, which this "
          "build does not have yet");
    }
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
  return push ? transport_->Put(remote, src.data, length, progress)
              : transport_->Get(remote, dst.data, length, progress);
}

}  // namespace gpumove
