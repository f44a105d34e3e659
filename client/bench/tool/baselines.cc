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

namespace {

// `pairs` ucx_perftest server/client pairs at once on ports port..: the servers with
// `server_env` before the command, the clients with `client_env`, both with `args` (the
// test, size, iterations); GB/s summed over the pairs' overall figures, 0 unless all ran.
double PerftestPairs(const std::string& server_env, const std::string& client_env,
                     const std::string& args, int port, int pairs) {
  // The servers are stopped once the clients are done: one left spinning (its client
  // timed out) would take a CPU from the next measurements.
  std::string servers, clients;
  for (int i = 0; i < pairs; ++i) {
    absl::StrAppend(&servers, server_env, " timeout 60 ucx_perftest ", args, " -p ", port + i,
                    " >/dev/null 2>&1 </dev/null & echo $!; ");
    absl::StrAppend(&clients, client_env, " timeout 60 ucx_perftest 127.0.0.1 ", args, " -p ",
                    port + i, " 2>/dev/null & ");
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
  absl::SleepFor(absl::Milliseconds(500));
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

}  // namespace

double UcxPerftest(uint64_t size, const std::string& tls, int port, const std::string& more_env,
                   int pairs) {
  // 4 GiB a run on shared memory; over TCP 1 GiB, and 256 MiB with UCX's own segment
  // sizes, where put runs at 0.2 GB/s and less from 4 MiB on.
  const bool tcp = tls == "tcp";
  const uint64_t total = !tcp ? (4ull << 30) : more_env.empty() ? (256ull << 20) : (1ull << 30);
  const uint64_t iters = std::clamp<uint64_t>(total / size, tcp ? 2 : 10, 20000);
  const std::string env =
      absl::StrCat(tls == "auto" ? "" : absl::StrCat("UCX_TLS=", tls, " "), more_env);
  return PerftestPairs(env, env, absl::StrCat("-t ucp_put_bw -s ", size, " -n ", iters), port,
                       std::max(pairs, 1));
}

double UcxPerftestCuda(uint64_t size, int port, bool single, int server_device) {
  const std::string server_env =
      server_device == 0 ? "" : absl::StrCat("CUDA_VISIBLE_DEVICES=", server_device, ",0");
  const uint64_t iters = size >= (256ull << 20) ? 40 : 200;
  return PerftestPairs(server_env, "",
                       absl::StrCat("-t ucp_put_bw -m cuda,cuda -s ", size,
                                    single ? " -n 1 -w 3" : absl::StrCat(" -n ", iters)),
                       port, 1);
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
