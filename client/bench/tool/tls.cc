// `gpumove-bench tls`: security on against off in one run. Two daemons a and b on this
// host are started for each configuration in turn every round (the order alternating):
// "open" (plaintext, no secret) and "secured" (--secured: tls = mTLS for clients and peers,
// secret = the cluster secret on every peer call; default both). Figures, each secured
// against its open twin:
//   4K, 4K p99    4 KiB Submit+wait on node a, one at a time (--tls_small_moves of
//                 them): median and 99th percentile, us
//   a->b 4K       4 KiB moves a -> b one at a time (peer calls stamped and checked), us
//   a->b          --tls_big host moves a -> b (bytes over UCX, not gRPC), GB/s
// The certificates are made with the openssl command (SKIPPED without it).
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/bench/stream.h"
#include "client/bench/tool/bench.h"
#include "daemon/common/bytes.h"
#include "tests/util/test_certs.h"

ABSL_FLAG(int, tls_small_moves, 2000, "tls: 4 KiB moves per round for the latency figures.");
ABSL_FLAG(gpumove::ByteSize, tls_big, gpumove::ByteSize{256ull << 20},
          "tls: the node-to-node move.");
ABSL_FLAG(int, tls_big_moves, 4, "tls: node-to-node moves per round (the median is kept).");
ABSL_FLAG(std::string, secured, "tls,secret",
          "tls: what \"secured\" turns on: tls (mTLS for clients and peers), secret (the "
          "cluster secret on peer calls), or both.");

