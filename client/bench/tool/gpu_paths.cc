// `gpumove-bench direct` and `gpumove-bench staged`: GPU memory between two daemons on
// this host (GPU 0, or node b on --dst_device), sizes --gpu_min_size ... --gpu_max_size by 4.
//
// direct: device -> device over path UCX handing device pointers to a CUDA-aware UCX, and
//   over CUDA_IPC, one move at a time (Submit and wait; "in daemon": the transfer's own
//   start -> end) and as a stream (--gpu_stream moves per Submit), against ucx_perftest
//   put_bw -m cuda,cuda: puts in flight, and one flushed put (-n 1), a single move's
//   like-for-like figure. SKIPPED where the daemons have no GPU or their UCX is not
//   CUDA-aware (run it under deploy/gpu/cuda_aware_env.sh).
// staged: the same over a UCX that is not CUDA-aware, so device memory goes through pinned
//   bounce buffers: device -> device pushed and pulled, device -> the other node's host
//   memory, and a stream, against each stage alone (D2H: LOCAL GPU -> pinned in a; H2D:
//   LOCAL pinned -> GPU in b; wire: UCX pinned a -> pinned b), whose slowest is the
//   pipeline's ceiling (the baseline); and a 4 KiB staged move's latency pushed and pulled.
//   Figures are the daemons' own times. SKIPPED where
//   there is no GPU or the UCX is CUDA-aware (device memory then goes direct).
#include <unistd.h>

#include <algorithm>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/bench/stream.h"
#include "client/bench/tool/baselines.h"
#include "client/bench/tool/bench.h"
#include "daemon/common/bytes.h"

ABSL_FLAG(gpumove::ByteSize, gpu_min_size, gpumove::ByteSize{1 << 20},
          "direct, staged: smallest move.");
ABSL_FLAG(gpumove::ByteSize, gpu_max_size, gpumove::ByteSize{1ull << 30},
          "direct, staged: largest move.");
ABSL_FLAG(int, gpu_stream, 4, "direct, staged: moves per Submit of the stream series.");
ABSL_DECLARE_FLAG(int, dst_device);  // vectored.cc

namespace gpumove::bench {
namespace {

// Two daemons a and b with GPU memory, b's buffers on --dst_device.
struct GpuPair {
  std::vector<std::unique_ptr<DaemonProcess>> own;
  std::unique_ptr<Client> a, b;
  v1::NodeInfo info;
  uint64_t min_size = 0, max_size = 0;
  int stream = 4;
  int b_device = 0;
};

absl::Status StartPair(const Context& ctx, Run& run, GpuPair& p) {
  p.min_size = absl::GetFlag(FLAGS_gpu_min_size).bytes;
  p.max_size = absl::GetFlag(FLAGS_gpu_max_size).bytes;
  p.stream = absl::GetFlag(FLAGS_gpu_stream);
  p.b_device = absl::GetFlag(FLAGS_dst_device);
  if (p.min_size == 0 || p.min_size > p.max_size || p.max_size > (8ull << 30) || p.stream < 1 ||
      p.stream > 64 || p.b_device < 0 || p.b_device > 64) {
    return absl::InvalidArgumentError(
        "--gpu_min_size must be > 0 and at most --gpu_max_size (8 GiB), --gpu_stream 1 to 64");
  }
  if (!ctx.addr.empty()) return absl::InvalidArgumentError("this subcommand starts two daemons");
  auto no_gpu = ProbeGpus(ctx, run);
  if (!no_gpu.ok()) return no_gpu.status();
  if (!no_gpu->empty()) return run.Skip(*no_gpu), absl::OkStatus();
  run.SetFlag("gpu_min_size", FormatBytes(p.min_size));
  run.SetFlag("gpu_max_size", FormatBytes(p.max_size));
  run.SetFlag("gpu_stream", absl::StrCat(p.stream));
  run.SetFlag("dst_device", absl::StrCat(p.b_device));
  // Device buffers of --gpu_stream times the largest move; pinned: a buffer of the
  // largest move and the bounce rings of the stream's moves, with room to spare.
  const std::vector<std::string> pools = {
      absl::StrCat("--device_pool_size=", p.stream * p.max_size + (64 << 20)),
      absl::StrCat("--pinned_pool_size=", 2 * p.max_size + (640 << 20)),
      absl::StrCat("--host_pool_size=", p.max_size + (64 << 20)), "--heartbeat=200ms"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), pools.begin(), pools.end());
    return more;
  };
  auto a = ctx.Daemon(with({"--node=a", "--gpus=0"}), p.own);
  if (!a.ok()) return a.status();
  auto b =
      ctx.Daemon(with({"--node=b", absl::StrCat("--gpus=", p.b_device), "--peers=" + *a}), p.own);
  if (!b.ok()) return b.status();
  auto ca = Client::Connect(*a);
  auto cb = Client::Connect(*b);
  if (!ca.ok() || !cb.ok()) return ca.ok() ? cb.status() : ca.status();
  p.a = *std::move(ca);
  p.b = *std::move(cb);
  if (!AwaitPeers(*p.a)) return absl::DeadlineExceededError("b did not join a");
  auto info = p.a->GetInfo();
  if (!info.ok()) return info.status();
  p.info = *info;
  run.SetDaemon(p.info);
  run.SetFlag("ucx", UcxReason(p.info));
  return absl::OkStatus();
}

