// Vectored moves on the host paths against their baselines, in one run: 65536 shuffled
// blocks of 4 KiB and 8192 of 64 KiB (256 MiB and 512 MiB), moved as one vectored
// transfer on LOCAL (host to host) and over UCX (node a to node b), against
//   (a) the same bytes as one contiguous move through gpumove on the same path,
//   (b) LOCAL: a same-process gather memcpy of the same blocks on as many threads,
//   (c) the same blocks as separate TransferSpecs (Submits of up to 1024),
// and how long a Submit of the whole block list takes to be accepted (wait = false); each
// row's "prepared list" line is the same move naming the list prepared once
// (TransferService.PreparePieces) instead of sending it.
// With --mpi=LAUNCH (one of tests/util/mpi_job's launches: ob1_tcp, ucx, ob1_shm_staged;
// mpich, mpich_staged with GPUMOVE_MPI=mpich): path MPI between two ranks of a job instead.
// Medians of --rounds; the ratios printed are vectored / baseline. With --device: LOCAL
// device -> device, pinned -> device and device -> pinned instead (GPU 0), where "in
// daemon" is the transfer's own time (start to end, without the Submit of the list) and
// the gather kernel baseline (b) is deploy/gpu/raw_gather.cu's, printed by run.sh.
// --dst_device=1 (two GPUs): the device -> device rows (LOCAL, and CUDA_IPC to node b) and
// --mpi_device's receiving rank write that GPU's memory instead (rows device0->deviceN).
//   bazel run //client/bench:vectored_bench -- --rounds=5 [--device]
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/bench/shuffled_blocks.h"
#include "client/bench/stream.h"
#include "client/gpumove_client.h"
#include "tests/util/daemon_process.h"
#include "tests/util/mpi_job.h"

ABSL_FLAG(int, rounds, 5, "Rounds; medians are printed.");
ABSL_FLAG(bool, device, false, "Measure LOCAL moves with GPU 0's memory (see above).");
ABSL_FLAG(std::string, mpi, "",
          "Measure path MPI between two ranks started with this launch (\"default\": no "
          "launcher options).");
ABSL_FLAG(bool, mpi_device, false, "With --mpi: GPU 0's memory on both ranks.");
ABSL_FLAG(int, dst_device, 0,
          "With --device or --mpi_device: the GPU of the device -> device rows' destination.");
ABSL_FLAG(std::vector<std::string>, rank_flags, {},
          "More gpumoved flags for the two daemons (with --mpi: the ranks), comma-separated.");
ABSL_FLAG(bool, trace, false,
          "At the end, the two daemons' log lines on vectored moves (start them with "
          "--rank_flags=--v=2): where each move's time went.");
ABSL_FLAG(int, separate_blocks, 8192,
          "Blocks moved as separate TransferSpecs for baseline (c) (its time is scaled to "
          "the whole list).");

