#include "daemon/server/starting_server.h"

#include <atomic>
#include <chrono>

#include "absl/strings/str_cat.h"

namespace gpumove {
namespace {

// grpc.health.v1.HealthCheckResponse{status: NOT_SERVING}, encoded by hand (the gRPC
// packages ship no generated health messages): field 1, varint 2.
grpc::ByteBuffer NotServing() {
  static constexpr char kBytes[] = {0x08, 0x02};
  grpc::Slice slice(kBytes, sizeof(kBytes));
  return grpc::ByteBuffer(&slice, 1);
}

}  // namespace

// One call: a health Check is answered NOT_SERVING; a health Watch is told NOT_SERVING
// and held (without a thread) until the server stops; anything else is UNAVAILABLE at once.
class StartingServer::Call : public grpc::ServerGenericBidiReactor {
 public:
  Call(const StartingServer& server, grpc::GenericCallbackServerContext* ctx) {
    const std::string step = server.Step();
    ctx->AddTrailingMetadata(kStartingKey, step);
    const std::string& method = ctx->method();
    if (method == "/grpc.health.v1.Health/Check" || method == "/grpc.health.v1.Health/Watch") {
      watch_ = method == "/grpc.health.v1.Health/Watch";
      StartRead(&request_);  // The service asked about does not matter: none serves yet.
      return;
    }
    FinishOnce(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            absl::StrCat("gpumoved is starting (", step, "); try again shortly")));
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED, "no health request"));
      return;
    }
    response_ = NotServing();
    if (!watch_) {
      if (!finished_.exchange(true)) StartWriteAndFinish(&response_, {}, grpc::Status::OK);
      return;
    }
    StartWrite(&response_);
  }
  void OnWriteDone(bool) override {}
  void OnCancel() override {
    FinishOnce(grpc::Status(grpc::StatusCode::UNAVAILABLE, "gpumoved has started: ask again"));
  }
  void OnDone() override { delete this; }

 private:
  void FinishOnce(grpc::Status status) {
    if (!finished_.exchange(true)) Finish(std::move(status));
  }

  bool watch_ = false;
  std::atomic<bool> finished_{false};
  grpc::ByteBuffer request_, response_;
};

absl::StatusOr<std::unique_ptr<StartingServer>> StartingServer::Start(
    Listeners& listeners, std::shared_ptr<grpc::ServerCredentials> tcp) {
  std::unique_ptr<StartingServer> s(new StartingServer());
  grpc::ServerBuilder builder;
  // Health is answered here, by the generic service, not by gRPC's default one (which would
  // say SERVING); the daemon's own server turns the default back on.
  grpc::EnableDefaultHealthCheckService(false);
  builder.RegisterCallbackGenericService(s.get());
  listeners.Register(builder, std::move(tcp));
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr) return absl::InternalError("cannot start the starting server");
  listeners.Start();
  return s;
}

StartingServer::~StartingServer() { Stop(); }

void StartingServer::SetStep(absl::string_view step) {
  absl::MutexLock lock(&mu_);
  step_ = std::string(step);
}

std::string StartingServer::Step() const {
  absl::MutexLock lock(&mu_);
  return step_;
}

grpc::ServerGenericBidiReactor* StartingServer::CreateReactor(
    grpc::GenericCallbackServerContext* ctx) {
  return new Call(*this, ctx);
}

void StartingServer::Stop() {
  if (server_ == nullptr) return;
  // Calls under way (a Check) get a moment; watches are then cancelled.
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
  server_->Wait();
  server_.reset();
}

}  // namespace gpumove
