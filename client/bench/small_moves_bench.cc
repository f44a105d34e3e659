// Small independent moves per second that one daemon completes with many concurrent
// clients: 4 KiB host moves, LOCAL (both ends on node-a) and node to node (node-a ->
// node-b, pushed by node-a), each client a thread of this process with its own connection,
// moving back to back (Submit with wait) for --seconds. The baseline is a bare gRPC unary
// echo of 4 KiB at the same concurrency (a move is at least one such round trip). Prints
// moves/s, echo calls/s and their ratio for clients 1 ... --max_clients, medians of
// --rounds.
//
//   bazel run -c opt //client/bench:small_moves_bench -- [--max_clients=64] [--size=4KiB]
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "client/bench/echo.grpc.pb.h"
#include "client/bench/echo_server.h"
#include "client/gpumove_client.h"
#include "daemon/common/bytes.h"
#include "tests/util/daemon_process.h"

ABSL_FLAG(int, max_clients, 64, "Largest number of concurrent clients (powers of 2 up to it).");
ABSL_FLAG(gpumove::ByteSize, size, gpumove::ByteSize{4096}, "Bytes per move.");
ABSL_FLAG(double, seconds, 2, "Time each point is measured.");
ABSL_FLAG(int, rounds, 3, "Rounds per point (the median is printed).");

namespace gpumove {
namespace {

std::shared_ptr<grpc::Channel> OwnChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // A connection per client.
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

// Calls per second of `clients` threads each running `call(client index)` back to back
// (a call that fails ends the benchmark, saying why).
double Rate(int clients, const std::function<absl::Status(int)>& call) {
  std::atomic<bool> go{false}, stop{false};
  std::atomic<uint64_t> done{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      while (!go.load()) std::this_thread::yield();
      uint64_t n = 0;
      while (!stop.load()) {
        if (absl::Status st = call(c); !st.ok()) {
          std::fprintf(stderr, "a call failed: %s\n", st.ToString().c_str());
          std::exit(1);
        }
        ++n;
      }
      done += n;
    });
  }
  const absl::Duration span = absl::Seconds(absl::GetFlag(FLAGS_seconds));
  const absl::Time t0 = absl::Now();
  go = true;
  absl::SleepFor(span);
  stop = true;
  for (auto& t : threads) t.join();
  return done.load() / absl::ToDoubleSeconds(absl::Now() - t0);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Main() {
  const uint64_t size = absl::GetFlag(FLAGS_size).bytes;
  const int max_clients = absl::GetFlag(FLAGS_max_clients);
  std::string echo_address;
  const pid_t echo = StartEchoServer("127.0.0.1:0", &echo_address);
  if (echo < 0) return 1;
  auto a = DaemonProcess::Start({"--node=node-a", "--host_pool_size=512MiB",
                                 "--pinned_pool_size=0", "--heartbeat=200ms"});
  if (!a.ok()) return 1;
  auto b = DaemonProcess::Start({"--node=node-b", "--host_pool_size=512MiB",
                                 "--pinned_pool_size=0", "--heartbeat=200ms",
                                 "--peers=" + (*a)->address()});
  if (!b.ok()) return 1;
  auto admin_a = *Client::Connect((*a)->address());
  auto admin_b = *Client::Connect((*b)->address());
  for (absl::Time end = absl::Now() + absl::Seconds(20); absl::Now() < end;) {
    auto peers = admin_a->ListPeers();
    if (peers.ok() && !peers->empty() && (*peers)[0].up()) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  // Per client: a source and a destination on node-a, a destination on node-b.
  std::vector<std::string> src, dst_a, dst_b;
  for (int c = 0; c < max_clients; ++c) {
    src.push_back(admin_a->Allocate(size)->id());
    dst_a.push_back(admin_a->Allocate(size)->id());
    dst_b.push_back(admin_b->Allocate(size)->id());
  }
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<std::unique_ptr<bench::Echo::Stub>> echoes;
  for (int c = 0; c < max_clients; ++c) {
    clients.push_back(std::make_unique<Client>(OwnChannel((*a)->address())));
    echoes.push_back(bench::Echo::NewStub(OwnChannel(echo_address)));
  }
  bench::EchoMessage ping;
  ping.set_payload(std::string(size, 'x'));
  auto echo_call = [&](int c) {
    grpc::ClientContext ctx;
    bench::EchoMessage pong;
    return FromGrpcStatus(echoes[c]->Echo(&ctx, ping, &pong));
  };
  auto move = [&](int c, bool remote) -> absl::Status {
    v1::BufferRef to = Ref(remote ? dst_b[c] : dst_a[c]);
    if (remote) to.set_node("node-b");
    auto t = clients[c]->Move(Ref(src[c]), to);
    if (!t.ok()) return t.status();
    if (t->state() != v1::SUCCEEDED) return absl::InternalError(t->error_message());
    return absl::OkStatus();
  };
  // Warm up every connection and path.
  Rate(max_clients, echo_call);
  Rate(max_clients, [&](int c) { return move(c, false); });
  Rate(max_clients, [&](int c) { return move(c, true); });
  std::printf("%s moves, medians of %d rounds of %.1f s (host memory, loopback, %u CPUs)\n",
              FormatBytes(size).c_str(), absl::GetFlag(FLAGS_rounds),
              absl::GetFlag(FLAGS_seconds), std::thread::hardware_concurrency());
  std::printf("%8s %12s %14s %8s %14s %8s\n", "clients", "echo/s", "LOCAL moves/s", "/echo",
              "node moves/s", "/echo");
  for (int n = 1; n <= max_clients; n *= 2) {
    std::vector<double> e, l, r;
    for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
      e.push_back(Rate(n, echo_call));
      l.push_back(Rate(n, [&](int c) { return move(c, false); }));
      r.push_back(Rate(n, [&](int c) { return move(c, true); }));
    }
    const double em = Median(e), lm = Median(l), rm = Median(r);
    std::printf("%8d %12.0f %14.0f %8.2f %14.0f %8.2f\n", n, em, lm, lm / em, rm, rm / em);
    std::fflush(stdout);
  }
  kill(echo, SIGTERM);
  waitpid(echo, nullptr, 0);
  return 0;
}

}  // namespace
}  // namespace gpumove

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return gpumove::Main();
}