namespace gpumove {
namespace {

// The daemons' GPUs: GPU0, and the destination's where it is another.
std::string GpusFlag() {
  const int dst = absl::GetFlag(FLAGS_dst_device);
  return dst == 0 ? std::string("--gpus=0") : absl::StrCat("--gpus=0,", dst);
}

// GB/s of a gather memcpy of the blocks on `threads` threads (baseline b).
double GatherMemcpy(const Shape& shape, const std::vector<uint64_t>& si,
                    const std::vector<uint64_t>& di, int threads) {
  const uint64_t bytes = shape.block * shape.count;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  std::vector<double> rates;
  for (int r = 0; r < 3; ++r) {
    const absl::Time t0 = absl::Now();
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
    rates.push_back(static_cast<double>(bytes) / absl::ToDoubleSeconds(absl::Now() - t0) / 1e9);
  }
  return Median(rates);
}

struct Figures {
  double vectored = 0, in_daemon = 0, contiguous = 0, separate = 0, accept_ms = 0;
  // The same move naming the list prepared once (TransferSpec.prepared_pieces): end to
  // end, in the daemon, and the Submit's accept time.
  double prepared = 0, prepared_in_daemon = 0, prepared_accept_ms = 0;
};

absl::Duration Ran(const v1::Transfer& t) {
  auto at = [](const google::protobuf::Timestamp& ts) {
    return absl::FromUnixSeconds(ts.seconds()) + absl::Nanoseconds(ts.nanos());
  };
  return at(t.end_time()) - at(t.start_time());
}

absl::StatusOr<Figures> Measure(Client& c, const v1::BufferRef& src, const v1::BufferRef& dst,
                                const Shape& shape, const std::vector<uint64_t>& si,
                                const std::vector<uint64_t>& di, v1::Path path = v1::PATH_AUTO) {
  const uint64_t bytes = shape.block * shape.count;
  Figures f;
  MoveOptions o;
  o.path = path;
  o.blocks.set_block_size(shape.block);
  for (size_t i = 0; i < shape.count; ++i) {
    o.blocks.add_source_blocks(si[i]);
    o.blocks.add_destination_blocks(di[i]);
  }
  auto kept = c.PreparePieces({}, o.blocks);
  if (!kept.ok()) return kept.status();
  MoveOptions named;
  named.path = path;
  named.prepared_pieces = kept->id();
  std::vector<double> vec, ran, whole, accept, prep, prep_ran, prep_accept;
  for (int r = 0; r < absl::GetFlag(FLAGS_rounds); ++r) {
    absl::Time t0 = absl::Now();
    auto t = c.Move(src, dst, o);
    if (!t.ok() || t->state() != v1::SUCCEEDED) {
      return absl::InternalError(
          absl::StrCat("vectored move: ", t.ok() ? t->error_message() : t.status().ToString()));
    }
    vec.push_back(static_cast<double>(bytes) / absl::ToDoubleSeconds(absl::Now() - t0) / 1e9);
    ran.push_back(static_cast<double>(bytes) / absl::ToDoubleSeconds(Ran(*t)) / 1e9);
    v1::BufferRef s = src, d = dst;
    s.set_length(bytes);
    t0 = absl::Now();
    MoveOptions whole_move;
    whole_move.path = path;
    auto w = c.Move(s, d, whole_move);
    if (!w.ok() || w->state() != v1::SUCCEEDED) return absl::InternalError("contiguous move");
    whole.push_back(static_cast<double>(bytes) / absl::ToDoubleSeconds(absl::Now() - t0) / 1e9);
    // Accepted: a Submit of the whole list that does not wait.
    MoveOptions nw = o;
    nw.wait = false;
    t0 = absl::Now();
    auto a = c.Move(src, dst, nw);
    if (!a.ok()) return a.status();
    accept.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
    if (auto e = c.Wait(a->id()); !e.ok() || e->state() != v1::SUCCEEDED) {
      return absl::InternalError("the unwaited vectored move");
    }
    // The prepared list: a move that waits, and one that does not.
    t0 = absl::Now();
    auto p = c.Move(src, dst, named);
    if (!p.ok() || p->state() != v1::SUCCEEDED) {
      return absl::InternalError(
          absl::StrCat("prepared move: ", p.ok() ? p->error_message() : p.status().ToString()));
    }
    prep.push_back(static_cast<double>(bytes) / absl::ToDoubleSeconds(absl::Now() - t0) / 1e9);
    prep_ran.push_back(static_cast<double>(bytes) / absl::ToDoubleSeconds(Ran(*p)) / 1e9);
    MoveOptions pnw = named;
    pnw.wait = false;
    t0 = absl::Now();
    auto pa = c.Move(src, dst, pnw);
    if (!pa.ok()) return pa.status();
    prep_accept.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
    if (auto e = c.Wait(pa->id()); !e.ok() || e->state() != v1::SUCCEEDED) {
      return absl::InternalError("the unwaited prepared move");
    }
  }
  (void)c.ReleasePieces(kept->id());
  f.prepared = Median(prep);
  f.prepared_in_daemon = Median(prep_ran);
  f.prepared_accept_ms = Median(prep_accept);
  f.vectored = Median(vec);
  f.in_daemon = Median(ran);
  f.contiguous = Median(whole);
  f.accept_ms = Median(accept);
  // (c): the first blocks as separate moves, Submits of up to 1024 that wait.
  const size_t n = std::min<size_t>(shape.count, absl::GetFlag(FLAGS_separate_blocks));
  const absl::Time t0 = absl::Now();
  for (size_t at = 0; at < n; at += 1024) {
    v1::SubmitRequest req;
    req.set_wait(true);
    for (size_t i = at; i < std::min(n, at + 1024); ++i) {
      v1::TransferSpec* spec = req.add_transfers();
      spec->set_path(path);
      *spec->mutable_source() = src;
      spec->mutable_source()->set_offset(src.offset() + si[i] * shape.block);
      spec->mutable_source()->set_length(shape.block);
      *spec->mutable_destination() = dst;
      spec->mutable_destination()->set_offset(dst.offset() + di[i] * shape.block);
    }
    auto r = c.Submit(req);
    if (!r.ok()) return r.status();
  }
  f.separate = static_cast<double>(n * shape.block) / absl::ToDoubleSeconds(absl::Now() - t0) / 1e9;
  return f;
}

// LOCAL with GPU 0's memory: the vectored move end to end and in the daemon, one
// contiguous move of the same bytes, separate specs, and the Submit's accept time.
int DeviceRows(Client& c) {
  std::printf("%-34s %10s %10s %10s %10s %8s %8s %10s\n", "LOCAL (ipc: CUDA_IPC a->b)", "vectored",
              "in daemon", "(a) whole", "(c) specs", "v/(a)", "v/(c)", "accept ms");
  struct Way {
    const char* name;
    v1::MemoryKind from, to;
    const char* to_node;  // Null: node a (LOCAL); "b": CUDA_IPC between the daemons.
  };
  for (const Shape& shape : {Shape{4096, 65536}, Shape{65536, 8192}}) {
    const uint64_t bytes = shape.block * shape.count;
    std::vector<uint64_t> si, di;
    Shuffle(shape.count, shape.block, &si, &di);
    const int peer = absl::GetFlag(FLAGS_dst_device);
    const std::string dd = peer == 0 ? "device->device" : absl::StrCat("device0->device", peer);
    const std::string ipc_dd = absl::StrCat("ipc:", dd);
    for (const Way& w : {Way{dd.c_str(), v1::DEVICE, v1::DEVICE, nullptr},
                         Way{"pinned->device", v1::PINNED_HOST, v1::DEVICE, nullptr},
                         Way{"device->pinned", v1::DEVICE, v1::PINNED_HOST, nullptr},
                         Way{ipc_dd.c_str(), v1::DEVICE, v1::DEVICE, "b"}}) {
      const std::string to_node = w.to_node == nullptr ? "" : w.to_node;
      // Device -> device rows end on the --dst_device GPU.
      const int to_device = w.from == v1::DEVICE && w.to == v1::DEVICE ? peer : 0;
      auto src = c.Allocate(bytes, w.from, 0);
      auto dst = c.Allocate(bytes, w.to, to_device, absl::ZeroDuration(), "", to_node);
      if (!src.ok() || !dst.ok()) {
        return std::printf("allocation failed: %s %s\n", src.status().ToString().c_str(),
                           dst.status().ToString().c_str()),
               1;
      }
      v1::BufferRef to = Ref(dst->id());
      to.set_node(to_node);
      auto f = Measure(c, Ref(src->id()), to, shape, si, di);
      if (!f.ok()) return std::printf("%s\n", f.status().ToString().c_str()), 1;
      std::printf("%-34s %10.2f %10.2f %10.2f %10.3f %8.2f %8.0f %10.2f\n",
                  absl::StrCat(w.name, ", ", shape.count, " x ", shape.block >> 10, " KiB").c_str(),
                  f->vectored, f->in_daemon, f->contiguous, f->separate,
                  f->vectored / f->contiguous, f->vectored / f->separate, f->accept_ms);
      std::printf("%-34s %10.2f %10.2f %10.2f %10.3f %8.2f %8.0f %10.2f\n", "  prepared list",
                  f->prepared, f->prepared_in_daemon, f->contiguous, f->separate,
                  f->prepared / f->contiguous, f->prepared / f->separate, f->prepared_accept_ms);
      (void)c.Release(src->id());
      (void)c.Release(dst->id(), to_node);
    }
  }
  std::printf(
      "GB/s, medians of %d rounds; in daemon: the transfer's start to end; (c) moves the first "
      "%d blocks as separate specs\n",
      absl::GetFlag(FLAGS_rounds), absl::GetFlag(FLAGS_separate_blocks));
  // What a checksum costs a device move: 256 MiB device -> device with and without, as
  // one range and as 65536 shuffled blocks of 4 KiB (the pieces hashed on the GPU too).
  const uint64_t bytes = 256 << 20;
  auto src = c.Allocate(bytes, v1::DEVICE, 0);
  auto dst = c.Allocate(bytes, v1::DEVICE, 0);
  if (!src.ok() || !dst.ok()) return std::printf("allocation failed\n"), 1;
  std::vector<uint64_t> si, di;
  Shuffle(65536, 4096, &si, &di);
  for (bool vectored : {false, true}) {
    std::vector<double> plain, summed;
    for (int r = 0; r < absl::GetFlag(FLAGS_rounds); ++r) {
      for (bool checksum : {false, true}) {
        MoveOptions o;
        o.checksum = checksum;
        if (vectored) {
          o.blocks.set_block_size(4096);
          for (size_t i = 0; i < si.size(); ++i) {
            o.blocks.add_source_blocks(si[i]);
            o.blocks.add_destination_blocks(di[i]);
          }
        }
        const absl::Time t0 = absl::Now();
        auto t = c.Move(Ref(src->id()), Ref(dst->id()), o);
        if (!t.ok() || t->state() != v1::SUCCEEDED) return std::printf("checksummed move\n"), 1;
        (checksum ? summed : plain)
            .push_back(static_cast<double>(bytes) / absl::ToDoubleSeconds(absl::Now() - t0) / 1e9);
      }
    }
    std::printf("LOCAL device->device 256 MiB%s: %.2f GB/s, with checksums %.2f GB/s (%.2f)\n",
                vectored ? " as 65536 x 4 KiB" : "", Median(plain), Median(summed),
                Median(summed) / Median(plain));
  }
  return 0;
}

// Whether the node `c` talks to sees its one peer up within 20 s.
bool AwaitOnePeer(Client& c) {
  for (absl::Time end = absl::Now() + absl::Seconds(20);;) {
    auto peers = c.ListPeers();
    if (peers.ok() && peers->size() == 1 && (*peers)[0].up()) return true;
    if (absl::Now() > end) return false;
    absl::SleepFor(absl::Milliseconds(50));
  }
}

// Path MPI between two ranks of a job: host (or device) memory, rank0 -> rank1.
int MpiRows(const std::string& name) {
  std::optional<MpiLaunch> launch;
  if (name == "default") launch = MpiLaunch{"default", {}, {}};
  for (const MpiLaunch& l : MpiLaunches()) {
    if (l.name == name) launch = l;
  }
  if (!launch) return std::printf("no MPI launch %s here\n", name.c_str()), 1;
  const bool device = absl::GetFlag(FLAGS_mpi_device);
  const v1::MemoryKind kind = device ? v1::DEVICE : v1::HOST;
  std::vector<std::string> flags = {"--host_pool_size=1536MiB", "--mpi_chunk=4MiB"};
  if (device) {
    flags = {"--host_pool_size=64MiB",
             "--pinned_pool_size=512MiB",
             "--device_pool_size=2GiB",
             GpusFlag(),
             "--noucx",
             "--mpi_chunk=4MiB"};
  }
  for (const std::string& f : absl::GetFlag(FLAGS_rank_flags)) flags.push_back(f);
  auto job = MpiJob::Start(2, *launch, flags);
  if (!job.ok()) return std::printf("%s\n", job.status().ToString().c_str()), 1;
  Client& c = (*job)->client(0);
  if (!AwaitOnePeer(c)) return std::printf("rank1 did not join rank0\n"), 1;
  std::printf("%-30s %10s %10s %10s %10s %8s %8s %8s %10s\n", "path, blocks", "vectored",
              "in daemon", "(a) whole", "(c) specs", "v/(a)", "d/(a)", "v/(c)", "accept ms");
  for (const Shape& shape : {Shape{4096, 65536}, Shape{65536, 8192}}) {
    const uint64_t bytes = shape.block * shape.count;
    std::vector<uint64_t> si, di;
    Shuffle(shape.count, shape.block, &si, &di);
    auto src = c.Allocate(bytes, kind, 0);
    auto remote = c.Allocate(bytes, kind, device ? absl::GetFlag(FLAGS_dst_device) : 0,
                             absl::ZeroDuration(), "", "rank1");
    if (!src.ok() || !remote.ok()) return std::printf("allocation failed\n"), 1;
    v1::BufferRef to = Ref(remote->id());
    to.set_node("rank1");
    auto f = Measure(c, Ref(src->id()), to, shape, si, di, v1::MPI);
    if (!f.ok()) return std::printf("%s\n", f.status().ToString().c_str()), 1;
    std::printf("%-30s %10.2f %10.2f %10.2f %10.3f %8.2f %8.2f %8.0f %10.2f\n",
                absl::StrCat("MPI ", name, device ? " dev" : "",
                             device && absl::GetFlag(FLAGS_dst_device) != 0
                                 ? absl::StrCat("0->dev", absl::GetFlag(FLAGS_dst_device))
                                 : std::string(),
                             " r0->r1, ", shape.count, " x ", shape.block >> 10, " KiB")
                    .c_str(),
                f->vectored, f->in_daemon, f->contiguous, f->separate, f->vectored / f->contiguous,
                f->in_daemon / f->contiguous, f->vectored / f->separate, f->accept_ms);
    std::printf("%-30s %10.2f %10.2f %10.2f %10.3f %8.2f %8.2f %8.0f %10.2f\n", "  prepared list",
                f->prepared, f->prepared_in_daemon, f->contiguous, f->separate,
                f->prepared / f->contiguous, f->prepared_in_daemon / f->contiguous,
                f->prepared / f->separate, f->prepared_accept_ms);
    (void)c.Release(src->id());
    (void)c.Release(remote->id(), "rank1");
  }
  std::printf(
      "GB/s, medians of %d rounds; in daemon: the vectored transfer's start to end (d), "
      "without the Submit of its list; (c) moves the first %d blocks as separate specs\n",
      absl::GetFlag(FLAGS_rounds), absl::GetFlag(FLAGS_separate_blocks));
  return 0;
}

int HostRows(Client& client);

int Main() {
  if (!absl::GetFlag(FLAGS_mpi).empty()) return MpiRows(absl::GetFlag(FLAGS_mpi));
  const bool device = absl::GetFlag(FLAGS_device);
  std::vector<std::string> flags = {"--host_pool_size=1536MiB", "--pinned_pool_size=16MiB"};
  if (device) {
    flags = {"--host_pool_size=64MiB", "--pinned_pool_size=1100MiB", "--device_pool_size=2GiB",
             GpusFlag()};
  }
  for (const std::string& f : absl::GetFlag(FLAGS_rank_flags)) flags.push_back(f);
  auto a = DaemonProcess::Start([&] {
    auto f = flags;
    f.push_back("--node=a");
    return f;
  }());
  if (!a.ok()) return std::printf("%s\n", a.status().ToString().c_str()), 1;
  auto b = DaemonProcess::Start([&] {
    auto f = flags;
    f.push_back("--node=b");
    f.push_back("--peers=" + (*a)->address());
    return f;
  }());
  if (!b.ok()) return std::printf("%s\n", b.status().ToString().c_str()), 1;
  auto c = Client::Connect((*a)->address(), ConnectOptions{});
  if (!c.ok()) return 1;
  if (!AwaitOnePeer(**c)) return std::printf("b did not join a\n"), 1;
  const int rc = device ? DeviceRows(**c) : HostRows(**c);
  if (absl::GetFlag(FLAGS_trace)) {
    for (const auto* d : {&*a, &*b}) {
      int lines = 0;
      for (absl::string_view line : absl::StrSplit((*d)->Log(), '\n')) {
        if ((absl::StrContains(line, " pieces") || absl::StrContains(line, "Submit of")) &&
            ++lines <= 400) {
          std::printf("%s| %s\n", d == &*a ? "a" : "b", std::string(line).c_str());
        }
      }
    }
  }
  return rc;
}

int HostRows(Client& client) {
  Client* const c = &client;
  const int threads =
      static_cast<int>(std::min(8u, std::max(1u, std::thread::hardware_concurrency())));
  std::printf("%-22s %10s %10s %10s %10s %8s %8s %8s %10s\n", "path, blocks", "vectored",
              "(a) whole", "(b) gather", "(c) specs", "v/(a)", "v/(b)", "v/(c)", "accept ms");
  for (const Shape& shape : {Shape{4096, 65536}, Shape{65536, 8192}}) {
    const uint64_t bytes = shape.block * shape.count;
    std::vector<uint64_t> si, di;
    Shuffle(shape.count, shape.block, &si, &di);
    const double gather = GatherMemcpy(shape, si, di, threads);
    auto src = c->Allocate(bytes);
    auto local = c->Allocate(bytes);
    auto remote = c->Allocate(bytes, v1::HOST, 0, absl::ZeroDuration(), "", "b");
    if (!src.ok() || !local.ok() || !remote.ok()) return std::printf("allocation failed\n"), 1;
    v1::BufferRef on_b = Ref(remote->id());
    on_b.set_node("b");
    for (bool ucx : {false, true}) {
      auto f = Measure(*c, Ref(src->id()), ucx ? on_b : Ref(local->id()), shape, si, di);
      if (!f.ok()) return std::printf("%s\n", f.status().ToString().c_str()), 1;
      std::printf("%-22s %10.2f %10.2f %10.2f %10.3f %8.2f %8.2f %8.0f %10.2f\n",
                  absl::StrCat(ucx ? "UCX a->b" : "LOCAL host", ", ", shape.count, " x ",
                               shape.block >> 10, " KiB")
                      .c_str(),
                  f->vectored, f->contiguous, ucx ? 0.0 : gather, f->separate,
                  f->vectored / f->contiguous, ucx ? 0.0 : f->vectored / gather,
                  f->vectored / f->separate, f->accept_ms);
      std::printf("%-22s %10.2f %10.2f %10.2f %10.3f %8.2f %8.2f %8.0f %10.2f\n", "  prepared list",
                  f->prepared, f->contiguous, ucx ? 0.0 : gather, f->separate,
                  f->prepared / f->contiguous, ucx ? 0.0 : f->prepared / gather,
                  f->prepared / f->separate, f->prepared_accept_ms);
    }
    (void)c->Release(src->id());
    (void)c->Release(local->id());
    (void)c->Release(remote->id(), "b");
  }
  std::printf(
      "GB/s, medians of %d rounds; (b) is %d threads' memcpy of the same blocks in one "
      "process; (c) moves the first %d blocks as separate specs\n",
      absl::GetFlag(FLAGS_rounds), threads, absl::GetFlag(FLAGS_separate_blocks));
  return 0;
}

}  // namespace
}  // namespace gpumove

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return gpumove::Main();
}
