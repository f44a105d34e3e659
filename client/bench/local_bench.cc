// Local-move benchmark: a host-memory move through gpumoved (Submit with wait: one
// round trip) against a raw memcpy of the same size in this process, and the 4 KiB move
// latency against a bare gRPC unary echo on the same kind of channel. Prints medians and
// ratios.
//
//   bazel run //client/bench:local_bench -- [--max_size=256MiB] [--channel=tcp|unix]
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/bench/echo.grpc.pb.h"
#include "client/bench/echo_server.h"
#include "client/gpumove_client.h"
#include "daemon/common/bytes.h"
#include "daemon/common/host_copy.h"
#include "tests/util/daemon_process.h"

ABSL_FLAG(gpumove::ByteSize, min_size, gpumove::ByteSize{4096}, "Smallest move.");
ABSL_FLAG(gpumove::ByteSize, max_size, gpumove::ByteSize{256ull << 20}, "Largest move.");
ABSL_FLAG(std::string, channel, "tcp", "tcp (127.0.0.1) or unix (a socket in /tmp).");
ABSL_FLAG(double, seconds_per_size, 0.5, "Time spent measuring each size (each side).");
ABSL_FLAG(int, latency_reps, 2000, "Round trips for the latency comparison.");

namespace gpumove {
namespace {

struct Stats {
  double median = 0, p10 = 0, p90 = 0;  // Seconds.
};

Stats Summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))]; };
  return {at(0.5), at(0.1), at(0.9)};
}

// Repeats `op` for about `budget` seconds (at least 5, at most max_reps times).
template <typename Op>
Stats Measure(Op op, double budget, int max_reps = 100000) {
  op();  // Warm up.
  std::vector<double> samples;
  const absl::Time end = absl::Now() + absl::Seconds(budget);
  while ((samples.size() < 5 || absl::Now() < end) && samples.size() < static_cast<size_t>(max_reps)) {
    const absl::Time t0 = absl::Now();
    op();
    samples.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
  }
  return Summarize(samples);
}

