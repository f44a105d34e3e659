#include "daemon/server/transfer_service.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/common/grpc_status.h"
#include "daemon/common/log.h"
#include "daemon/common/quote.h"
#include "daemon/server/auth.h"
#include "daemon/server/convert.h"
#include "daemon/server/field_limits.h"
#include "daemon/server/forward.h"
#include "daemon/server/paging.h"
#include "daemon/server/transfer_reactors.h"

namespace gpumove {
namespace {

// The pieces of a vectored move or prepared list, checked (MakeSegments / ExpandBlocks):
// `segments`, or `blocks` when not null (both: INVALID_ARGUMENT).
absl::StatusOr<std::shared_ptr<const Segments>> PiecesOf(
    const google::protobuf::RepeatedPtrField<v1::Segment>& segments, const v1::BlockList* blocks,
    size_t max_pieces) {
  if (!segments.empty() && blocks != nullptr) {
    return absl::InvalidArgumentError("segments or blocks, not both");
  }
  if (blocks != nullptr) {
    const v1::BlockList& b = *blocks;
    BlockListSpec list;
    list.block_size = b.block_size();
    list.source_stride = b.source_stride();
    list.destination_stride = b.destination_stride();
    if ((b.source_blocks_size() > 0 && b.source_blocks32_size() > 0) ||
        (b.destination_blocks_size() > 0 && b.destination_blocks32_size() > 0)) {
      return absl::InvalidArgumentError(
          "the indices of a side in one form: *_blocks or *_blocks32, not both");
    }
    // Each side's indices in the form given (views of the request's arrays).
    auto side = [](const auto& wide, const auto& narrow) {
      return wide.empty() ? BlockIndices(absl::MakeConstSpan(narrow.data(), narrow.size()))
                          : BlockIndices(absl::MakeConstSpan(wide.data(), wide.size()));
    };
    list.source_blocks = side(b.source_blocks(), b.source_blocks32());
    list.destination_blocks = side(b.destination_blocks(), b.destination_blocks32());
    return ExpandBlocks(list, max_pieces);
  }
  if (static_cast<size_t>(segments.size()) > max_pieces) {
    return absl::ResourceExhaustedError(absl::StrCat(segments.size(),
                                                     " segments in one move; at most ", max_pieces,
                                                     " (--max_blocks_per_move)"));
  }
  std::vector<Segment> list;
  list.reserve(segments.size());
  for (const v1::Segment& g : segments) {
    list.push_back(Segment{g.source_offset(), g.destination_offset(), g.length()});
  }
  return MakeSegments(std::move(list), max_pieces);
}

// The node in an id "x-<hex>.<node>" ("" when it has none).
std::string IdNode(const std::string& id) {
  const size_t dot = id.find('.');
  return dot == std::string::npos ? "" : id.substr(dot + 1);
}

// The classes of a Submit's moves (and the transport classes they require), before
// anything is forwarded or held: INVALID_ARGUMENT
// for a value the API does not define, PERMISSION_DENIED above the caller's cap (refused,
// not lowered: a move quietly run as bulk would queue behind the very work its caller
// asked to pass, and the caller could not tell).
grpc::Status CheckPriorities(const Caller& caller, const v1::SubmitRequest& request) {
  for (int i = 0; i < request.transfers_size(); ++i) {
    const std::string& need = request.transfers(i).require_transport();
    if (!need.empty() && need != "rdma" && need != "tcp") {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("transfer ", i, ": require_transport must be rdma, tcp or "
                                       "empty, not ", Quoted(need.substr(0, 32))));
    }
    auto p = FromProto(request.transfers(i).priority());
    if (!p.ok()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("transfer ", i, ": ", p.status().message()));
    }
    if (Above(*p, caller.max_priority)) {
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                          absl::StrCat("transfer ", i, ": ", Quoted(caller.principal),
                                       " may ask for classes up to ",
                                       PriorityName(caller.max_priority), ", not ",
                                       PriorityName(*p)));
    }
  }
  return grpc::Status::OK;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Segments>> TransferServiceImpl::PreparedFor(
    const std::string& owner, const std::string& id) const {
  if (prepared_ == nullptr) return absl::UnimplementedError("no prepared piece lists here");
  if (const std::string node = IdNode(id); node != node_) {
    // Runner checks in Submit say so before a move is forwarded; this is a list made up.
    return absl::FailedPreconditionError(
        absl::StrCat("prepared piece list ", Quoted(id), " is not kept on node ", Quoted(node_),
                     ", where this move runs; prepare the list on the node that runs the move "
                     "(its source node for a push, its destination node for a pull)"));
  }
  auto list = prepared_->Find(owner, id);
  if (!list.ok()) return list.status();
  return list->pieces;
}

