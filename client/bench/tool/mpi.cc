// `gpumove-bench mpi`: path MPI between two gpumoved ranks of one MPI job on this host,
// one move at a time ("gpumove single": Submit with wait) and as a stream (--mpi_per_submit
// moves per Submit, --mpi_in_flight Submits in flight), sizes --mpi_min_size ...
// --mpi_max_size by 4, against, in turns in the same run, over the same MPI transport
// (--mpi_launch: default, ob1_tcp, ucx, ...):
//   raw MPI       the same messages (--mpi_chunk bytes, four in flight) between two ranks
//                 of a job of this tool (`mpi_raw_rank`), no daemon: MPI_Isend/MPI_Irecv
//                 through the daemon's own MPI thread, from the same bytes every time
//   raw MPI cold  the same going round the stream's footprint, as the stream's moves do
//   NetPIPE       NPopenmpi's ping-pong (bytes / half the round trip), where it is on PATH
// and, beside them without a ratio, one thread's memcpy going round the stream's footprint
// ("memcpy cold", host memory).
// --mpi_device: GPU memory (rank0's GPU 0 to rank1's last GPU), staged through pinned
// buffers when MPI is not CUDA-aware; raw MPI then hands device buffers to a CUDA-aware
// MPI in --mpi_device_chunk messages (none when MPI is not CUDA-aware). Every round starts
// its own job; SKIPPED without a GPU (--mpi_device).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/bench/stream.h"
#include "client/bench/tool/baselines.h"
#include "client/bench/tool/bench.h"
#include "daemon/common/bytes.h"
#include "daemon/gpu/gpu.h"
#include "daemon/path/mpi/mpi_transport.h"
#include "tests/util/mpi_job.h"

ABSL_FLAG(gpumove::ByteSize, mpi_min_size, gpumove::ByteSize{4096}, "mpi: smallest move.");
ABSL_FLAG(gpumove::ByteSize, mpi_max_size, gpumove::ByteSize{256ull << 20}, "mpi: largest move.");
ABSL_FLAG(gpumove::ByteSize, mpi_chunk, gpumove::ByteSize{4 << 20},
          "mpi, mpi_datatype: the ranks' --mpi_chunk, and the raw baselines' message size.");
ABSL_FLAG(gpumove::ByteSize, mpi_device_chunk, gpumove::ByteSize{64 << 20},
          "mpi --mpi_device: the ranks' --mpi_device_chunk, and raw MPI's message size.");
ABSL_FLAG(int, mpi_per_submit, 16, "mpi: moves per Submit of the stream.");
ABSL_FLAG(int, mpi_in_flight, 2, "mpi: Submits of the stream in flight at once.");
ABSL_FLAG(bool, netpipe, true, "mpi: run NetPIPE (NPopenmpi) beside, where it is on PATH.");
ABSL_DECLARE_FLAG(std::string, mpi_launch);  // vectored.cc
ABSL_DECLARE_FLAG(bool, mpi_device);         // vectored.cc

