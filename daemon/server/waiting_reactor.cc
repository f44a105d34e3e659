#include "daemon/server/waiting_reactor.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/common/grpc_status.h"
#include "daemon/common/quote.h"
#include "daemon/server/stream_timer.h"

namespace gpumove {

void WaitingReactor::OnCancel() {
  absl::MutexLock lock(&mu_);
  if (relayed_ != nullptr) relayed_->TryCancel();
  if (busy_) return;
  FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "the waiting caller went away"));
}

void WaitingReactor::AwaitEndsLocked(std::string owner, std::vector<TransferSnapshot> snapshots,
                                     absl::Time deadline, Answer answer) {
  owner_ = std::move(owner);
  ends_ = std::move(snapshots);
  deadline_ = deadline;
  answer_ = std::move(answer);
  std::weak_ptr<WaitingReactor> w = Weak(this);
  auto wake = [w] {
    StreamTimer::Shared().Post([w] {
      if (auto r = w.lock()) r->Check();
    });
  };
  for (const TransferSnapshot& t : ends_) {
    if (!IsTerminal(t.state)) listeners_.push_back(scheduler_->ListenForChanges(t.id, wake));
  }
  CheckLocked();
}

void WaitingReactor::Check() {
  absl::MutexLock lock(&mu_);
  CheckLocked();
}

void WaitingReactor::CheckLocked() {
  if (!LiveLocked()) return;
  if (context_->IsCancelled()) {
    FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "the waiting caller went away"));
    return;
  }
  for (TransferSnapshot& end : ends_) {
    if (IsTerminal(end.state)) continue;
    auto t = scheduler_->Get(owner_, end.id);
    if (!t.ok()) {
      FinishLocked(ToGrpcStatus(t.status()));
      return;
    }
    end = *std::move(t);
    if (IsTerminal(end.state)) continue;
    if (absl::Now() >= deadline_ || scheduler_->stopped()) {
      FinishLocked(grpc::Status(
          grpc::StatusCode::DEADLINE_EXCEEDED,
          absl::StrCat("transfer ", Quoted(end.id), " is still ", TransferStateName(end.state))));
      return;
    }
    if (timer_ == 0 && deadline_ != absl::InfiniteFuture()) {
      std::weak_ptr<WaitingReactor> w = Weak(this);
      timer_ = StreamTimer::Shared().At(deadline_, [w] {
        if (auto r = w.lock()) r->Check();
      });
    }
    return;
  }
  answer_(ends_);
  FinishLocked(grpc::Status::OK);
}

void WaitingReactor::Closed() {
  std::vector<uint64_t> listeners;
  {
    absl::MutexLock lock(&mu_);
    listeners.swap(listeners_);
    if (relayed_ != nullptr) relayed_->TryCancel();
    if (timer_ != 0) StreamTimer::Shared().Cancel(timer_);
  }
  for (uint64_t l : listeners) scheduler_->ForgetChanges(l);
}

}  // namespace gpumove