std::string TransferServiceImpl::NodeOf(const std::string& id) const {
  const std::string node = IdNode(id);
  return node == node_ ? "" : node;
}

absl::StatusOr<std::unique_ptr<v1::TransferService::Stub>> TransferServiceImpl::StubFor(
    const grpc::ServerContextBase& context, const std::string& node) {
  return StubOn<v1::TransferService>(context, cluster_, node_, node);
}

template <typename Request, typename Response>
std::optional<grpc::Status> TransferServiceImpl::MaybeForward(
    const std::string& id,
    grpc::Status (v1::TransferService::Stub::*method)(grpc::ClientContext*, const Request&,
                                                      Response*),
    grpc::ServerContext* context, const Request& request, Response* response,
    absl::Duration bound) {
  const std::string node = NodeOf(id);
  if (node.empty()) return std::nullopt;
  auto stub = StubFor(*context, node);
  if (!stub.ok()) return ToGrpcStatus(stub.status());
  return ForwardUnary(**stub, method, context, auth_, *cluster_, node, request, response, bound);
}

absl::StatusOr<absl::Time> TransferServiceImpl::WaitDeadline(
    const grpc::ServerContextBase* context, bool has_timeout,
    const google::protobuf::Duration& timeout) {
  absl::Time deadline = absl::FromChrono(context->deadline());
  if (has_timeout) {
    auto d = FromProto(timeout);
    if (!d.ok()) return d.status();
    deadline = std::min(deadline, absl::Now() + *d);
  }
  return deadline;
}

absl::Duration TransferServiceImpl::WaitBound(bool has_timeout,
                                              const google::protobuf::Duration& timeout) const {
  if (!has_timeout) return absl::InfiniteDuration();  // As long as the caller waits.
  auto d = FromProto(timeout);
  return d.ok() ? *d + ForwardTimeout(cluster_) : ForwardTimeout(cluster_);
}

grpc::Status TransferServiceImpl::RunnerOf(const v1::SubmitRequest& request,
                                           std::string* runner) const {
  // Where does each move run? On the node that keeps its prepared piece list (which must
  // hold one of its ends), else here when this node holds one of its ends, else on its
  // source node. A batch runs on one node.
  for (int i = 0; i < request.transfers_size(); ++i) {
    const v1::TransferSpec& spec = request.transfers(i);
    const std::string src = spec.source().node().empty() ? node_ : spec.source().node();
    const std::string dst = spec.destination().node().empty() ? node_ : spec.destination().node();
    std::string here = (src == node_ || dst == node_) ? node_ : src;
    if (!spec.prepared_pieces().empty()) {
      const std::string kept = IdNode(spec.prepared_pieces());
      if (kept != src && kept != dst) {
        return grpc::Status(
            grpc::StatusCode::FAILED_PRECONDITION,
            absl::StrCat("transfer ", i, ": prepared piece list ", Quoted(spec.prepared_pieces()),
                         " is kept on node ", Quoted(kept),
                         ", which holds neither end of the "
                         "move; prepare it on the source's node (a push) or the destination's "
                         "(a pull)"));
      }
      here = kept;
    }
    if (!runner->empty() && here != *runner) {
      return grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("the moves of one Submit must run on one node (", Quoted(*runner), " and ",
                       Quoted(here), " here); split the batch"));
    }
    *runner = here;
  }
  return grpc::Status::OK;
}

