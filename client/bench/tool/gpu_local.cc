// `gpumove-bench gpu_local`: moves of GPU memory within one host through the daemon,
// sizes --gpu_min_size ... --gpu_max_size by 4, against cudaMemcpyAsync of the same size
// issued from this process (and synchronized, as the daemon does), in turns:
//   wall        Submit with wait, one move at a time (what a client sees)
//   in daemon   the daemon's own start -> end for the move (context: the copy itself)
//   batch16     16 moves of size/16 into disjoint ranges in one Submit (below 64 KiB, 16
//               moves of the size into the same range), bytes / the Submit's round trip
//   stream      moves of the size, 8 per Submit, two Submits in flight
// --gl_case: device (LOCAL GPU 0 -> GPU --dst_device), pinned_to_device (LOCAL pinned ->
// GPU 0), device_to_pinned (LOCAL GPU 0 -> pinned), both_ways (LOCAL GPU 0 -> GPU
// --dst_device and back in one Submit, against two copies at once on a stream of each GPU;
// --dst_device must not be 0), ipc (CUDA_IPC from daemon a on GPU 0 to daemon b on GPU
// --dst_device, against the same copy in one process with peer access on). SKIPPED where
// the daemon has no GPU or the tool was built without CUDA.
#include <algorithm>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "client/bench/stream.h"
#include "client/bench/tool/bench.h"
#include "daemon/common/bytes.h"

#ifdef GPUMOVE_HAVE_CUDA
#include <cuda_runtime.h>
#endif

ABSL_FLAG(std::string, gl_case, "pinned_to_device",
          "gpu_local: device | pinned_to_device | device_to_pinned | both_ways | ipc.");
ABSL_DECLARE_FLAG(gpumove::ByteSize, gpu_min_size);  // gpu_paths.cc
ABSL_DECLARE_FLAG(gpumove::ByteSize, gpu_max_size);  // gpu_paths.cc
ABSL_DECLARE_FLAG(int, dst_device);                  // vectored.cc