namespace gpumove::bench {
namespace {

struct Certs {
  std::string dir;
  CertFiles ca, a, b, client;
};

struct Figures {
  double p50_us = 0, p99_us = 0, remote_p50_us = 0, gbps = 0;
};

// Microseconds of each of `n` moves from `from` to `to`, one at a time, sorted.
absl::StatusOr<std::vector<double>> Latencies(Client& c, const v1::BufferRef& from,
                                              const v1::BufferRef& to, int n) {
  std::vector<double> us;
  for (int i = 0; i < n; ++i) {
    const absl::Time t0 = absl::Now();
    auto m = c.Move(from, to);
    if (!m.ok()) return m.status();
    if (m->state() != v1::SUCCEEDED) return absl::InternalError(m->error_message());
    us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
  }
  std::sort(us.begin(), us.end());
  return us;
}

// Starts a and b (`secured` or open) and connects to a.
absl::StatusOr<std::unique_ptr<Client>> StartPair(
    const Context& ctx, bool secured, const Certs& certs,
    std::vector<std::unique_ptr<DaemonProcess>>& own) {
  const std::string parts = absl::GetFlag(FLAGS_secured);
  const bool tls = secured && absl::StrContains(parts, "tls");
  const bool secret = secured && absl::StrContains(parts, "secret");
  const uint64_t big = absl::GetFlag(FLAGS_tls_big).bytes;
  auto flags = [&](const std::string& node, const CertFiles& c) {
    std::vector<std::string> f = {"--node=" + node,
                                  absl::StrCat("--host_pool_size=", 2 * big + (64 << 20)),
                                  "--pinned_pool_size=16MiB", "--heartbeat=100ms"};
    if (tls) {
      for (std::string x :
           {"--tls_cert=" + c.cert, "--tls_key=" + c.key, "--tls_client_ca=" + certs.ca.cert}) {
        f.push_back(x);
      }
    }
    if (secret) f.push_back("--cluster_secret_file=" + certs.dir + "/secret");
    return f;
  };
  auto a = ctx.Daemon(flags("a", certs.a), own);
  if (!a.ok()) return a.status();
  std::vector<std::string> fb = flags("b", certs.b);
  fb.push_back("--peers=" + *a);
  auto b = ctx.Daemon(fb, own);
  if (!b.ok()) return b.status();
  ConnectOptions o;
  if (tls) {
    o = ConnectOptions{
        .tls_ca = certs.ca.cert, .tls_cert = certs.client.cert, .tls_key = certs.client.key};
  }
  auto c = Client::Connect(*a, o);
  if (!c.ok()) return c.status();
  if (!AwaitPeers(**c)) return absl::DeadlineExceededError("b did not join a");
  return c;
}

// One configuration's figures: its own two daemons, stopped at the end.
absl::StatusOr<Figures> Measure(const Context& ctx, Run& run, bool secured, const Certs& certs) {
  std::vector<std::unique_ptr<DaemonProcess>> own;
  auto c = StartPair(ctx, secured, certs, own);
  if (!c.ok()) return c.status();
  Client& a = **c;
  auto info = a.GetInfo();
  if (!info.ok()) return info.status();
  run.SetDaemon(*info);
  Figures f;
  auto s = a.Allocate(4096);
  if (!s.ok()) return s.status();
  auto d = a.Allocate(4096);
  if (!d.ok()) return d.status();
  const int n = absl::GetFlag(FLAGS_tls_small_moves);
  auto us = Latencies(a, Ref(s->id()), Ref(d->id()), n);
  if (!us.ok()) return us.status();
  f.p50_us = (*us)[us->size() / 2];
  f.p99_us = (*us)[us->size() * 99 / 100];
  // 4 KiB a -> b, one at a time: a hold and an acknowledgement to b per move.
  auto rd = a.Allocate(4096, v1::HOST, 0, absl::ZeroDuration(), "", "b");
  if (!rd.ok()) return rd.status();
  v1::BufferRef on_b = Ref(rd->id());
  on_b.set_node("b");
  auto remote = Latencies(a, Ref(s->id()), on_b, n);
  if (!remote.ok()) return remote.status();
  f.remote_p50_us = (*remote)[remote->size() / 2];
  // Big host moves a -> b.
  const uint64_t big = absl::GetFlag(FLAGS_tls_big).bytes;
  auto src = a.Allocate(big);
  if (!src.ok()) return src.status();
  auto dst = a.Allocate(big, v1::HOST, 0, absl::ZeroDuration(), "", "b");
  if (!dst.ok()) return dst.status();
  v1::BufferRef to = Ref(dst->id());
  to.set_node("b");
  std::vector<double> rates;
  for (int i = 0; i < absl::GetFlag(FLAGS_tls_big_moves); ++i) {
    const absl::Time t0 = absl::Now();
    auto m = a.Move(Ref(src->id()), to);
    if (!m.ok()) return m.status();
    if (m->state() != v1::SUCCEEDED) return absl::InternalError(m->error_message());
    rates.push_back(static_cast<double>(big) / absl::ToDoubleSeconds(absl::Now() - t0) / 1e9);
  }
  f.gbps = Median(rates);
  return f;
}

absl::StatusOr<Certs> MakeCerts(const std::string& dir) {
  Certs c;
  c.dir = dir;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot make ", dir, ": ", ec.message()));
  {
    std::ofstream secret(dir + "/secret");
    secret << "gpumove-bench-tls-cluster-secret-0123456789\n";
    if (!secret) return absl::InternalError("cannot write the cluster secret");
  }
  auto ca = MakeCa(dir, "bench-ca");
  if (!ca.ok()) return ca.status();
  c.ca = *ca;
  for (auto [name, out] : {std::pair{"a", &c.a}, {"b", &c.b}, {"client", &c.client}}) {
    auto cert = MakeCert(dir, c.ca, name);
    if (!cert.ok()) return cert.status();
    *out = *cert;
  }
  return c;
}

absl::Status RunTls(const Context& ctx, Run& run) {
  const int small = absl::GetFlag(FLAGS_tls_small_moves);
  const uint64_t big = absl::GetFlag(FLAGS_tls_big).bytes;
  const int big_moves = absl::GetFlag(FLAGS_tls_big_moves);
  const std::string parts = absl::GetFlag(FLAGS_secured);
  if (small < 1 || small > 1000000 || big == 0 || big > (4ull << 30) || big_moves < 1 ||
      big_moves > 1000) {
    return absl::InvalidArgumentError(
        "--tls_small_moves must be 1 to 1000000, --tls_big 1 B to 4 GiB, --tls_big_moves 1 to "
        "1000");
  }
  if (parts != "tls" && parts != "secret" && parts != "tls,secret" && parts != "secret,tls") {
    return absl::InvalidArgumentError("--secured must be tls, secret or tls,secret");
  }
  if (!ctx.addr.empty()) return absl::InvalidArgumentError("tls starts its own daemons");
  run.SetFlag("tls_small_moves", absl::StrCat(small));
  run.SetFlag("tls_big", FormatBytes(big));
  run.SetFlag("tls_big_moves", absl::StrCat(big_moves));
  run.SetFlag("secured", parts);
  if (!HaveOpenssl()) return run.Skip("no openssl command to make certificates"), absl::OkStatus();
  const std::string dir =
      std::filesystem::temp_directory_path() / absl::StrCat("gpumove-bench-tls.", getpid());
  struct Remove {
    std::string dir;
    ~Remove() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } remove{dir};
  auto certs = MakeCerts(dir);
  if (!certs.ok()) return certs.status();
  // Each secured series is compared with its open twin only.
  const std::pair<const char*, const char*> latencies[] = {{"secured 4K", "open 4K"},
                                                           {"secured 4K p99", "open 4K p99"},
                                                           {"secured a->b 4K", "open a->b 4K"}};
  for (const auto& [secured, open] : latencies) run.AddSeries(secured, false, "us", false, open);
  run.AddSeries("secured a->b", false, "GB/s", true, "open a->b");
  for (const auto& [secured, open] : latencies) run.AddSeries(open, true, "us", false);
  run.AddSeries("open a->b", true, "GB/s", true);
  for (int r = 0; r < ctx.rounds; ++r) {
    for (bool secured : {r % 2 == 1, r % 2 == 0}) {
      auto f = Measure(ctx, run, secured, *certs);
      if (!f.ok()) {
        return absl::Status(f.status().code(),
                            absl::StrCat(secured ? "secured" : "open", ": ", f.status().message()));
      }
      const std::string w = secured ? "secured" : "open";
      run.Add(w + " 4K", 4096, 1, f->p50_us);
      run.Add(w + " 4K p99", 4096, 1, f->p99_us);
      run.Add(w + " a->b 4K", 4096, 1, f->remote_p50_us);
      run.Add(w + " a->b", big, 1, f->gbps);
    }
  }
  return absl::OkStatus();
}

}  // namespace

Subcommand TlsSubcommand() {
  return {"tls",
          "mTLS and the cluster secret on against plaintext: small-move latency and a "
          "node-to-node move",
          RunTls};
}

}  // namespace gpumove::bench
