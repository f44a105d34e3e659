// Staged-path benchmark (GPU machine): two daemons on one host, UCX not CUDA-aware, so
// GPU memory between them goes through pinned bounce buffers. In one run it measures each
// stage alone and the staged moves, and prints the staged figure against the slowest
// stage (the pipeline's ceiling):
//   D2H      LOCAL GPU0 -> pinned inside node A
//   H2D      LOCAL pinned -> GPU inside node B
//   wire     UCX pinned (A) -> pinned (B), no GPU
//   staged   UCX GPU0 (A) -> GPU (B), staged on both sides; and GPU0 (A) -> host (B)
// Figures are the daemons' own start->end times (medians; the stages and the staged moves
// taken in turns), so the RPC of each Submit is not counted.
#include <algorithm>
#include <iostream>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/bench/stream.h"
#include "client/gpumove_client.h"
#include "daemon/common/bytes.h"
#include "tests/util/daemon_process.h"

ABSL_FLAG(gpumove::ByteSize, min_size, gpumove::ByteSize{16ull << 20}, "Smallest move.");
ABSL_FLAG(gpumove::ByteSize, max_size, gpumove::ByteSize{1ull << 30}, "Largest move.");
ABSL_FLAG(int, reps, 9, "Rounds per size (medians are printed).");

