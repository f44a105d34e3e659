// TransferService.Submit as a callback reactor (waiting_reactor.h): the accept, which may
// run small moves inline or wait for other nodes' holds, runs on the bounded CallPool; a
// Submit with wait then listens for its moves' ends instead of holding a thread; a batch
// another node runs is relayed to it with gRPC's callback client.
#include <sys/resource.h>
#include <time.h>

#include <memory>

#include "absl/time/clock.h"
#include "daemon/common/grpc_status.h"
#include "daemon/common/log.h"
#include "daemon/server/call_pool.h"
#include "daemon/server/convert.h"
#include "daemon/server/field_limits.h"
#include "daemon/server/forward.h"
#include "daemon/server/transfer_reactors.h"
#include "daemon/server/waiting_reactor.h"

namespace gpumove {

class SubmitReactor final : public WaitingReactor {
 public:
  SubmitReactor(TransferServiceImpl* service, grpc::CallbackServerContext* context,
                const v1::SubmitRequest* request, v1::SubmitResponse* response)
      : WaitingReactor(service->scheduler_, context),
        s_(service),
        context_(context),
        request_(request),
        response_(response) {}

  grpc::Status Start() override {
    entered_ = trace_ ? absl::Now() : absl::InfinitePast();
    GPUMOVE_CHECK_CALLER(caller, *s_->auth_, context_, Access::kChange, "Submit");
    GPUMOVE_CHECK_FIELDS(*request_);
    if (absl::Status st = EnterLongCall(s_->long_calls_, request_->wait(), caller.principal);
        !st.ok()) {
      return ToGrpcStatus(st);
    }
    std::string runner;
    if (grpc::Status st = s_->RunnerOf(*request_, &runner); !st.ok()) return st;
    if (!runner.empty() && runner != s_->node_) return Forward(runner);
    caller_ = caller;
    absl::MutexLock lock(&mu_);
    busy_ = true;
    auto self = std::static_pointer_cast<SubmitReactor>(shared_from_this());
    CallPool::Shared().Run([self] { self->Accept(); });
    return grpc::Status::OK;
  }

 private:
  // The batch runs on node `runner`: sent there with this node's ends named.
  grpc::Status Forward(const std::string& runner) {
    auto stub = s_->StubFor(*context_, runner);
    if (!stub.ok()) return ToGrpcStatus(stub.status());
    v1::SubmitRequest forwarded = *request_;
    for (v1::TransferSpec& spec : *forwarded.mutable_transfers()) {
      if (spec.source().node().empty()) spec.mutable_source()->set_node(s_->node_);
      if (spec.destination().node().empty()) spec.mutable_destination()->set_node(s_->node_);
    }
    std::shared_ptr<v1::TransferService::Stub> shared = *std::move(stub);
    Relay<v1::SubmitResponse>(
        std::make_unique<ForwardedCall>(
            *context_, s_->auth_, *s_->cluster_, runner,
            request_->wait() ? s_->WaitBound(request_->has_wait_timeout(), request_->wait_timeout())
                             : ForwardTimeout(s_->cluster_)),
        response_,
        [shared, request = std::move(forwarded)](grpc::ClientContext* c, v1::SubmitResponse* out,
                                                 std::function<void(grpc::Status)> done) mutable {
          shared->async()->Submit(c, &request, out, std::move(done));
        });
    return grpc::Status::OK;
  }

  // On CallPool: the moves read and handed to the scheduler; then the answer, at once or
  // once they end.
  void Accept() {
    grpc::Status st = AcceptSteps();
    absl::MutexLock lock(&mu_);
    busy_ = false;
    if (!st.ok()) {
      FinishLocked(st);
      return;
    }
    if (request_->wait()) {
      AwaitEndsLocked(caller_.owner(), std::move(accepted_), deadline_,
                      [this](const std::vector<TransferSnapshot>& ends) {
                        for (const TransferSnapshot& t : ends)
                          ToProto(t, response_->add_transfers());
                      });
      return;
    }
    for (const TransferSnapshot& t : accepted_) ToProto(t, response_->add_transfers());
    FinishLocked(grpc::Status::OK);
  }

  grpc::Status AcceptSteps() {
    // --v=2: where a Submit's time goes (reading its specs, the scheduler's accept), with
    // the thread's CPU time and page faults (a 65536-block list's fresh pages cost more
    // than its parsing).
    timespec cpu0{};
    rusage ru0{};
    if (trace_) {
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu0);
      getrusage(RUSAGE_THREAD, &ru0);
    }
    std::vector<TransferSpec> specs;
    if (grpc::Status st = s_->SpecsOf(caller_, *request_, &specs); !st.ok()) return st;
    auto deadline = TransferServiceImpl::WaitDeadline(context_, request_->has_wait_timeout(),
                                                      request_->wait_timeout());
    if (!deadline.ok()) return ToGrpcStatus(deadline.status());
    deadline_ = *deadline;
    const absl::Time t0 = absl::Now();
    // A caller that waits only so long (wait_timeout, or its RPC's deadline) is answered
    // at that time, so its moves run inline only where they end quickly anyway.
    const bool bounded = *deadline - absl::Now() < absl::Hours(24);
    auto transfers = s_->scheduler_->Submit(caller_.owner(), specs, request_->idempotency_key(),
                                            request_->wait(), bounded);
    if (!transfers.ok()) return ToGrpcStatus(transfers.status());
    accepted_ = *std::move(transfers);
    if (trace_) {
      timespec cpu1{};
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu1);
      rusage ru1{};
      getrusage(RUSAGE_THREAD, &ru1);
      VLOG(2) << "Submit of " << specs.size() << ": read in "
              << absl::ToDoubleMicroseconds(t0 - entered_) << " us, accepted in "
              << absl::ToDoubleMicroseconds(absl::Now() - t0) << " us (thread CPU "
              << absl::ToDoubleMicroseconds(absl::DurationFromTimespec(cpu1) -
                                            absl::DurationFromTimespec(cpu0))
              << " us, " << ru1.ru_minflt - ru0.ru_minflt << " page faults)";
    }
    return grpc::Status::OK;
  }

  TransferServiceImpl* const s_;
  grpc::CallbackServerContext* const context_;
  const v1::SubmitRequest* const request_;
  v1::SubmitResponse* const response_;
  const bool trace_ = LogVerbosity() >= 2;
  absl::Time entered_;
  Caller caller_;
  absl::Time deadline_;
  std::vector<TransferSnapshot> accepted_;
};

grpc::ServerUnaryReactor* ServeSubmit(TransferServiceImpl* service,
                                      grpc::CallbackServerContext* context,
                                      const v1::SubmitRequest* request,
                                      v1::SubmitResponse* response) {
  return SubmitReactor::Serve<SubmitReactor>(service, context, request, response);
}

}  // namespace gpumove
