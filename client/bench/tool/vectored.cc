// `gpumove-bench vectored`: one vectored move of shuffled blocks (--vec_shapes, default
// 65536 x 4 KiB and 8192 x 64 KiB) on one path and memory (--vec_case), as the blocks
// sent with each move ("vectored") and as a list prepared once (TransferService.
// PreparePieces, "prepared"), against, in turns in the same run:
//   whole      the same bytes as one contiguous move through gpumove on the same path
//   specs      the first --separate_blocks blocks as separate TransferSpecs (Submits of
//              up to 1024 that wait), the rate of the whole list at that speed
//   gather     local host: a gather memcpy of the same blocks in this process on up to 8
//              threads; device cases: the same-process gather kernel of
//              deploy/gpu/raw_gather.cu (--raw_gather=BIN, built there with nvcc)
// "vectored in daemon" is the transfer's own start -> end (without the Submit of the list);
// "accept" how long a Submit of the whole list (not waiting) takes to be answered.
// Cases: local (host -> host LOCAL), ucx (host, node a -> b), device, pinned_to_device,
// device_to_pinned (LOCAL with GPU memory), ipc (device a -> b, CUDA_IPC), ucx_device
// (device a -> b over UCX: staged, or direct with a CUDA-aware UCX), mpi (path MPI between
// two ranks of an MPI job: --mpi_launch, --mpi_device). GPU cases say SKIPPED where the
// daemon has no GPU. Point sizes are the bytes of the whole move.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/bench/shuffled_blocks.h"
#include "client/bench/stream.h"
#include "client/bench/tool/baselines.h"
#include "client/bench/tool/bench.h"
#include "daemon/common/bytes.h"
#include "tests/util/mpi_job.h"

ABSL_FLAG(std::string, vec_case, "local",
          "vectored: local | ucx | device | pinned_to_device | device_to_pinned | ipc | "
          "ucx_device | mpi.");
ABSL_FLAG(std::vector<std::string>, vec_shapes,
          std::vector<std::string>({"65536x4KiB", "8192x64KiB"}),
          "vectored: COUNTxBLOCK shapes of shuffled blocks, comma-separated.");
ABSL_FLAG(int, separate_blocks, 8192,
          "vectored: blocks moved as separate TransferSpecs for the specs baseline.");
ABSL_FLAG(std::string, raw_gather, "",
          "vectored, device cases: deploy/gpu/raw_gather.cu built with nvcc; its kernel's "
          "median is the gather baseline.");
ABSL_FLAG(std::string, mpi_launch, "default",
          "vectored --vec_case=mpi, mpi, mpi_datatype: a launch of tests/util/mpi_job (ob1_tcp, "
          "ucx, ob1_shm_staged; mpich, mpich_staged with GPUMOVE_MPI=mpich) or default.");
ABSL_FLAG(bool, mpi_device, false,
          "vectored --vec_case=mpi, mpi, mpi_datatype: GPU memory on both ranks.");
ABSL_FLAG(int, dst_device, 0, "vectored device -> device cases: the destination's GPU.");
ABSL_FLAG(bool, trace, false,
          "vectored: at the end, the daemons' log lines on vectored moves (start them with "
          "--daemon_flags=--v=2): where each move's time went.");