namespace gpumove {
namespace {

// One kind of move the benchmark times: `src` to `dst`, submitted to `client`.
struct Kind {
  Client* client;
  v1::BufferRef src;
  v1::BufferRef dst;
};

// Median GB/s of `reps` moves of each kind, taken in turns (one of each kind per round,
// after a round to warm up), so that every figure sees the machine as the others do: on
// the H200 machine a stage measured alone drifted by a quarter between runs.
std::vector<double> MeasureInTurns(const std::vector<Kind>& kinds, uint64_t size, int reps) {
  std::vector<std::vector<double>> s(kinds.size());
  for (int i = 0; i < reps + 1; ++i) {
    for (size_t k = 0; k < kinds.size(); ++k) {
      v1::BufferRef from = kinds[k].src;
      from.set_length(size);
      // Between the two daemons: UCX (AUTO would take CUDA_IPC for GPU to GPU on one host).
      MoveOptions o;
      o.path = from.node().empty() && kinds[k].dst.node().empty() ? v1::PATH_AUTO : v1::UCX;
      auto t = kinds[k].client->Move(from, kinds[k].dst, o);
      if (!t.ok() || t->state() != v1::SUCCEEDED) {
        std::cerr << "move failed: " << t.status() << " "
                  << (t.ok() ? t->error_message() : "") << "\n";
        std::exit(1);
      }
      if (i > 0) s[k].push_back(EngineSeconds(*t));
    }
  }
  std::vector<double> gbps;
  for (const auto& times : s) gbps.push_back(size / Median(times) / 1e9);
  return gbps;
}

// Median wall time, in microseconds, of a 4 KiB staged move (Submit and wait) from `src`
// to `dst`, after 300 ms of such moves (a daemon's first moves run slower).
double Latency4k(Client& c, v1::BufferRef src, const v1::BufferRef& dst) {
  src.set_length(4096);
  MoveOptions o;
  o.path = v1::UCX;
  std::vector<double> us;
  for (const absl::Time warm = absl::Now() + absl::Milliseconds(300); us.size() < 50;) {
    const absl::Time t0 = absl::Now();
    auto t = c.Move(src, dst, o);
    if (!t.ok() || t->state() != v1::SUCCEEDED) {
      std::cerr << "4 KiB move failed: " << t.status() << "\n";
      std::exit(1);
    }
    if (t0 > warm) us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
  }
  return Median(us);
}

// The three stages at once, as a staged move runs them, each a loop of its own moves on
// ranges of its own (so none waits for another): GB/s each kept up. Stages that share
// host memory bandwidth (DMA into pinned memory, the wire's copy between pinned pools,
// DMA out of it) slow each other; the slowest of these is what a pipeline can reach.
struct Busy {
  double d2h = 0, wire = 0, h2d = 0;
  double slowest() const { return std::min({d2h, wire, h2d}); }
};
Busy MeasureBusy(const std::string& a, const std::string& b, const v1::BufferRef& a_dev,
                 const v1::BufferRef& a_pin, const v1::BufferRef& b_pin,
                 const v1::BufferRef& b_dev, uint64_t size) {
  auto at = [size](v1::BufferRef r, uint64_t k) {
    r.set_offset(k * size);
    r.set_length(size);
    return r;
  };
  auto loop = [size](const std::string& address, v1::BufferRef from, v1::BufferRef to,
                     double* gbps) {
    auto c = Client::Connect(address);
    if (!c.ok()) return;
    MoveOptions o;
    o.path = from.node() == to.node() ? v1::PATH_AUTO : v1::UCX;
    const absl::Time start = absl::Now();
    int moves = 0;
    for (; absl::Now() - start < absl::Milliseconds(600); ++moves) {
      auto t = (*c)->Move(from, to, o);
      if (!t.ok() || t->state() != v1::SUCCEEDED) {
        std::cerr << "busy: move failed: " << t.status() << " "
                  << (t.ok() ? t->error_message() : "") << "\n";
        return;
      }
    }
    *gbps = static_cast<double>(moves) * size / absl::ToDoubleSeconds(absl::Now() - start) / 1e9;
  };
  Busy busy;
  // a's GPU into the first half of a's pinned buffer; the wire from its second half into
  // the first half of b's; b's GPU from the second half of b's.
  std::thread d2h(loop, a, at(a_dev, 0), at(a_pin, 0), &busy.d2h);
  std::thread wire(loop, a, at(a_pin, 1), at(b_pin, 0), &busy.wire);
  v1::BufferRef b_pin_here = b_pin;  // Moved by b itself.
  b_pin_here.clear_node();
  std::thread h2d(loop, b, at(b_pin_here, 1), b_dev, &busy.h2d);
  d2h.join();
  wire.join();
  h2d.join();
  return busy;
}

v1::BufferRef On(const std::string& node, const std::string& id) {
  v1::BufferRef r = Ref(id);
  r.set_node(node);
  return r;
}

int Main() {
  const uint64_t max = absl::GetFlag(FLAGS_max_size).bytes;
  const int reps = absl::GetFlag(FLAGS_reps);
  const std::string pools = absl::StrFormat("--device_pool_size=%d", 4 * max + (64 << 20));
  // Pinned: a buffer of the largest move, and the bounce rings of a stream's 16 moves in
  // flight (four 8 MiB slots each), with room to spare.
  const uint64_t rings = 512 << 20;
  const std::string pinned = absl::StrFormat("--pinned_pool_size=%d",
                                             max + std::max(max, rings) + (128 << 20));
  auto a = DaemonProcess::Start({"--node=stage-a", pools, pinned, "--host_pool_size=64MiB"});
  if (!a.ok()) {
    std::cerr << a.status() << "\n";
    return 1;
  }
  auto b = DaemonProcess::Start({"--node=stage-b", pools, pinned,
                                 absl::StrFormat("--host_pool_size=%d", max + (64 << 20)),
                                 "--peers=" + (*a)->address()});
  if (!b.ok()) {
    std::cerr << b.status() << "\n";
    return 1;
  }
  auto ca = *Client::Connect((*a)->address());
  auto cb = *Client::Connect((*b)->address());
  for (int i = 0; i < 200 && ca->ListPeers()->empty(); ++i) absl::SleepFor(absl::Milliseconds(50));
  const auto info = ca->GetInfo();
  const int gpus = info->gpus_size();
  if (gpus == 0) {
    std::cout << "gpu_staged_bench: no GPU here (" << info->gpu_status() << ")\n";
    return 0;
  }
  for (const auto& p : info->paths()) {
    if (p.path() == v1::UCX) std::cout << "UCX path: " << p.reason() << "\n";
  }
  // Device buffers of four times the largest move, so that a stream of it keeps several
  // in flight.
  auto a_dev = ca->Allocate(4 * max, v1::DEVICE, 0);
  auto a_pin = ca->Allocate(max, v1::PINNED_HOST);
  auto b_dev = cb->Allocate(4 * max, v1::DEVICE, gpus - 1);
  auto b_pin = cb->Allocate(max, v1::PINNED_HOST);
  auto b_host = cb->Allocate(max, v1::HOST);
  for (auto* r : {&a_dev, &a_pin, &b_dev, &b_pin, &b_host}) {
    if (!r->ok()) {
      std::cerr << "allocate: " << r->status() << "\n";
      return 1;
    }
  }
  std::cout << absl::StrFormat(
      "GB/s, medians of %d rounds (a move of each kind per round); ratios are staged / slowest "
      "stage\n",
      reps);
  std::cout << "stream = dev->dev moves, 8 per Submit, two Submits in flight (GB/s of wall time);\n"
               "pull = the same dev->dev move run by the destination's node;\n"
               "busy = the slowest of the three stages run at once, each its own loop of moves\n"
               "(up to half the largest size), what they keep up sharing host memory\n";
  std::cout << absl::StrFormat("%10s %8s %8s %8s %10s %10s %8s %8s %8s %8s %8s %10s %9s %9s\n",
                               "size", "D2H", "H2D", "wire", "dev->dev", "dev->host", "pull",
                               "stream", "busy", "d2d/min", "d2h/min", "stream/min", "pull/min",
                               "d2d/busy");
  for (uint64_t size = absl::GetFlag(FLAGS_min_size).bytes; size <= max; size *= 4) {
    const std::vector<double> m = MeasureInTurns(
        {{ca.get(), Ref(a_dev->id()), Ref(a_pin->id())},
         {cb.get(), Ref(b_pin->id()), Ref(b_dev->id())},
         {ca.get(), Ref(a_pin->id()), On("stage-b", b_pin->id())},
         {ca.get(), Ref(a_dev->id()), On("stage-b", b_dev->id())},
         {ca.get(), Ref(a_dev->id()), On("stage-b", b_host->id())},
         {cb.get(), On("stage-a", a_dev->id()), Ref(b_dev->id())}},
        size, reps);
    const double d2h = m[0], h2d = m[1], wire = m[2], d2d = m[3], d2host = m[4], pull = m[5];
    StreamOptions so;
    so.per_submit = 8;
    so.duration = absl::Milliseconds(700);
    so.path = v1::UCX;
    auto stream =
        StreamThroughput(*ca, Ref(a_dev->id()), On("stage-b", b_dev->id()), size, 4 * max, so);
    if (!stream.ok()) {
      std::cerr << "stream: " << stream.status() << "\n";
      return 1;
    }
    const double slowest = std::min({d2h, h2d, wire});
    const double busy =
        2 * size <= max ? MeasureBusy((*a)->address(), (*b)->address(), Ref(a_dev->id()),
                                      Ref(a_pin->id()), On("stage-b", b_pin->id()),
                                      Ref(b_dev->id()), size)
                              .slowest()
                        : 0;
    std::cout << absl::StrFormat(
        "%10s %8.2f %8.2f %8.2f %10.2f %10.2f %8.2f %8.2f %8.2f %8.3f %8.3f %10.3f %9.3f %9.3f\n",
        FormatBytes(size), d2h, h2d, wire, d2d, d2host, pull, *stream, busy, d2d / slowest,
        d2host / std::min(d2h, wire), *stream / slowest, pull / slowest,
        busy > 0 ? d2d / busy : 0.0);
  }
  std::cout << absl::StrFormat(
      "4 KiB staged move latency (Submit + wait, median of 50), dev->dev push %.1f us, "
      "pull %.1f us\n",
      Latency4k(*ca, Ref(a_dev->id()), On("stage-b", b_dev->id())),
      Latency4k(*cb, On("stage-a", a_dev->id()), Ref(b_dev->id())));
  return 0;
}

}  // namespace
}  // namespace gpumove

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return gpumove::Main();
}