namespace gpumove::bench {
namespace {

#ifdef GPUMOVE_HAVE_CUDA

absl::Status Cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

#define RETURN_IF_CUDA(x)                                                                \
  do {                                                                                   \
    if (absl::Status cuda_status = Cuda((x), #x); !cuda_status.ok()) return cuda_status; \
  } while (0)

// The case's buffers: where each end lives, on the daemon's side and in this process.
struct GlCase {
  std::string name;
  v1::MemoryKind from = v1::DEVICE, to = v1::DEVICE;
  int src_dev = 0, dst_dev = 0;  // -1: pinned host memory.
  v1::Path path = v1::LOCAL;
  bool both = false;
};

absl::StatusOr<GlCase> GlCaseNamed(const std::string& name, int dst) {
  if (name == "device") return GlCase{name, v1::DEVICE, v1::DEVICE, 0, dst};
  if (name == "pinned_to_device") return GlCase{name, v1::PINNED_HOST, v1::DEVICE, -1, 0};
  if (name == "device_to_pinned") return GlCase{name, v1::DEVICE, v1::PINNED_HOST, 0, -1};
  if (name == "both_ways") {
    if (dst == 0) return absl::InvalidArgumentError("--gl_case=both_ways needs --dst_device=1");
    return GlCase{name, v1::DEVICE, v1::DEVICE, 0, dst, v1::LOCAL, true};
  }
  if (name == "ipc") return GlCase{name, v1::DEVICE, v1::DEVICE, 0, dst, v1::CUDA_IPC};
  return absl::InvalidArgumentError(absl::StrCat("no --gl_case ", name));
}

// The raw side: `n` copies at once (one, or both_ways' two), each a cudaMemcpyAsync on a
// stream of the GPU it is issued on, from `src[i]` to `dst[i]`.
class RawCopies {
 public:
  ~RawCopies() {
    for (auto& [dev, p] : allocations_) {
      if (dev < 0) {
        cudaFreeHost(p);
      } else {
        cudaSetDevice(dev);
        cudaFree(p);
      }
    }
    for (auto& [dev, s] : streams_) {
      cudaSetDevice(dev);
      cudaStreamDestroy(s);
    }
  }

  // A copy of up to `bytes` from `src_dev` to `dst_dev` (-1: pinned host).
  absl::Status Add(int src_dev, int dst_dev, uint64_t bytes) {
    Copy c;
    RETURN_IF_CUDA(Alloc(src_dev, bytes, &c.src));
    RETURN_IF_CUDA(Alloc(dst_dev, bytes, &c.dst));
    c.dev = src_dev >= 0 ? src_dev : dst_dev;
    if (src_dev >= 0 && dst_dev >= 0 && src_dev != dst_dev) {
      // Over NVLink as the daemon's copy goes (else the driver stages it through the host).
      RETURN_IF_CUDA(cudaSetDevice(src_dev));
      cudaError_t e = cudaDeviceEnablePeerAccess(dst_dev, 0);
      if (e != cudaErrorPeerAccessAlreadyEnabled) RETURN_IF_CUDA(e);
      cudaGetLastError();
    }
    RETURN_IF_CUDA(cudaSetDevice(c.dev));
    RETURN_IF_CUDA(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking));
    streams_.emplace_back(c.dev, c.stream);
    copies_.push_back(c);
    return absl::OkStatus();
  }

  // Seconds for all the copies of `size` bytes at once, issued and synchronized.
  absl::StatusOr<double> Once(uint64_t size) {
    const absl::Time t0 = absl::Now();
    for (const Copy& c : copies_) {
      RETURN_IF_CUDA(cudaSetDevice(c.dev));
      RETURN_IF_CUDA(cudaMemcpyAsync(c.dst, c.src, size, cudaMemcpyDefault, c.stream));
    }
    for (const Copy& c : copies_) RETURN_IF_CUDA(cudaStreamSynchronize(c.stream));
    return absl::ToDoubleSeconds(absl::Now() - t0);
  }

 private:
  struct Copy {
    void *src = nullptr, *dst = nullptr;
    int dev = 0;
    cudaStream_t stream = nullptr;
  };
  cudaError_t Alloc(int dev, uint64_t bytes, void** p) {
    cudaError_t e = dev < 0 ? cudaHostAlloc(p, bytes, cudaHostAllocPortable)
                            : (cudaSetDevice(dev), cudaMalloc(p, bytes));
    if (e == cudaSuccess) allocations_.emplace_back(dev, *p);
    return e;
  }
  std::vector<Copy> copies_;
  std::vector<std::pair<int, void*>> allocations_;
  std::vector<std::pair<int, cudaStream_t>> streams_;
};

// The daemon side: a (and b for ipc) and the case's buffers.
struct Daemons {
  std::vector<std::unique_ptr<DaemonProcess>> own;
  std::unique_ptr<Client> a;
  v1::BufferRef src, dst;    // dst on node b for ipc.
  v1::BufferRef src2, dst2;  // both_ways: the way back.
};

v1::BufferRef On(const std::string& node, const std::string& id) {
  v1::BufferRef r = Ref(id);
  r.set_node(node);
  return r;
}

absl::Status StartDaemons(const Context& ctx, Run& run, const GlCase& k, uint64_t capacity,
                          Daemons& d) {
  const bool ipc = k.path == v1::CUDA_IPC;
  if (ipc && !ctx.addr.empty()) {
    return absl::InvalidArgumentError("--gl_case=ipc starts its own two daemons");
  }
  std::vector<std::string> flags = {
      absl::StrCat("--device_pool_size=", 2 * capacity + (256 << 20)),
      absl::StrCat(
          "--pinned_pool_size=",
          (k.from == v1::PINNED_HOST || k.to == v1::PINNED_HOST ? capacity : 0) + (64 << 20)),
      "--host_pool_size=64MiB",
      "--copy_threads=4",
      "--heartbeat=200ms",
      "--node=a"};
  if (ipc) flags.push_back("--gpus=0");
  auto a = ctx.Connect(flags, d.own, run);
  if (!a.ok()) return a.status();
  d.a = std::move(a->client);
  std::string node;
  if (ipc) {
    flags.pop_back();
    flags.back() = "--node=b";
    flags.push_back(absl::StrCat("--gpus=", k.dst_dev));
    flags.push_back("--peers=" + a->address);
    auto b = ctx.Daemon(flags, d.own);
    if (!b.ok()) return b.status();
    if (!AwaitPeers(*d.a)) return absl::DeadlineExceededError("b did not join a");
    node = "b";
  }
  auto src = d.a->Allocate(capacity, k.from, std::max(0, k.src_dev));
  if (!src.ok()) return src.status();
  auto dst = d.a->Allocate(capacity, k.to, std::max(0, k.dst_dev), absl::ZeroDuration(), "", node);
  if (!dst.ok()) return dst.status();
  d.src = Ref(src->id());
  d.dst = On(node, dst->id());
  if (k.both) {
    auto src2 = d.a->Allocate(capacity, v1::DEVICE, k.dst_dev);
    if (!src2.ok()) return src2.status();
    auto dst2 = d.a->Allocate(capacity, v1::DEVICE, 0);
    if (!dst2.ok()) return dst2.status();
    d.src2 = Ref(src2->id());
    d.dst2 = Ref(dst2->id());
  }
  return absl::OkStatus();
}

// The Submit of `req` (waiting): its round trip and, over its transfers, the span from the
// first start to the last end, median over `seconds` (at least 3 after one to warm, at
// most 1000).
absl::StatusOr<Timing> TimeSubmits(Client& c, const v1::SubmitRequest& req, double seconds) {
  std::vector<double> wall, engine;
  const absl::Time end = absl::Now() + absl::Seconds(seconds);
  for (int i = 0; i < 1001 && (wall.size() < 3 || absl::Now() < end); ++i) {
    const absl::Time t0 = absl::Now();
    auto r = c.Submit(req);
    if (!r.ok()) return r.status();
    const double w = absl::ToDoubleSeconds(absl::Now() - t0);
    absl::Time first = absl::InfiniteFuture(), last = absl::InfinitePast();
    for (const v1::Transfer& t : r->transfers()) {
      if (t.state() != v1::SUCCEEDED) return absl::InternalError(t.error_message());
      first = std::min(first, absl::FromUnixSeconds(t.start_time().seconds()) +
                                  absl::Nanoseconds(t.start_time().nanos()));
      last = std::max(last, absl::FromUnixSeconds(t.end_time().seconds()) +
                                absl::Nanoseconds(t.end_time().nanos()));
    }
    if (i == 0) continue;  // Warm.
    wall.push_back(w);
    engine.push_back(absl::ToDoubleSeconds(last - first));
  }
  return Timing{Median(wall), Median(engine)};
}

v1::TransferSpec* Spec(v1::SubmitRequest& req, const v1::BufferRef& src, const v1::BufferRef& dst,
                       uint64_t offset, uint64_t size, v1::Path path) {
  v1::TransferSpec* s = req.add_transfers();
  *s->mutable_source() = src;
  s->mutable_source()->set_offset(offset);
  s->mutable_source()->set_length(size);
  *s->mutable_destination() = dst;
  s->mutable_destination()->set_offset(offset);
  s->set_path(path);
  return s;
}

// gpumove's figures at `size`: wall, in daemon, batch16 and stream (both_ways: one Submit
// of the two ways, wall and in daemon).
absl::Status Ours(const Context& ctx, Run& run, const GlCase& k, Daemons& d, uint64_t size,
                  uint64_t capacity) {
  Client& c = *d.a;
  const double bytes = k.both ? 2.0 * size : size;
  if (k.both) {
    v1::SubmitRequest both;
    both.set_wait(true);
    Spec(both, d.src, d.dst, 0, size, v1::LOCAL);
    Spec(both, d.src2, d.dst2, 0, size, v1::LOCAL);
    auto t = TimeSubmits(c, both, ctx.seconds);
    if (!t.ok()) return t.status();
    run.Add("wall", size, 1, bytes / t->wall / 1e9);
    run.Add("in daemon", size, 1, bytes / t->engine / 1e9);
    return absl::OkStatus();
  }
  MoveOptions o;
  o.path = k.path;
  v1::BufferRef from = d.src;
  from.set_length(size);
  auto t = TimeMoves(c, from, d.dst, o, ctx.seconds);
  if (!t.ok()) return t.status();
  run.Add("wall", size, 1, bytes / t->wall / 1e9);
  run.Add("in daemon", size, 1, bytes / t->engine / 1e9);
  // 16 moves of size/16 into disjoint ranges in one Submit; below 64 KiB, 16 moves of
  // `size` into the same range (which then run in order).
  v1::SubmitRequest batch;
  batch.set_wait(true);
  const uint64_t part = size >= 16 * 4096 ? size / 16 : size;
  for (int i = 0; i < 16; ++i) Spec(batch, d.src, d.dst, part == size ? 0 : i * part, part, k.path);
  auto b = TimeSubmits(c, batch, ctx.seconds);
  if (!b.ok()) return b.status();
  run.Add("batch16", size, 1, 16.0 * part / b->wall / 1e9);
  StreamOptions so;
  so.per_submit = 8;
  so.duration = absl::Seconds(ctx.seconds);
  so.path = k.path;
  auto stream = StreamThroughput(c, d.src, d.dst, size, capacity, so);
  if (!stream.ok()) return stream.status();
  run.Add("stream", size, 1, *stream);
  return absl::OkStatus();
}

absl::Status RunGpuLocal(const Context& ctx, Run& run) {
  const uint64_t min_size = absl::GetFlag(FLAGS_gpu_min_size).bytes;
  const uint64_t max_size = absl::GetFlag(FLAGS_gpu_max_size).bytes;
  const int dst = absl::GetFlag(FLAGS_dst_device);
  if (min_size == 0 || min_size > max_size || max_size > (8ull << 30) || dst < 0 || dst > 64) {
    return absl::InvalidArgumentError(
        "--gpu_min_size must be > 0 and at most --gpu_max_size (8 GiB), --dst_device 0 to 64");
  }
  auto k = GlCaseNamed(absl::GetFlag(FLAGS_gl_case), dst);
  if (!k.ok()) return k.status();
  run.SetFlag("gl_case", k->name);
  run.SetFlag("gpu_min_size", FormatBytes(min_size));
  run.SetFlag("gpu_max_size", FormatBytes(max_size));
  run.SetFlag("dst_device", absl::StrCat(dst));
  auto no_gpu = ProbeGpus(ctx, run);
  if (!no_gpu.ok()) return no_gpu.status();
  if (!no_gpu->empty()) return run.Skip(*no_gpu), absl::OkStatus();
  // Device to device: buffers of four times the largest move, so that a stream of the
  // largest moves keeps several in flight.
  const uint64_t capacity =
      k->from == v1::DEVICE && k->to == v1::DEVICE && !k->both ? 4 * max_size : max_size;
  Daemons d;
  if (absl::Status st = StartDaemons(ctx, run, *k, capacity, d); !st.ok()) return st;
  RawCopies raw;
  if (absl::Status st = raw.Add(k->src_dev, k->dst_dev, max_size); !st.ok()) return st;
  if (k->both) {
    if (absl::Status st = raw.Add(k->dst_dev, 0, max_size); !st.ok()) return st;
  }
  run.AddSeries("wall", false, "GB/s", true);
  if (!k->both) {
    run.AddSeries("batch16", false, "GB/s", true);
    run.AddSeries("stream", false, "GB/s", true);
  }
  run.AddContext("in daemon", "GB/s", true);
  const std::string copy = k->both ? "2 cudaMemcpyAsync" : "cudaMemcpyAsync";
  run.AddSeries(copy, true, "GB/s", true);
  // A daemon in use: a fresh channel, daemon threads and CUDA mappings make the first
  // moves slow (4 KiB GPU0 -> GPU1 ran 425 us with one warm-up move).
  MoveOptions o;
  o.path = k->path;
  v1::BufferRef small = d.src;
  small.set_length(4096);
  for (const absl::Time end = absl::Now() + absl::Milliseconds(300); absl::Now() < end;) {
    if (!d.a->Move(small, d.dst, o).ok()) break;
  }
  for (int r = 0; r < ctx.rounds; ++r) {
    for (uint64_t size = min_size; size <= max_size; size *= 4) {
      auto copies = [&]() -> absl::Status {
        std::vector<double> t;
        const absl::Time end = absl::Now() + absl::Seconds(ctx.seconds);
        for (int i = 0; i < 1001 && (t.size() < 3 || absl::Now() < end); ++i) {
          auto s = raw.Once(size);
          if (!s.ok()) return s.status();
          if (i > 0) t.push_back(*s);  // The first warms.
        }
        run.Add(copy, size, 1, (k->both ? 2.0 : 1.0) * size / Median(t) / 1e9);
        return absl::OkStatus();
      };
      for (int side = 0; side < 2; ++side) {
        const bool ours = (side == 0) == (r % 2 == 0);
        absl::Status st = ours ? Ours(ctx, run, *k, d, size, capacity) : copies();
        if (!st.ok()) return st;
      }
      if (size > max_size / 4) break;
    }
  }
  return absl::OkStatus();
}

#else  // No CUDA toolkit at build time.

absl::Status RunGpuLocal(const Context&, Run& run) {
  run.Skip("gpumove-bench was built without the CUDA toolkit: no cudaMemcpyAsync baseline");
  return absl::OkStatus();
}

#endif

}  // namespace

Subcommand GpuLocalSubcommand() {
  return {"gpu_local", "LOCAL and CUDA_IPC moves of GPU memory on one host against cudaMemcpyAsync",
          RunGpuLocal};
}

}  // namespace gpumove::bench
