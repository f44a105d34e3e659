#include "daemon/server/peer_handler.h"

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "daemon/common/log.h"
#include "daemon/common/quote.h"
#include "daemon/path/cuda_ipc_protocol.h"
#include "daemon/path/ucx_protocol.h"
#include "daemon/server/convert.h"

namespace gpumove {
namespace {

// A bounce ring's slots (addresses in this process) and their size, into a response.
template <class Response>
void ListSlots(const HoldTable::Slots& ring, Response* response) {
  for (char* slot : ring.slots) response->add_stage_slots(reinterpret_cast<uint64_t>(slot));
  response->set_stage_slot_size(ring.slot_size);
}

}  // namespace

absl::Status PeerHandler::Hello(const peer::v1::HelloRequest& request,
                                peer::v1::HelloResponse* response) {
  auto known = cluster_->OnHello(request.from());
  if (!known.ok()) return (known.status());
  for (std::string& a : *known) response->add_known_addresses(std::move(a));
  *response->mutable_node() = cluster_->self();
  return absl::OkStatus();
}

absl::Status PeerHandler::PrepareRemote(const peer::v1::PrepareRemoteRequest& request,
                                        peer::v1::PrepareRemoteResponse* response) {
  if (request.from_node().empty() || request.transfer_id().empty()) {
    return absl::InvalidArgumentError("from_node and transfer_id are required");
  }
  // Bounce slots only serve UCX moves that stage here: not a move that asked for another
  // path, nor one between GPUs of two daemons on this host (AUTO takes CUDA_IPC then).
  bool may_stage = request.path() == v1::PATH_AUTO || request.path() == v1::UCX;
  if (may_stage && request.path() == v1::PATH_AUTO && request.runner_device() && ipc_ != nullptr) {
    auto runner = cluster_->Find(request.from_node());
    may_stage = !(runner.ok() && runner->descriptor.host_id() == cluster_->self().host_id());
  }
  auto held = holds_->Hold(request.from_node(), request.from_incarnation(), request.transfer_id(),
                           request.owner(), request.range().buffer_id(), request.range().offset(),
                           request.range().length(), may_stage);
  if (!held.ok()) return (held.status());
  // An MPI push: its receiving half starts now (what StartMpi would do), unless it stages:
  // a staged half holds bounce buffers while it waits, and many holds of one Submit would
  // take them all while the runner sends to one of them at a time. The runner then sends
  // StartMpi when the move runs.
  if (request.mpi().tag() != 0 && mpi_ != nullptr &&
      !mpi_->StagesRange(Endpoint{held->data, held->kind, held->device})) {
    peer::v1::StartMpiRequest start;
    start.set_transfer_id(request.transfer_id());
    start.set_from_node(request.from_node());
    start.set_from_rank(request.mpi().from_rank());
    start.set_tag(request.mpi().tag());
    start.set_chunk(request.mpi().chunk());
    start.set_send(false);
    // Patient: the runner's move may sit in its queue for a while before it sends.
    absl::Status st =
        request.write()
            ? StartHalf(start, /*patient=*/true)
            : absl::InvalidArgumentError("an MPI half starts with the hold only for a push");
    if (!st.ok()) {
      holds_->Complete(request.from_node(), request.transfer_id(), false, /*runner_ok=*/false)
          .IgnoreError();
      return st;
    }
    response->mutable_mpi()->set_started(true);
  }
  const HoldTable::Held& u = *held;
  response->set_address(reinterpret_cast<uint64_t>(u.data));
  response->set_length(u.length);
  response->set_kind(ToProto(u.kind));
  response->set_device(u.device);
  const peer::v1::NodeDescriptor self = cluster_->self();
  OfferUcx(self, u.kind, u.device, response);
  if (u.kind == MemoryKind::kDevice && ipc_ != nullptr && gpu_ != nullptr) {
    if (auto ref = ipc_->Find(u.data, u.length)) {
      std::string uuid;
      for (const GpuDevice& d : gpu_->devices()) {
        if (d.index == u.device) uuid = d.uuid;
      }
      OfferCudaIpc(ref->handle, ref->offset, uuid, response);
      response->set_waits_fences(fences_ && !gpu_->devices().empty());
    }
  }
  if (held->ring.has_value()) {
    OfferStage(self, held->ring->slots, held->ring->slot_size, false, response);
  } else if (held->stage_later) {
    OfferStage(self, {}, held->stage_slot_size, true, response);
  }
  return absl::OkStatus();
}

absl::Status PeerHandler::CompleteRemote(const peer::v1::CompleteRemoteRequest& request,
                                         peer::v1::CompleteRemoteResponse* response) {
  const absl::Time t0 = absl::Now();
  // A fence: the runner's GPU copy into (or out of) the range may still run; this node
  // sees it end itself before the hold ends (and before it acknowledges or hashes, unless
  // the runner waits for it too).
  auto hash = holds_->Complete(
      request.from_node(), request.transfer_id(), request.checksum(),
      /*runner_ok=*/request.code() == 0, absl::Seconds(2),
      AckFence{request.fence(), request.fence_bytes(), request.runner_waits_fence()});
  VLOG(2) << "CompleteRemote handled in " << absl::ToDoubleMicroseconds(absl::Now() - t0) << " us"
          << (request.fence().empty() ? ""
              : request.runner_waits_fence() && !request.checksum()
                  ? " (the hold ends when the runner's fence passes)"
                  : " (after the runner's fence passed)");
  if (!hash.ok()) return (hash.status());
  response->set_xxh3(*hash);
  return absl::OkStatus();
}

namespace {

absl::Status CheckBatchSize(int n) {
  if (n == 0) return absl::InvalidArgumentError("no items in the batch");
  if (static_cast<size_t>(n) > kMaxPeerBatch) {
    return absl::InvalidArgumentError(
        absl::StrCat(n, " items in one batch; at most ", kMaxPeerBatch));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status PeerHandler::PrepareRemoteBatch(const peer::v1::PrepareRemoteBatchRequest& request,
                                             peer::v1::PrepareRemoteBatchResponse* response) {
  if (absl::Status st = CheckBatchSize(request.items_size()); !st.ok()) return st;
  const absl::Time t0 = absl::Now();
  absl::Cleanup log = [&] {
    VLOG(2) << "PrepareRemoteBatch of " << request.items_size() << " handled in "
            << absl::ToDoubleMicroseconds(absl::Now() - t0) << " us";
  };
  for (const peer::v1::PrepareRemoteRequest& item : request.items()) {
    peer::v1::PrepareRemoteResult* r = response->add_results();
    absl::Status st = PrepareRemote(item, r->mutable_response());
    r->set_code(static_cast<int32_t>(st.code()));
    r->set_message(Bounded(st.message()));
    if (!st.ok()) r->clear_response();
  }
  return absl::OkStatus();
}

absl::Status PeerHandler::CompleteRemoteBatch(const peer::v1::CompleteRemoteBatchRequest& request,
                                              peer::v1::CompleteRemoteBatchResponse* response) {
  if (absl::Status st = CheckBatchSize(request.items_size()); !st.ok()) return st;
  for (const peer::v1::CompleteRemoteRequest& item : request.items()) {
    peer::v1::CompleteRemoteResult* r = response->add_results();
    peer::v1::CompleteRemoteResponse one;
    absl::Status st = CompleteRemote(item, &one);
    r->set_code(static_cast<int32_t>(st.code()));
    r->set_message(Bounded(st.message()));
    r->set_xxh3(one.xxh3());
  }
  return absl::OkStatus();
}

}  // namespace gpumove

namespace gpumove {

absl::Status PeerHandler::TakeStageSlots(const peer::v1::TakeStageSlotsRequest& request,
                                         peer::v1::TakeStageSlotsResponse* response) {
  auto ring = holds_->TakeRing(request.from_node(), request.transfer_id());
  if (!ring.ok()) return (ring.status());
  ListSlots(*ring, response);
  return absl::OkStatus();
}

absl::Status PeerHandler::StageChunk(const peer::v1::StageChunkRequest& request,
                                     peer::v1::StageChunkResponse* response) {
  return (holds_->StageChunk(request.from_node(), request.transfer_id(), request.slot(),
                             request.slot_offset(), request.offset(), request.length(),
                             request.to_range()));
}

}  // namespace gpumove

namespace gpumove {

absl::Status PeerHandler::StartMpi(const peer::v1::StartMpiRequest& request,
                                   peer::v1::StartMpiResponse* response) {
  return StartHalf(request, /*patient=*/false);
}

absl::Status PeerHandler::StartHalf(const peer::v1::StartMpiRequest& request, bool patient) {
  if (mpi_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("node ", cluster_->self().node(), " is not an MPI rank"));
  }
  // The rank must be the one the runner's node announced in this job.
  auto runner = cluster_->Find(request.from_node());
  if (!runner.ok()) return (runner.status());
  const peer::v1::NodeDescriptor self = cluster_->self();
  if (runner->descriptor.mpi_world() != self.mpi_world() ||
      runner->descriptor.mpi_rank() != request.from_rank()) {
    return absl::FailedPreconditionError(absl::StrCat("node ", Quoted(request.from_node()),
                                                      " is not rank ", request.from_rank(),
                                                      " of this node's MPI job"));
  }
  return (holds_->StartHalf(request.from_node(), request.transfer_id(), [&](const BufferUse& u) {
    return mpi_->StartPassive(Endpoint{u.data(), u.kind(), u.device()}, u.length(),
                              request.from_rank(), request.tag(), request.chunk(), request.send(),
                              patient);
  }));
}

absl::Status PeerHandler::StopMpi(const peer::v1::StopMpiRequest& request,
                                  peer::v1::StopMpiResponse* response) {
  return (holds_->StopHalf(request.from_node(), request.transfer_id()));
}

}  // namespace gpumove
