#include "client/bench/tool/baselines.h"

#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace gpumove::bench {

// Runs a shell command, returns its stdout.
std::string Capture(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

// ucx_perftest ucp_put_bw between two processes on loopback; GB/s (overall), 0 if it
// could not run. `pairs` pairs at once on ports port.. (GB/s summed): as many TCP
// connections and threads as the daemons' UCX lanes.
// `env`: more VAR=value settings for it.
double UcxPerftest(uint64_t size, const std::string& tls, int port, const std::string& more_env,
                   int pairs) {
  // 4 GiB a run on shared memory; over TCP 1 GiB, and 256 MiB with UCX's own segment
  // sizes, where put runs at 0.2 GB/s and less from 4 MiB on.
  const bool tcp = tls == "tcp";
  const uint64_t total = !tcp ? (4ull << 30) : more_env.empty() ? (256ull << 20) : (1ull << 30);
  const uint64_t iters = std::clamp<uint64_t>(total / size, tcp ? 2 : 10, 20000);
  const std::string env =
      absl::StrCat(tls == "auto" ? "" : absl::StrCat("UCX_TLS=", tls, " "), more_env, " ");
  pairs = std::max(pairs, 1);
  const std::string common = absl::StrCat("-t ucp_put_bw -s ", size, " -n ", iters, " -p ");
  // The servers are stopped once the clients are done: one left spinning (its client
  // timed out) would take a CPU from the next measurements.
  std::string servers, clients;
  for (int i = 0; i < pairs; ++i) {
    absl::StrAppend(&servers, env, "timeout 60 ucx_perftest ", common, port + i,
                    " >/dev/null 2>&1 </dev/null & echo $!; ");
    absl::StrAppend(&clients, env, "timeout 60 ucx_perftest 127.0.0.1 ", common, port + i,
                    " 2>/dev/null & ");
  }
  std::vector<pid_t> server_pids;
  for (absl::string_view pid : absl::StrSplit(Capture(servers), '\n', absl::SkipWhitespace())) {
    pid_t p = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(pid), &p) && p > 0) server_pids.push_back(p);
  }
  if (server_pids.size() != static_cast<size_t>(pairs)) {
    for (pid_t p : server_pids) kill(p, SIGTERM);
    return 0;
  }
  absl::SleepFor(absl::Milliseconds(300));
  const std::string out = Capture(absl::StrCat(clients, "wait"));
  for (pid_t p : server_pids) kill(p, SIGTERM);  // `timeout` passes it on to ucx_perftest.
  for (pid_t p : server_pids) {
    for (int i = 0; i < 100 && kill(p, 0) == 0; ++i) absl::SleepFor(absl::Milliseconds(20));
  }
  double sum = 0;
  int finished = 0;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    if (line.find("Final:") == absl::string_view::npos) continue;
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    // Final: iters 50% avg overall bw_avg bw_overall ...
    double mbps = 0;
    if (f.size() >= 7 && absl::SimpleAtod(f[6], &mbps)) {
      sum += mbps * 1024 * 1024 / 1e9;
      ++finished;
    }
  }
  return finished == pairs ? sum : 0;
}

// The UCX lanes the daemon says it has ("N lanes over the network"), 1 when none.
int LanesOf(const std::string& reason) {
  const size_t at = reason.find(" lanes over the network");
  if (at == std::string::npos) return 1;
  const size_t start = reason.rfind(' ', at - 1);
  int lanes = 1;
  if (start == std::string::npos ||
      !absl::SimpleAtoi(reason.substr(start + 1, at - start - 1), &lanes)) {
    return 1;
  }
  return std::max(lanes, 1);
}

// iperf3 over loopback, one stream, 2 s; GB/s.
double Iperf3(int port) {
  if (system(absl::StrCat("timeout 20 iperf3 -s -1 -p ", port, " >/dev/null 2>&1 &").c_str()) !=
      0) {
    return 0;
  }
  absl::SleepFor(absl::Milliseconds(300));
  const std::string out = Capture(absl::StrCat("timeout 20 iperf3 -c 127.0.0.1 -p ", port,
                                               " -t 2 -f g 2>/dev/null | grep receiver"));
  std::vector<std::string> f = absl::StrSplit(out, ' ', absl::SkipEmpty());
  for (size_t i = 1; i < f.size(); ++i) {
    double v = 0;
    if (f[i] == "Gbits/sec" && absl::SimpleAtod(f[i - 1], &v)) return v / 8;
  }
  return 0;
}

}  // namespace gpumove::bench