grpc::Status TransferServiceImpl::SpecsOf(const Caller& caller, const v1::SubmitRequest& request,
                                          std::vector<TransferSpec>* specs) const {
  for (int i = 0; i < request.transfers_size(); ++i) {
    const v1::TransferSpec& in = request.transfers(i);
    auto path = FromProto(in.path());
    if (!path.ok()) return ToGrpcStatus(path.status());
    TransferSpec spec;
    spec.source = FromProto(in.source());
    spec.destination = FromProto(in.destination());
    spec.path = *path;
    spec.checksum = in.checksum();
    spec.durable = in.durable();
    spec.label = in.label();
    spec.priority = FromProto(in.priority()).value_or(Priority::kNormal);  // CheckPriorities.
    spec.require_transport = in.require_transport();                       // CheckPriorities.
    if (in.has_notify()) spec.notify = in.notify();
    const bool listed = in.segments_size() > 0 || in.has_blocks();
    if (listed && !in.prepared_pieces().empty()) {
      return grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("transfer ", i, ": segments or blocks or prepared_pieces, not two of them"));
    }
    if (!in.prepared_pieces().empty()) {
      auto kept = PreparedFor(caller.owner(), in.prepared_pieces());
      if (!kept.ok()) {
        return ToGrpcStatus(absl::Status(
            kept.status().code(), absl::StrCat("transfer ", i, ": ", kept.status().message())));
      }
      spec.pieces = *std::move(kept);
    } else if (listed) {
      auto pieces = PiecesOf(in.segments(), in.has_blocks() ? &in.blocks() : nullptr,
                             scheduler_->max_pieces());
      if (!pieces.ok()) {
        return ToGrpcStatus(absl::Status(
            pieces.status().code(), absl::StrCat("transfer ", i, ": ", pieces.status().message())));
      }
      spec.pieces = *std::move(pieces);
    }
    specs->push_back(std::move(spec));
  }
  return grpc::Status::OK;
}

grpc::Status TransferServiceImpl::Submit(grpc::ServerContext* context,
                                         const v1::SubmitRequest* request,
                                         v1::SubmitResponse* response) {
  // --v=2: where a Submit's time goes (reading its specs, the scheduler's accept).
  const bool trace = LogVerbosity() >= 2;
  const absl::Time entered = trace ? absl::Now() : absl::InfinitePast();
  GPUMOVE_CHECK_CALLER(caller, *auth_, context, Access::kChange, "Submit");
  GPUMOVE_CHECK_FIELDS(*request);
  GPUMOVE_ENTER_LONG_CALL(long_calls_, request->wait(), caller);
  if (grpc::Status st = CheckPriorities(caller, *request); !st.ok()) return st;
  std::string runner;
  if (grpc::Status st = RunnerOf(*request, &runner); !st.ok()) return st;
  if (!runner.empty() && runner != node_) return ForwardSubmit(context, runner, *request, response);
  std::vector<TransferSpec> specs;
  if (grpc::Status st = SpecsOf(caller, *request, &specs); !st.ok()) return st;
  auto deadline = WaitDeadline(context, request->has_wait_timeout(), request->wait_timeout());
  if (!deadline.ok()) return ToGrpcStatus(deadline.status());
  const std::string owner = caller.owner();
  const absl::Time t0 = absl::Now();
  // A caller that waits only so long (wait_timeout, or its RPC's deadline) is answered at
  // that time, so its moves run inline only where they end quickly anyway.
  const bool bounded = *deadline - absl::Now() < absl::Hours(24);
  auto transfers =
      scheduler_->Submit(owner, specs, request->idempotency_key(), request->wait(), bounded);
  if (!transfers.ok()) return ToGrpcStatus(transfers.status());
  if (trace) {
    VLOG(2) << "Submit of " << specs.size() << ": read in "
            << absl::ToDoubleMicroseconds(t0 - entered) << " us, accepted in "
            << absl::ToDoubleMicroseconds(absl::Now() - t0) << " us";
  }
  for (TransferSnapshot& t : *transfers) {
    if (request->wait() && !IsTerminal(t.state)) {  // Moves run inline have ended.
      auto done = WaitEnd(context, owner, t.id, *deadline);
      if (!done.ok()) return ToGrpcStatus(done.status());
      t = *std::move(done);
    }
    ToProto(t, response->add_transfers());
  }
  return grpc::Status::OK;
}

