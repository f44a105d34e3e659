#include "daemon/cluster/remote_ranges.h"

#include "absl/strings/str_cat.h"
#include "daemon/common/log.h"

namespace gpumove {
namespace {

absl::Status FromGrpc(const grpc::Status& s, const std::string& node) {
  if (s.ok()) return absl::OkStatus();
  // A transport failure talking to the peer is the peer being unavailable.
  const auto code = s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED
                        ? absl::StatusCode::kUnavailable
                        : static_cast<absl::StatusCode>(s.error_code());
  return absl::Status(code, absl::StrCat(s.error_message(), " (node ", node, ")"));
}

MemoryKind FromProtoKind(v1::MemoryKind k) {
  return k == v1::DEVICE        ? MemoryKind::kDevice
         : k == v1::PINNED_HOST ? MemoryKind::kPinnedHost
                                : MemoryKind::kHost;
}

}  // namespace

ClusterRemoteRanges::ClusterRemoteRanges(Cluster* cluster, absl::Duration rpc_timeout)
    : cluster_(cluster), rpc_timeout_(rpc_timeout) {
  releaser_ = std::thread([this] { ReleaseLoop(); });
}

ClusterRemoteRanges::~ClusterRemoteRanges() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  releaser_.join();
}

absl::StatusOr<RemoteHold> ClusterRemoteRanges::Prepare(
    const std::string& owner, const std::string& transfer_id, const std::string& node,
    const std::string& buffer_id, uint64_t offset, uint64_t length, bool write, PathKind path,
    bool local_device) {
  auto peer = cluster_->Find(node);
  if (!peer.ok()) return peer.status();
  auto stub = v1::PeerService::NewStub(
      peer->channel != nullptr ? peer->channel : cluster_->ChannelTo(peer->address));
  v1::PrepareRemoteRequest request;
  request.set_transfer_id(transfer_id);
  const v1::NodeDescriptor self = cluster_->self();
  request.set_from_node(self.node());
  request.set_from_incarnation(self.incarnation());
  request.set_owner(owner);
  request.mutable_range()->set_buffer_id(buffer_id);
  request.mutable_range()->set_offset(offset);
  request.mutable_range()->set_length(length);
  request.set_write(write);
  request.set_path(static_cast<v1::Path>(path));
  request.set_runner_device(local_device);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + rpc_timeout_));
  v1::PrepareRemoteResponse response;
  absl::Status st = FromGrpc(stub->PrepareRemote(&context, request, &response), node);
  if (!st.ok()) return st;
  RemoteHold hold;
  hold.node = node;
  hold.incarnation = peer->descriptor.incarnation();
  hold.transfer_id = transfer_id;
  hold.address = response.address();
  hold.length = response.length();
  hold.kind = FromProtoKind(response.kind());
  hold.device = response.device();
  hold.write = write;
  hold.ucx_worker_address = peer->descriptor.ucx_worker_address();
  hold.same_host = peer->descriptor.host_id() == self.host_id();
  if (self.mpi_world() != 0 && peer->descriptor.mpi_world() == self.mpi_world()) {
    hold.mpi_rank = peer->descriptor.mpi_rank();
  }
  if (response.pool_index() >= 0 && response.pool_index() < peer->descriptor.pools_size()) {
    hold.ucx_rkey = peer->descriptor.pools(response.pool_index()).rkey();
  }
  hold.cuda_ipc_handle = response.cuda_ipc_handle();
  hold.cuda_ipc_offset = response.cuda_ipc_offset();
  hold.device_uuid = response.device_uuid();
  hold.stage_slots.assign(response.stage_slots().begin(), response.stage_slots().end());
  hold.stage_slot_size = response.stage_slot_size();
  if (response.stage_pool_index() >= 0 &&
      response.stage_pool_index() < peer->descriptor.pools_size()) {
    hold.stage_rkey = peer->descriptor.pools(response.stage_pool_index()).rkey();
  }
  return hold;
}

