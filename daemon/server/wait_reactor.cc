// TransferService.Wait and Cancel as callback reactors (waiting_reactor.h): a Wait, or a
// Cancel with wait, listens for the transfer's end instead of holding a thread; a Cancel's
// own step, which may let go of other nodes' holds, runs on the bounded CallPool.
#include <memory>

#include "daemon/common/grpc_status.h"
#include "daemon/server/call_pool.h"
#include "daemon/server/convert.h"
#include "daemon/server/field_limits.h"
#include "daemon/server/forward.h"
#include "daemon/server/transfer_reactors.h"
#include "daemon/server/waiting_reactor.h"

namespace gpumove {

class WaitReactor final : public WaitingReactor {
 public:
  WaitReactor(TransferServiceImpl* service, grpc::CallbackServerContext* context,
              const v1::WaitRequest* request, v1::Transfer* response)
      : WaitingReactor(service->scheduler_, context),
        s_(service),
        context_(context),
        request_(request),
        response_(response) {}

  grpc::Status Start() override {
    GPUMOVE_CHECK_CALLER(caller, *s_->auth_, context_, Access::kRead, "Wait");
    GPUMOVE_CHECK_FIELDS(*request_);
    if (absl::Status st = EnterLongCall(s_->long_calls_, true, caller.principal); !st.ok()) {
      return ToGrpcStatus(st);
    }
    if (const std::string node = s_->NodeOf(request_->id()); !node.empty()) {
      auto stub = s_->StubFor(*context_, node);
      if (!stub.ok()) return ToGrpcStatus(stub.status());
      std::shared_ptr<v1::TransferService::Stub> shared = *std::move(stub);
      Relay<v1::Transfer>(
          std::make_unique<ForwardedCall>(
              *context_, s_->auth_, *s_->cluster_, node,
              s_->WaitBound(request_->has_timeout(), request_->timeout())),
          response_,
          [shared, request = *request_](grpc::ClientContext* c, v1::Transfer* out,
                                        std::function<void(grpc::Status)> done) mutable {
            shared->async()->Wait(c, &request, out, std::move(done));
          });
      return grpc::Status::OK;
    }
    auto deadline =
        TransferServiceImpl::WaitDeadline(context_, request_->has_timeout(), request_->timeout());
    if (!deadline.ok()) return ToGrpcStatus(deadline.status());
    auto t = s_->scheduler_->Get(caller.owner(), request_->id());
    if (!t.ok()) return ToGrpcStatus(t.status());
    absl::MutexLock lock(&mu_);
    AwaitEndsLocked(
        caller.owner(), {*std::move(t)}, *deadline,
        [this](const std::vector<TransferSnapshot>& ends) { ToProto(ends.front(), response_); });
    return grpc::Status::OK;
  }

 private:
  TransferServiceImpl* const s_;
  grpc::CallbackServerContext* const context_;
  const v1::WaitRequest* const request_;
  v1::Transfer* const response_;
};

class CancelReactor final : public WaitingReactor {
 public:
  CancelReactor(TransferServiceImpl* service, grpc::CallbackServerContext* context,
                const v1::CancelRequest* request, v1::Transfer* response)
      : WaitingReactor(service->scheduler_, context),
        s_(service),
        context_(context),
        request_(request),
        response_(response) {}

  grpc::Status Start() override {
    GPUMOVE_CHECK_CALLER(caller, *s_->auth_, context_, Access::kChange, "Cancel");
    GPUMOVE_CHECK_FIELDS(*request_);
    if (absl::Status st = EnterLongCall(s_->long_calls_, request_->wait(), caller.principal);
        !st.ok()) {
      return ToGrpcStatus(st);
    }
    if (const std::string node = s_->NodeOf(request_->id()); !node.empty()) {
      auto stub = s_->StubFor(*context_, node);
      if (!stub.ok()) return ToGrpcStatus(stub.status());
      std::shared_ptr<v1::TransferService::Stub> shared = *std::move(stub);
      Relay<v1::Transfer>(
          std::make_unique<ForwardedCall>(*context_, s_->auth_, *s_->cluster_, node,
                                          ForwardTimeout(s_->cluster_)),
          response_,
          [shared, request = *request_](grpc::ClientContext* c, v1::Transfer* out,
                                        std::function<void(grpc::Status)> done) mutable {
            shared->async()->Cancel(c, &request, out, std::move(done));
          });
      return grpc::Status::OK;
    }
    auto deadline = TransferServiceImpl::WaitDeadline(context_, request_->has_wait_timeout(),
                                                      request_->wait_timeout());
    if (!deadline.ok()) return ToGrpcStatus(deadline.status());
    owner_ = caller.owner();
    deadline_ = *deadline;
    absl::MutexLock lock(&mu_);
    busy_ = true;
    auto self = std::static_pointer_cast<CancelReactor>(shared_from_this());
    CallPool::Shared().Run([self] { self->CancelNow(); });
    return grpc::Status::OK;
  }

 private:
  void CancelNow() {
    auto t = s_->scheduler_->Cancel(owner_, request_->id());
    absl::MutexLock lock(&mu_);
    busy_ = false;
    if (!t.ok()) {
      FinishLocked(ToGrpcStatus(t.status()));
      return;
    }
    if (request_->wait() && !IsTerminal(t->state)) {
      AwaitEndsLocked(
          owner_, {*std::move(t)}, deadline_,
          [this](const std::vector<TransferSnapshot>& ends) { ToProto(ends.front(), response_); });
      return;
    }
    ToProto(*t, response_);
    FinishLocked(grpc::Status::OK);
  }

  TransferServiceImpl* const s_;
  grpc::CallbackServerContext* const context_;
  const v1::CancelRequest* const request_;
  v1::Transfer* const response_;
  std::string owner_;
  absl::Time deadline_;
};

grpc::ServerUnaryReactor* ServeWait(TransferServiceImpl* service,
                                    grpc::CallbackServerContext* context,
                                    const v1::WaitRequest* request, v1::Transfer* response) {
  return WaitReactor::Serve<WaitReactor>(service, context, request, response);
}

grpc::ServerUnaryReactor* ServeCancel(TransferServiceImpl* service,
                                      grpc::CallbackServerContext* context,
                                      const v1::CancelRequest* request, v1::Transfer* response) {
  return CancelReactor::Serve<CancelReactor>(service, context, request, response);
}

}  // namespace gpumove
