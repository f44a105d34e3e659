// TransferService.Watch as a callback reactor: an event at once for each change of the
// transfer's state (the scheduler's listener wakes it), its progress at most once per
// progress_interval (the shared timer), the end when it ends.
#include <memory>

#include "absl/time/clock.h"
#include "daemon/common/grpc_status.h"
#include "daemon/server/convert.h"
#include "daemon/server/field_limits.h"
#include "daemon/server/forward.h"
#include "daemon/server/stream_reactor.h"
#include "daemon/server/stream_timer.h"
#include "daemon/server/transfer_reactors.h"

namespace gpumove {

class WatchReactor final : public StreamReactor<v1::TransferEvent> {
 public:
  WatchReactor(TransferServiceImpl* service, grpc::CallbackServerContext* context,
               const v1::WatchRequest* request)
      : StreamReactor("watcher went away"), s_(service), context_(context), request_(request) {}

  grpc::Status Start() override {
    GPUMOVE_CHECK_CALLER(caller, *s_->auth_, context_, Access::kRead, "Watch");
    GPUMOVE_CHECK_FIELDS(*request_);
    if (absl::Status st = EnterLongCall(s_->long_calls_, true, caller.principal); !st.ok()) {
      return ToGrpcStatus(st);
    }
    if (request_->has_progress_interval()) {
      auto d = FromProto(request_->progress_interval());
      if (!d.ok()) return ToGrpcStatus(d.status());
      if (*d > absl::ZeroDuration()) interval_ = std::max(*d, absl::Milliseconds(1));
    }
    if (const std::string node = s_->NodeOf(request_->id()); !node.empty()) {
      auto stub = s_->StubFor(*context_, node);
      if (!stub.ok()) return ToGrpcStatus(stub.status());
      auto call = std::make_unique<ForwardedCall>(*context_, s_->auth_, *s_->cluster_, node,
                                                  absl::InfiniteDuration());
      std::shared_ptr<v1::TransferService::Stub> shared = *std::move(stub);
      Relay(std::move(call),
            [shared, request = *request_](grpc::ClientContext* c,
                                          grpc::ClientReadReactor<v1::TransferEvent>* r) mutable {
              shared->async()->Watch(c, &request, r);
            });
      return grpc::Status::OK;
    }
    owner_ = caller.owner();
    auto t = s_->scheduler_->Get(owner_, request_->id());
    if (!t.ok()) return ToGrpcStatus(t.status());
    credentials_.emplace(*s_->auth_, context_, caller);
    EndWhenRevoked(s_->auth_, context_, caller);
    std::weak_ptr<WatchReactor> w = Weak(this);
    listener_ = s_->scheduler_->ListenForChanges(request_->id(), [w] {
      StreamTimer::Shared().Post([w] {
        if (auto r = w.lock()) r->Pump();
      });
    });
    absl::MutexLock lock(&mu_);
    PumpLocked();
    return grpc::Status::OK;
  }

 private:
  void Pump() {
    absl::MutexLock lock(&mu_);
    PumpLocked();
  }

  // Writes the transfer when it changed (its state at once, its progress once the
  // interval since the last event is over), ends the stream at its end; otherwise comes
  // back at the interval's end.
  void PumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!LiveLocked() || writing_) return;  // A write's end pumps again.
    if (absl::Status st = credentials_->Check(); !st.ok()) {
      FinishLocked(ToGrpcStatus(st));
      return;
    }
    auto t = s_->scheduler_->Get(owner_, request_->id());
    if (!t.ok()) {
      FinishLocked(ToGrpcStatus(t.status()));
      return;
    }
    const absl::Time now = absl::Now();
    if (first_ || t->version != sent_version_ ||
        (t->bytes_done != sent_bytes_ && now >= progress_due_)) {
      event_.Clear();
      ToProto(*t, event_.mutable_transfer());
      first_ = false;
      sent_version_ = t->version;
      sent_bytes_ = t->bytes_done;
      ended_ = IsTerminal(t->state);
      progress_due_ = now + interval_;
      WriteLocked(&event_);
      return;
    }
    if (context_->IsCancelled()) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "watcher went away"));
      return;
    }
    if (s_->scheduler_->stopped()) {
      FinishLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE, "daemon is shutting down"));
      return;
    }
    if (tick_ != 0) StreamTimer::Shared().Cancel(tick_);
    std::weak_ptr<WatchReactor> w = Weak(this);
    tick_ = StreamTimer::Shared().At(std::max(progress_due_, now + absl::Milliseconds(1)), [w] {
      if (auto r = w.lock()) r->Pump();
    });
  }

  void WrittenLocked(bool ok) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!ok) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "watcher went away"));
    } else if (ended_) {
      FinishLocked(grpc::Status::OK);
    } else {
      PumpLocked();
    }
  }

  void Closed() override {
    StreamReactor::Closed();
    if (listener_ != 0) s_->scheduler_->ForgetChanges(listener_);
    absl::MutexLock lock(&mu_);
    if (tick_ != 0) StreamTimer::Shared().Cancel(tick_);
  }

  TransferServiceImpl* const s_;
  grpc::CallbackServerContext* const context_;
  const v1::WatchRequest* const request_;
  absl::Duration interval_ = absl::Milliseconds(100);
  std::string owner_;
  std::optional<CredentialsWatch> credentials_;
  uint64_t listener_ = 0;
  uint64_t tick_ ABSL_GUARDED_BY(mu_) = 0;
  bool first_ ABSL_GUARDED_BY(mu_) = true;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t sent_version_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t sent_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time progress_due_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  v1::TransferEvent event_ ABSL_GUARDED_BY(mu_);
};

grpc::ServerWriteReactor<v1::TransferEvent>* ServeWatch(TransferServiceImpl* service,
                                                        grpc::CallbackServerContext* context,
                                                        const v1::WatchRequest* request) {
  return WatchReactor::Serve<WatchReactor>(service, context, request);
}

}  // namespace gpumove