absl::StatusOr<std::unique_ptr<v1::PeerService::Stub>> ClusterRemoteRanges::StubFor(
    const RemoteHold& hold) {
  auto peer = cluster_->Find(hold.node);
  if (!peer.ok()) return peer.status();
  if (peer->descriptor.incarnation() != hold.incarnation) {
    return absl::UnavailableError(absl::StrCat("node ", hold.node, " restarted during the move"));
  }
  return v1::PeerService::NewStub(cluster_->ChannelTo(peer->address));
}

absl::StatusOr<uint64_t> ClusterRemoteRanges::Complete(const RemoteHold& hold,
                                                       const absl::Status& outcome, bool checksum) {
  const absl::Time t0 = absl::Now();
  auto stub = StubFor(hold);
  const absl::Time t1 = absl::Now();
  if (!stub.ok()) return stub.status();
  v1::CompleteRemoteRequest request;
  request.set_transfer_id(hold.transfer_id);
  request.set_from_node(cluster_->self().node());
  request.set_code(static_cast<int32_t>(outcome.code()));
  request.set_message(std::string(outcome.message()));
  request.set_checksum(checksum && outcome.ok());
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + rpc_timeout_));
  v1::CompleteRemoteResponse response;
  absl::Status st = FromGrpc((*stub)->CompleteRemote(&context, request, &response), hold.node);
  VLOG(2) << "CompleteRemote: stub " << absl::ToDoubleMicroseconds(t1 - t0) << " us, rpc "
          << absl::ToDoubleMicroseconds(absl::Now() - t1) << " us";
  if (!st.ok()) return st;
  return response.xxh3();
}

absl::Status ClusterRemoteRanges::StageChunk(const RemoteHold& hold, uint32_t slot,
                                             uint64_t offset, uint64_t length, bool to_range) {
  auto stub = StubFor(hold);
  if (!stub.ok()) return stub.status();
  v1::StageChunkRequest request;
  request.set_transfer_id(hold.transfer_id);
  request.set_from_node(cluster_->self().node());
  request.set_slot(slot);
  request.set_offset(offset);
  request.set_length(length);
  request.set_to_range(to_range);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + rpc_timeout_));
  v1::StageChunkResponse response;
  return FromGrpc((*stub)->StageChunk(&context, request, &response), hold.node);
}

absl::Status ClusterRemoteRanges::StartMpi(const RemoteHold& hold, int tag, uint64_t chunk,
                                           bool send) {
  auto stub = StubFor(hold);
  if (!stub.ok()) return stub.status();
  v1::StartMpiRequest request;
  request.set_transfer_id(hold.transfer_id);
  const v1::NodeDescriptor self = cluster_->self();
  request.set_from_node(self.node());
  request.set_from_rank(self.mpi_rank());
  request.set_tag(tag);
  request.set_chunk(chunk);
  request.set_send(send);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + rpc_timeout_));
  v1::StartMpiResponse response;
  return FromGrpc((*stub)->StartMpi(&context, request, &response), hold.node);
}

absl::Status ClusterRemoteRanges::StopMpi(const RemoteHold& hold) {
  auto stub = StubFor(hold);
  if (!stub.ok()) return stub.status();
  v1::StopMpiRequest request;
  request.set_transfer_id(hold.transfer_id);
  request.set_from_node(cluster_->self().node());
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + rpc_timeout_));
  v1::StopMpiResponse response;
  return FromGrpc((*stub)->StopMpi(&context, request, &response), hold.node);
}

void ClusterRemoteRanges::Release(const RemoteHold& hold) {
  absl::MutexLock lock(&mu_);
  to_release_.push_back(hold);
}

void ClusterRemoteRanges::ReleaseLoop() {
  while (true) {
    RemoteHold hold;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_ || !to_release_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (to_release_.empty()) return;
      hold = std::move(to_release_.front());
      to_release_.pop_front();
    }
    auto st = Complete(hold, absl::CancelledError("move did not run"), false);
    if (!st.ok())
      VLOG(1) << "releasing hold " << hold.transfer_id << " on " << hold.node << ": "
              << st.status();
  }
}

}  // namespace gpumove