namespace gpumove::bench {
namespace {

struct Case {
  std::string name;
  v1::MemoryKind from = v1::HOST, to = v1::HOST;
  bool peer = false;  // The destination is node b (or rank1).
  v1::Path path = v1::PATH_AUTO;
  bool gpu = false;
  std::string kernel;  // raw_gather's direction name, for the gather kernel baseline.
};

absl::StatusOr<Case> CaseNamed(const std::string& name) {
  const int dst = absl::GetFlag(FLAGS_dst_device);
  const std::string dd = dst == 0 ? "device->device" : absl::StrCat("device0->device", dst);
  if (name == "local") return Case{name, v1::HOST, v1::HOST, false, v1::PATH_AUTO, false, ""};
  if (name == "ucx") return Case{name, v1::HOST, v1::HOST, true, v1::UCX, false, ""};
  if (name == "device") return Case{name, v1::DEVICE, v1::DEVICE, false, v1::PATH_AUTO, true, dd};
  if (name == "pinned_to_device") {
    return Case{name, v1::PINNED_HOST, v1::DEVICE, false, v1::PATH_AUTO, true, "pinned->device"};
  }
  if (name == "device_to_pinned") {
    return Case{name, v1::DEVICE, v1::PINNED_HOST, false, v1::PATH_AUTO, true, "device->pinned"};
  }
  if (name == "ipc") return Case{name, v1::DEVICE, v1::DEVICE, true, v1::CUDA_IPC, true, dd};
  if (name == "ucx_device") return Case{name, v1::DEVICE, v1::DEVICE, true, v1::UCX, true, ""};
  if (name == "mpi") {
    const bool dev = absl::GetFlag(FLAGS_mpi_device);
    const v1::MemoryKind k = dev ? v1::DEVICE : v1::HOST;
    return Case{name, k, k, true, v1::MPI, dev, ""};
  }
  return absl::InvalidArgumentError(absl::StrCat("no --vec_case ", name));
}

// Seconds the first `n` blocks take as separate specs (Submits of up to 1024 that wait).
absl::StatusOr<double> SeparateSpecs(Client& c, const v1::BufferRef& src, const v1::BufferRef& dst,
                                     const Shape& shape, const std::vector<uint64_t>& si,
                                     const std::vector<uint64_t>& di, v1::Path path, size_t n) {
  const absl::Time t0 = absl::Now();
  for (size_t at = 0; at < n; at += 1024) {
    v1::SubmitRequest req;
    req.set_wait(true);
    for (size_t i = at; i < std::min(n, at + 1024); ++i) {
      v1::TransferSpec* spec = req.add_transfers();
      spec->set_path(path);
      *spec->mutable_source() = src;
      spec->mutable_source()->set_offset(si[i] * shape.block);
      spec->mutable_source()->set_length(shape.block);
      *spec->mutable_destination() = dst;
      spec->mutable_destination()->set_offset(di[i] * shape.block);
    }
    auto r = c.Submit(req);
    if (!r.ok()) return r.status();
    for (const v1::Transfer& t : r->transfers()) {
      if (t.state() != v1::SUCCEEDED) return absl::InternalError(t.error_message());
    }
  }
  return absl::ToDoubleSeconds(absl::Now() - t0);
}

// GB/s of a gather memcpy of the blocks on `threads` threads (median of `seconds`).
double GatherMemcpy(const Shape& shape, const std::vector<uint64_t>& si,
                    const std::vector<uint64_t>& di, int threads, double seconds) {
  const uint64_t bytes = shape.block * shape.count;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  const double s = MedianSeconds(
      [&] {
        std::vector<std::thread> pool;
        for (int t = 0; t < threads; ++t) {
          pool.emplace_back([&, t] {
            const size_t lo = shape.count * t / threads, hi = shape.count * (t + 1) / threads;
            for (size_t i = lo; i < hi; ++i) {
              std::memcpy(dst.data() + di[i] * shape.block, src.data() + si[i] * shape.block,
                          shape.block);
            }
          });
        }
        for (auto& p : pool) p.join();
      },
      seconds);
  return bytes / s / 1e9;
}

// The gather kernel's median GB/s per "direction count block_KiB" from one run of
// raw_gather ("raw_gather device->device 65536 x 4 KiB: 1706.2 GB/s median, ...").
std::map<std::string, double> RawGather(const std::string& binary) {
  std::map<std::string, double> out;
  for (absl::string_view line :
       absl::StrSplit(Capture(absl::StrCat("timeout 120 '", binary, "' 2>/dev/null")), '\n')) {
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    double v = 0;
    if (f.size() >= 8 && f[0] == "raw_gather" && f[3] == "x" && f[5] == "KiB:" &&
        absl::SimpleAtod(f[6], &v)) {
      out[absl::StrCat(f[1], " ", f[2], " ", f[4])] = v;
    }
  }
  return out;
}

// Where the case's buffers live: `a` runs the moves; node b (or rank1) is the peer.
struct Ends {
  Client* a = nullptr;
  std::string peer;  // The destination's node name when the case has one.
};

// One round of every series at `shape`, in turns (the order reversed every other round).
absl::Status Round(const Context& ctx, Run& run, const Case& k, Ends ends, const Shape& shape,
                   int round, const std::map<std::string, double>& kernel) {
  Client& c = *ends.a;
  const uint64_t bytes = shape.block * shape.count;
  std::vector<uint64_t> si, di;
  Shuffle(shape.count, shape.block, &si, &di);
  const int to_device =
      k.from == v1::DEVICE && k.to == v1::DEVICE ? absl::GetFlag(FLAGS_dst_device) : 0;
  auto src = c.Allocate(bytes, k.from, 0);
  if (!src.ok()) return src.status();
  auto dst = c.Allocate(bytes, k.to, to_device, absl::ZeroDuration(), "", ends.peer);
  if (!dst.ok()) return dst.status();
  v1::BufferRef from = Ref(src->id()), to = Ref(dst->id());
  to.set_node(ends.peer);
  MoveOptions o;
  o.path = k.path;
  o.blocks.set_block_size(shape.block);
  for (size_t i = 0; i < shape.count; ++i) {
    o.blocks.add_source_blocks(si[i]);
    o.blocks.add_destination_blocks(di[i]);
  }
  auto kept = c.PreparePieces({}, o.blocks);
  if (!kept.ok()) return kept.status();
  MoveOptions named, whole;
  named.path = whole.path = k.path;
  named.prepared_pieces = kept->id();
  absl::Status failed;
  auto gbps = [bytes](double s) { return s > 0 ? bytes / s / 1e9 : 0; };
  std::vector<std::function<void()>> sides = {
      [&] {
        auto t = TimeMoves(c, from, to, o, ctx.seconds);
        if (!t.ok()) return failed.Update(t.status());
        run.Add("vectored", bytes, 1, gbps(t->wall));
        run.Add("vectored in daemon", bytes, 1, gbps(t->engine));
        // How long a Submit of the whole list takes to be accepted (it does not wait).
        MoveOptions unwaited = o;
        unwaited.wait = false;
        const absl::Time t0 = absl::Now();
        auto a = c.Move(from, to, unwaited);
        if (!a.ok()) return failed.Update(a.status());
        run.Add("accept", bytes, 1, absl::ToDoubleMilliseconds(absl::Now() - t0));
        auto e = c.Wait(a->id());
        if (!e.ok()) return failed.Update(e.status());
        if (e->state() != v1::SUCCEEDED) failed.Update(absl::InternalError(e->error_message()));
      },
      [&] {
        auto t = TimeMoves(c, from, to, named, ctx.seconds);
        if (!t.ok()) return failed.Update(t.status());
        run.Add("prepared", bytes, 1, gbps(t->wall));
      },
      [&] {
        v1::BufferRef all = from;
        all.set_length(bytes);
        auto t = TimeMoves(c, all, to, whole, ctx.seconds);
        if (!t.ok()) return failed.Update(t.status());
        run.Add("whole", bytes, 1, gbps(t->wall));
      },
      [&] {
        const size_t n = std::min<size_t>(shape.count, absl::GetFlag(FLAGS_separate_blocks));
        auto s = SeparateSpecs(c, from, to, shape, si, di, k.path, n);
        if (!s.ok()) return failed.Update(s.status());
        run.Add("specs", bytes, 1, n * shape.block / *s / 1e9);
      },
      [&] {
        if (k.name == "local") {
          const int threads =
              static_cast<int>(std::min(8u, std::max(1u, std::thread::hardware_concurrency())));
          run.Add("gather memcpy", bytes, 1, GatherMemcpy(shape, si, di, threads, ctx.seconds));
        }
        auto it = kernel.find(absl::StrCat(k.kernel, " ", shape.count, " ", shape.block >> 10));
        if (it != kernel.end()) run.Add("gather kernel", bytes, 1, it->second);
      }};
  if (round % 2 == 1) std::reverse(sides.begin(), sides.end());
  for (auto& side : sides) {
    side();
    if (!failed.ok()) break;
  }
  (void)c.ReleasePieces(kept->id());
  (void)c.Release(src->id());
  (void)c.Release(dst->id(), ends.peer);
  return failed;
}

// The two daemons (or ranks) the case runs on; `a` set to the moving side's client.
struct Nodes {
  std::vector<std::unique_ptr<DaemonProcess>> own;
  std::unique_ptr<MpiJob> job;
  std::unique_ptr<Client> client;
  Ends ends;
};

absl::Status StartNodes(const Context& ctx, const Case& k, uint64_t max_bytes, Nodes& n) {
  const uint64_t room = 2 * max_bytes + (64 << 20);
  std::vector<std::string> flags;
  if (k.gpu) {
    flags = {"--host_pool_size=64MiB", absl::StrCat("--device_pool_size=", room),
             absl::StrCat("--pinned_pool_size=", room + (256 << 20))};
    const int dst = absl::GetFlag(FLAGS_dst_device);
    flags.push_back(dst == 0 ? std::string("--gpus=0") : absl::StrCat("--gpus=0,", dst));
  } else {
    flags = {absl::StrCat("--host_pool_size=", room), "--pinned_pool_size=16MiB"};
  }
  if (k.name == "mpi") {
    if (!ctx.addr.empty()) return absl::InvalidArgumentError("--vec_case=mpi starts its own job");
    auto launch = LaunchNamed(absl::GetFlag(FLAGS_mpi_launch));
    if (!launch.ok()) return launch.status();
    flags.push_back("--mpi_chunk=4MiB");
    if (k.gpu) flags.push_back("--noucx");
    for (const std::string& f : ctx.daemon_flags) flags.push_back(f);
    auto job = MpiJob::Start(2, *launch, flags);
    if (!job.ok()) return job.status();
    n.job = *std::move(job);
    n.ends = Ends{&n.job->client(0), "rank1"};
    if (!AwaitPeers(*n.ends.a)) return absl::DeadlineExceededError("rank1 did not join rank0");
    return absl::OkStatus();
  }
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), flags.begin(), flags.end());
    return more;
  };
  auto a = ctx.Daemon(with({"--node=a"}), n.own);
  if (!a.ok()) return a.status();
  auto c = Client::Connect(*a);
  if (!c.ok()) return c.status();
  n.client = *std::move(c);
  n.ends.a = n.client.get();
  if (!k.peer) return absl::OkStatus();
  if (!ctx.addr.empty()) return absl::InvalidArgumentError("this case starts its own two daemons");
  auto b = ctx.Daemon(with({"--node=b", "--peers=" + *a}), n.own);
  if (!b.ok()) return b.status();
  n.ends.peer = "b";
  if (!AwaitPeers(*n.client)) return absl::DeadlineExceededError("b did not join a");
  return absl::OkStatus();
}