grpc::Status TransferServiceImpl::ForwardSubmit(grpc::ServerContext* context,
                                                const std::string& runner,
                                                const v1::SubmitRequest& request,
                                                v1::SubmitResponse* response) {
  auto stub = StubFor(*context, runner);
  if (!stub.ok()) return ToGrpcStatus(stub.status());
  v1::SubmitRequest forwarded = request;
  for (v1::TransferSpec& spec : *forwarded.mutable_transfers()) {
    if (spec.source().node().empty()) spec.mutable_source()->set_node(node_);
    if (spec.destination().node().empty()) spec.mutable_destination()->set_node(node_);
  }
  ForwardedCall call(*context, auth_, *cluster_, runner,
                     request.wait() ? WaitBound(request.has_wait_timeout(), request.wait_timeout())
                                    : ForwardTimeout(cluster_));
  return call.Finish((*stub)->Submit(call.context(), forwarded, response));
}

absl::StatusOr<TransferSnapshot> TransferServiceImpl::WaitEnd(grpc::ServerContext* context,
                                                              const std::string& owner,
                                                              const std::string& id,
                                                              absl::Time deadline) const {
  // In slices, so that a caller that hung up frees its thread within one.
  constexpr absl::Duration kSlice = absl::Milliseconds(200);
  while (true) {
    const absl::Time slice = std::min(deadline, absl::Now() + kSlice);
    auto t = scheduler_->Wait(owner, id, slice);
    if (t.ok() || t.status().code() != absl::StatusCode::kDeadlineExceeded || slice >= deadline ||
        scheduler_->stopped()) {
      return t;
    }
    if (context->IsCancelled()) return absl::CancelledError("the waiting caller went away");
  }
}

grpc::Status TransferServiceImpl::Get(grpc::ServerContext* context,
                                      const v1::GetTransferRequest* request,
                                      v1::Transfer* response) {
  GPUMOVE_CHECK_CALLER(caller, *auth_, context, Access::kRead, "Get");
  GPUMOVE_CHECK_FIELDS(*request);
  if (auto forwarded = MaybeForward(request->id(), &v1::TransferService::Stub::Get, context,
                                    *request, response, ForwardTimeout(cluster_))) {
    return *forwarded;
  }
  auto t = scheduler_->Get(caller.owner(), request->id());
  if (!t.ok()) return ToGrpcStatus(t.status());
  ToProto(*t, response);
  return grpc::Status::OK;
}

grpc::Status TransferServiceImpl::List(grpc::ServerContext* context,
                                       const v1::ListTransfersRequest* request,
                                       v1::ListTransfersResponse* response) {
  GPUMOVE_CHECK_CALLER(caller, *auth_, context, Access::kRead, "List");
  GPUMOVE_CHECK_FIELDS(*request);
  std::vector<TransferState> states;
  for (int s : request->states()) {
    auto state = FromProto(static_cast<v1::TransferState>(s));
    if (!state.ok()) return ToGrpcStatus(state.status());
    states.push_back(*state);
  }
  const uint32_t items =
      PageItems(request->page_size() != 0 ? request->page_size() : request->limit());
  auto next = FillPage(
      scheduler_->List(caller.owner(), states, std::numeric_limits<size_t>::max()),
      request->page_token(), items, /*newest_first=*/true,
      [](const TransferSnapshot& t) {
        return PageKey{t.create_time, t.id};
      },
      [&](const TransferSnapshot& t) {
        v1::Transfer* out = response->add_transfers();
        ToProto(t, out);
        return out->ByteSizeLong();
      });
  if (!next.ok()) return ToGrpcStatus(next.status());
  response->set_next_page_token(*next);
  return grpc::Status::OK;
}

grpc::ServerUnaryReactor* TransferServiceImpl::Wait(grpc::CallbackServerContext* context,
                                                    const v1::WaitRequest* request,
                                                    v1::Transfer* response) {
  return ServeWait(this, context, request, response);
}

grpc::ServerWriteReactor<v1::TransferEvent>* TransferServiceImpl::Watch(
    grpc::CallbackServerContext* context, const v1::WatchRequest* request) {
  return ServeWatch(this, context, request);
}

grpc::ServerUnaryReactor* TransferServiceImpl::Cancel(grpc::CallbackServerContext* context,
                                                      const v1::CancelRequest* request,
                                                      v1::Transfer* response) {
  return ServeCancel(this, context, request, response);
}

