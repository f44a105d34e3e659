// Node-to-node benchmark: moves between two gpumoved nodes over UCX, next to the
// baselines run in the same invocation on the same link: ucx_perftest ucp_put_bw (same
// UCX_TLS, same sizes) and, for TCP, iperf3. Prints every figure and the ratios.
//
//   bazel run //client/bench:node_bench -- --tls=auto   # UCX picks (cma/shm on one host)
//   bazel run //client/bench:node_bench -- --tls=tcp    # UCX_TLS=tcp, plus iperf3
//
// gpumove figures per size: "single" is one move at a time, Submit+wait (what one client
// sees, RPCs included); "stream" is up to 16 moves of that size per Submit, two Submits in
// flight on ranges of their own (bytes per second of wall time, as ucx_perftest keeps
// many puts in flight).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/bench/stream.h"
#include "client/bench/tool/baselines.h"
#include "client/gpumove_client.h"
#include "daemon/common/bytes.h"
#include "tests/util/daemon_process.h"

ABSL_FLAG(std::string, tls, "auto", "auto (UCX chooses) or a UCX_TLS value such as tcp.");
ABSL_FLAG(gpumove::ByteSize, min_size, gpumove::ByteSize{4096}, "Smallest move.");
ABSL_FLAG(gpumove::ByteSize, max_size, gpumove::ByteSize{256ull << 20}, "Largest move.");
ABSL_FLAG(double, seconds_per_size, 0.5, "Time spent on each gpumove figure per size.");
ABSL_FLAG(int, copy_threads, 4, "Worker threads of the node that runs the moves.");
ABSL_FLAG(bool, baselines, true, "Run ucx_perftest (and iperf3 for tcp) alongside.");
ABSL_FLAG(int, per_submit, 16, "Stream: moves per Submit.");
ABSL_FLAG(int, in_flight, 2, "Stream: Submits in flight at once.");
ABSL_FLAG(std::vector<std::string>, daemon_flags, {}, "More flags for both daemons.");
ABSL_FLAG(int, rounds, 1,
          "Rounds per size, gpumove and the baselines taking turns; the figures are medians "
          "over the rounds (the machine's speed drifts between runs).");

