#include "daemon/peer/remote_ranges.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "daemon/common/log.h"
#include "daemon/peer/kinds.h"
#include "daemon/peer/piece_list.h"

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

}  // namespace

ClusterRemoteRanges::ClusterRemoteRanges(Cluster* cluster, absl::Duration rpc_timeout,
                                         PeerCallChannel* channel,
                                         std::vector<const PathCodec*> codecs)
    : cluster_(cluster), rpc_timeout_(rpc_timeout), channel_(channel), codecs_(std::move(codecs)) {
  releaser_ = std::thread([this] { ReleaseLoop(); });
}

ClusterRemoteRanges::~ClusterRemoteRanges() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  releaser_.join();
  absl::MutexLock lock(&ackers_mu_);
  for (auto& [node, a] : ackers_) {
    {
      absl::MutexLock al(&a->mu);
      a->stop = true;
    }
    if (a->drainer.joinable()) a->drainer.join();
  }
}

absl::StatusOr<RemoteHold> ClusterRemoteRanges::Prepare(
    const std::string& owner, const std::string& transfer_id, const std::string& node,
    const std::string& buffer_id, uint64_t offset, uint64_t length, bool write, PathKind path,
    bool local_device) {
  RemoteAsk ask{transfer_id, buffer_id, offset, length, write, path, local_device};
  return std::move(PrepareMany(owner, node, {ask})[0]);
}

std::vector<absl::StatusOr<RemoteHold>> ClusterRemoteRanges::PrepareMany(
    const std::string& owner, const std::string& node, const std::vector<RemoteAsk>& asks) {
  std::vector<absl::StatusOr<RemoteHold>> out;
  auto peer = cluster_->Find(node);
  if (!peer.ok()) {
    out.assign(asks.size(), peer.status());
    return out;
  }
  const peer::v1::NodeDescriptor self = cluster_->self();
  for (size_t first = 0; first < asks.size(); first += kMaxPeerBatch) {
    const size_t last = std::min(asks.size(), first + kMaxPeerBatch);
    peer::v1::PrepareRemoteBatchRequest request;
    for (size_t i = first; i < last; ++i) {
      const RemoteAsk& a = asks[i];
      peer::v1::PrepareRemoteRequest* item = request.add_items();
      item->set_transfer_id(a.transfer_id);
      item->set_from_node(self.node());
      item->set_from_incarnation(self.incarnation());
      item->set_owner(owner);
      item->mutable_range()->set_buffer_id(a.buffer_id);
      item->mutable_range()->set_offset(a.offset);
      item->mutable_range()->set_length(a.length);
      item->set_write(a.write);
      item->set_path(ToProto(a.path));
      item->set_runner_device(a.local_device);
      if (a.write && a.notify.has_value()) item->set_notify(*a.notify);
      if (a.pieces != nullptr) {
        const Segment* p = a.pieces->list.data();
        const bool write = a.write;
        EncodePieces(
            a.pieces->list.size(), [p, write](size_t i) { return write ? p[i].dst : p[i].src; },
            [p](size_t i) { return p[i].length; }, item->mutable_pieces());
      }
      if (a.path_ask != nullptr) {
        for (const PathCodec* c : codecs_) c->EncodeAsk(*a.path_ask, *peer, item);
      }
    }
    peer::v1::PrepareRemoteBatchResponse response;
    const absl::Time t0 = absl::Now();
    absl::Status st = Invoke(*peer, PeerMethod::kPrepareRemoteBatch, request, &response,
                             &peer::v1::PeerService::Stub::PrepareRemoteBatch);
    VLOG(2) << "PrepareRemoteBatch of " << request.items_size() << " to " << node << ": "
            << absl::ToDoubleMicroseconds(absl::Now() - t0) << " us";
    if (st.ok() && response.results_size() != request.items_size()) {
      st = absl::InternalError(absl::StrCat("node ", node, " answered ", response.results_size(),
                                            " of ", request.items_size(), " holds"));
      // What it did hold is let go.
      for (int i = 0; i < response.results_size(); ++i) {
        if (response.results(i).code() != 0) continue;
        RemoteHold h;
        h.node = node;
        h.incarnation = peer->descriptor.incarnation();
        h.transfer_id = asks[first + i].transfer_id;
        Release(h);
      }
    }
    for (size_t i = first; i < last; ++i) {
      if (!st.ok()) {
        // The node may still make the hold when it gets the request (stopped or slow now),
        // and nobody would end it: it is told that the move is over.
        if (MayStillHold(st)) {
          RemoteHold h;
          h.node = node;
          h.incarnation = peer->descriptor.incarnation();
          h.transfer_id = asks[i].transfer_id;
          Linger(h, st);
        }
        out.push_back(st);
        continue;
      }
      const peer::v1::PrepareRemoteResult& r = response.results(static_cast<int>(i - first));
      if (r.code() != 0) {
        out.push_back(absl::Status(static_cast<absl::StatusCode>(r.code()),
                                   absl::StrCat(r.message(), " (node ", node, ")")));
        continue;
      }
      auto hold = HoldFrom(node, *peer, self, asks[i], r.response());
      if (!hold.ok())
        Release(RemoteHold{node, peer->descriptor.incarnation(), asks[i].transfer_id});
      out.push_back(std::move(hold));
    }
  }
  return out;
}

