// Path MPI throughput between two gpumoved ranks of one MPI job on this host, next to
// NetPIPE (NPopenmpi, MPI ping-pong) over the same MPI transport in the same run.
//
//   bazel run -c opt //client/bench:mpi_bench -- [--mca=default|ob1_tcp|ucx]
//
// "single": one move at a time (Submit with wait: the client's whole round trip).
// "stream": 16 moves per Submit, two Submits in flight (what a pipeline sees; flags change it).
// NetPIPE's figure is bytes / half the ping-pong time, the same buffer every time.
#include <unistd.h>

#include <cstdio>
#include <deque>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/bench/stream.h"
#include "client/gpumove_client.h"
#include "daemon/common/bytes.h"
#include "daemon/gpu/gpu.h"
#include "daemon/path/mpi/mpi_transport.h"
#include "tests/util/mpi_job.h"

ABSL_FLAG(std::string, mca, "default",
          "Open MPI transport for both: default (ob1 with shared memory), ob1_tcp, or ucx.");
ABSL_FLAG(gpumove::ByteSize, min_size, gpumove::ByteSize{4096}, "Smallest move.");
ABSL_FLAG(gpumove::ByteSize, max_size, gpumove::ByteSize{256ull << 20}, "Largest move.");
ABSL_FLAG(gpumove::ByteSize, chunk, gpumove::ByteSize{4 << 20}, "--mpi_chunk of the ranks.");
ABSL_FLAG(double, seconds_per_size, 0.5, "Time spent on each gpumove figure per size.");
ABSL_FLAG(bool, baselines, true, "Run NetPIPE alongside.");
ABSL_FLAG(int, per_submit, 16, "Stream: moves per Submit.");
ABSL_FLAG(int, in_flight, 2, "Stream: Submits in flight at once.");
ABSL_FLAG(int, rounds, 1,
          "Rounds, gpumove and the baselines taking turns; the figures are medians over them "
          "(the machine's speed drifts between runs).");
ABSL_FLAG(std::vector<std::string>, daemon_flags, {}, "More flags for every rank.");
ABSL_FLAG(bool, raw_child, false,
          "Internal: run as a rank of the raw-MPI baseline (started by this benchmark).");
ABSL_FLAG(gpumove::ByteSize, device_chunk, gpumove::ByteSize{64 << 20},
          "--device: --mpi_device_chunk of the ranks, and the raw baseline's message size.");
ABSL_FLAG(bool, device, false,
          "Move GPU buffers (rank0's GPU0 to rank1's last GPU): staged through pinned "
          "buffers on both sides when MPI is not CUDA-aware.");