grpc::ServerWriteReactor<v1::Notification>* TransferServiceImpl::Notifications(
    grpc::CallbackServerContext* context, const v1::NotificationsRequest* request) {
  return ServeNotifications(this, context, request);
}

}  // namespace gpumove

namespace gpumove {

namespace {

void PreparedToProto(const PreparedList& list, v1::PreparedPieces* out) {
  out->set_id(list.id);
  out->set_pieces(list.pieces->list.size());
  out->set_bytes(list.pieces->total);
  out->set_source_extent(list.pieces->src_hi);
  out->set_destination_extent(list.pieces->dst_hi);
  out->set_label(list.label);
  ToProto(list.created, out->mutable_create_time());
  out->set_owner(list.owner);
}

}  // namespace

grpc::Status TransferServiceImpl::PreparePieces(grpc::ServerContext* context,
                                                const v1::PreparePiecesRequest* request,
                                                v1::PreparedPieces* response) {
  GPUMOVE_CHECK_CALLER(caller, *auth_, context, Access::kChange, "PreparePieces");
  GPUMOVE_CHECK_FIELDS(*request);
  if (!request->node().empty() && request->node() != node_) {
    auto stub = StubFor(*context, request->node());
    if (!stub.ok()) return ToGrpcStatus(stub.status());
    return ForwardUnary(**stub, &v1::TransferService::Stub::PreparePieces, context, auth_,
                        *cluster_, request->node(), *request, response, ForwardTimeout(cluster_));
  }
  if (prepared_ == nullptr) {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "no prepared piece lists here");
  }
  if (request->segments_size() == 0 && !request->has_blocks()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "a prepared piece list needs segments or blocks");
  }
  auto pieces = PiecesOf(request->segments(), request->has_blocks() ? &request->blocks() : nullptr,
                         scheduler_->max_pieces());
  if (!pieces.ok()) return ToGrpcStatus(pieces.status());
  auto list = prepared_->Add(caller.owner(), **pieces, request->label());
  if (!list.ok()) return ToGrpcStatus(list.status());
  PreparedToProto(*list, response);
  return grpc::Status::OK;
}

grpc::Status TransferServiceImpl::ReleasePieces(grpc::ServerContext* context,
                                                const v1::ReleasePiecesRequest* request,
                                                v1::ReleasePiecesResponse* response) {
  GPUMOVE_CHECK_CALLER(caller, *auth_, context, Access::kChange, "ReleasePieces");
  GPUMOVE_CHECK_FIELDS(*request);
  if (auto forwarded = MaybeForward(request->id(), &v1::TransferService::Stub::ReleasePieces,
                                    context, *request, response, ForwardTimeout(cluster_))) {
    return *forwarded;
  }
  if (prepared_ == nullptr) {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "no prepared piece lists here");
  }
  return ToGrpcStatus(prepared_->Remove(caller.owner(), request->id()));
}

grpc::Status TransferServiceImpl::ListPreparedPieces(grpc::ServerContext* context,
                                                     const v1::ListPreparedPiecesRequest* request,
                                                     v1::ListPreparedPiecesResponse* response) {
  GPUMOVE_CHECK_CALLER(caller, *auth_, context, Access::kRead, "ListPreparedPieces");
  GPUMOVE_CHECK_FIELDS(*request);
  if (!request->node().empty() && request->node() != node_) {
    auto stub = StubFor(*context, request->node());
    if (!stub.ok()) return ToGrpcStatus(stub.status());
    return ForwardUnary(**stub, &v1::TransferService::Stub::ListPreparedPieces, context, auth_,
                        *cluster_, request->node(), *request, response, ForwardTimeout(cluster_));
  }
  if (prepared_ == nullptr) return grpc::Status::OK;
  auto next = FillPage(
      prepared_->List(caller.owner()), request->page_token(), PageItems(request->page_size()),
      /*newest_first=*/false,
      [](const PreparedList& l) {
        return PageKey{l.created, l.id};
      },
      [&](const PreparedList& l) {
        v1::PreparedPieces* out = response->add_lists();
        PreparedToProto(l, out);
        return out->ByteSizeLong();
      });
  if (!next.ok()) return ToGrpcStatus(next.status());
  response->set_next_page_token(*next);
  return grpc::Status::OK;
}

}  // namespace gpumove
