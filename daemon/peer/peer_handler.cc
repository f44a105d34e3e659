#include "daemon/peer/peer_handler.h"

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/common/log.h"
#include "daemon/common/quote.h"
#include "daemon/common/status_macros.h"
#include "daemon/peer/kinds.h"
#include "daemon/peer/piece_list.h"

namespace gpumove {

// Pieces one hold may name (a move's own cap, --max_blocks_per_move, is the runner's).
constexpr size_t kMaxHeldPieces = size_t{1} << 22;

absl::Status PeerHandler::Hello(const peer::v1::HelloRequest& request,
                                peer::v1::HelloResponse* response) {
  auto known = cluster_->OnHello(request.from());
  if (!known.ok()) return known.status();
  for (std::string& a : *known) response->add_known_addresses(std::move(a));
  *response->mutable_node() = cluster_->self();
  return absl::OkStatus();
}

absl::Status PeerHandler::PrepareRemote(const peer::v1::PrepareRemoteRequest& request,
                                        peer::v1::PrepareRemoteResponse* response) {
  if (request.from_node().empty() || request.transfer_id().empty()) {
    return absl::InvalidArgumentError("from_node and transfer_id are required");
  }
  // Holds are kept for peers this node has met, and end when it loses them: a node that
  // never said Hello (or is not up at that incarnation) holds nothing here, or its holds
  // would pin buffers for ever. A peer met a moment ago may not be learned yet (its
  // Hello's answer on its way): a brief wait, reached only over gRPC (the UCX channel
  // admits met peers only).
  auto met = [&] {
    return cluster_->Matches(request.from_node(), request.from_incarnation(),
                             [](const PeerView&) { return true; });
  };
  for (const absl::Time until = absl::Now() + absl::Milliseconds(500); !met();) {
    if (absl::Now() >= until) {
      return absl::FailedPreconditionError(absl::StrCat(
          "node ", Quoted(request.from_node()), " (incarnation ", request.from_incarnation(),
          ") is not a peer of this node: say Hello first"));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  const HoldContext context{request, [&] {
                              auto runner = cluster_->Find(request.from_node());
                              return runner.ok() &&
                                     runner->descriptor.host_id() == cluster_->self().host_id();
                            }};
  HoldAsk ask;
  if (request.write() && request.has_notify()) ask.notify = request.notify();
  auto pieces = PieceListView::Of(request.pieces(), kMaxHeldPieces);
  if (!pieces.ok()) return pieces.status();
  ask.pieces.resize(pieces->size());
  for (size_t i = 0; i < pieces->size(); ++i) {
    const uint64_t at = pieces->offset(i);
    ask.pieces[i] = Segment{at, at, pieces->length(i)};
  }
  // Each path offers what reaches the range, and keeps its part with the hold.
  auto held = holds_->Hold(
      request.from_node(), request.from_incarnation(), request.transfer_id(), request.owner(),
      request.range().buffer_id(), request.range().offset(), request.range().length(),
      [&](const BufferUse& range, std::vector<std::unique_ptr<HoldPart>>* parts) {
        for (PathHolder* h : holders_) {
          auto part = h->Offer(context, range, response);
          if (!part.ok()) return part.status();
          if (*part != nullptr) parts->push_back(*std::move(part));
        }
        return absl::OkStatus();
      },
      std::move(ask));
  if (!held.ok()) return held.status();
  response->set_address(reinterpret_cast<uint64_t>(held->data));
  response->set_length(held->length);
  response->set_kind(ToProto(held->kind));
  response->set_device(held->device);
  return absl::OkStatus();
}

absl::Status PeerHandler::CompleteRemote(const peer::v1::CompleteRemoteRequest& request,
                                         peer::v1::CompleteRemoteResponse* response) {
  const absl::Time t0 = absl::Now();
  // A tail: the runner's copy into (or out of) the range may still run; this node sees
  // it end itself before the hold ends (and before it acknowledges or hashes, unless the
  // runner waits for it too).
  auto hash = holds_->Complete(
      request.from_node(), request.transfer_id(), request.checksum(),
      /*runner_ok=*/request.code() == 0, TailOf(request), HoldTable::kTailWait,
      request.has_source_xxh3() ? std::optional<uint64_t>(request.source_xxh3()) : std::nullopt);
  VLOG(2) << "CompleteRemote handled in " << absl::ToDoubleMicroseconds(absl::Now() - t0) << " us"
          << (request.tail_token().empty() ? ""
              : request.runner_waits_tail() && !request.checksum()
                  ? " (the hold ends when the runner's tail lands)"
                  : " (after the runner's tail landed)");
  if (!hash.ok()) return hash.status();
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
  GPUMOVE_RETURN_IF_ERROR(CheckBatchSize(request.items_size()));
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
  GPUMOVE_RETURN_IF_ERROR(CheckBatchSize(request.items_size()));
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

absl::Status PeerHandler::PathCall(const peer::v1::PathCallRequest& request,
                                   peer::v1::PathCallResponse* response) {
  // The caller first, before anything of the call is looked at further. No wait as for a
  // hold: a path call follows a hold, made once the caller was met.
  if (!cluster_->Matches(request.from_node(), request.from_incarnation(),
                         [](const PeerView&) { return true; })) {
    return absl::FailedPreconditionError(
        absl::StrCat("node ", Quoted(request.from_node()), " (incarnation ",
                     request.from_incarnation(), ") is not a peer of this node: say Hello first"));
  }
  for (const std::string* name : {&request.path(), &request.method()}) {
    if (name->empty() || name->size() > PathCalls::kMaxName) {
      return absl::InvalidArgumentError(absl::StrCat("a path call's path and method have 1 to ",
                                                     PathCalls::kMaxName, " bytes, not ",
                                                     name->size()));
    }
  }
  if (request.body().size() > PathCalls::kMaxBody) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a path call's body of ", request.body().size(), " bytes; at most ", PathCalls::kMaxBody));
  }
  const PathCalls::Entry* e =
      path_calls_ == nullptr ? nullptr : path_calls_->Find(request.path(), request.method());
  if (e == nullptr) {
    return absl::UnimplementedError(absl::StrCat("node ", cluster_->self().node(),
                                                 " serves no path call ", Quoted(request.path()),
                                                 " ", Quoted(request.method())));
  }
  auto answer =
      e->handler(PathCaller{request.from_node(), request.from_incarnation()}, request.body());
  if (!answer.ok()) return answer.status();
  response->set_body(*std::move(answer));
  return absl::OkStatus();
}

}  // namespace gpumove
