// `gpumove-bench small`: small independent LOCAL moves per second at 1 ... --max_clients
// concurrent clients (each a thread with its own connection, Submit with wait, back to
// back) against a bare gRPC unary echo of the same payload at the same concurrency (a
// move is at least one such round trip). --small_node adds node-to-node moves (a -> b on
// this host); --batch=N puts N moves in each Submit (the echo then carries N sizes).
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "client/bench/echo.grpc.pb.h"
#include "client/bench/tool/bench.h"
#include "daemon/common/bytes.h"

ABSL_FLAG(int, max_clients, 16, "small: the most concurrent clients (powers of 2 up to it).");
ABSL_FLAG(gpumove::ByteSize, size, gpumove::ByteSize{4096}, "small: bytes per move.");
ABSL_FLAG(int, batch, 1,
          "small: moves per Submit (into disjoint ranges, waiting for all); moves/s counts "
          "moves, and the echo then carries as many bytes as the Submit moves.");
ABSL_FLAG(bool, small_node, false,
          "small: also node-to-node moves (\"gpumove node\": a second daemon b on this host, "
          "the moves pushed by the first).");
ABSL_FLAG(bool, callback_echo, false,
          "small: serve the echo baseline on gRPC's callback API instead of the synchronous "
          "server.");

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

// Per client: a source on a, a destination of `batch` ranges on a (and on b with
// --small_node); each client's Submit of `batch` moves into its ranges, waiting for all.
struct SmallMoves {
  std::vector<v1::SubmitRequest> local, remote;
};

absl::StatusOr<SmallMoves> Prepare(Client& a, Client* b, uint64_t size, int clients, int batch) {
  SmallMoves m;
  m.local.resize(clients);
  m.remote.resize(b != nullptr ? clients : 0);
  for (int c = 0; c < clients; ++c) {
    auto src = a.Allocate(size);
    if (!src.ok()) return src.status();
    for (bool far : {false, true}) {
      if (far && b == nullptr) break;
      auto dst = (far ? b : &a)->Allocate(size * batch);
      if (!dst.ok()) return dst.status();
      v1::SubmitRequest& req = far ? m.remote[c] : m.local[c];
      req.set_wait(true);
      for (int i = 0; i < batch; ++i) {
        v1::TransferSpec* t = req.add_transfers();
        *t->mutable_source() = Ref(src->id());
        *t->mutable_destination() = Ref(dst->id(), i * size, size);
        if (far) t->mutable_destination()->set_node("b");
      }
    }
  }
  return m;
}

absl::Status RunSmall(const Context& ctx, Run& run) {
  const uint64_t size = absl::GetFlag(FLAGS_size).bytes;
  const int max_clients = absl::GetFlag(FLAGS_max_clients);
  const int batch = absl::GetFlag(FLAGS_batch);
  const bool node = absl::GetFlag(FLAGS_small_node);
  if (size == 0 || size > (64 << 20) || max_clients < 1 || max_clients > 1024 || batch < 1 ||
      batch > 4096 || size * batch > (256 << 20)) {
    return absl::InvalidArgumentError(
        "--size must be 1 B to 64 MiB, --max_clients 1 to 1024, --batch 1 to 4096 (at most "
        "256 MiB a Submit)");
  }
  if (node && !ctx.addr.empty()) {
    return absl::InvalidArgumentError("--small_node starts its own two daemons");
  }
  run.SetFlag("size", FormatBytes(size));
  run.SetFlag("max_clients", absl::StrCat(max_clients));
  run.SetFlag("batch", absl::StrCat(batch));
  run.SetFlag("small_node", node ? "true" : "false");
  auto echo = EchoChild::Start(absl::GetFlag(FLAGS_callback_echo));
  if (!echo.ok()) return echo.status();
  std::vector<std::unique_ptr<DaemonProcess>> own;
  const std::vector<std::string> flags = {
      absl::StrCat("--host_pool_size=", 2 * size * batch * max_clients + (64 << 20)),
      "--pinned_pool_size=0", "--heartbeat=200ms"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), flags.begin(), flags.end());
    return more;
  };
  auto a = ctx.Connect(with({"--node=bench"}), own, run);
  if (!a.ok()) return a.status();
  std::unique_ptr<Client> b;
  if (node) {
    auto b_addr = ctx.Daemon(with({"--node=b", "--peers=" + a->address}), own);
    if (!b_addr.ok()) return b_addr.status();
    auto cb = Client::Connect(*b_addr);
    if (!cb.ok()) return cb.status();
    b = *std::move(cb);
    if (!AwaitPeers(*a->client)) return absl::DeadlineExceededError("b did not join a");
  }
  auto moves = Prepare(*a->client, b.get(), size, max_clients, batch);
  if (!moves.ok()) return moves.status();
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<std::unique_ptr<Echo::Stub>> echoes;
  for (int c = 0; c < max_clients; ++c) {
    clients.push_back(std::make_unique<Client>(OwnChannel(a->address)));
    echoes.push_back(Echo::NewStub(OwnChannel((*echo)->address())));
  }
  // The echo carries what one Submit carries: `batch` moves' bytes.
  EchoMessage ping;
  ping.set_payload(std::string(size * batch, 'x'));
  auto echo_call = [&](int c) {
    grpc::ClientContext context;
    EchoMessage pong;
    return FromGrpcStatus(echoes[c]->Echo(&context, ping, &pong));
  };
  auto submit = [&](int c, const v1::SubmitRequest& req) -> absl::Status {
    auto r = clients[c]->Submit(req);
    if (!r.ok()) return r.status();
    for (const v1::Transfer& t : r->transfers()) {
      if (t.state() != v1::SUCCEEDED) return absl::InternalError(t.error_message());
    }
    return absl::OkStatus();
  };
  struct Side {
    const char* series;
    std::function<absl::Status(int)> call;
    int per_call;  // Moves (or echo calls) per call.
  };
  std::vector<Side> sides = {{"gpumove", [&](int c) { return submit(c, moves->local[c]); }, batch},
                             {"grpc echo", echo_call, 1}};
  if (node) {
    sides.insert(sides.begin() + 1,
                 {"gpumove node", [&](int c) { return submit(c, moves->remote[c]); }, batch});
  }
  run.AddSeries("gpumove", false, "moves/s", true);
  if (node) run.AddSeries("gpumove node", false, "moves/s", true);
  run.AddSeries("grpc echo", true, "calls/s", true);
  absl::Status failed;
  for (const Side& s : sides) Rate(max_clients, 0.2, s.call, failed);  // Warm every connection.
  for (int r = 0; r < ctx.rounds && failed.ok(); ++r) {
    for (int n = 1; n <= max_clients; n *= 2) {
      // In turns: the order reversed every other round.
      for (size_t i = 0; i < sides.size(); ++i) {
        const Side& s = sides[r % 2 == 0 ? i : sides.size() - 1 - i];
        run.Add(s.series, size, n, s.per_call * Rate(n, ctx.seconds, s.call, failed));
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
