// Where does a unary gRPC round trip get slow? A bare echo server in a child process,
// called (A) from a plain client, (B) from a process that also serves gRPC, (C) from
// another thread of it, (D) from inside one of its own handlers (as gpumoved's Submit
// handler calls peers), and (E) with gpumoved's server settings. Medians of 2000.
//   bazel run //client/bench:rpc_probe
#include <grpcpp/ext/channelz_service_plugin.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <iostream>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/bench/echo.grpc.pb.h"
#include "client/bench/stream.h"

namespace gpumove {
namespace {

class EchoService final : public bench::Echo::Service {
 public:
  // When set, each call first makes one call there and records how long it took.
  std::shared_ptr<grpc::Channel> forward;
  grpc::Status Echo(grpc::ServerContext*, const bench::EchoMessage* in,
                    bench::EchoMessage* out) override {
    if (forward != nullptr) {
      auto stub = bench::Echo::NewStub(forward);
      grpc::ClientContext c;
      const absl::Time t0 = absl::Now();
      grpc::Status st = stub->Echo(&c, *in, out);
      absl::MutexLock lock(&mu);
      nested.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
      return st;
    }
    *out = *in;
    return grpc::Status::OK;
  }
  absl::Mutex mu;
  std::vector<double> nested;
};

// Serves `service` on a free loopback port; with `daemon_like`, gpumoved's settings.
std::string Serve(EchoService* service, bool daemon_like, std::unique_ptr<grpc::Server>* server) {
  if (daemon_like) {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::channelz::experimental::InitChannelzService();
  }
  grpc::ServerBuilder b;
  if (daemon_like) {
    b.SetMaxReceiveMessageSize(64 << 20);
    b.SetMaxSendMessageSize(64 << 20);
    b.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    b.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  }
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.RegisterService(service);
  *server = b.BuildAndStart();
  return absl::StrCat("127.0.0.1:", port);
}

double RoundTrips(bench::Echo::Stub& stub, int n) {
  bench::EchoMessage m;
  m.set_payload("x");
  std::vector<double> t;
  for (int i = 0; i < n; ++i) {
    grpc::ClientContext c;
    bench::EchoMessage r;
    const absl::Time t0 = absl::Now();
    (void)stub.Echo(&c, m, &r);
    t.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
  }
  return Median(t);
}

int Main() {
  int fds[2];
  if (pipe(fds) != 0) return 1;
  const pid_t echo_pid = fork();
  if (echo_pid == 0) {  // The echo server, before this process has any gRPC state.
    EchoService echo;
    std::unique_ptr<grpc::Server> server;
    const std::string address = Serve(&echo, false, &server);
    (void)!write(fds[1], address.data(), address.size());
    server->Wait();
    _exit(0);
  }
  char buf[64] = {};
  if (read(fds[0], buf, sizeof(buf) - 1) <= 0) return 1;
  const std::string remote = buf;
  constexpr int kN = 2000;
  auto channel = grpc::CreateChannel(remote, grpc::InsecureChannelCredentials());
  auto stub = bench::Echo::NewStub(channel);
  std::cout << std::thread::hardware_concurrency() << " CPUs; median round trip, us\n";
  std::cout << "A plain client                     " << RoundTrips(*stub, kN) << std::endl;
  EchoService local;
  std::unique_ptr<grpc::Server> server;
  const std::string mine = Serve(&local, true, &server);
  std::cout << "B this process also serves (E)     " << RoundTrips(*stub, kN) << std::endl;
  double other = 0;
  std::thread([&] { other = RoundTrips(*stub, kN); }).join();
  std::cout << "C from another thread              " << other << std::endl;
  local.forward = channel;
  auto self = bench::Echo::NewStub(grpc::CreateChannel(mine, grpc::InsecureChannelCredentials()));
  const double outer = RoundTrips(*self, kN);
  absl::MutexLock lock(&local.mu);
  std::cout << "D inside a handler of this process " << Median(local.nested) << "  (outer call "
            << outer << ")" << std::endl;
  kill(echo_pid, SIGKILL);  // It holds our stdout too: a pipe reader would wait for it.
  waitpid(echo_pid, nullptr, 0);
  _exit(0);
}

}  // namespace
}  // namespace gpumove

int main() { return gpumove::Main(); }
