// `gpumove-bench small`: small independent LOCAL moves per second at 1 ... --max_clients
// concurrent clients (each a thread with its own connection, Submit with wait, back to
// back) against a bare gRPC unary echo of the same payload at the same concurrency (a
// move is at least one such round trip).
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "client/bench/echo.grpc.pb.h"
#include "client/bench/echo_server.h"
#include "client/bench/tool/bench.h"
#include "daemon/common/bytes.h"

ABSL_FLAG(int, max_clients, 16, "small: the most concurrent clients (powers of 2 up to it).");
ABSL_FLAG(gpumove::ByteSize, size, gpumove::ByteSize{4096}, "small: bytes per move.");

namespace gpumove::bench {
namespace {

std::shared_ptr<grpc::Channel> OwnChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // A connection per client.
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

// Calls per second of `clients` threads each running `call(client)` back to back for
// `seconds`; the first failure is kept in `failed`.
double Rate(int clients, double seconds, const std::function<absl::Status(int)>& call,
            absl::Status& failed) {
  std::atomic<bool> go{false}, stop{false};
  std::atomic<uint64_t> done{0};
  absl::Mutex mu;
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      while (!go.load()) std::this_thread::yield();
      uint64_t n = 0;
      while (!stop.load()) {
        if (absl::Status st = call(c); !st.ok()) {
          absl::MutexLock lock(&mu);
          failed.Update(st);
          break;
        }
        ++n;
      }
      done += n;
    });
  }
  const absl::Time t0 = absl::Now();
  go = true;
  absl::SleepFor(absl::Seconds(seconds));
  stop = true;
  for (auto& t : threads) t.join();
  return done.load() / absl::ToDoubleSeconds(absl::Now() - t0);
}

absl::Status RunSmall(const Context& ctx, Run& run) {
  const uint64_t size = absl::GetFlag(FLAGS_size).bytes;
  const int max_clients = absl::GetFlag(FLAGS_max_clients);
  if (size == 0 || size > (64 << 20) || max_clients < 1 || max_clients > 1024) {
    return absl::InvalidArgumentError("--size must be 1 B to 64 MiB, --max_clients 1 to 1024");
  }
  run.SetFlag("size", FormatBytes(size));
  run.SetFlag("max_clients", absl::StrCat(max_clients));
  // The echo server forks: before this process has any gRPC state.
  std::string echo_address;
  const pid_t echo = StartEchoServer("127.0.0.1:0", &echo_address);
  if (echo < 0) return absl::InternalError("cannot start the echo server");
  struct Stop {
    pid_t pid;
    ~Stop() { StopEchoServer(pid); }
  } stop_echo{echo};
  std::vector<std::unique_ptr<DaemonProcess>> own;
  auto addr = ctx.Daemon(
      {"--node=bench", absl::StrCat("--host_pool_size=", 2 * size * max_clients + (64 << 20)),
       "--pinned_pool_size=0"},
      own);
  if (!addr.ok()) return addr.status();
  auto admin = Client::Connect(*addr);
  if (!admin.ok()) return admin.status();
  auto info = (*admin)->GetInfo();
  if (!info.ok()) return info.status();
  run.SetDaemon(*info);
  std::vector<v1::SubmitRequest> moves(max_clients);
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<std::unique_ptr<Echo::Stub>> echoes;
  for (int c = 0; c < max_clients; ++c) {
    auto src = (*admin)->Allocate(size);
    auto dst = (*admin)->Allocate(size);
    if (!src.ok() || !dst.ok()) return src.ok() ? dst.status() : src.status();
    v1::TransferSpec* t = moves[c].add_transfers();
    *t->mutable_source() = Ref(src->id());
    *t->mutable_destination() = Ref(dst->id());
    moves[c].set_wait(true);
    clients.push_back(std::make_unique<Client>(OwnChannel(*addr)));
    echoes.push_back(Echo::NewStub(OwnChannel(echo_address)));
  }
  EchoMessage ping;
  ping.set_payload(std::string(size, 'x'));
  auto echo_call = [&](int c) {
    grpc::ClientContext context;
    EchoMessage pong;
    return FromGrpcStatus(echoes[c]->Echo(&context, ping, &pong));
  };
  auto move = [&](int c) -> absl::Status {
    auto r = clients[c]->Submit(moves[c]);
    if (!r.ok()) return r.status();
    for (const v1::Transfer& t : r->transfers()) {
      if (t.state() != v1::SUCCEEDED) return absl::InternalError(t.error_message());
    }
    return absl::OkStatus();
  };
  run.AddSeries("gpumove", false, "moves/s", true);
  run.AddSeries("grpc echo", true, "calls/s", true);
  absl::Status failed;
  Rate(max_clients, 0.2, move, failed);  // Warm every connection.
  Rate(max_clients, 0.2, echo_call, failed);
  for (int r = 0; r < ctx.rounds && failed.ok(); ++r) {
    for (int n = 1; n <= max_clients; n *= 2) {
      for (int side = 0; side < 2; ++side) {
        const bool ours = (side == 0) == (r % 2 == 0);
        const double rate =
            Rate(n, ctx.seconds, ours ? std::function<absl::Status(int)>(move) : echo_call, failed);
        run.Add(ours ? "gpumove" : "grpc echo", size, n, rate);
      }
    }
  }
  return failed;
}

}  // namespace

Subcommand SmallSubcommand() {
  return {"small", "small LOCAL moves per second by concurrent clients against a gRPC echo",
          RunSmall};
}

}  // namespace gpumove::bench