absl::Status RunVectored(const Context& ctx, Run& run) {
  auto k = CaseNamed(absl::GetFlag(FLAGS_vec_case));
  if (!k.ok()) return k.status();
  auto shapes = VecShapes();
  if (!shapes.ok()) return shapes.status();
  const int separate = absl::GetFlag(FLAGS_separate_blocks);
  if (separate < 1 || separate > (1 << 22)) {
    return absl::InvalidArgumentError("--separate_blocks must be 1 to 4M");
  }
  run.SetFlag("vec_case", k->name);
  run.SetFlag("vec_shapes", absl::StrJoin(absl::GetFlag(FLAGS_vec_shapes), ","));
  run.SetFlag("separate_blocks", absl::StrCat(separate));
  uint64_t max_bytes = 0;
  for (const Shape& s : *shapes) max_bytes = std::max(max_bytes, s.block * s.count);
  if (k->gpu) {
    auto no_gpu = ProbeGpus(ctx, run);
    if (!no_gpu.ok()) return no_gpu.status();
    if (!no_gpu->empty()) {
      run.Skip(absl::StrCat("--vec_case=", k->name, " needs GPU memory: ", *no_gpu));
      return absl::OkStatus();
    }
  }
  Nodes nodes;
  if (absl::Status st = StartNodes(ctx, *k, max_bytes, nodes); !st.ok()) return st;
  auto info = nodes.ends.a->GetInfo();
  if (!info.ok()) return info.status();
  run.SetDaemon(*info);
  if (k->path == v1::UCX) run.SetFlag("ucx", UcxReason(*info));
  run.AddSeries("vectored", false, "GB/s", true);
  run.AddSeries("prepared", false, "GB/s", true);
  run.AddContext("vectored in daemon", "GB/s", true);
  run.AddContext("accept", "ms", false);
  run.AddSeries("whole", true, "GB/s", true);
  run.AddSeries("specs", true, "GB/s", true);
  if (k->name == "local") run.AddSeries("gather memcpy", true, "GB/s", true);
  const std::string raw_gather = absl::GetFlag(FLAGS_raw_gather);
  const bool kernel = !k->kernel.empty() && !raw_gather.empty();
  if (kernel) run.AddSeries("gather kernel", true, "GB/s", true);
  struct Trace {  // At the end, however the rounds went.
    const Nodes& nodes;
    ~Trace() {
      if (!absl::GetFlag(FLAGS_trace)) return;
      std::vector<std::pair<std::string, std::string>> logs;
      for (size_t i = 0; i < nodes.own.size(); ++i) {
        logs.emplace_back(i == 0 ? "a" : "b", nodes.own[i]->Log());
      }
      if (nodes.job != nullptr) logs.emplace_back("job", nodes.job->Log());
      for (const auto& [name, log] : logs) {
        int lines = 0;
        for (absl::string_view line : absl::StrSplit(log, '\n')) {
          if ((absl::StrContains(line, " pieces") || absl::StrContains(line, "Submit of")) &&
              ++lines <= 400) {
            std::printf("%s| %s\n", name.c_str(), std::string(line).c_str());
          }
        }
      }
    }
  } trace{nodes};
  for (int r = 0; r < ctx.rounds; ++r) {
    const std::map<std::string, double> figures =
        kernel ? RawGather(raw_gather) : std::map<std::string, double>();
    if (kernel && figures.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(raw_gather, " printed no figures"));
    }
    for (const Shape& shape : *shapes) {
      if (absl::Status st = Round(ctx, run, *k, nodes.ends, shape, r, figures); !st.ok()) {
        return st;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<Shape>> VecShapes() {
  std::vector<Shape> shapes;
  for (const std::string& s : absl::GetFlag(FLAGS_vec_shapes)) {
    std::vector<std::string> parts = absl::StrSplit(s, 'x');
    Shape shape{};
    ByteSize block;
    std::string error;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &shape.count) ||
        !AbslParseFlag(parts[1], &block, &error) || shape.count == 0 || shape.count > (1 << 22) ||
        block.bytes == 0 || block.bytes % 16 != 0 || block.bytes > (64ull << 20) ||
        shape.count * block.bytes > (4ull << 30)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--vec_shapes: \"", s,
                       "\" is not COUNTxBLOCK (a block a multiple of 16 bytes, "
                       "at most 4M blocks and 4 GiB)"));
    }
    shape.block = block.bytes;
    shapes.push_back(shape);
  }
  if (shapes.empty()) return absl::InvalidArgumentError("--vec_shapes is empty");
  return shapes;
}

Subcommand VectoredSubcommand() {
  return {"vectored",
          "vectored moves of shuffled blocks against the bytes whole, separate specs and a "
          "gather",
          RunVectored};
}

}  // namespace gpumove::bench