int Main() {
  const bool unix_socket = absl::GetFlag(FLAGS_channel) == "unix";
  const std::string tag = absl::StrCat(getpid());
  std::string echo_address;
  const pid_t echo = StartEchoServer(
      unix_socket ? absl::StrCat("unix:/tmp/gpumove-bench-echo-", tag, ".sock") : "127.0.0.1:0",
      &echo_address);
  const uint64_t max_size = absl::GetFlag(FLAGS_max_size).bytes;
  std::vector<std::string> flags = {
      absl::StrCat("--host_pool_size=", 2 * max_size + (64 << 20)), "--pinned_pool_size=0",
      "--device_pool_size=0", "--node=bench"};
  if (unix_socket) flags.push_back(absl::StrCat("--listen=unix:/tmp/gpumove-bench-", tag, ".sock"));
  auto daemon = DaemonProcess::Start(flags);
  if (!daemon.ok()) {
    std::cerr << daemon.status() << "\n";
    StopEchoServer(echo);
    return 1;
  }
  auto client = Client::Connect((*daemon)->address());
  if (!client.ok()) {
    std::cerr << client.status() << "\n";
    return 1;
  }
  auto info = (*client)->GetInfo();
  std::cout << "gpumoved " << info->version() << " at " << (*daemon)->address() << ", echo at "
            << echo_address << ", " << sysconf(_SC_NPROCESSORS_ONLN) << " CPUs\n";

  auto src = (*client)->Allocate(max_size, v1::HOST);
  auto dst = (*client)->Allocate(max_size, v1::HOST);
  if (!src.ok() || !dst.ok()) {
    std::cerr << "allocate: " << src.status() << " " << dst.status() << "\n";
    return 1;
  }
  // The same pre-faulted pageable memory on the raw side.
  char* raw_src = static_cast<char*>(mmap(nullptr, max_size, PROT_READ | PROT_WRITE,
                                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0));
  char* raw_dst = static_cast<char*>(mmap(nullptr, max_size, PROT_READ | PROT_WRITE,
                                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0));
  std::memset(raw_src, 1, max_size);
  std::memset(raw_dst, 2, max_size);

  const double budget = absl::GetFlag(FLAGS_seconds_per_size);
  std::cout << "\nLocal host->host move through gpumoved (Submit+wait, one RPC) vs raw copies in\n"
               "this process: glibc memcpy (the baseline) and HostCopy (the daemon's own copy\n"
               "routine, streaming stores from 8 MiB). Medians.\n";
  std::cout << absl::StrFormat("%10s %12s %14s %13s %12s %12s %10s %10s\n", "size", "memcpy GB/s",
                               "HostCopy GB/s", "gpumove GB/s", "memcpy med", "move med",
                               "vs memcpy", "vs HostCopy");
  for (uint64_t size = absl::GetFlag(FLAGS_min_size).bytes; size <= max_size; size *= 4) {
    Stats raw = Measure([&] { std::memcpy(raw_dst, raw_src, size); }, budget);
    Stats streaming = Measure([&] { HostCopy(raw_dst, raw_src, size); }, budget);
    Stats moved = Measure(
        [&] {
          auto t = (*client)->Move(Ref(src->id(), 0, size), Ref(dst->id()));
          if (!t.ok() || t->state() != v1::SUCCEEDED) {
            std::cerr << "move failed: " << t.status() << "\n";
            std::exit(1);
          }
        },
        budget);
    const double raw_bw = size / raw.median / 1e9, move_bw = size / moved.median / 1e9;
    const double streaming_bw = size / streaming.median / 1e9;
    std::cout << absl::StrFormat("%10s %12.2f %14.2f %13.2f %10.1fus %10.1fus %10.3f %10.3f\n",
                                 FormatBytes(size), raw_bw, streaming_bw, move_bw,
                                 raw.median * 1e6, moved.median * 1e6, move_bw / raw_bw,
                                 move_bw / streaming_bw);
  }

  auto channel = grpc::CreateChannel(echo_address, grpc::InsecureChannelCredentials());
  auto stub = bench::Echo::NewStub(channel);
  bench::EchoMessage ping;
  ping.set_payload(std::string(128, 'p'));  // About a Submit request's size.
  const int reps = absl::GetFlag(FLAGS_latency_reps);
  Stats echo_rtt = Measure(
      [&] {
        grpc::ClientContext ctx;
        bench::EchoMessage pong;
        if (!stub->Echo(&ctx, ping, &pong).ok()) std::exit(1);
      },
      60, reps);
  Stats move_4k = Measure(
      [&] { (void)(*client)->Move(Ref(src->id(), 0, 4096), Ref(dst->id())); }, 60, reps);
  Stats two_rpc = Measure(
      [&] {
        MoveOptions o;
        o.wait = false;
        auto t = (*client)->Move(Ref(src->id(), 0, 4096), Ref(dst->id()), o);
        (void)(*client)->Wait(t->id());
      },
      60, reps);
  std::cout << absl::StrFormat(
      "\n4 KiB latency over %s (%d round trips each; median, p10-p90)\n", absl::GetFlag(FLAGS_channel), reps);
  std::cout << absl::StrFormat("  bare gRPC echo          %8.1fus  (%.1f-%.1f)\n", echo_rtt.median * 1e6,
                               echo_rtt.p10 * 1e6, echo_rtt.p90 * 1e6);
  std::cout << absl::StrFormat("  move, Submit+wait       %8.1fus  (%.1f-%.1f)  = %.2f echo round trips\n",
                               move_4k.median * 1e6, move_4k.p10 * 1e6, move_4k.p90 * 1e6,
                               move_4k.median / echo_rtt.median);
  std::cout << absl::StrFormat("  move, Submit then Wait  %8.1fus  (%.1f-%.1f)  = %.2f echo round trips\n",
                               two_rpc.median * 1e6, two_rpc.p10 * 1e6, two_rpc.p90 * 1e6,
                               two_rpc.median / echo_rtt.median);
  StopEchoServer(echo);
  return 0;
}

}  // namespace
}  // namespace gpumove

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return gpumove::Main();
}
