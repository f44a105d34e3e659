// The base of TransferService's unary calls that may wait (Wait, Submit, Cancel), served
// as callback reactors: a wait for transfers' ends listens to the scheduler and arms one
// timer for its deadline, holding no thread; a call another node runs is relayed with
// gRPC's callback client.
#ifndef GPUMOVE_DAEMON_SERVER_WAITING_REACTOR_H_
#define GPUMOVE_DAEMON_SERVER_WAITING_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "daemon/core/transfer_scheduler.h"
#include "daemon/server/forward.h"
#include "daemon/server/lasting_reactor.h"

namespace gpumove {

class WaitingReactor : public LastingReactor<grpc::ServerUnaryReactor> {
 public:
  // The caller went away: CANCELLED ("the waiting caller went away"), at once unless a
  // step that may block is under way (busy_), which sees it when it is done.
  void OnCancel() override;

 protected:
  using Answer = std::function<void(const std::vector<TransferSnapshot>&)>;
  WaitingReactor(TransferScheduler* scheduler, const grpc::ServerContextBase* context)
      : scheduler_(scheduler), context_(context) {}

  // Answers once every transfer of `snapshots` has ended: `answer` (under mu_) fills the
  // response from their ends, and the call finishes OK. DEADLINE_EXCEEDED, naming the
  // first one still going, at `deadline` or when the scheduler stops; CANCELLED when the
  // caller went away; a transfer no longer found is NOT_FOUND.
  void AwaitEndsLocked(std::string owner, std::vector<TransferSnapshot> snapshots,
                       absl::Time deadline, Answer answer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Relays the call to the node of `call`: `start(context, response, done)` calls the
  // stub's async method; its response becomes this call's. From Start().
  template <typename Response>
  using StartRelay =
      std::function<void(grpc::ClientContext*, Response*, std::function<void(grpc::Status)>)>;
  template <typename Response>
  void Relay(std::unique_ptr<ForwardedCall> call, Response* response, StartRelay<Response> start) {
    struct Relayed {
      std::unique_ptr<ForwardedCall> call;
      Response out;
      StartRelay<Response> start;  // Keeps the stub and request it captured.
    };
    auto r = std::make_shared<Relayed>();
    r->call = std::move(call);
    r->start = std::move(start);
    auto keep = std::static_pointer_cast<WaitingReactor>(this->shared_from_this());
    {
      absl::MutexLock lock(&mu_);
      relayed_ = r->call->context();
    }
    r->start(r->call->context(), &r->out, [r, keep, response](grpc::Status st) {
      absl::MutexLock lock(&keep->mu_);
      keep->relayed_ = nullptr;
      if (!keep->LiveLocked()) return;
      if (st.ok()) *response = std::move(r->out);
      keep->FinishLocked(r->call->Finish(st));
    });
  }

  void Closed() override;

  TransferScheduler* const scheduler_;
  const grpc::ServerContextBase* const context_;
  // A step that may block runs (on CallPool); the call finishes after it.
  bool busy_ ABSL_GUARDED_BY(mu_) = false;

 private:
  void Check();
  void CheckLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::string owner_;
  std::vector<TransferSnapshot> ends_ ABSL_GUARDED_BY(mu_);
  absl::Time deadline_ ABSL_GUARDED_BY(mu_);
  Answer answer_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> listeners_ ABSL_GUARDED_BY(mu_);
  uint64_t timer_ ABSL_GUARDED_BY(mu_) = 0;
  grpc::ClientContext* relayed_ ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_SERVER_WAITING_REACTOR_H_