namespace gpumove {
namespace {

using bench::Iperf3;
using bench::LanesOf;
using bench::UcxPerftest;

int Main() {
  const std::string tls = absl::GetFlag(FLAGS_tls);
  if (tls != "auto") setenv("UCX_TLS", tls.c_str(), 1);  // Inherited by both daemons.
  const uint64_t max_size = absl::GetFlag(FLAGS_max_size).bytes;
  const std::string pool = absl::StrCat("--host_pool_size=", 2 * max_size + (64 << 20));
  std::vector<std::string> flags_a = {
      "--node=bench-a", pool, "--pinned_pool_size=0", "--device_pool_size=0",
      absl::StrCat("--copy_threads=", absl::GetFlag(FLAGS_copy_threads))};
  std::vector<std::string> flags_b = {"--node=bench-b", pool, "--pinned_pool_size=0",
                                      "--device_pool_size=0"};
  for (const std::string& f : absl::GetFlag(FLAGS_daemon_flags)) {
    flags_a.push_back(f);
    flags_b.push_back(f);
  }
  auto a = DaemonProcess::Start(flags_a);
  if (!a.ok()) {
    std::cerr << a.status() << "\n";
    return 1;
  }
  flags_b.push_back("--peers=" + (*a)->address());
  auto b = DaemonProcess::Start(flags_b);
  if (!b.ok()) {
    std::cerr << b.status() << "\n";
    return 1;
  }
  auto ca = *Client::Connect((*a)->address());
  auto cb = *Client::Connect((*b)->address());
  for (int i = 0; i < 200 && ca->ListPeers()->empty(); ++i) absl::SleepFor(absl::Milliseconds(50));
  auto src = ca->Allocate(max_size);
  auto dst = cb->Allocate(max_size);
  if (!src.ok() || !dst.ok()) {
    std::cerr << "allocate: " << src.status() << dst.status() << "\n";
    return 1;
  }
  v1::BufferRef to = Ref(dst->id());
  to.set_node("bench-b");
  const auto info = ca->GetInfo();
  int lanes = 1;
  for (const auto& p : info->paths()) {
    if (p.path() != v1::UCX) continue;
    std::cout << "UCX path: " << p.reason() << "\n";
    lanes = LanesOf(p.reason());
  }
  std::cout << "UCX_TLS=" << tls << ", " << sysconf(_SC_NPROCESSORS_ONLN) << " CPUs; medians; "
            << "stream: " << absl::GetFlag(FLAGS_per_submit) << " moves per Submit, "
            << absl::GetFlag(FLAGS_in_flight) << " Submits in flight; "
            << std::max(1, absl::GetFlag(FLAGS_rounds))
            << " round(s) per size, gpumove and the baselines taking turns\n";
  const double budget = absl::GetFlag(FLAGS_seconds_per_size);
  int port = 20000 + getpid() % 20000;
  // Over TCP the baselines are the link (iperf3, median of three) and ucx_perftest both
  // with UCX's own settings and with the daemon's (gpumoved sets 512 KiB TCP segments);
  // the ratios are to the best of them. With L UCX lanes the daemons use L connections:
  // L ucx_perftest pairs at once (512 KiB segments) are the like-for-like figure, shown
  // with the stream's ratio to it.
  const bool tcp = tls == "tcp" && absl::GetFlag(FLAGS_baselines);
  double iperf = 0;
  if (tcp) {
    std::vector<double> runs;
    for (int i = 0; i < 3; ++i) runs.push_back(Iperf3(port++));
    iperf = Median(runs);
    std::cout << absl::StrFormat("iperf3 (one TCP stream, loopback, median of 3): %.3f GB/s\n",
                                 iperf);
    std::cout << absl::StrFormat("\n%10s %12s %12s %14s %14s %10s %10s %14s %11s\n", "size",
                                 "single GB/s", "stream GB/s", "perftest GB/s", "pt 512k GB/s",
                                 "single/best", "stream/best",
                                 absl::StrCat("pt 512k x", lanes), "stream/ptxL");
  } else {
    std::cout << absl::StrFormat("\n%10s %12s %12s %14s %10s %10s\n", "size", "single GB/s",
                                 "stream GB/s", "perftest GB/s", "single/pt", "stream/pt");
  }
  const int rounds = std::max(1, absl::GetFlag(FLAGS_rounds));
  StreamOptions so;
  so.duration = absl::Seconds(budget);
  so.per_submit = absl::GetFlag(FLAGS_per_submit);
  so.in_flight = absl::GetFlag(FLAGS_in_flight);
  std::vector<std::pair<uint64_t, double>> streams;  // Shared memory: size, stream GB/s.
  for (uint64_t size = absl::GetFlag(FLAGS_min_size).bytes; size <= max_size; size *= 4) {
    std::vector<double> single_bws, stream_bws, pts, tuneds, multis;
    for (int round = 0; round < rounds; ++round) {
      std::vector<double> single;
      const absl::Time end = absl::Now() + absl::Seconds(budget);
      while (single.size() < 5 || (absl::Now() < end && single.size() < 2000)) {
        const absl::Time t0 = absl::Now();
        auto t = ca->Move(Ref(src->id(), 0, size), to);
        if (!t.ok() || t->state() != v1::SUCCEEDED) {
          std::cerr << "move failed: " << t.status() << (t.ok() ? t->error_message() : "")
                    << "\n";
          return 1;
        }
        single.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
      }
      auto stream = StreamThroughput(*ca, Ref(src->id()), to, size, max_size, so);
      if (!stream.ok()) {
        std::cerr << "stream: " << stream.status() << "\n";
        return 1;
      }
      stream_bws.push_back(*stream);
      single_bws.push_back(size / Median(single) / 1e9);
      // Over TCP, UCX's own settings are run once: at tenths of a GB/s they take long and
      // are never the best.
      if (absl::GetFlag(FLAGS_baselines) && (!tcp || round == 0)) {
        pts.push_back(UcxPerftest(size, tls, port++, ""));
      }
      if (tcp) {
        const std::string segments = "UCX_TCP_TX_SEG_SIZE=512k UCX_TCP_RX_SEG_SIZE=512k";
        tuneds.push_back(UcxPerftest(size, tls, port++, segments));
        if (lanes > 1) {
          multis.push_back(UcxPerftest(size, tls, port, segments, lanes));
          port += lanes;
        } else {
          multis.push_back(tuneds.back());
        }
      }
    }
    const double stream_bw = Median(stream_bws);
    const double single_bw = Median(single_bws);
    const double pt = Median(pts);
    if (tcp) {
      const double tuned = Median(tuneds);
      const double multi = Median(multis);
      const double best = std::max({pt, tuned, iperf});
      // Ratios to 3 significant figures: a loaded machine's small ones are not 0.000.
      std::cout << absl::StrFormat("%10s %12.3f %12.3f %14.3f %14.3f %10.3g %10.3g %14.3f %11.3g\n",
                                   FormatBytes(size), single_bw, stream_bw, pt, tuned,
                                   best > 0 ? single_bw / best : 0,
                                   best > 0 ? stream_bw / best : 0, multi,
                                   multi > 0 ? stream_bw / multi : 0);
      continue;
    }
    std::cout << absl::StrFormat("%10s %12.3f %12.3f %14.3f %10.3g %10.3g\n", FormatBytes(size),
                                 single_bw, stream_bw, pt, pt > 0 ? single_bw / pt : 0,
                                 pt > 0 ? stream_bw / pt : 0);
    streams.emplace_back(size, stream_bw);
  }
  if (!streams.empty()) {
    PrintMemcpyTable(streams, max_size, so, absl::Seconds(budget), "ucx_perftest's puts");
  }
  return 0;
}

}  // namespace
}  // namespace gpumove

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return gpumove::Main();
}