absl::StatusOr<RemoteHold> ClusterRemoteRanges::HoldFrom(
    const std::string& node, const PeerView& peer, const peer::v1::NodeDescriptor& self,
    const RemoteAsk& ask, const peer::v1::PrepareRemoteResponse& response) const {
  auto kind = FromProto(response.kind());
  if (!kind.ok()) {
    return absl::InternalError(
        absl::StrCat("node ", node, " held a range of ", kind.status().message()));
  }
  RemoteHold hold;
  hold.node = node;
  hold.incarnation = peer.descriptor.incarnation();
  hold.transfer_id = ask.transfer_id;
  hold.address = response.address();
  hold.length = response.length();
  hold.kind = *kind;
  hold.device = response.device();
  hold.write = ask.write;
  hold.same_host = peer.descriptor.host_id() == self.host_id();
  for (const PathCodec* c : codecs_) c->DecodeOffer(peer, ask, response, &hold);
  return hold;
}

absl::StatusOr<PeerView> ClusterRemoteRanges::PeerFor(const RemoteHold& hold) {
  auto peer = cluster_->Find(hold.node);
  if (!peer.ok()) return peer.status();
  if (peer->descriptor.incarnation() != hold.incarnation) {
    return absl::UnavailableError(absl::StrCat("node ", hold.node, " restarted during the move"));
  }
  return peer;
}

const char* PeerMethodName(PeerMethod method) {
  switch (method) {
    case PeerMethod::kPrepareRemoteBatch:
      return "prepare_remote_batch";
    case PeerMethod::kCompleteRemoteBatch:
      return "complete_remote_batch";
    case PeerMethod::kPathCall:
      return "path_call";
  }
  return "unknown";
}

absl::Status ClusterRemoteRanges::CallPath(const RemoteHold& hold, absl::string_view path,
                                           absl::string_view method,
                                           const google::protobuf::Message& request,
                                           google::protobuf::Message* response) {
  auto peer = PeerFor(hold);
  if (!peer.ok()) return peer.status();
  const peer::v1::NodeDescriptor self = cluster_->self();
  peer::v1::PathCallRequest call;
  call.set_path(std::string(path));
  call.set_method(std::string(method));
  call.set_from_node(self.node());
  call.set_from_incarnation(self.incarnation());
  call.set_body(request.SerializeAsString());
  peer::v1::PathCallResponse answer;
  absl::Status st = Call(*peer, PeerMethod::kPathCall, method, call, &answer,
                         [&](peer::v1::PeerService::Stub& stub, grpc::ClientContext* context) {
                           return stub.PathCall(context, call, &answer);
                         });
  if (!st.ok()) return st;
  if (!response->ParseFromString(answer.body())) {
    return absl::InternalError(absl::StrCat("malformed reply from node ", hold.node));
  }
  return absl::OkStatus();
}

absl::Status ClusterRemoteRanges::Call(
    const PeerView& peer, PeerMethod method, absl::string_view name,
    const google::protobuf::Message& request, google::protobuf::Message* response,
    absl::FunctionRef<grpc::Status(peer::v1::PeerService::Stub&, grpc::ClientContext*)> rpc,
    absl::Duration more) {
  const bool fast = channel_ != nullptr && channel_->Reaches(peer);
  const absl::Duration timeout = rpc_timeout_ + more;
  PeerCallObserver* observer = observer_.load(std::memory_order_relaxed);
  if (observer == nullptr) return CallUntimed(peer, method, request, response, fast, rpc, timeout);
  const absl::Time start = absl::Now();
  absl::Status st = CallUntimed(peer, method, request, response, fast, rpc, timeout);
  observer->OnPeerCall(name, fast ? "ucx" : "grpc", absl::Now() - start, st);
  return st;
}

