// What the in-process service tests share: a token file and the authenticator reading it,
// host pools and a buffer registry, and an in-process gRPC server for the service under
// test, with its stub.
#ifndef GPUMOVE_DAEMON_SERVER_SERVICE_TEST_BASE_H_
#define GPUMOVE_DAEMON_SERVER_SERVICE_TEST_BASE_H_

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "daemon/core/buffer_registry.h"
#include "daemon/gpu/gpu.h"
#include "daemon/memory/pool.h"
#include "daemon/server/auth.h"
#include "daemon/server/call_limits.h"

namespace gpumove {

class ServiceTestBase : public ::testing::Test {
 protected:
  // `tokens`: the token file's lines; `host_pool`: the HOST pool's bytes.
  void SetUpNode(const std::string& tokens, uint64_t host_pool = 16 << 20) {
    const char* tmp = std::getenv("TEST_TMPDIR");
    tokens_ = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/service_test.", getpid());
    std::ofstream(tokens_) << tokens;
    auth_ = *Authenticator::FromTokenFile(tokens_, absl::Seconds(1));
    PoolSizes sizes;
    sizes.host = host_pool;
    sizes.pinned = 0;
    pools_ = *PoolSet::Create(sizes, {}, gpu_.get());
    registry_ = std::make_unique<BufferRegistry>(pools_.get(), absl::ZeroDuration());
  }
  // Serves `service` in-process; its stub.
  template <class Service>
  std::unique_ptr<typename Service::Stub> Serve(grpc::Service* service) {
    grpc::ServerBuilder builder;
    builder.RegisterService(service);
    server_ = builder.BuildAndStart();
    return Service::NewStub(server_->InProcessChannel(grpc::ChannelArguments()));
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
    std::filesystem::remove(tokens_);
  }
  // A call as the holder of `token` (none: no credentials).
  static std::unique_ptr<grpc::ClientContext> As(const std::string& token) {
    auto c = std::make_unique<grpc::ClientContext>();
    if (!token.empty()) c->AddMetadata("authorization", "Bearer " + token);
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    return c;
  }

  std::string tokens_;
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<GpuRuntime> gpu_ = GpuRuntime::CreateHostOnly("test");
  std::unique_ptr<PoolSet> pools_;
  std::unique_ptr<BufferRegistry> registry_;
  std::unique_ptr<LongCalls> calls_ = std::make_unique<LongCalls>(CallLimits{});
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_SERVER_SERVICE_TEST_BASE_H_
