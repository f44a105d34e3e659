// A server stream served as a callback reactor: written here (Read, Watch, Notifications
// of this node) or relayed message by message from the node it belongs to, read there
// with gRPC's callback client; neither holds a thread while it waits.
#ifndef GPUMOVE_DAEMON_SERVER_STREAM_REACTOR_H_
#define GPUMOVE_DAEMON_SERVER_STREAM_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <utility>

#include "daemon/server/forward.h"
#include "daemon/server/lasting_reactor.h"

namespace gpumove {

template <typename Response>
class StreamReactor : public LastingReactor<grpc::ServerWriteReactor<Response>> {
  using Base = LastingReactor<grpc::ServerWriteReactor<Response>>;

 public:
  // Starts the relayed call: `start(context, reactor)` calls the stub's async method.
  using StartRelay = std::function<void(grpc::ClientContext*, grpc::ClientReadReactor<Response>*)>;

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&this->mu_);
    const bool live = this->WriteDoneLocked();
    if (upstream_ == nullptr) {
      WrittenLocked(ok && live);
      return;
    }
    if (ok && live) {
      upstream_->StartRead(&upstream_->message);
    } else {
      upstream_->call->context()->TryCancel();  // Its end finishes this call.
    }
  }

  void OnCancel() override {
    absl::MutexLock lock(&this->mu_);
    if (upstream_ != nullptr) upstream_->call->context()->TryCancel();
    this->FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, gone_));
  }

 protected:
  explicit StreamReactor(const char* gone) : gone_(gone) {}

  // Writes `message` (kept by the caller until OnWriteDone); false when nothing may be
  // written any more.
  bool WriteLocked(const Response* message) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this->mu_) {
    if (!this->LiveLocked() || this->writing_) return false;
    this->writing_ = true;
    headers_sent_ = true;  // The first write carries them.
    this->StartWrite(message);
    return true;
  }
  // Sends the headers now (once; a write sends them otherwise).
  void SendHeadersLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(this->mu_) {
    if (headers_sent_ || !this->LiveLocked()) return;
    headers_sent_ = true;
    this->StartSendInitialMetadata();
  }
  // A write done (`ok`: it went and more may follow), for streams written here.
  virtual void WrittenLocked(bool ok) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this->mu_) {
    if (!ok) this->FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, gone_));
  }

  // Relays the stream of `call` (which `start` begins) to this call's caller, headers
  // first (a caller that waits for them knows the other node subscribed). From Start().
  void Relay(std::unique_ptr<ForwardedCall> call, StartRelay start) {
    auto up = std::make_unique<Upstream>();
    up->call = std::move(call);
    up->start = std::move(start);
    up->server = std::static_pointer_cast<StreamReactor>(this->shared_from_this());
    Upstream* u = up.get();
    {
      absl::MutexLock lock(&this->mu_);
      upstream_ = std::move(up);
    }
    u->start(u->call->context(), u);
    u->StartRead(&u->message);
    u->StartCall();
  }

  void Closed() override {
    absl::MutexLock lock(&this->mu_);
    if (upstream_ != nullptr) upstream_->call->context()->TryCancel();
  }

 private:
  struct Upstream : grpc::ClientReadReactor<Response> {
    std::unique_ptr<ForwardedCall> call;
    StartRelay start;  // Keeps the stub and request it captured to the end.
    Response message;
    // Kept until this call ends: it writes into the server's call.
    std::shared_ptr<StreamReactor> server;

    void OnReadInitialMetadataDone(bool ok) override {
      absl::MutexLock lock(&server->mu_);
      if (ok) server->SendHeadersLocked();
    }
    void OnReadDone(bool ok) override {
      if (!ok) return;  // The end: OnDone has its status.
      absl::MutexLock lock(&server->mu_);
      if (!server->WriteLocked(&message)) call->context()->TryCancel();
    }
    void OnDone(const grpc::Status& status) override {
      std::shared_ptr<StreamReactor> last = std::move(server);
      absl::MutexLock lock(&last->mu_);
      last->FinishLocked(call->Finish(status));
    }
  };

  const char* const gone_;
  bool headers_sent_ ABSL_GUARDED_BY(this->mu_) = false;
  std::unique_ptr<Upstream> upstream_ ABSL_GUARDED_BY(this->mu_);
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_SERVER_STREAM_REACTOR_H_
