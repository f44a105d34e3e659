// Small independent moves per second that one daemon completes with many concurrent
// clients: 4 KiB host moves, LOCAL (both ends on node-a) and node to node (node-a ->
// node-b, pushed by node-a), each client a thread of this process with its own connection,
// moving back to back (Submit with wait) for --seconds. The baseline is a bare gRPC unary
// echo of 4 KiB at the same concurrency (a move is at least one such round trip). Prints
// moves/s, echo calls/s and their ratio for clients 1 ... --max_clients, medians of
// --rounds. With --batch=N each Submit carries N independent moves (to N disjoint ranges of
// the client's destination) and waits for all: moves/s counts moves, not Submits, and the
// echo's payload is then N times larger (what one round trip carries).
//
//   bazel run -c opt //client/bench:small_moves_bench -- [--max_clients=64] [--size=4KiB]
//       [--batch=1,32]
#include <grpcpp/grpcpp.h>

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
#include "absl/strings/numbers.h"
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
ABSL_FLAG(int, min_clients, 1, "Smallest number of concurrent clients.");
ABSL_FLAG(bool, callback_echo, false,
          "Serve the echo baseline on gRPC's callback API instead of the synchronous server.");
ABSL_FLAG(bool, local_only, false, "Measure LOCAL moves only (no echo, no node to node).");
ABSL_FLAG(std::vector<std::string>, daemon_flags, {},
          "More flags for both daemons, comma-separated (e.g. --grpc_max_pollers=2).");
ABSL_FLAG(std::vector<std::string>, batch, {"1"},
          "Moves per Submit: one table per value (e.g. 1,32).");

