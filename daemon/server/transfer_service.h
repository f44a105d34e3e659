// gpumove.v1.TransferService over the transfer scheduler.
#ifndef GPUMOVE_DAEMON_SERVER_TRANSFER_SERVICE_H_
#define GPUMOVE_DAEMON_SERVER_TRANSFER_SERVICE_H_

#include <optional>
#include <string>
#include <vector>

#include "daemon/cluster/cluster.h"
#include "daemon/core/buffer_registry.h"
#include "daemon/core/prepared_pieces.h"
#include "daemon/core/transfer_scheduler.h"
#include "daemon/server/auth.h"
#include "daemon/server/call_limits.h"
#include "proto/gpumove/v1/gpumove.grpc.pb.h"

namespace gpumove {

// Any daemon accepts any request: a move runs on the node holding one of its ends
// (pushes from the source, pulls into the destination); a Submit naming neither end's
// node is forwarded to the source's node, and Get/Wait/Watch/Cancel of a transfer id are
// forwarded to the node that runs it (the id ends in ".<node>"). Watch and Notifications
// are callback reactors, as are Wait and Cancel (transfer_reactors.h): an open stream or
// a blocked Wait holds no thread. Submit is synchronous (below).
class TransferServiceImpl final : public v1::TransferService::WithCallbackMethod_Wait<
                                      v1::TransferService::WithCallbackMethod_Watch<
                                          v1::TransferService::WithCallbackMethod_Cancel<
                                              v1::TransferService::WithCallbackMethod_Notifications<
                                                  v1::TransferService::Service>>>> {
 public:
  // `cluster` may be null: a node without peers.
  // `auth` checks every caller (and must outlive the service), as must `notifications`
  // (null: none are streamed) and `prepared` (null: no prepared piece lists).
  TransferServiceImpl(const Authenticator* auth, TransferScheduler* scheduler, Cluster* cluster,
                      std::string node, NotificationLog* notifications = nullptr,
                      PreparedPieceLists* prepared = nullptr)
      : auth_(auth),
        scheduler_(scheduler),
        cluster_(cluster),
        node_(std::move(node)),
        notifications_(notifications),
        prepared_(prepared) {}

  // On the synchronous server: its callback form measured 10-34% fewer small moves a
  // second (docs/reliability.md). A Submit that waits for moves that did not end inline
  // holds its thread until they end, within the open-call caps.
  grpc::Status Submit(grpc::ServerContext* context, const v1::SubmitRequest* request,
                      v1::SubmitResponse* response) override;
  grpc::Status Get(grpc::ServerContext* context, const v1::GetTransferRequest* request,
                   v1::Transfer* response) override;
  grpc::Status List(grpc::ServerContext* context, const v1::ListTransfersRequest* request,
                    v1::ListTransfersResponse* response) override;
  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext* context,
                                 const v1::WaitRequest* request, v1::Transfer* response) override;
  grpc::ServerWriteReactor<v1::TransferEvent>* Watch(grpc::CallbackServerContext* context,
                                                     const v1::WatchRequest* request) override;
  grpc::ServerUnaryReactor* Cancel(grpc::CallbackServerContext* context,
                                   const v1::CancelRequest* request,
                                   v1::Transfer* response) override;
  grpc::ServerWriteReactor<v1::Notification>* Notifications(
      grpc::CallbackServerContext* context, const v1::NotificationsRequest* request) override;
  grpc::Status PreparePieces(grpc::ServerContext* context, const v1::PreparePiecesRequest* request,
                             v1::PreparedPieces* response) override;
  grpc::Status ReleasePieces(grpc::ServerContext* context, const v1::ReleasePiecesRequest* request,
                             v1::ReleasePiecesResponse* response) override;
  grpc::Status ListPreparedPieces(grpc::ServerContext* context,
                                  const v1::ListPreparedPiecesRequest* request,
                                  v1::ListPreparedPiecesResponse* response) override;

  // Caps the calls that last (streams, waits); null: no caps. Set before serving.
  void set_long_calls(LongCalls* calls) { long_calls_ = calls; }
  // This node's buffers: Notifications for named buffers checks they exist, and ends once
  // every one of them is released.
  void set_buffers(const BufferRegistry* buffers) { buffers_ = buffers; }

 private:
  friend class WatchReactor;
  friend class NotificationsReactor;
  friend class WaitReactor;
  friend class CancelReactor;

  // The earlier of the RPC's own deadline and now + `timeout` (when given).
  static absl::StatusOr<absl::Time> WaitDeadline(const grpc::ServerContextBase* context,
                                                 bool has_timeout,
                                                 const google::protobuf::Duration& timeout);
  // The node a Submit's moves run on ("" for none: an empty batch); FAILED_PRECONDITION
  // or INVALID_ARGUMENT for a batch that cannot run on one node.
  grpc::Status RunnerOf(const v1::SubmitRequest& request, std::string* runner) const;
  // A Submit's moves as the scheduler takes them, checked.
  grpc::Status SpecsOf(const Caller& caller, const v1::SubmitRequest& request,
                       std::vector<TransferSpec>* specs) const;
  // The node a request for transfer `id` belongs to ("" when it is this one), and a stub
  // for it. NOT_FOUND / UNAVAILABLE for unknown or down nodes.
  std::string NodeOf(const std::string& id) const;
  absl::StatusOr<std::unique_ptr<v1::TransferService::Stub>> StubFor(
      const grpc::ServerContextBase& context, const std::string& node);
  // The forwarded call's status when transfer `id` belongs to another node; nullopt when
  // it is this node's.
  template <typename Request, typename Response>
  std::optional<grpc::Status> MaybeForward(const std::string& id,
                                           grpc::Status (v1::TransferService::Stub::*method)(
                                               grpc::ClientContext*, const Request&, Response*),
                                           grpc::ServerContext* context, const Request& request,
                                           Response* response, absl::Duration bound);
  // The pieces of prepared list `id` for a move `owner` runs here: NOT_FOUND for a list
  // the owner does not have, FAILED_PRECONDITION for one kept on another node.
  absl::StatusOr<std::shared_ptr<const Segments>> PreparedFor(const std::string& owner,
                                                              const std::string& id) const;
  // How long a forwarded call that waits `timeout` (none: as long as its caller) may take.
  absl::Duration WaitBound(bool has_timeout, const google::protobuf::Duration& timeout) const;
  // Submit's: the batch sent to node `runner`, which runs it.
  grpc::Status ForwardSubmit(grpc::ServerContext* context, const std::string& runner,
                             const v1::SubmitRequest& request, v1::SubmitResponse* response);
  // Submit with wait's: transfer `id`'s end, by `deadline`, or CANCELLED once the caller
  // has gone (checked between slices of the wait).
  absl::StatusOr<TransferSnapshot> WaitEnd(grpc::ServerContext* context, const std::string& owner,
                                           const std::string& id, absl::Time deadline) const;

  LongCalls* long_calls_ = nullptr;
  const BufferRegistry* buffers_ = nullptr;
  const Authenticator* const auth_;
  TransferScheduler* const scheduler_;
  Cluster* const cluster_;
  const std::string node_;
  NotificationLog* const notifications_;
  PreparedPieceLists* const prepared_;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_SERVER_TRANSFER_SERVICE_H_