absl::Status ClusterRemoteRanges::CallUntimed(
    const PeerView& peer, PeerMethod method, const google::protobuf::Message& request,
    google::protobuf::Message* response, bool fast,
    absl::FunctionRef<grpc::Status(peer::v1::PeerService::Stub&, grpc::ClientContext*)> rpc,
    absl::Duration timeout) {
  if (fast) {
    auto body = channel_->Call(peer, method, request.SerializeAsString(), timeout);
    if (!body.ok()) {
      return absl::Status(body.status().code(),
                          absl::StrCat(body.status().message(), " (node ", peer.node, ")"));
    }
    if (!response->ParseFromString(*body)) {
      return absl::InternalError(absl::StrCat("malformed reply from node ", peer.node));
    }
    return absl::OkStatus();
  }
  auto stub = peer::v1::PeerService::NewStub(
      peer.channel != nullptr ? peer.channel : cluster_->ChannelTo(peer.address));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  const std::string mac = StampGrpcCall(cluster_->auth(), static_cast<uint32_t>(method), request,
                                        peer.descriptor.incarnation(), &context);
  const grpc::Status st = rpc(*stub, &context);
  if (st.ok() && !AnswerSigned(cluster_->auth(), mac, *response, context)) {
    return absl::UnauthenticatedError(
        absl::StrCat("the answer of node ", peer.node, " is not signed with the cluster's secret"));
  }
  return FromGrpc(st, peer.node);
}

namespace {

// What hashing `bytes` may take a node, at a rate far below xxh3's (a loaded machine, a
// sanitizer build): the time an acknowledgement that checks a checksum gets besides the
// call timeout.
absl::Duration HashingTime(uint64_t bytes) {
  constexpr double kSlowestBytesPerSecond = 256.0 * (1 << 20);
  return absl::Seconds(static_cast<double>(bytes) / kSlowestBytesPerSecond);
}

// The acknowledgement of one move, as an item of a CompleteRemoteBatch.
void FillComplete(const std::string& self, const RemoteHold& hold, const absl::Status& outcome,
                  bool checksum, const AckTail& tail, peer::v1::CompleteRemoteRequest* item) {
  item->set_transfer_id(hold.transfer_id);
  item->set_from_node(self);
  item->set_code(static_cast<int32_t>(outcome.code()));
  item->set_message(std::string(outcome.message()));
  item->set_checksum(checksum && outcome.ok());
  if (checksum && outcome.ok() && hold.source_xxh3.has_value()) {
    item->set_source_xxh3(*hold.source_xxh3);
  }
  if (outcome.ok() && !tail.token.empty()) {
    item->set_tail_token(tail.token);
    item->set_tail_bytes(tail.bytes);
    item->set_runner_waits_tail(tail.runner_waits);
  }
}

}  // namespace

absl::StatusOr<uint64_t> ClusterRemoteRanges::Complete(const RemoteHold& hold,
                                                       const absl::Status& outcome, bool checksum,
                                                       const AckTail& tail) {
  auto hash = CompleteOnce(hold, outcome, checksum, tail);
  if (!hash.ok() && MayStillHold(hash.status())) Linger(hold, hash.status());
  return hash;
}

absl::StatusOr<uint64_t> ClusterRemoteRanges::CompleteOnce(const RemoteHold& hold,
                                                           const absl::Status& outcome,
                                                           bool checksum, const AckTail& tail) {
  const absl::Time t0 = absl::Now();
  auto peer = PeerFor(hold);
  if (!peer.ok()) return peer.status();
  peer::v1::CompleteRemoteBatchRequest request;
  FillComplete(cluster_->self().node(), hold, outcome, checksum, tail, request.add_items());
  peer::v1::CompleteRemoteBatchResponse response;
  absl::Status st = Invoke(*peer, PeerMethod::kCompleteRemoteBatch, request, &response,
                           &peer::v1::PeerService::Stub::CompleteRemoteBatch,
                           HashingTime(checksum && outcome.ok() ? hold.length : 0));
  VLOG(2) << "CompleteRemoteBatch of one: " << absl::ToDoubleMicroseconds(absl::Now() - t0)
          << " us";
  if (!st.ok()) return st;
  if (response.results_size() != 1) {
    return absl::UnavailableError(absl::StrCat("node ", hold.node, " answered ",
                                               response.results_size(), " of 1 acknowledgements"));
  }
  const peer::v1::CompleteRemoteResult& r = response.results(0);
  if (r.code() != 0) {
    return absl::Status(static_cast<absl::StatusCode>(r.code()),
                        absl::StrCat(r.message(), " (node ", hold.node, ")"));
  }
  return r.xxh3();
}