namespace gpumove {
namespace {

std::shared_ptr<grpc::Channel> OwnChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // A connection per client.
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

// Calls per second of `clients` threads each running `call(client index)` back to back
// (a call that fails ends the benchmark, saying why), times `per_call`.
double Rate(int clients, const std::function<absl::Status(int)>& call, int per_call = 1) {
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
  return done.load() * per_call / absl::ToDoubleSeconds(absl::Now() - t0);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Main() {
  const uint64_t size = absl::GetFlag(FLAGS_size).bytes;
  const int max_clients = absl::GetFlag(FLAGS_max_clients);
  std::vector<int> batches;
  for (const std::string& b : absl::GetFlag(FLAGS_batch)) {
    int n = 0;
    if (!absl::SimpleAtoi(b, &n) || n < 1 || n > 4096) {
      std::fprintf(stderr, "--batch: %s is not a count of 1 to 4096\n", b.c_str());
      return 2;
    }
    batches.push_back(n);
  }
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  std::string echo_address;
  const pid_t echo = StartEchoServer("127.0.0.1:0", &echo_address, absl::GetFlag(FLAGS_callback_echo));
  if (echo < 0) return 1;
  auto flags = [](std::vector<std::string> own) {
    for (const std::string& f : absl::GetFlag(FLAGS_daemon_flags)) own.push_back(f);
    return own;
  };
  auto a = DaemonProcess::Start(flags({"--node=node-a", "--host_pool_size=1GiB",
                                       "--pinned_pool_size=0", "--heartbeat=200ms"}));
  if (!a.ok()) return 1;
  auto b = DaemonProcess::Start(flags({"--node=node-b", "--host_pool_size=1GiB",
                                       "--pinned_pool_size=0", "--heartbeat=200ms",
                                       "--peers=" + (*a)->address()}));
  if (!b.ok()) return 1;
  auto admin_a = *Client::Connect((*a)->address());
  auto admin_b = *Client::Connect((*b)->address());
  for (absl::Time end = absl::Now() + absl::Seconds(20); absl::Now() < end;) {
    auto peers = admin_a->ListPeers();
    if (peers.ok() && !peers->empty() && (*peers)[0].up()) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  // Per client: a source and a destination on node-a, a destination on node-b; the
  // destinations hold one range per move of the largest batch.
  std::vector<std::string> src, dst_a, dst_b;
  for (int c = 0; c < max_clients; ++c) {
    auto s = admin_a->Allocate(size);
    auto da = admin_a->Allocate(size * max_batch);
    auto db = admin_b->Allocate(size * max_batch);
    if (!s.ok() || !da.ok() || !db.ok()) {
      std::fprintf(stderr, "allocation failed: %s %s %s\n", s.status().ToString().c_str(),
                   da.status().ToString().c_str(), db.status().ToString().c_str());
      return 1;
    }
    src.push_back(s->id());
    dst_a.push_back(da->id());
    dst_b.push_back(db->id());
  }
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<std::unique_ptr<bench::Echo::Stub>> echoes;
  for (int c = 0; c < max_clients; ++c) {
    clients.push_back(std::make_unique<Client>(OwnChannel((*a)->address())));
    echoes.push_back(bench::Echo::NewStub(OwnChannel(echo_address)));
  }
  std::printf("%s moves, medians of %d rounds of %.1f s (host memory, loopback, %u CPUs)\n",
              FormatBytes(size).c_str(), absl::GetFlag(FLAGS_rounds),
              absl::GetFlag(FLAGS_seconds), std::thread::hardware_concurrency());
  for (const int batch : batches) {
    bench::EchoMessage ping;
    ping.set_payload(std::string(size * batch, 'x'));
    auto echo_call = [&](int c) {
      grpc::ClientContext ctx;
      bench::EchoMessage pong;
      return FromGrpcStatus(echoes[c]->Echo(&ctx, ping, &pong));
    };
    // One Submit of `batch` moves src -> destination range i, waiting for all.
    std::vector<v1::SubmitRequest> local(max_clients), remote(max_clients);
    for (int c = 0; c < max_clients; ++c) {
      for (int i = 0; i < batch; ++i) {
        for (bool far : {false, true}) {
          v1::TransferSpec* t = (far ? remote : local)[c].add_transfers();
          *t->mutable_source() = Ref(src[c]);
          v1::BufferRef* to = t->mutable_destination();
          *to = Ref(far ? dst_b[c] : dst_a[c]);
          if (far) to->set_node("node-b");
          to->set_offset(i * size);
          to->set_length(size);
        }
      }
      local[c].set_wait(true);
      remote[c].set_wait(true);
    }
    auto move = [&](int c, bool far) -> absl::Status {
      auto r = clients[c]->Submit(far ? remote[c] : local[c]);
      if (!r.ok()) return r.status();
      for (const v1::Transfer& t : r->transfers()) {
        if (t.state() != v1::SUCCEEDED) return absl::InternalError(t.error_message());
      }
      return absl::OkStatus();
    };
    // Warm up every connection and path.
    if (!absl::GetFlag(FLAGS_local_only)) Rate(max_clients, echo_call);
    Rate(max_clients, [&](int c) { return move(c, false); });
    if (!absl::GetFlag(FLAGS_local_only)) Rate(max_clients, [&](int c) { return move(c, true); });
    std::printf("\n%d move%s per Submit%s\n", batch, batch == 1 ? "" : "s",
                batch == 1 ? "" : " (echo: one call of as many bytes; /echo: moves per echo call)");
    std::printf("%8s %12s %14s %8s %14s %8s\n", "clients", "echo/s", "LOCAL moves/s", "/echo",
                "node moves/s", "/echo");
    const bool all = !absl::GetFlag(FLAGS_local_only);
    for (int n = absl::GetFlag(FLAGS_min_clients); n <= max_clients; n *= 2) {
      std::vector<double> e{0}, l, r{0};
      for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
        if (all) e.push_back(Rate(n, echo_call));
        l.push_back(Rate(n, [&](int c) { return move(c, false); }, batch));
        if (all) r.push_back(Rate(n, [&](int c) { return move(c, true); }, batch));
      }
      if (all) e.erase(e.begin()), r.erase(r.begin());
      const double em = Median(e), lm = Median(l), rm = Median(r);
      if (all) {
        std::printf("%8d %12.0f %14.0f %8.2f %14.0f %8.2f\n", n, em, lm, lm / em, rm, rm / em);
      } else {
        std::printf("%8d %12s %14.0f\n", n, "-", lm);
      }
      std::fflush(stdout);
    }
  }
  StopEchoServer(echo);
  return 0;
}

}  // namespace
}  // namespace gpumove

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return gpumove::Main();
}
