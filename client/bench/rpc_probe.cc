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
#include "daemon/path/ucx/ucx_transport.h"

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

UcxOptions ProbeUcxOptions() {
  UcxOptions o;
  if (const char* w = getenv("POLL_US")) o.poll_window = absl::Microseconds(atoi(w));
  return o;
}

// A child process that serves UCX calls (method 1: from a thread, as gpumoved does;
// method 2: on the progress thread); returns its worker address through `fd`.
pid_t ServeUcxCalls(int fd) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  auto t = UcxTransport::Create(ProbeUcxOptions());
  if (!t.ok()) _exit(1);
  absl::Mutex mu;
  std::vector<std::pair<std::string, UcxReply>> queue;
  (*t)->ServeCalls("echo#1", [&](const UcxPeer&, uint32_t method, std::string body, UcxReply reply) {
    if (method == 2) return reply(absl::OkStatus(), std::move(body));
    absl::MutexLock lock(&mu);
    queue.emplace_back(std::move(body), std::move(reply));
  });
  const std::string& address = (*t)->worker_address();
  const uint32_t n = address.size();
  (void)!write(fd, &n, sizeof(n));
  (void)!write(fd, address.data(), n);
  while (true) {
    std::vector<std::pair<std::string, UcxReply>> work;
    {
      absl::MutexLock lock(&mu);
      mu.Await(absl::Condition(+[](std::vector<std::pair<std::string, UcxReply>>* q) {
        return !q->empty();
      }, &queue));
      work.swap(queue);
    }
    for (auto& [body, reply] : work) reply(absl::OkStatus(), std::move(body));
  }
}

double UcxRoundTrips(UcxTransport& t, const UcxPeer& peer, uint32_t method, int n) {
  std::vector<double> times;
  for (int i = 0; i < n; ++i) {
    const absl::Time t0 = absl::Now();
    (void)t.Call(peer, method, "x", absl::Seconds(5));
    times.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
  }
  return Median(times);
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

  int ufds[2];
  if (pipe(ufds) != 0) return 1;
  const pid_t ucx_pid = ServeUcxCalls(ufds[1]);
  uint32_t n = 0;
  std::string address;
  if (read(ufds[0], &n, sizeof(n)) == sizeof(n)) {
    address.resize(n);
    if (read(ufds[0], address.data(), n) != static_cast<ssize_t>(n)) address.clear();
  }
  auto ucx = UcxTransport::Create(ProbeUcxOptions());
  if (!address.empty() && ucx.ok()) {
    (*ucx)->ServeCalls("probe#1", nullptr);
    const UcxPeer peer{"echo#1", address, false};
    UcxRoundTrips(**ucx, peer, 1, 100);  // Wire-up.
    std::cout << "F UCX call, answered by a thread   " << UcxRoundTrips(**ucx, peer, 1, kN)
              << std::endl;
    std::cout << "G UCX call, answered in callback   " << UcxRoundTrips(**ucx, peer, 2, kN)
              << std::endl;
  }
  kill(ucx_pid, SIGKILL);
  waitpid(ucx_pid, nullptr, 0);
  _exit(0);
}

}  // namespace
}  // namespace gpumove

int main() { return gpumove::Main(); }
