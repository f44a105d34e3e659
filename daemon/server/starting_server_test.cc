// The starting server on real sockets: what a client and a probe are told while the
// daemon starts, and the handover of the sockets to the daemon's server.
#include "daemon/server/starting_server.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/health_check_service_interface.h>
#include <unistd.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/gpumove_client.h"
#include "gtest/gtest.h"
#include "proto/gpumove/v1/gpumove.grpc.pb.h"

namespace gpumove {
namespace {

class StartingServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // TempDir is too long a path for a unix socket here.
    socket_ = absl::StrCat("unix:/tmp/gpumove-starting-test.", getpid());
    ListenOptions options;
    options.addresses = {socket_, "127.0.0.1:0"};
    auto listeners = Listeners::Bind(options);
    ASSERT_TRUE(listeners.ok()) << listeners.status();
    listeners_ = *std::move(listeners);
    auto starting = StartingServer::Start(*listeners_, grpc::InsecureServerCredentials());
    ASSERT_TRUE(starting.ok()) << starting.status();
    starting_ = *std::move(starting);
    starting_->SetStep("setting up memory pools");
  }
  void TearDown() override {
    listeners_->Stop();
    if (starting_ != nullptr) starting_->Stop();
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
  }

  // What the daemon's Serve does: the sockets move to a server with gRPC's health.
  void HandOver() {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    builder.RegisterService(&node_service_);  // A server has at least one service.
    listeners_->Pause();
    listeners_->Register(builder, grpc::InsecureServerCredentials());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    listeners_->Start();
    starting_->Stop();
    starting_.reset();
  }

  std::string socket_;
  std::unique_ptr<Listeners> listeners_;
  std::unique_ptr<StartingServer> starting_;
  v1::NodeService::Service node_service_;  // Every method UNIMPLEMENTED.
  std::unique_ptr<grpc::Server> server_;
};

ConnectOptions Probe() {
  ConnectOptions options;
  options.wait_while_starting = false;
  return options;
}

TEST_F(StartingServerTest, HealthSaysNotServingAndCallsNameTheStep) {
  for (const std::string& address : listeners_->bound()) {
    auto client = Client::Connect(address, Probe());
    ASSERT_TRUE(client.ok()) << address << ": " << client.status();
    absl::Status health = (*client)->Health();
    EXPECT_EQ(health.code(), absl::StatusCode::kUnavailable) << address;
    EXPECT_EQ(health.message(),
              "health: NOT_SERVING (gpumoved is starting: setting up memory pools)");
    EXPECT_EQ((*client)->Health("gpumove.v1.TransferService").code(),
              absl::StatusCode::kUnavailable);
    auto info = (*client)->GetInfo();
    EXPECT_EQ(info.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(info.status().message(),
              "gpumoved is starting (setting up memory pools); try again shortly");
  }
}

TEST_F(StartingServerTest, ConnectWaitsForTheStartAndGivesUpAtItsTimeout) {
  ConnectOptions brief;
  brief.timeout = absl::Seconds(2);  // Room for a sanitizer build's first call.
  auto early = Client::Connect(socket_, brief);
  ASSERT_FALSE(early.ok());
  EXPECT_EQ(early.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(early.status().message().find("is still starting after 2s"), std::string::npos)
      << early.status();

  const absl::Time begun = absl::Now();
  std::thread later([&] {
    absl::SleepFor(absl::Milliseconds(400));
    HandOver();
  });
  auto client = Client::Connect(socket_, ConnectOptions());
  const absl::Duration waited = absl::Now() - begun;
  later.join();
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_GE(waited, absl::Milliseconds(400));
  EXPECT_LT(waited, absl::Seconds(4));
  EXPECT_TRUE((*client)->Health().ok());
}

TEST_F(StartingServerTest, AChannelOpenedWhileStartingReachesTheDaemonsServer) {
  auto client = Client::Connect(listeners_->bound().back(), Probe());
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_FALSE((*client)->Health().ok());

  // A health watch opened now is told NOT_SERVING and ends when the server stops.
  grpc::GenericStub stub((*client)->channel());
  grpc::ClientContext watch_context;
  watch_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::CompletionQueue cq;
  auto watch = stub.PrepareCall(&watch_context, "/grpc.health.v1.Health/Watch", &cq);
  void* tag;
  bool ok;
  watch->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  grpc::Slice empty("");  // HealthCheckRequest{service: ""}.
  grpc::ByteBuffer request(&empty, 1), first;
  watch->Write(request, reinterpret_cast<void*>(2));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  watch->Read(&first, reinterpret_cast<void*>(3));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(first.Dump(&slices).ok());
  ASSERT_EQ(slices.size(), 1u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(slices[0].begin()), slices[0].size()),
            std::string("\x08\x02", 2));

  HandOver();
  grpc::ByteBuffer more;
  watch->Read(&more, reinterpret_cast<void*>(4));
  ASSERT_TRUE(cq.Next(&tag, &ok));
  EXPECT_FALSE(ok);  // The watch ended with the starting server.
  grpc::Status status;
  watch->Finish(&status, reinterpret_cast<void*>(5));
  ASSERT_TRUE(cq.Next(&tag, &ok));
  EXPECT_FALSE(status.ok());

  // The same channel reconnects, now to the daemon's server.
  absl::Status health;
  for (int i = 0; i < 100; ++i) {
    health = (*client)->Health();
    if (health.ok()) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_TRUE(health.ok()) << health;
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

}  // namespace
}  // namespace gpumove