namespace gpumove {
namespace {

std::vector<std::string> McaArgs(const std::string& mca) {
  if (mca == "ob1_tcp") return {"--mca", "pml", "ob1", "--mca", "btl", "self,tcp"};
  if (mca == "ucx") {
    return {"--mca", "pml", "ucx", "--mca", "pml_ucx_tls", "any", "--mca", "pml_ucx_devices",
            "any"};
  }
  return {};
}

// NetPIPE over [min, max]: bytes -> GB/s for the exact powers of two it measures.
std::map<uint64_t, double> NetPipe(const std::vector<std::string>& mca, uint64_t min,
                                   uint64_t max) {
  const std::string out = "/tmp/gpumove-netpipe.out";
  std::remove(out.c_str());
  std::vector<std::string> cmd = MpiLauncher(2);
  cmd.insert(cmd.end(), mca.begin(), mca.end());
  for (std::string a : {std::string("NPopenmpi"), absl::StrCat("-l ", min),
                        absl::StrCat("-u ", max), "-o " + out}) {
    cmd.push_back(a);
  }
  const std::string line = absl::StrCat(absl::StrJoin(cmd, " "), " > /dev/null 2>&1");
  std::map<uint64_t, double> bw;
  if (std::system(line.c_str()) != 0) {
    std::cerr << "NetPIPE failed: " << line << "\n";
    return bw;
  }
  std::ifstream in(out);
  double bytes = 0, mbps = 0, seconds = 0;
  // Its third column is the one-way time (half a round trip); its Mbps column counts
  // 2^20 bits and overflows at 256 MiB, so the rate is worked out here.
  while (in >> bytes >> mbps >> seconds) {
    if (seconds > 0) bw[static_cast<uint64_t>(bytes)] = bytes / seconds / 1e9;
  }
  return bw;
}

// The stream's shape: up to --per_submit moves per Submit, --in_flight Submits at once,
// --seconds_per_size long, on path MPI.
StreamOptions MpiStream() {
  StreamOptions so;
  so.duration = absl::Seconds(absl::GetFlag(FLAGS_seconds_per_size));
  so.path = v1::MPI;
  so.per_submit = absl::GetFlag(FLAGS_per_submit);
  so.in_flight = absl::GetFlag(FLAGS_in_flight);
  return so;
}

// The host transport alone: the same messages (chunk bytes, four in flight) between two
// ranks with MPI_Isend/MPI_Irecv through the daemon's own MPI thread, no daemon around
// it, from and into the same bytes every time (hot, as NetPIPE) and going round the
// stream's footprint (cold, as the stream's moves do). Rank 0 prints "size hot cold"
// lines, GB/s.
int RawChild() {
  auto mpi = MpiTransport::Start({});
  if (!mpi.ok()) {
    std::cerr << mpi.status() << "\n";
    return 1;
  }
  const uint64_t min_size = absl::GetFlag(FLAGS_min_size).bytes;
  const uint64_t max_size = absl::GetFlag(FLAGS_max_size).bytes;
  uint64_t chunk = absl::GetFlag(FLAGS_chunk).bytes;
  std::string host(absl::GetFlag(FLAGS_device) ? 0 : max_size, 'x');
  char* buffer = host.data();
  const int rank = (*mpi)->world().rank;
  // --device: device buffers handed to a CUDA-aware MPI (as osu_bw -d cuda D D does), in
  // messages of --device_chunk (the daemons' --mpi_device_chunk); nothing to compare with
  // when MPI is not CUDA-aware.
  std::unique_ptr<GpuRuntime> gpu;
  if (absl::GetFlag(FLAGS_device)) {
    if (!(*mpi)->world().cuda_aware) return 0;
    gpu = GpuRuntime::Create();
    const int gpus = static_cast<int>(gpu->devices().size());
    if (gpus == 0) return 0;
    auto d = gpu->DeviceAlloc(rank == 0 ? 0 : gpus - 1, max_size);
    if (!d.ok()) {
      std::cerr << d.status() << "\n";
      return 1;
    }
    buffer = static_cast<char*>(*d);
    chunk = std::max(chunk, absl::GetFlag(FLAGS_device_chunk).bytes);
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
  for (uint64_t size = min_size; size <= max_size; size *= 4) {
    const int reps = static_cast<int>(std::clamp<uint64_t>((1ull << 30) / size, 5, 50));
    const uint64_t footprint =
        std::min(max_size, StreamFootprint(size, max_size, MpiStream()));
    std::vector<double> hot, cold;
    for (int r = 0; r < reps; ++r) {
      auto h = once(0, size);
      auto c = once((r % (footprint / size)) * size, size);
      if (!h.has_value() || !c.has_value()) return 1;
      hot.push_back(*h);
      cold.push_back(*c);
    }
    if (rank == 0) {
      std::cout << size << " " << size / Median(hot) / 1e9 << " " << size / Median(cold) / 1e9
                << std::endl;
    }
  }
  return 0;
}

// Runs RawChild as a two-rank job: bytes -> GB/s, hot and cold.
struct RawFigures {
  std::map<uint64_t, double> hot, cold;
};
RawFigures RawMpi(const std::vector<std::string>& mca) {
  std::vector<std::string> cmd = MpiLauncher(2);
  cmd.insert(cmd.end(), mca.begin(), mca.end());
  char self[4096] = {};
  RawFigures f;
  if (readlink("/proc/self/exe", self, sizeof(self) - 1) <= 0) return f;
  cmd.push_back(self);
  cmd.push_back("--raw_child");
  cmd.push_back(absl::StrCat("--min_size=", absl::GetFlag(FLAGS_min_size).bytes));
  cmd.push_back(absl::StrCat("--max_size=", absl::GetFlag(FLAGS_max_size).bytes));
  cmd.push_back(absl::StrCat("--chunk=", absl::GetFlag(FLAGS_chunk).bytes));
  if (absl::GetFlag(FLAGS_device)) {
    cmd.push_back("--device");
    cmd.push_back(absl::StrCat("--device_chunk=", absl::GetFlag(FLAGS_device_chunk).bytes));
  }
  cmd.push_back(absl::StrCat("--per_submit=", absl::GetFlag(FLAGS_per_submit)));
  cmd.push_back(absl::StrCat("--in_flight=", absl::GetFlag(FLAGS_in_flight)));
  FILE* p = popen(absl::StrCat(absl::StrJoin(cmd, " "), " 2>/dev/null").c_str(), "r");
  if (p == nullptr) return f;
  unsigned long long size = 0;
  double hot = 0, cold = 0;
  while (std::fscanf(p, "%llu %lf %lf", &size, &hot, &cold) == 3) {
    f.hot[size] = hot;
    f.cold[size] = cold;
  }
  pclose(p);
  return f;
}

// One round of gpumove figures: a two-rank job moving each size single and streamed.
struct Figures {
  int gpus = 0;
  std::map<uint64_t, double> single, stream;  // size -> GB/s
};

absl::StatusOr<Figures> GpumoveRound(const std::string& mca) {
  const uint64_t min_size = absl::GetFlag(FLAGS_min_size).bytes;
  const uint64_t max_size = absl::GetFlag(FLAGS_max_size).bytes;
  const double budget = absl::GetFlag(FLAGS_seconds_per_size);
  MpiLaunch launch{mca, McaArgs(mca), {}};
  std::vector<std::string> flags = {
      absl::StrCat("--host_pool_size=", 2 * max_size + (64 << 20)),
      absl::StrCat("--mpi_chunk=", absl::GetFlag(FLAGS_chunk).bytes),
      "--heartbeat=500ms", "--peer_timeout=5s"};
  const bool device = absl::GetFlag(FLAGS_device);
  if (device) {
    flags.push_back(absl::StrCat("--device_pool_size=", max_size + (64 << 20)));
    flags.push_back(absl::StrCat("--mpi_device_chunk=", absl::GetFlag(FLAGS_device_chunk).bytes));
    flags.push_back("--pinned_pool_size=256MiB");
  }
  for (const std::string& f : absl::GetFlag(FLAGS_daemon_flags)) flags.push_back(f);
  auto job = MpiJob::Start(2, launch, flags);
  if (!job.ok()) return job.status();
  Client& c0 = (*job)->client(0);
  Client& c1 = (*job)->client(1);
  // Wait for the two ranks to meet.
  for (int i = 0; i < 200; ++i) {
    auto peers = c0.ListPeers();
    if (peers.ok() && !peers->empty() && (*peers)[0].up()) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  Figures f;
  f.gpus = device ? c1.GetInfo()->gpus_size() : 0;
  if (device && f.gpus == 0) return absl::FailedPreconditionError("--device: no GPU here");
  auto src = device ? c0.Allocate(max_size, v1::DEVICE, 0) : c0.Allocate(max_size);
  auto dst = device ? c1.Allocate(max_size, v1::DEVICE, f.gpus - 1) : c1.Allocate(max_size);
  if (!src.ok()) return src.status();
  if (!dst.ok()) return dst.status();
  std::string fill(max_size, '\0');
  for (uint64_t i = 0; i < max_size; i += 4096) fill[i] = static_cast<char>(i / 4096);
  (void)c0.Write(Ref(src->id()), fill);
  v1::BufferRef to = Ref(dst->id());
  to.set_node("rank1");
  for (uint64_t size = min_size; size <= max_size; size *= 4) {
    MoveOptions o;
    o.path = v1::MPI;
    std::vector<double> single;
    const absl::Time end = absl::Now() + absl::Seconds(budget);
    while (absl::Now() < end || single.size() < 5) {
      v1::BufferRef d = to;
      d.set_length(size);
      const absl::Time t0 = absl::Now();
      auto t = c0.Move(Ref(src->id(), 0, size), d, o);
      if (!t.ok()) return t.status();
      if (t->state() != v1::SUCCEEDED) return absl::InternalError(t->error_message());
      single.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
    }
    auto stream = StreamThroughput(c0, Ref(src->id()), to, size, max_size, MpiStream());
    if (!stream.ok()) return stream.status();
    f.single[size] = size / Median(single) / 1e9;
    f.stream[size] = *stream;
  }
  return f;  // The job stops here, before the baselines run.
}

// The median over rounds of one size's figure (0 where a round has none).
double MedianAt(const std::vector<std::map<uint64_t, double>>& rounds, uint64_t size) {
  std::vector<double> v;
  for (const auto& r : rounds) v.push_back(r.count(size) ? r.at(size) : 0);
  return Median(v);
}

int Main() {
  if (absl::GetFlag(FLAGS_raw_child)) return RawChild();
  const std::string mca = absl::GetFlag(FLAGS_mca);
  const uint64_t min_size = absl::GetFlag(FLAGS_min_size).bytes;
  const uint64_t max_size = absl::GetFlag(FLAGS_max_size).bytes;
  const int rounds = std::max(1, absl::GetFlag(FLAGS_rounds));
  std::vector<std::map<uint64_t, double>> single, stream, np, raw, raw_cold;
  int gpus = 0;
  for (int round = 0; round < rounds; ++round) {
    auto f = GpumoveRound(mca);
    if (!f.ok()) {
      std::cerr << "gpumove: " << f.status() << "\n";
      return 1;
    }
    gpus = f->gpus;
    single.push_back(f->single);
    stream.push_back(f->stream);
    if (absl::GetFlag(FLAGS_baselines)) np.push_back(NetPipe(McaArgs(mca), min_size, max_size));
    RawFigures r = RawMpi(McaArgs(mca));
    raw.push_back(std::move(r.hot));
    raw_cold.push_back(std::move(r.cold));
  }

  std::cout << "path MPI between two ranks on this host"
            << (absl::GetFlag(FLAGS_device)
                    ? absl::StrCat(", GPU0 -> GPU", gpus - 1, " (staged unless CUDA-aware)")
                    : std::string(", host memory"))
            << " (" << MpiFlavor() << ", mca " << mca
            << ", " << FormatBytes(absl::GetFlag(FLAGS_chunk).bytes)
            << " messages) vs NetPIPE NPopenmpi, GB/s\n";
  if (absl::GetFlag(FLAGS_device)) {
    std::cout << "device buffers: the ranks' --mpi_device_chunk "
              << FormatBytes(absl::GetFlag(FLAGS_device_chunk).bytes)
              << " when MPI is CUDA-aware; raw MPI = device buffers between two ranks of the "
                 "same MPI, no daemon, messages of that size, four in flight (osu_bw -d cuda D D "
                 "alike; none when MPI is not CUDA-aware)\n";
  }
  std::cout << "raw MPI = the same messages between two ranks, no daemon (the "
               "transport alone), from the same bytes every time as NetPIPE; raw cold = going "
               "round the stream's footprint as its moves do; stream: "
            << absl::GetFlag(FLAGS_per_submit) << " moves per Submit, "
            << absl::GetFlag(FLAGS_in_flight) << " Submits in flight; medians of " << rounds
            << " round(s), gpumove and the baselines taking turns\n";
  std::cout << absl::StrFormat("%10s %10s %10s %10s %10s %10s %10s %10s %10s %10s %11s\n",
                               "size", "single", "stream", "NetPIPE", "raw MPI", "raw cold",
                               "single/NP", "stream/NP", "single/raw", "stream/raw",
                               "stream/rawc");
  for (uint64_t size = min_size; size <= max_size; size *= 4) {
    const double one = MedianAt(single, size), many = MedianAt(stream, size);
    const double base = np.empty() ? 0 : MedianAt(np, size);
    const double rw = MedianAt(raw, size), rc = MedianAt(raw_cold, size);
    std::cout << absl::StrFormat(
        "%10s %10.3f %10.3f %10.3f %10.3f %10.3f %10.3g %10.3g %10.3g %10.3g %11.3g\n",
        FormatBytes(size), one, many, base, rw, rc, base > 0 ? one / base : 0,
        base > 0 ? many / base : 0, rw > 0 ? one / rw : 0, rw > 0 ? many / rw : 0,
        rc > 0 ? many / rc : 0);
  }
  if (const double one = MedianAt(single, 4096); one > 0) {
    std::cout << absl::StrFormat("4 KiB single move latency (Submit + wait): %.1f us\n",
                                 4096 / one / 1e3);
  }
  if (absl::GetFlag(FLAGS_device)) return 0;
  // What the memory allows: NetPIPE and raw MPI send the same buffers every time.
  std::vector<std::pair<uint64_t, double>> streams;
  for (uint64_t size = min_size; size <= max_size; size *= 4) {
    streams.emplace_back(size, MedianAt(stream, size));
  }
  PrintMemcpyTable(streams, max_size, MpiStream(), MpiStream().duration,
                   "NetPIPE and raw MPI send");
  return 0;
}

}  // namespace
}  // namespace gpumove

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return gpumove::Main();
}