v1::BufferRef On(const std::string& node, const std::string& id, uint64_t length = 0) {
  v1::BufferRef r = Ref(id, 0, length);
  r.set_node(node);
  return r;
}

bool CudaAware(const v1::NodeInfo& info) {
  return absl::StrContains(UcxReason(info), "device memory: direct");
}

absl::Status RunDirect(const Context& ctx, Run& run) {
  GpuPair p;
  if (absl::Status st = StartPair(ctx, run, p); !st.ok() || run.skipped()) return st;
  if (!CudaAware(p.info)) {
    run.Skip(absl::StrCat("the daemons' UCX is not CUDA-aware (", UcxReason(p.info),
                          "): the direct path needs the CUDA-aware UCX (on the GPU machine: "
                          "source deploy/gpu/cuda_aware_env.sh)"));
    return absl::OkStatus();
  }
  auto src = p.a->Allocate(p.stream * p.max_size, v1::DEVICE, 0);
  auto dst =
      p.a->Allocate(p.stream * p.max_size, v1::DEVICE, p.b_device, absl::ZeroDuration(), "", "b");
  if (!src.ok() || !dst.ok()) return src.ok() ? dst.status() : src.status();
  run.AddSeries("UCX direct", false, "GB/s", true);
  run.AddSeries("UCX direct stream", false, "GB/s", true);
  run.AddSeries("CUDA_IPC", false, "GB/s", true);
  run.AddContext("UCX direct in daemon", "GB/s", true);
  run.AddSeries("ucx_perftest put", true, "GB/s", true);
  run.AddSeries("ucx_perftest 1 put", true, "GB/s", true);
  int port = 21000 + getpid() % 20000;
  StreamOptions so;
  so.per_submit = p.stream;
  so.in_flight = 1;
  so.duration = absl::Seconds(ctx.seconds);
  so.path = v1::UCX;
  absl::Status failed;
  for (int r = 0; r < ctx.rounds && failed.ok(); ++r) {
    for (uint64_t size = p.min_size; size <= p.max_size && failed.ok(); size *= 4) {
      auto ours = [&] {
        for (v1::Path path : {v1::UCX, v1::CUDA_IPC}) {
          MoveOptions o;
          o.path = path;
          auto t = TimeMoves(*p.a, Ref(src->id(), 0, size), On("b", dst->id()), o, ctx.seconds);
          if (!t.ok()) return failed.Update(t.status());
          run.Add(path == v1::UCX ? "UCX direct" : "CUDA_IPC", size, 1, size / t->wall / 1e9);
          if (path == v1::UCX) run.Add("UCX direct in daemon", size, 1, size / t->engine / 1e9);
        }
        auto s = StreamThroughput(*p.a, Ref(src->id()), On("b", dst->id()), size,
                                  p.stream * p.max_size, so);
        if (!s.ok()) return failed.Update(s.status());
        run.Add("UCX direct stream", size, 1, *s);
      };
      auto raw = [&] {
        for (bool single : {false, true}) {
          const double v = UcxPerftestCuda(size, port++, single, p.b_device);
          if (v > 0) run.Add(single ? "ucx_perftest 1 put" : "ucx_perftest put", size, 1, v);
        }
      };
      if (r % 2 == 0)
        ours(), raw();
      else
        raw(), ours();
      if (size > p.max_size / 4) break;
    }
  }
  (void)p.a->Release(src->id());
  (void)p.a->Release(dst->id(), "b");
  return failed;
}

// The staged subcommand's buffers: a's GPU and pinned memory, b's GPU, pinned and host.
struct StagedBuffers {
  v1::Buffer a_dev, a_pin, b_dev, b_pin, b_host;
};