ClusterRemoteRanges::Acker* ClusterRemoteRanges::AckerFor(const std::string& node) {
  absl::MutexLock lock(&ackers_mu_);
  auto& slot = ackers_[node];
  if (slot == nullptr) {
    slot = std::make_unique<Acker>();
    Acker* a = slot.get();
    a->drainer = std::thread([this, node, a] { DrainLoop(node, a); });
  }
  return slot.get();
}

void ClusterRemoteRanges::CompleteAsync(const RemoteHold& hold, const absl::Status& outcome,
                                        bool checksum, const AckTail& tail, bool caller_busy,
                                        AckCallback done) {
  Acker* a = AckerFor(hold.node);
  {
    absl::MutexLock lock(&a->mu);
    if (a->busy || caller_busy) {
      a->queue.push_back(PendingAck{hold, outcome, checksum, tail, std::move(done)});
      // Nothing in flight but a busy caller: the drainer sends it, this thread goes back
      // to moving bytes.
      if (!a->busy) a->busy = a->drain = true;
      return;
    }
    a->busy = true;
  }
  // Nothing in flight to this node: send ours now, on this thread (no hand-off for a lone
  // move). What queues meanwhile is the drainer's to send, so this thread can go back to
  // moving bytes.
  std::vector<PendingAck> batch;
  batch.push_back(PendingAck{hold, outcome, checksum, tail, std::move(done)});
  SendAcks(hold.node, batch);
  absl::MutexLock lock(&a->mu);
  if (a->queue.empty()) {
    a->busy = false;
  } else {
    a->drain = true;
  }
}

void ClusterRemoteRanges::DrainLoop(const std::string& node, Acker* a) {
  while (true) {
    std::vector<PendingAck> batch;
    {
      absl::MutexLock lock(&a->mu);
      auto ready = [a]() ABSL_SHARED_LOCKS_REQUIRED(a->mu) { return a->stop || a->drain; };
      a->mu.Await(absl::Condition(&ready));
      if (!a->drain) return;  // Stopping with nothing handed over.
      batch.swap(a->queue);
      if (batch.empty()) {
        a->drain = false;
        a->busy = false;
        continue;
      }
    }
    SendAcks(node, batch);
  }
}

void ClusterRemoteRanges::SendAcks(const std::string& node, std::vector<PendingAck>& batch) {
  const absl::Time t0 = absl::Now();
  auto peer = cluster_->Find(node);
  // Those for an incarnation that is gone end here; the rest go in batches.
  std::vector<PendingAck*> sent;
  for (PendingAck& p : batch) {
    if (!peer.ok()) {
      if (MayStillHold(peer.status())) Linger(p.hold, peer.status());  // Down, not gone.
      p.done(peer.status());
    } else if (peer->descriptor.incarnation() != p.hold.incarnation) {
      p.done(absl::UnavailableError(absl::StrCat("node ", node, " restarted during the move")));
    } else {
      sent.push_back(&p);
    }
  }
  const std::string self = cluster_->self().node();
  for (size_t first = 0; first < sent.size(); first += kMaxPeerBatch) {
    const size_t last = std::min(sent.size(), first + kMaxPeerBatch);
    peer::v1::CompleteRemoteBatchRequest part;
    uint64_t hashed = 0;  // Bytes the other node hashes before it answers.
    for (size_t i = first; i < last; ++i) {
      const PendingAck& p = *sent[i];
      FillComplete(self, p.hold, p.outcome, p.checksum, p.tail, part.add_items());
      if (p.checksum && p.outcome.ok()) hashed += p.hold.length;
    }
    peer::v1::CompleteRemoteBatchResponse response;
    absl::Status st =
        Invoke(*peer, PeerMethod::kCompleteRemoteBatch, part, &response,
               &peer::v1::PeerService::Stub::CompleteRemoteBatch, HashingTime(hashed));
    if (st.ok() && response.results_size() != part.items_size()) {
      st = absl::UnavailableError(absl::StrCat("node ", node, " answered ", response.results_size(),
                                               " of ", part.items_size(), " acknowledgements"));
    }
    for (size_t i = first; i < last; ++i) {
      if (!st.ok()) {
        if (MayStillHold(st)) Linger(sent[i]->hold, st);
        sent[i]->done(st);
        continue;
      }
      const peer::v1::CompleteRemoteResult& r = response.results(static_cast<int>(i - first));
      if (r.code() != 0) {
        sent[i]->done(absl::Status(static_cast<absl::StatusCode>(r.code()),
                                   absl::StrCat(r.message(), " (node ", node, ")")));
      } else {
        sent[i]->done(r.xxh3());
      }
    }
  }
  VLOG(2) << "CompleteRemoteBatch of " << sent.size() << " to " << node << ": "
          << absl::ToDoubleMicroseconds(absl::Now() - t0) << " us";
}

