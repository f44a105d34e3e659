// TransferService.Notifications as a callback reactor: the notification log's listener
// wakes it when something its caller may see is published; a shared timer comes back
// every second for the periodic checks (credentials, the buffers it watches).
#include <memory>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/common/grpc_status.h"
#include "daemon/common/quote.h"
#include "daemon/server/convert.h"
#include "daemon/server/field_limits.h"
#include "daemon/server/forward.h"
#include "daemon/server/stream_reactor.h"
#include "daemon/server/stream_timer.h"
#include "daemon/server/transfer_reactors.h"

namespace gpumove {

class NotificationsReactor final : public StreamReactor<v1::Notification> {
 public:
  NotificationsReactor(TransferServiceImpl* service, grpc::CallbackServerContext* context,
                       const v1::NotificationsRequest* request)
      : StreamReactor("subscriber went away"), s_(service), context_(context), request_(request) {}

  grpc::Status Start() override {
    GPUMOVE_CHECK_CALLER(caller, *s_->auth_, context_, Access::kRead, "Notifications");
    GPUMOVE_CHECK_FIELDS(*request_);
    if (absl::Status st = EnterLongCall(s_->long_calls_, true, caller.principal); !st.ok()) {
      return ToGrpcStatus(st);
    }
    if (request_->buffers_size() > 4096) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat(request_->buffers_size(), " buffers; at most 4096"));
    }
    if (!request_->node().empty() && request_->node() != s_->node_) {
      auto stub = s_->StubFor(*context_, request_->node());
      if (!stub.ok()) return ToGrpcStatus(stub.status());
      auto call = std::make_unique<ForwardedCall>(*context_, s_->auth_, *s_->cluster_,
                                                  request_->node(), absl::InfiniteDuration());
      v1::NotificationsRequest forwarded = *request_;
      forwarded.clear_node();
      std::shared_ptr<v1::TransferService::Stub> shared = *std::move(stub);
      // Subscribed there: the caller learns it as it would from this node (the relay
      // sends the headers once the other node's come).
      Relay(std::move(call),
            [shared, request = std::move(forwarded)](
                grpc::ClientContext* c, grpc::ClientReadReactor<v1::Notification>* r) mutable {
              shared->async()->Notifications(c, &request, r);
            });
      return grpc::Status::OK;
    }
    if (s_->notifications_ == nullptr) {
      return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "this node publishes no notifications");
    }
    owner_ = caller.owner();
    buffers_.insert(request_->buffers().begin(), request_->buffers().end());
    // Named buffers are this node's (moves into them publish here): one that does not
    // exist (a typo, another node's) would never see a notification.
    for (const std::string& b : buffers_) {
      if (s_->buffers_ != nullptr && !s_->buffers_->Get(owner_, b).ok()) {
        return grpc::Status(grpc::StatusCode::NOT_FOUND,
                            absl::StrCat("no buffer ", Quoted(b), " on node ", s_->node_,
                                         " (notifications name buffers of the node they ask)"));
      }
    }
    if (!buffers_.empty()) {
      accept_ = [this](const Notification& n) { return buffers_.contains(n.destination_buffer); };
    }
    after_ = request_->has_after_sequence() ? request_->after_sequence()
                                            : s_->notifications_->Last(owner_);
    credentials_.emplace(*s_->auth_, context_, caller);
    EndWhenRevoked(s_->auth_, context_, caller);
    std::weak_ptr<NotificationsReactor> w = Weak(this);
    listener_ = s_->notifications_->Listen(owner_, [w] {
      StreamTimer::Shared().Post([w] {
        if (auto r = w.lock()) r->Pump();
      });
    });
    absl::MutexLock lock(&mu_);
    // The subscription is in place: a client that waits for the headers
    // (Client::Subscribe) sees every move submitted after that.
    SendHeadersLocked();
    buffers_checked_ = absl::Now();
    PumpLocked();
    return grpc::Status::OK;
  }

 private:
  void Pump() {
    absl::MutexLock lock(&mu_);
    PumpLocked();
  }

  // Writes what was published since the last batch, one at a time; ends the stream when
  // its caller went, its credentials were revoked, every buffer it watched was released
  // (nothing more can come) or the daemon stops; otherwise comes back in a second.
  void PumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!LiveLocked() || writing_) return;  // A write's end pumps again.
    if (context_->IsCancelled()) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "subscriber went away"));
      return;
    }
    if (absl::Status st = credentials_->Check(); !st.ok()) {
      FinishLocked(ToGrpcStatus(st));
      return;
    }
    if (!buffers_.empty() && absl::Now() - buffers_checked_ >= absl::Seconds(1)) {
      buffers_checked_ = absl::Now();
      if (!AnyLeft()) {
        FinishLocked(grpc::Status(grpc::StatusCode::NOT_FOUND,
                                  "every buffer this stream watched was released"));
        return;
      }
    }
    if (next_ == batch_.entries.size()) {
      batch_ = s_->notifications_->Read(owner_, after_, accept_, 256, absl::InfinitePast());
      next_ = 0;
      after_ = batch_.next_after;
    }
    if (next_ < batch_.entries.size()) {
      WriteEntryLocked(batch_.entries[next_++]);
      return;
    }
    if (s_->notifications_->stopped()) {
      FinishLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE, "daemon is shutting down"));
      return;
    }
    if (tick_ != 0) StreamTimer::Shared().Cancel(tick_);
    std::weak_ptr<NotificationsReactor> w = Weak(this);
    tick_ = StreamTimer::Shared().At(absl::Now() + absl::Seconds(1), [w] {
      if (auto r = w.lock()) r->Pump();
    });
  }

  void WriteEntryLocked(const NotificationLog::Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    out_.Clear();
    out_.set_sequence(e.sequence);
    out_.set_missed(e.missed);
    if (e.notification != nullptr) {
      const Notification& n = *e.notification;
      out_.set_transfer_id(n.transfer_id);
      out_.set_source_node(n.source_node);
      out_.set_destination_buffer(n.destination_buffer);
      out_.set_notify(n.notify);
      ToProto(n.time, out_.mutable_time());
    }
    WriteLocked(&out_);
  }

  bool AnyLeft() const {
    for (const std::string& b : buffers_) {
      if (s_->buffers_ == nullptr || s_->buffers_->Get(owner_, b).ok()) return true;
    }
    return false;
  }

  void WrittenLocked(bool ok) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!ok) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "subscriber went away"));
    } else {
      PumpLocked();
    }
  }

  void Closed() override {
    StreamReactor::Closed();
    if (listener_ != 0) s_->notifications_->Unlisten(listener_);
    absl::MutexLock lock(&mu_);
    if (tick_ != 0) StreamTimer::Shared().Cancel(tick_);
  }

  TransferServiceImpl* const s_;
  grpc::CallbackServerContext* const context_;
  const v1::NotificationsRequest* const request_;
  std::string owner_;
  absl::flat_hash_set<std::string> buffers_;
  std::function<bool(const Notification&)> accept_;
  std::optional<CredentialsWatch> credentials_;
  uint64_t listener_ = 0;
  uint64_t tick_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t after_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time buffers_checked_ ABSL_GUARDED_BY(mu_);
  NotificationLog::Batch batch_ ABSL_GUARDED_BY(mu_);
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;
  v1::Notification out_ ABSL_GUARDED_BY(mu_);
};

grpc::ServerWriteReactor<v1::Notification>* ServeNotifications(
    TransferServiceImpl* service, grpc::CallbackServerContext* context,
    const v1::NotificationsRequest* request) {
  return NotificationsReactor::Serve<NotificationsReactor>(service, context, request);
}

}  // namespace gpumove