// One round at `size`: each kind of move in turns (the daemons' own times), then the stream.
absl::Status StagedRound(const Context& ctx, Run& run, GpuPair& p, const StagedBuffers& s,
                         uint64_t size, int round) {
  struct Kind {
    const char* series;
    Client* client;
    v1::BufferRef src, dst;
  };
  std::vector<Kind> kinds = {
      {"D2H", p.a.get(), Ref(s.a_dev.id(), 0, size), Ref(s.a_pin.id())},
      {"H2D", p.b.get(), Ref(s.b_pin.id(), 0, size), Ref(s.b_dev.id())},
      {"wire", p.a.get(), Ref(s.a_pin.id(), 0, size), On("b", s.b_pin.id())},
      {"staged dev->dev", p.a.get(), Ref(s.a_dev.id(), 0, size), On("b", s.b_dev.id())},
      {"staged dev->host", p.a.get(), Ref(s.a_dev.id(), 0, size), On("b", s.b_host.id())},
      {"staged pull", p.b.get(), On("a", s.a_dev.id(), size), Ref(s.b_dev.id())}};
  if (round % 2 == 1) std::reverse(kinds.begin(), kinds.end());
  std::map<std::string, double> gbps;
  for (const Kind& k : kinds) {
    MoveOptions o;
    o.path = k.src.node().empty() && k.dst.node().empty() ? v1::PATH_AUTO : v1::UCX;
    auto t = TimeMoves(*k.client, k.src, k.dst, o, ctx.seconds);
    if (!t.ok())
      return absl::Status(t.status().code(), absl::StrCat(k.series, ": ", t.status().message()));
    gbps[k.series] = size / t->engine / 1e9;
    run.Add(k.series, size, 1, gbps[k.series]);
  }
  run.Add("slowest stage", size, 1, std::min({gbps["D2H"], gbps["H2D"], gbps["wire"]}));
  StreamOptions so;
  so.per_submit = p.stream;
  so.in_flight = 2;
  so.duration = absl::Seconds(ctx.seconds);
  so.path = v1::UCX;
  auto stream = StreamThroughput(*p.a, Ref(s.a_dev.id()), On("b", s.b_dev.id()), size,
                                 p.stream * p.max_size, so);
  if (!stream.ok()) return stream.status();
  run.Add("staged stream", size, 1, *stream);
  return absl::OkStatus();
}

absl::Status RunStaged(const Context& ctx, Run& run) {
  GpuPair p;
  if (absl::Status st = StartPair(ctx, run, p); !st.ok() || run.skipped()) return st;
  if (CudaAware(p.info)) {
    run.Skip(absl::StrCat("the daemons' UCX is CUDA-aware (", UcxReason(p.info),
                          "): device memory goes direct, measure it with `direct`"));
    return absl::OkStatus();
  }
  StagedBuffers s;
  auto a_dev = p.a->Allocate(p.stream * p.max_size, v1::DEVICE, 0);
  auto a_pin = p.a->Allocate(p.max_size, v1::PINNED_HOST);
  auto b_dev = p.b->Allocate(p.stream * p.max_size, v1::DEVICE, p.b_device);
  auto b_pin = p.b->Allocate(p.max_size, v1::PINNED_HOST);
  auto b_host = p.b->Allocate(p.max_size, v1::HOST);
  for (auto* r : {&a_dev, &a_pin, &b_dev, &b_pin, &b_host}) {
    if (!r->ok()) return r->status();
  }
  s = {*a_dev, *a_pin, *b_dev, *b_pin, *b_host};
  run.AddSeries("staged dev->dev", false, "GB/s", true);
  run.AddSeries("staged pull", false, "GB/s", true);
  run.AddSeries("staged dev->host", false, "GB/s", true);
  run.AddSeries("staged stream", false, "GB/s", true);
  run.AddSeries("slowest stage", true, "GB/s", true);
  for (const char* stage : {"D2H", "H2D", "wire"}) run.AddContext(stage, "GB/s", true);
  run.AddContext("4 KiB push", "us", false);
  run.AddContext("4 KiB pull", "us", false);
  MoveOptions ucx;
  ucx.path = v1::UCX;
  for (int r = 0; r < ctx.rounds; ++r) {
    for (uint64_t size = p.min_size; size <= p.max_size; size *= 4) {
      if (absl::Status st = StagedRound(ctx, run, p, s, size, r); !st.ok()) return st;
      if (size > p.max_size / 4) break;
    }
    // A small staged move's latency (Submit and wait), pushed and pulled.
    auto push =
        TimeMoves(*p.a, Ref(s.a_dev.id(), 0, 4096), On("b", s.b_dev.id()), ucx, ctx.seconds);
    if (!push.ok()) return push.status();
    auto pull = TimeMoves(*p.b, On("a", s.a_dev.id(), 4096), Ref(s.b_dev.id()), ucx, ctx.seconds);
    if (!pull.ok()) return pull.status();
    run.Add("4 KiB push", 4096, 1, push->wall * 1e6);
    run.Add("4 KiB pull", 4096, 1, pull->wall * 1e6);
  }
  return absl::OkStatus();
}

}  // namespace

Subcommand DirectSubcommand() {
  return {"direct",
          "device -> device between two daemons over direct UCX (CUDA-aware) and CUDA_IPC "
          "against ucx_perftest -m cuda,cuda",
          RunDirect};
}

Subcommand StagedSubcommand() {
  return {"staged", "device memory between two daemons over staged UCX against each stage alone",
          RunStaged};
}

}  // namespace gpumove::bench