void ClusterRemoteRanges::Release(const RemoteHold& hold) {
  absl::MutexLock lock(&mu_);
  to_release_.push_back(hold);
}

bool ClusterRemoteRanges::MayStillHold(const absl::Status& st) {
  return absl::IsUnavailable(st) || absl::IsDeadlineExceeded(st) || absl::IsCancelled(st);
}

void ClusterRemoteRanges::Linger(const RemoteHold& hold, const absl::Status& why) {
  VLOG(1) << "the end of transfer " << hold.transfer_id << "'s hold on " << hold.node
          << " is told again later: " << why;
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  lingering_.push_back(
      Lingering{hold, now + absl::Milliseconds(250), now, absl::Milliseconds(250)});
  lingered_ = true;  // The release loop sets its next wake-up anew.
}

size_t ClusterRemoteRanges::lingering() {
  absl::MutexLock lock(&mu_);
  return lingering_.size();
}

bool ClusterRemoteRanges::RetryLingering(Lingering& l) {
  auto peer = cluster_->Find(l.hold.node);
  if (absl::IsNotFound(peer.status())) return true;
  // Restarted: its holds went with the old process.
  if (peer.ok() && peer->descriptor.incarnation() != l.hold.incarnation) return true;
  if (absl::Now() - l.since > kLingerFor) {
    LOG(WARNING) << "gave up telling " << l.hold.node << " that transfer " << l.hold.transfer_id
                 << " ended; its hold there stays until it sees this node go";
    return true;
  }
  if (peer.ok()) {
    auto st = CompleteOnce(l.hold,
                           absl::UnavailableError("the move ended while this node could not "
                                                  "reach yours"),
                           false, AckTail{});
    VLOG(1) << "told " << l.hold.node << " again that transfer " << l.hold.transfer_id
            << " ended: " << (st.ok() ? absl::OkStatus() : st.status());
    if (st.ok() || !MayStillHold(st.status())) return true;  // Told, or no hold there.
  }
  l.backoff = std::min(l.backoff * 2, absl::Seconds(1));
  l.due = absl::Now() + l.backoff;
  return false;  // Down or silent: try again once it may be back.
}

void ClusterRemoteRanges::ReleaseLoop() {
  while (true) {
    std::optional<RemoteHold> hold;
    std::vector<Lingering> due;
    {
      absl::MutexLock lock(&mu_);
      absl::Time next = absl::InfiniteFuture();
      for (const Lingering& l : lingering_) next = std::min(next, l.due);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stop_ || !to_release_.empty() || lingered_;
      };
      mu_.AwaitWithDeadline(absl::Condition(&ready), next);
      lingered_ = false;
      if (stop_ && to_release_.empty()) return;
      if (!to_release_.empty()) {
        hold = std::move(to_release_.front());
        to_release_.pop_front();
      }
      const absl::Time now = absl::Now();
      for (auto it = lingering_.begin(); it != lingering_.end();) {
        if (it->due <= now) {
          due.push_back(std::move(*it));
          it = lingering_.erase(it);
        } else {
          ++it;
        }
      }
    }
    if (hold.has_value()) {
      auto st = Complete(*hold, absl::CancelledError("move did not run"), false, AckTail{});
      if (!st.ok()) {
        VLOG(1) << "releasing hold " << hold->transfer_id << " on " << hold->node << ": "
                << st.status();
      }
    }
    for (Lingering& l : due) {
      if (!RetryLingering(l)) {
        absl::MutexLock lock(&mu_);
        lingering_.push_back(std::move(l));
      }
    }
  }
}

}  // namespace gpumove
