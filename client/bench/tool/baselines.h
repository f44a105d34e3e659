// Baselines that run as programs beside gpumove on the same link: ucx_perftest's puts
// between two processes on loopback, iperf3 over loopback.
#ifndef GPUMOVE_CLIENT_BENCH_TOOL_BASELINES_H_
#define GPUMOVE_CLIENT_BENCH_TOOL_BASELINES_H_

#include <cstdint>
#include <string>

namespace gpumove::bench {

// Runs a shell command, returns its stdout.
std::string Capture(const std::string& cmd);

// ucx_perftest ucp_put_bw between two processes on loopback; GB/s (overall), 0 if it
// could not run. `pairs` pairs at once on ports port.. (GB/s summed): as many TCP
// connections and threads as the daemons' UCX lanes. `tls`: "auto" or a UCX_TLS value;
// `more_env`: more VAR=value settings for it.
double UcxPerftest(uint64_t size, const std::string& tls, int port, const std::string& more_env,
                   int pairs = 1);

// ucx_perftest ucp_put_bw -m cuda,cuda (GPU memory on both sides, a CUDA-aware UCX) on
// loopback; GB/s, 0 if it could not run. `single`: one flushed put after three to warm
// (-n 1 -w 3), a single move's like-for-like figure; else puts in flight. `server_device`:
// the server's GPU (CUDA_VISIBLE_DEVICES=N,0 for it).
double UcxPerftestCuda(uint64_t size, int port, bool single, int server_device = 0);

// iperf3 over loopback, one stream, 2 s; GB/s (0 if it could not run).
double Iperf3(int port);

// The UCX lanes a daemon's UCX path reason names ("N lanes over the network"), 1 when none.
int LanesOf(const std::string& reason);

}  // namespace gpumove::bench

#endif  // GPUMOVE_CLIENT_BENCH_TOOL_BASELINES_H_
