// Security on against off, in one run: 4 KiB Submit+wait latency on one node and between
// two (the peer calls of a remote move stamped and checked), and 256 MiB host moves
// between two nodes (bytes go over UCX, not gRPC), each configuration started in turn for
// every round; prints medians and the ratios. On: mTLS for clients and peers and the
// cluster secret on every peer call. Off: plaintext, open.
//
//   bazel run //client/bench:tls_bench -- --rounds=3
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/gpumove_client.h"
#include "daemon/common/bytes.h"
#include "tests/util/daemon_process.h"
#include "tests/util/test_certs.h"

ABSL_FLAG(int, rounds, 3, "Rounds, plaintext and TLS taking turns; figures are medians.");
ABSL_FLAG(int, small_moves, 2000, "4 KiB moves per round for the latency figure.");
ABSL_FLAG(gpumove::ByteSize, big, gpumove::ByteSize{256ull << 20}, "The node-to-node move.");
ABSL_FLAG(int, big_moves, 4, "Node-to-node moves per round.");
ABSL_FLAG(std::string, secured, "tls,secret",
          "What \"secured\" turns on: tls (mTLS for clients and peers), secret (the cluster "
          "secret on peer calls), or both.");

namespace gpumove {
namespace {

struct Figures {
  double p50_us = 0, p99_us = 0, remote_p50_us = 0, gbps = 0;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Microseconds of each of `n` moves from `from` to `to`, one at a time.
absl::StatusOr<std::vector<double>> TimeMoves(Client& c, const v1::BufferRef& from,
                                              const v1::BufferRef& to, int n) {
  std::vector<double> us;
  for (int i = 0; i < n; ++i) {
    const absl::Time t0 = absl::Now();
    auto m = c.Move(from, to);
    if (!m.ok() || m->state() != v1::SUCCEEDED) return absl::InternalError("a small move failed");
    us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
  }
  return us;
}

absl::StatusOr<Figures> Round(bool tls, const std::string& dir, const CertFiles& ca,
                              const CertFiles& a_cert, const CertFiles& b_cert,
                              const CertFiles& client_cert) {
  auto flags = [&](const std::string& node, const CertFiles& c) {
    std::vector<std::string> f = {"--node=" + node, "--host_pool_size=1GiB",
                                  "--pinned_pool_size=16MiB", "--heartbeat=100ms"};
    const std::string parts = absl::GetFlag(FLAGS_secured);
    if (tls && absl::StrContains(parts, "tls")) {
      f.push_back("--tls_cert=" + c.cert);
      f.push_back("--tls_key=" + c.key);
      f.push_back("--tls_client_ca=" + ca.cert);
    }
    if (tls && absl::StrContains(parts, "secret")) {
      f.push_back("--cluster_secret_file=" + dir + "/secret");
    }
    return f;
  };
  auto a = DaemonProcess::Start(flags("a", a_cert));
  if (!a.ok()) return a.status();
  std::vector<std::string> fb = flags("b", b_cert);
  fb.push_back("--peers=" + (*a)->address());
  auto b = DaemonProcess::Start(fb);
  if (!b.ok()) return b.status();
  ConnectOptions o;
  if (tls && absl::StrContains(absl::GetFlag(FLAGS_secured), "tls"))
    o = ConnectOptions{.tls_ca = ca.cert, .tls_cert = client_cert.cert, .tls_key = client_cert.key};
  auto c = Client::Connect((*a)->address(), o);
  if (!c.ok()) return c.status();
  for (absl::Time end = absl::Now() + absl::Seconds(20);;) {
    auto peers = (*c)->ListPeers();
    if (peers.ok() && peers->size() == 1 && (*peers)[0].up()) break;
    if (absl::Now() > end) return absl::DeadlineExceededError("b did not join a");
    absl::SleepFor(absl::Milliseconds(50));
  }
  Figures f;
  // 4 KiB on node a, one at a time.
  auto s = (*c)->Allocate(4096);
  auto d = (*c)->Allocate(4096);
  if (!s.ok() || !d.ok()) return absl::InternalError("allocation failed");
  const int n = absl::GetFlag(FLAGS_small_moves);
  auto us = TimeMoves(**c, Ref(s->id()), Ref(d->id()), n);
  if (!us.ok()) return us.status();
  std::sort(us->begin(), us->end());
  f.p50_us = (*us)[us->size() / 2];
  f.p99_us = (*us)[us->size() * 99 / 100];
  // 4 KiB a -> b, one at a time: a hold and an acknowledgement to b per move.
  auto rd = (*c)->Allocate(4096, v1::HOST, 0, absl::ZeroDuration(), "", "b");
  if (!rd.ok()) return absl::InternalError("remote allocation failed");
  v1::BufferRef on_b = Ref(rd->id());
  on_b.set_node("b");
  auto remote = TimeMoves(**c, Ref(s->id()), on_b, n);
  if (!remote.ok()) return remote.status();
  f.remote_p50_us = Median(*remote);
  // Big host moves a -> b.
  const uint64_t big = absl::GetFlag(FLAGS_big).bytes;
  auto src = (*c)->Allocate(big);
  auto dst = (*c)->Allocate(big, v1::HOST, 0, absl::ZeroDuration(), "", "b");
  if (!src.ok() || !dst.ok()) return absl::InternalError("big allocation failed");
  v1::BufferRef to = Ref(dst->id());
  to.set_node("b");
  std::vector<double> rates;
  for (int i = 0; i < absl::GetFlag(FLAGS_big_moves); ++i) {
    const absl::Time t0 = absl::Now();
    auto m = (*c)->Move(Ref(src->id()), to);
    if (!m.ok() || m->state() != v1::SUCCEEDED) return absl::InternalError("a big move failed");
    rates.push_back(static_cast<double>(big) / absl::ToDoubleSeconds(absl::Now() - t0) / 1e9);
  }
  f.gbps = Median(rates);
  return f;
}

int Main() {
  if (!HaveOpenssl()) {
    std::printf("SKIPPED: no openssl command to make certificates\n");
    return 0;
  }
  const std::string dir =
      std::filesystem::temp_directory_path() / absl::StrCat("tls_bench.", getpid());
  std::filesystem::create_directories(dir);
  { std::ofstream(dir + "/secret") << "tls-bench-cluster-secret-0123456789\n"; }
  auto ca = MakeCa(dir, "bench-ca");
  if (!ca.ok()) return std::printf("%s\n", ca.status().ToString().c_str()), 1;
  auto a = MakeCert(dir, *ca, "a"), b = MakeCert(dir, *ca, "b"), cl = MakeCert(dir, *ca, "client");
  if (!a.ok() || !b.ok() || !cl.ok()) return std::printf("certificates failed\n"), 1;
  std::vector<Figures> plain, tls;
  for (int r = 0; r < absl::GetFlag(FLAGS_rounds); ++r) {
    for (bool on : {false, true}) {
      auto f = Round(on, dir, *ca, *a, *b, *cl);
      if (!f.ok()) return std::printf("round failed: %s\n", f.status().ToString().c_str()), 1;
      (on ? tls : plain).push_back(*f);
      std::printf(
          "round %d %-7s 4 KiB p50 %7.1f us p99 %7.1f us, a->b p50 %7.1f us; %s a->b %6.2f GB/s\n",
          r + 1, on ? "secured" : "open", f->p50_us, f->p99_us, f->remote_p50_us,
          FormatBytes(absl::GetFlag(FLAGS_big).bytes).c_str(), f->gbps);
    }
  }
  auto med = [](const std::vector<Figures>& v, double Figures::*m) {
    std::vector<double> x;
    for (const Figures& f : v) x.push_back(f.*m);
    return Median(x);
  };
  const double p50p = med(plain, &Figures::p50_us), p50t = med(tls, &Figures::p50_us);
  const double bwp = med(plain, &Figures::gbps), bwt = med(tls, &Figures::gbps);
  std::printf("\nmedians of %d rounds   open (plain)  secured  secured/open\n",
              absl::GetFlag(FLAGS_rounds));
  std::printf("4 KiB Submit+wait p50  %7.1f us %7.1f us   %.2fx (aim <= 1.3x)\n", p50p, p50t,
              p50t / p50p);
  std::printf("4 KiB Submit+wait p99  %7.1f us %7.1f us   %.2fx\n", med(plain, &Figures::p99_us),
              med(tls, &Figures::p99_us),
              med(tls, &Figures::p99_us) / med(plain, &Figures::p99_us));
  std::printf("4 KiB a->b p50         %7.1f us %7.1f us   %.2fx\n",
              med(plain, &Figures::remote_p50_us), med(tls, &Figures::remote_p50_us),
              med(tls, &Figures::remote_p50_us) / med(plain, &Figures::remote_p50_us));
  std::printf("%s a->b          %7.2f GB/s %6.2f GB/s %.2f (aim >= 0.95)\n",
              FormatBytes(absl::GetFlag(FLAGS_big).bytes).c_str(), bwp, bwt, bwt / bwp);
  std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace gpumove

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return gpumove::Main();
}
