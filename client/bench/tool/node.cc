// `gpumove-bench node`: host moves between two daemons on this host over UCX (shared
// memory, or `--ucx_tls=tcp`), one at a time ("gpumove single": Submit with wait) and as a
// stream (many per Submit, two Submits in flight), against ucx_perftest's puts of the same
// size on the same transports (and iperf3 over TCP); over shared memory, one thread's
// memcpy going round the stream's footprint beside them ("memcpy cold", no ratio).
#include <unistd.h>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "client/bench/stream.h"
#include "client/bench/tool/baselines.h"
#include "client/bench/tool/bench.h"
#include "daemon/common/bytes.h"

ABSL_FLAG(std::string, ucx_tls, "auto", "node: auto (UCX chooses) or a UCX_TLS value (tcp).");
ABSL_FLAG(gpumove::ByteSize, node_min_size, gpumove::ByteSize{64 << 10}, "node: smallest move.");
ABSL_FLAG(gpumove::ByteSize, node_max_size, gpumove::ByteSize{64ull << 20}, "node: largest move.");

namespace gpumove::bench {
namespace {

absl::Status RunNode(const Context& ctx, Run& run) {
  const std::string tls = absl::GetFlag(FLAGS_ucx_tls);
  const uint64_t min_size = absl::GetFlag(FLAGS_node_min_size).bytes;
  const uint64_t max_size = absl::GetFlag(FLAGS_node_max_size).bytes;
  if (min_size == 0 || min_size > max_size || max_size > (4ull << 30)) {
    return absl::InvalidArgumentError(
        "--node_min_size must be > 0, at most --node_max_size (4 GiB)");
  }
  if (!ctx.addr.empty()) return absl::InvalidArgumentError("node starts its own two daemons");
  run.SetFlag("ucx_tls", tls);
  run.SetFlag("node_min_size", FormatBytes(min_size));
  run.SetFlag("node_max_size", FormatBytes(max_size));
  if (tls != "auto") setenv("UCX_TLS", tls.c_str(), 1);  // Inherited by both daemons.
  const std::string pool = absl::StrCat("--host_pool_size=", 2 * max_size + (64 << 20));
  std::vector<std::unique_ptr<DaemonProcess>> own;
  auto a = ctx.Connect({"--node=bench-a", pool, "--pinned_pool_size=0"}, own, run);
  if (!a.ok()) return a.status();
  auto b =
      ctx.Daemon({"--node=bench-b", pool, "--pinned_pool_size=0", "--peers=" + a->address}, own);
  if (!b.ok()) return b.status();
  auto cb = Client::Connect(*b);
  if (!cb.ok()) return cb.status();
  if (!AwaitPeers(*a->client)) return absl::DeadlineExceededError("bench-b did not join bench-a");
  Client* ca = a->client.get();
  const v1::NodeInfo* info = &a->info;
  int lanes = 1;
  for (const auto& p : info->paths()) {
    if (p.path() == v1::UCX) lanes = LanesOf(p.reason());
  }
  auto src = ca->Allocate(max_size);
  auto dst = (*cb)->Allocate(max_size);
  if (!src.ok() || !dst.ok()) return src.ok() ? dst.status() : src.status();
  v1::BufferRef to = Ref(dst->id());
  to.set_node("bench-b");
  run.AddSeries("gpumove single", false, "GB/s", true);
  run.AddSeries("gpumove stream", false, "GB/s", true);
  run.AddSeries("ucx_perftest put", true, "GB/s", true);
  const bool tcp = tls == "tcp";
  if (tcp) run.AddSeries("iperf3", true, "GB/s", true);
  // Over shared memory: what one thread's memcpy allows going round the stream's
  // footprint (as its moves do; ucx_perftest puts the same bytes every time).
  if (!tcp) run.AddContext("memcpy cold", "GB/s", true);
  StreamOptions so;
  so.duration = absl::Seconds(ctx.seconds);
  int port = 20000 + getpid() % 20000;
  absl::Status failed;
  for (int r = 0; r < ctx.rounds; ++r) {
    for (uint64_t size = min_size; size <= max_size; size *= 4) {
      auto single = [&] {
        const double s = MedianSeconds(
            [&] {
              auto t = ca->Move(Ref(src->id(), 0, size), to);
              if (!t.ok())
                failed = t.status();
              else if (t->state() != v1::SUCCEEDED)
                failed = absl::InternalError(t->error_message());
            },
            ctx.seconds);
        run.Add("gpumove single", size, 1, size / s / 1e9);
        auto stream = StreamThroughput(*ca, Ref(src->id()), to, size, max_size, so);
        if (!stream.ok())
          failed = stream.status();
        else
          run.Add("gpumove stream", size, so.per_submit * so.in_flight, *stream);
      };
      auto baselines = [&] {
        // ucx_perftest keeps many puts in flight: beside the stream; one pair a lane.
        const double pt = UcxPerftest(size, tls, port,
                                      tcp ? "UCX_TCP_TX_SEG_SIZE=512k "
                                            "UCX_TCP_RX_SEG_SIZE=512k"
                                          : "",
                                      tcp ? lanes : 1);
        port += std::max(lanes, 1);
        if (pt > 0) {
          run.Add("ucx_perftest put", size, 1, pt);
          run.Add("ucx_perftest put", size, so.per_submit * so.in_flight, pt);
        }
        if (!tcp) {
          const MemcpyFigures m =
              MeasureMemcpy(size, StreamFootprint(size, max_size, so), so.duration);
          run.Add("memcpy cold", size, so.per_submit * so.in_flight, m.cold);
        }
        if (tcp) {
          const double ip = Iperf3(port++);
          if (ip > 0) run.Add("iperf3", size, 1, ip);
        }
      };
      if (r % 2 == 0)
        single(), baselines();
      else
        baselines(), single();
      if (!failed.ok()) return failed;
      if (size > max_size / 4) break;
    }
  }
  return absl::OkStatus();
}

}  // namespace

Subcommand NodeSubcommand() {
  return {"node", "host moves between two daemons over UCX against ucx_perftest's puts", RunNode};
}

}  // namespace gpumove::bench