namespace gpumove::bench {
namespace {

struct MpiSizes {
  uint64_t min = 0, max = 0, chunk = 0, device_chunk = 0;
  bool device = false;
  StreamOptions stream;
};

absl::StatusOr<MpiSizes> Sizes(double seconds) {
  MpiSizes s;
  s.min = absl::GetFlag(FLAGS_mpi_min_size).bytes;
  s.max = absl::GetFlag(FLAGS_mpi_max_size).bytes;
  s.chunk = absl::GetFlag(FLAGS_mpi_chunk).bytes;
  s.device_chunk = absl::GetFlag(FLAGS_mpi_device_chunk).bytes;
  s.device = absl::GetFlag(FLAGS_mpi_device);
  s.stream.duration = absl::Seconds(seconds);
  s.stream.path = v1::MPI;
  s.stream.per_submit = absl::GetFlag(FLAGS_mpi_per_submit);
  s.stream.in_flight = absl::GetFlag(FLAGS_mpi_in_flight);
  if (s.min == 0 || s.min > s.max || s.max > (4ull << 30) || s.chunk == 0 ||
      s.chunk > (1ull << 30) || s.device_chunk == 0 || s.device_chunk > (1ull << 30) ||
      s.stream.per_submit < 1 || s.stream.per_submit > 1024 || s.stream.in_flight < 1 ||
      s.stream.in_flight > 64) {
    return absl::InvalidArgumentError(
        "--mpi_min_size must be > 0 and at most --mpi_max_size (4 GiB), --mpi_chunk and "
        "--mpi_device_chunk 1 B to 1 GiB, --mpi_per_submit 1 to 1024, --mpi_in_flight 1 to 64");
  }
  return s;
}

std::vector<uint64_t> SizeList(const MpiSizes& s) {
  std::vector<uint64_t> v;
  for (uint64_t size = s.min; size <= s.max; size *= 4) {
    v.push_back(size);
    if (size > s.max / 4) break;
  }
  return v;
}

// A rank of the raw baseline: the same messages (chunk bytes, four in flight) between two
// ranks with MPI_Isend/MPI_Irecv through the daemon's own MPI thread, no daemon around it,
// from and into the same bytes every time (hot, as NetPIPE) and going round the stream's
// footprint (cold, as the stream's moves do). Rank 0 prints "size hot cold" lines, GB/s.
int RawRank() {
  auto sizes = Sizes(0.5);
  if (!sizes.ok()) return std::fprintf(stderr, "%s\n", sizes.status().ToString().c_str()), 2;
  const MpiSizes& s = *sizes;
  auto mpi = MpiTransport::Start({});
  if (!mpi.ok()) return std::fprintf(stderr, "%s\n", mpi.status().ToString().c_str()), 1;
  std::string host(s.device ? 0 : s.max, 'x');
  char* buffer = host.data();
  const int rank = (*mpi)->world().rank;
  uint64_t chunk = s.chunk;
  // --mpi_device: device buffers handed to a CUDA-aware MPI (as osu_bw -d cuda D D does);
  // nothing to compare with when MPI is not CUDA-aware.
  std::unique_ptr<GpuRuntime> gpu;
  if (s.device) {
    if (!(*mpi)->world().cuda_aware) return 0;
    gpu = GpuRuntime::Create();
    const int gpus = static_cast<int>(gpu->devices().size());
    if (gpus == 0) return 0;
    auto d = gpu->DeviceAlloc(rank == 0 ? 0 : gpus - 1, s.max);
    if (!d.ok()) return std::fprintf(stderr, "%s\n", d.status().ToString().c_str()), 1;
    buffer = static_cast<char*>(*d);
    chunk = std::max(chunk, s.device_chunk);
  }
  // One message of `size` bytes at `base`, timed from both ranks' start to the receiver's
  // completion; nullopt when MPI failed.
  auto once = [&](uint64_t base, uint64_t size) -> std::optional<double> {
    (void)(*mpi)->Allgather("");  // Both ranks start together.
    const absl::Time t0 = absl::Now();
    std::deque<std::shared_ptr<MpiTransport::Op>> window;
    for (uint64_t off = 0; off < size || !window.empty();) {
      while (off < size && window.size() < 4) {
        const uint64_t n = std::min(chunk, size - off);
        char* at = buffer + base + off;
        window.push_back(rank == 0 ? (*mpi)->Isend(at, n, 1, 7) : (*mpi)->Irecv(at, n, 0, 7));
        off += n;
      }
      if (!(*mpi)->Wait(window.front()).ok()) return std::nullopt;
      window.pop_front();
    }
    // The receiver's completion is the end: it tells rank 0 with a zero-byte message.
    if (rank == 1) {
      (void)(*mpi)->Wait((*mpi)->Isend(nullptr, 0, 0, 8));
    } else {
      (void)(*mpi)->Wait((*mpi)->Irecv(nullptr, 0, 1, 8));
    }
    return absl::ToDoubleSeconds(absl::Now() - t0);
  };
  for (uint64_t size : SizeList(s)) {
    const int reps = static_cast<int>(std::clamp<uint64_t>((1ull << 30) / size, 5, 50));
    const uint64_t footprint = std::min(s.max, StreamFootprint(size, s.max, s.stream));
    std::vector<double> hot, cold;
    for (int r = 0; r < reps; ++r) {
      auto h = once(0, size);
      auto c = once((r % (footprint / size)) * size, size);
      if (!h.has_value() || !c.has_value()) return 1;
      hot.push_back(*h);
      cold.push_back(*c);
    }
    if (rank == 0) {
      std::printf("%llu %.9g %.9g\n", static_cast<unsigned long long>(size),
                  size / Median(hot) / 1e9, size / Median(cold) / 1e9);
      std::fflush(stdout);
    }
  }
  return 0;
}

// The flags a rank of this tool gets for the sizes (its own are global, not inherited).
std::vector<std::string> RankFlags(const MpiSizes& s) {
  std::vector<std::string> f = {absl::StrCat("--mpi_min_size=", s.min),
                                absl::StrCat("--mpi_max_size=", s.max),
                                absl::StrCat("--mpi_chunk=", s.chunk),
                                absl::StrCat("--mpi_device_chunk=", s.device_chunk),
                                absl::StrCat("--mpi_per_submit=", s.stream.per_submit),
                                absl::StrCat("--mpi_in_flight=", s.stream.in_flight)};
  if (s.device) f.push_back("--mpi_device");
  return f;
}

// Runs RawRank as a two-rank job: bytes -> GB/s, hot and cold (empty maps where it printed
// nothing: not CUDA-aware with --mpi_device).
struct RawFigures {
  std::map<uint64_t, double> hot, cold;
};
absl::StatusOr<RawFigures> RawMpi(const MpiLaunch& launch, const MpiSizes& s) {
  auto cmd = RankJobCommand(launch, "mpi_raw_rank", RankFlags(s));
  if (!cmd.ok()) return cmd.status();
  RawFigures f;
  FILE* p = popen(absl::StrCat("timeout 600 ", *cmd, " 2>/dev/null").c_str(), "r");
  if (p == nullptr) return absl::InternalError("cannot start the raw MPI job");
  unsigned long long size = 0;
  double hot = 0, cold = 0;
  while (std::fscanf(p, "%llu %lf %lf", &size, &hot, &cold) == 3) {
    f.hot[size] = hot;
    f.cold[size] = cold;
  }
  if (pclose(p) != 0) return absl::InternalError(absl::StrCat("the raw MPI job failed: ", *cmd));
  return f;
}

// NetPIPE over [min, max]: bytes -> GB/s for the exact sizes it measures.
std::map<uint64_t, double> NetPipe(const MpiLaunch& launch, const MpiSizes& s) {
  char out[] = "/tmp/gpumove-netpipe.XXXXXX";
  const int fd = mkstemp(out);
  std::map<uint64_t, double> bw;
  if (fd < 0) return bw;
  close(fd);
  std::vector<std::string> cmd = MpiLauncher(2);
  cmd.insert(cmd.end(), launch.mpi_args.begin(), launch.mpi_args.end());
  for (std::string a : {std::string("NPopenmpi"), absl::StrCat("-l ", s.min),
                        absl::StrCat("-u ", s.max), absl::StrCat("-o ", out)}) {
    cmd.push_back(a);
  }
  const std::string line =
      absl::StrCat("timeout 600 ", absl::StrJoin(cmd, " "), " >/dev/null 2>&1");
  if (std::system(line.c_str()) == 0) {
    std::ifstream in(out);
    double bytes = 0, mbps = 0, seconds = 0;
    // Its third column is the one-way time (half a round trip); its Mbps column counts
    // 2^20 bits and overflows at 256 MiB, so the rate is worked out here.
    for (int i = 0; i < 100000 && in >> bytes >> mbps >> seconds; ++i) {
      if (seconds > 0) bw[static_cast<uint64_t>(bytes)] = bytes / seconds / 1e9;
    }
  } else {
    std::cerr << "NetPIPE failed: " << line << "\n";
  }
  std::remove(out);
  return bw;
}

// One round of gpumove figures: a two-rank job moving each size single and streamed;
// the job stops before the baselines run. Skips `run` where --mpi_device finds no GPU.
absl::Status GpumoveRound(const Context& ctx, Run& run, const MpiLaunch& launch,
                          const MpiSizes& s) {
  std::vector<std::string> flags = {absl::StrCat("--host_pool_size=", 2 * s.max + (64 << 20)),
                                    absl::StrCat("--mpi_chunk=", s.chunk), "--heartbeat=500ms",
                                    "--peer_timeout=5s"};
  if (s.device) {
    flags.push_back(absl::StrCat("--device_pool_size=", s.max + (64 << 20)));
    flags.push_back(absl::StrCat("--mpi_device_chunk=", s.device_chunk));
    flags.push_back("--pinned_pool_size=256MiB");
  }
  for (const std::string& f : ctx.daemon_flags) flags.push_back(f);
  auto job = MpiJob::Start(2, launch, flags);
  if (!job.ok()) return job.status();
  Client& c0 = (*job)->client(0);
  Client& c1 = (*job)->client(1);
  if (!AwaitPeers(c0)) return absl::DeadlineExceededError("rank1 did not join rank0");
  auto info = c1.GetInfo();
  if (!info.ok()) return info.status();
  run.SetDaemon(*info);
  const int gpus = info->gpus_size();
  if (s.device && gpus == 0)
    return run.Skip("--mpi_device: " + NoGpuReason(*info)), absl::OkStatus();
  auto src = s.device ? c0.Allocate(s.max, v1::DEVICE, 0) : c0.Allocate(s.max);
  if (!src.ok()) return src.status();
  auto dst = s.device ? c1.Allocate(s.max, v1::DEVICE, gpus - 1) : c1.Allocate(s.max);
  if (!dst.ok()) return dst.status();
  std::string fill(s.max, '\0');
  for (uint64_t i = 0; i < s.max; i += 4096) fill[i] = static_cast<char>(i / 4096);
  (void)c0.Write(Ref(src->id()), fill);  // Best effort: the moves measure alike.
  v1::BufferRef to = Ref(dst->id());
  to.set_node("rank1");
  MoveOptions o;
  o.path = v1::MPI;
  const uint32_t in_stream = s.stream.per_submit * s.stream.in_flight;
  for (uint64_t size : SizeList(s)) {
    auto t = TimeMoves(c0, Ref(src->id(), 0, size), to, o, ctx.seconds);
    if (!t.ok()) return t.status();
    run.Add("gpumove single", size, 1, size / t->wall / 1e9);
    auto stream = StreamThroughput(c0, Ref(src->id()), to, size, s.max, s.stream);
    if (!stream.ok()) return stream.status();
    run.Add("gpumove stream", size, in_stream, *stream);
  }
  return absl::OkStatus();
}

absl::Status RunMpi(const Context& ctx, Run& run) {
  auto sizes = Sizes(ctx.seconds);
  if (!sizes.ok()) return sizes.status();
  const MpiSizes& s = *sizes;
  if (!ctx.addr.empty()) return absl::InvalidArgumentError("mpi starts its own MPI jobs");
  auto launch = LaunchNamed(absl::GetFlag(FLAGS_mpi_launch));
  if (!launch.ok()) return launch.status();
  const bool netpipe =
      absl::GetFlag(FLAGS_netpipe) && !HydraLauncher() && !Capture("command -v NPopenmpi").empty();
  run.SetFlag("mpi_launch", launch->name);
  run.SetFlag("mpi_flavor", MpiFlavor());
  run.SetFlag("mpi_min_size", FormatBytes(s.min));
  run.SetFlag("mpi_max_size", FormatBytes(s.max));
  run.SetFlag("mpi_chunk", FormatBytes(s.chunk));
  run.SetFlag("mpi_device", s.device ? "true" : "false");
  if (s.device) run.SetFlag("mpi_device_chunk", FormatBytes(s.device_chunk));
  run.SetFlag("mpi_per_submit", absl::StrCat(s.stream.per_submit));
  run.SetFlag("mpi_in_flight", absl::StrCat(s.stream.in_flight));
  run.SetFlag("netpipe", netpipe ? "true" : "false");
  run.AddSeries("gpumove single", false, "GB/s", true);
  run.AddSeries("gpumove stream", false, "GB/s", true);
  run.AddSeries("raw MPI", true, "GB/s", true);
  run.AddSeries("raw MPI cold", true, "GB/s", true);
  if (netpipe) run.AddSeries("NetPIPE", true, "GB/s", true);
  // Host memory: what one thread's memcpy allows going round the stream's footprint (raw
  // MPI and NetPIPE send the same bytes every time).
  if (!s.device) run.AddContext("memcpy cold", "GB/s", true);
  // The baselines stand beside both the single moves and the stream.
  const uint32_t in_stream = s.stream.per_submit * s.stream.in_flight;
  auto beside = [&](const char* series, const std::map<uint64_t, double>& figures) {
    for (uint64_t size : SizeList(s)) {
      auto it = figures.find(size);
      if (it == figures.end() || it->second <= 0) continue;
      run.Add(series, size, 1, it->second);
      run.Add(series, size, in_stream, it->second);
    }
  };
  for (int r = 0; r < ctx.rounds; ++r) {
    auto baselines = [&]() -> absl::Status {
      auto raw = RawMpi(*launch, s);
      if (!raw.ok()) return raw.status();
      beside("raw MPI", raw->hot);
      beside("raw MPI cold", raw->cold);
      if (netpipe) beside("NetPIPE", NetPipe(*launch, s));
      for (uint64_t size : SizeList(s)) {
        if (s.device) break;
        const MemcpyFigures m =
            MeasureMemcpy(size, StreamFootprint(size, s.max, s.stream), s.stream.duration);
        run.Add("memcpy cold", size, in_stream, m.cold);
      }
      return absl::OkStatus();
    };
    if (r % 2 == 1) {
      if (absl::Status st = baselines(); !st.ok()) return st;
    }
    if (absl::Status st = GpumoveRound(ctx, run, *launch, s); !st.ok() || run.skipped()) {
      return st;
    }
    if (r % 2 == 0) {
      if (absl::Status st = baselines(); !st.ok()) return st;
    }
  }
  return absl::OkStatus();
}

}  // namespace

Subcommand MpiSubcommand() {
  return {"mpi", "path MPI between two ranks of an MPI job against raw MPI and NetPIPE", RunMpi};
}

RankChild MpiRawRank() { return {"mpi_raw_rank", RawRank}; }

}  // namespace gpumove::bench
