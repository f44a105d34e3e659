// The base of the streams and waits served as gRPC callback reactors (no thread each): a
// reactor keeps itself alive (a shared_ptr to itself) until gRPC is done with it, so that
// timers and listeners, which hold weak references, may wake it from other threads; it is
// finished once, and holds its LongCalls slot to the end.
#ifndef GPUMOVE_DAEMON_SERVER_LASTING_REACTOR_H_
#define GPUMOVE_DAEMON_SERVER_LASTING_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "daemon/server/auth.h"
#include "daemon/server/call_limits.h"
#include "daemon/server/stream_timer.h"

namespace gpumove {

// `Reactor`: grpc::ServerWriteReactor<T>, grpc::ServerReadReactor<T> or
// grpc::ServerUnaryReactor.
template <typename Reactor>
class LastingReactor : public Reactor,
                       public std::enable_shared_from_this<LastingReactor<Reactor>> {
 public:
  ~LastingReactor() override = default;

  // Makes a `Derived` (constructed from `args`), runs its Start(), which returns the
  // status to finish with at once or OK to go on, and hands it to gRPC.
  template <typename Derived, typename... Args>
  static Reactor* Serve(Args&&... args) {
    auto r = std::make_shared<Derived>(std::forward<Args>(args)...);
    r->self_ = r;
    grpc::Status st = r->Start();
    if (!st.ok()) {
      absl::MutexLock lock(&r->mu_);
      r->FinishLocked(st);
    }
    return r.get();
  }

  void OnDone() override {
    // First: the authenticator reads the call's context until Unwatch returns.
    if (auth_ != nullptr) auth_->Unwatch(revocation_);
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
    }
    Closed();
    // Last: may delete this (once no timer task holds it).
    std::shared_ptr<LastingReactor> last = std::move(self_);
  }

 protected:
  // Checks and sets up the call; not OK: finished with it at once.
  virtual grpc::Status Start() = 0;
  // After OnDone: unregisters listeners and timers (their weak references fail anyway).
  virtual void Closed() {}
  // Lets go of what the call holds (buffer ranges), as it finishes.
  virtual void FinishingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {}

  // Finishes the call once; a later status is dropped. A write reactor whose write is in
  // flight finishes when it completes (WriteDoneLocked).
  void FinishLocked(grpc::Status st) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finishing_ || done_) return;
    finishing_ = true;
    // What the call held is let go before its caller hears the end (as a handler's
    // return did): a caller may release the buffer, or open another call, at once.
    FinishingLocked();
    slot_ = LongCalls::Slot();
    if (writing_) {
      pending_ = std::move(st);
      return;
    }
    this->Finish(std::move(st));
  }
  // For write reactors: call first in OnWriteDone. False: the call is finishing (or
  // finished), nothing more may be written.
  bool WriteDoneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    writing_ = false;
    if (pending_.has_value()) {
      this->Finish(*std::move(pending_));
      pending_.reset();
    }
    return !finishing_ && !done_;
  }
  // Whether more may be started (written, read, finished).
  bool LiveLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !finishing_ && !done_; }

  // Counts this call against `calls`' caps while it lives (when it `lasts`);
  // RESOURCE_EXHAUSTED at a cap.
  absl::Status EnterLongCall(LongCalls* calls, bool lasts, const std::string& principal) {
    auto slot = EnterIf(calls, lasts, principal);
    if (!slot.ok()) return slot.status();
    slot_ = *std::move(slot);
    return absl::OkStatus();
  }

  // Ends the call UNAUTHENTICATED as soon as the credentials of its caller go (the
  // authenticator's re-read sees it), not at the next periodic check. From Start().
  void EndWhenRevoked(const Authenticator* auth, const grpc::ServerContextBase* context,
                      const Caller& caller) {
    auth_ = auth;
    context_base_ = context;
    caller_ = caller;
    std::weak_ptr<LastingReactor> w = this->shared_from_this();
    revocation_ = auth->WatchRevocation(context, [w] {
      StreamTimer::Shared().Post([w] {
        if (auto r = w.lock()) r->Revoked();
      });
    });
  }

  // A weak reference to this, for timer tasks and listeners.
  template <typename Derived>
  std::weak_ptr<Derived> Weak(Derived* /*self*/) {
    return std::static_pointer_cast<Derived>(this->shared_from_this());
  }

  absl::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;

 private:
  LongCalls::Slot slot_;
  void Revoked() {
    absl::MutexLock lock(&mu_);
    if (!LiveLocked()) return;
    absl::Status st = auth_->StillValid(context_base_, caller_);
    if (st.ok()) return;
    FinishLocked(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(st.message())));
  }

  const Authenticator* auth_ = nullptr;
  const grpc::ServerContextBase* context_base_ = nullptr;
  Caller caller_;
  uint64_t revocation_ = 0;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> pending_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<LastingReactor> self_;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_SERVER_LASTING_REACTOR_H_
