// GPU local-move benchmark (run on the GPU machine): moves through one gpumoved between
// GPU0 and GPU1 and between pinned host and GPU0, against the raw CUDA copy of the same
// size issued from this process. Three daemon figures per size:
//   wall   Submit(wait) round trip, one move at a time (what a client sees),
//   engine the daemon's own start->end time for the move (the copy itself),
//   batch  16 moves in one Submit, bytes / wall time (RPC cost amortized).
// With two GPUs, also both directions at once (GPU0 -> GPU1 and GPU1 -> GPU0 in one
// Submit) against two raw copies at once, one on each GPU's stream.
#include <algorithm>
#include <iostream>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/bench/cuda_check.h"
#include "client/bench/stream.h"
#include "client/gpumove_client.h"
#include "daemon/common/bytes.h"
#include "tests/util/daemon_process.h"

#ifdef GPUMOVE_HAVE_CUDA
#include <cuda_runtime.h>
#endif

ABSL_FLAG(gpumove::ByteSize, max_size, gpumove::ByteSize{1ull << 30}, "Largest move.");
ABSL_FLAG(int, reps, 20, "Repetitions per size (medians are printed).");
ABSL_FLAG(gpumove::ByteSize, min_size, gpumove::ByteSize{4096}, "Smallest move.");
ABSL_FLAG(bool, local, true, "Measure path LOCAL (GPU0 -> GPU1, pinned <-> GPU0).");
ABSL_FLAG(bool, cuda_ipc, true, "Measure path CUDA_IPC between two daemons.");
ABSL_FLAG(bool, both_ways, true, "Measure GPU0 <-> GPU1 both directions at once (LOCAL).");

namespace gpumove {
namespace {

#ifdef GPUMOVE_HAVE_CUDA
struct Raw {
  void* a = nullptr;  // On the source device (or pinned host).
  void* b = nullptr;  // On the destination device.
  cudaStream_t s;
};

// Raw copy time (median of reps), cudaMemcpyAsync + synchronize, as the daemon does.
double RawCopy(Raw& r, uint64_t size, int reps) {
  std::vector<double> t;
  CHECK_CUDA(cudaMemcpyAsync(r.b, r.a, size, cudaMemcpyDefault, r.s));
  CHECK_CUDA(cudaStreamSynchronize(r.s));
  for (int i = 0; i < reps; ++i) {
    const absl::Time t0 = absl::Now();
    CHECK_CUDA(cudaMemcpyAsync(r.b, r.a, size, cudaMemcpyDefault, r.s));
    CHECK_CUDA(cudaStreamSynchronize(r.s));
    t.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
  }
  return Median(t);
}

// One table: moves src -> dst on `path` through the client for sizes 4 KiB .. max_size,
// next to the raw copy `raw`.
// `capacity`: bytes of src and dst (at least max_size; more lets a stream of the largest
// moves keep several in flight).
bool Sweep(Client& client, const v1::BufferRef& src, const v1::BufferRef& dst, v1::Path path,
           Raw& raw, uint64_t max_size, uint64_t capacity, int reps) {
  std::cout << absl::StrFormat("%10s %9s %9s %9s %9s %9s %10s %10s %10s %10s\n", "size", "raw",
                               "wall", "engine", "batch16", "stream", "wall/raw", "engine/raw",
                               "batch/raw", "stream/raw");
  MoveOptions o;
  o.path = path;
  // Warm-up: a fresh channel, daemon threads and CUDA mappings make the first moves slow
  // (4 KiB GPU0 -> GPU1 ran 425 us with one warm-up move, the first table of the run);
  // the latency printed is that of a daemon in use.
  for (const absl::Time end = absl::Now() + absl::Milliseconds(300); absl::Now() < end;) {
    v1::BufferRef from = src;
    from.set_length(4096);
    if (!client.Move(from, dst, o).ok()) break;
  }
  for (uint64_t size = absl::GetFlag(FLAGS_min_size).bytes; size <= max_size; size *= 4) {
    const double raw_s = RawCopy(raw, size, reps);
    std::vector<double> wall, engine;
    for (int i = 0; i < reps + 1; ++i) {
      const absl::Time t0 = absl::Now();
      v1::BufferRef from = src;
      from.set_length(size);
      auto t = client.Move(from, dst, o);
      const double w = absl::ToDoubleSeconds(absl::Now() - t0);
      if (!t.ok() || t->state() != v1::SUCCEEDED) {
        std::cerr << "move failed: " << t.status() << " " << (t.ok() ? t->error_message() : "") << "\n";
        return false;
      }
      if (i == 0) continue;  // Warm-up.
      wall.push_back(w);
      engine.push_back(EngineSeconds(*t));
      if (t->path() != path) {
        std::cerr << "ran on path " << v1::Path_Name(t->path()) << "\n";
        return false;
      }
    }
    // 16 moves of size/16 into disjoint ranges in one Submit; below 64 KiB, 16 moves of
    // `size` into the same range (which then run in order).
    v1::SubmitRequest batch;
    batch.set_wait(true);
    const uint64_t part = size >= 16 * 4096 ? size / 16 : size;
    for (int i = 0; i < 16; ++i) {
      auto* s = batch.add_transfers();
      const uint64_t off = part == size ? 0 : i * part;
      *s->mutable_source() = src;
      s->mutable_source()->set_offset(off);
      s->mutable_source()->set_length(part);
      *s->mutable_destination() = dst;
      s->mutable_destination()->set_offset(off);
      s->set_path(path);
    }
    std::vector<double> batch_t;
    for (int i = 0; i < std::max(3, reps / 4); ++i) {
      const absl::Time t0 = absl::Now();
      auto r = client.Submit(batch);
      if (!r.ok()) {
        std::cerr << "batch: " << r.status() << "\n";
        return false;
      }
      batch_t.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
    }
    // A stream: moves of `size`, 8 per Submit, two Submits in flight (on ranges of their
    // own where the buffers hold them).
    StreamOptions so;
    so.per_submit = 8;
    so.duration = absl::Milliseconds(500);
    so.path = path;
    auto stream = StreamThroughput(client, src, dst, size, capacity, so);
    if (!stream.ok()) {
      std::cerr << "stream: " << stream.status() << "\n";
      return false;
    }
    const double batch_bytes = part * 16.0;
    const double raw_bw = size / raw_s / 1e9;
    const double wall_bw = size / Median(wall) / 1e9;
    const double engine_bw = size / Median(engine) / 1e9;
    const double batch_bw = batch_bytes / Median(batch_t) / 1e9;
    std::cout << absl::StrFormat(
        "%10s %9.2f %9.2f %9.2f %9.2f %9.2f %10.3f %10.3f %10.3f %10.3f\n", FormatBytes(size),
        raw_bw, wall_bw, engine_bw, batch_bw, *stream, wall_bw / raw_bw, engine_bw / raw_bw,
        batch_bw / raw_bw, *stream / raw_bw);
    if (size == 4096) {
      std::cout << absl::StrFormat("%10s raw %.1fus, move (Submit+wait) %.1fus\n", "4 KiB lat",
                                   raw_s * 1e6, Median(wall) * 1e6);
    }
  }
  return true;
}

// Both directions at once: GPU0 -> GPU1 and GPU1 -> GPU0, `size` bytes each, as one
// Submit of two LOCAL moves (the span from the first start to the last end, and the
// Submit's round trip) against two cudaMemcpyAsync at once on a stream of each GPU.
bool BothWays(Client& client, uint64_t max_size, int reps) {
  void* raw[2][2];  // [gpu][0: source, 1: destination]
  cudaStream_t streams[2];
  for (int g = 0; g < 2; ++g) {
    CHECK_CUDA(cudaSetDevice(g));
    CHECK_CUDA(cudaMalloc(&raw[g][0], max_size));
    CHECK_CUDA(cudaMalloc(&raw[g][1], max_size));
    CHECK_CUDA(cudaStreamCreateWithFlags(&streams[g], cudaStreamNonBlocking));
    cudaError_t e = cudaDeviceEnablePeerAccess(1 - g, 0);
    if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) CHECK_CUDA(e);
    cudaGetLastError();
  }
  auto raw_both = [&](uint64_t size) {
    const absl::Time t0 = absl::Now();
    for (int g = 0; g < 2; ++g) {  // GPU g's source into the other GPU's destination.
      CHECK_CUDA(cudaSetDevice(g));
      CHECK_CUDA(cudaMemcpyAsync(raw[1 - g][1], raw[g][0], size, cudaMemcpyDefault, streams[g]));
    }
    for (int g = 0; g < 2; ++g) CHECK_CUDA(cudaStreamSynchronize(streams[g]));
    return absl::ToDoubleSeconds(absl::Now() - t0);
  };
  std::string ids[2][2];
  for (int g = 0; g < 2; ++g) {
    for (int end = 0; end < 2; ++end) {
      auto b = client.Allocate(max_size, v1::DEVICE, g);
      if (!b.ok()) {
        std::cerr << "allocate: " << b.status() << "\n";
        return false;
      }
      ids[g][end] = b->id();
    }
  }
  std::cout << "\nGPU0 <-> GPU1, both directions at once (path LOCAL, one Submit of two moves; "
               "raw = a cudaMemcpyAsync on each GPU's stream at once; GB/s both ways together, "
               "medians of "
            << reps << ")\n";
  std::cout << absl::StrFormat("%10s %9s %9s %9s %10s %10s\n", "size", "raw", "wall", "engine",
                               "wall/raw", "engine/raw");
  for (uint64_t size = absl::GetFlag(FLAGS_min_size).bytes; size <= max_size; size *= 4) {
    v1::SubmitRequest both;
    both.set_wait(true);
    for (int g = 0; g < 2; ++g) {
      v1::TransferSpec* spec = both.add_transfers();
      *spec->mutable_source() = Ref(ids[g][0], 0, size);
      *spec->mutable_destination() = Ref(ids[1 - g][1]);
      spec->set_path(v1::LOCAL);
    }
    std::vector<double> raw_t, wall, engine;
    raw_both(size);  // Warm-up.
    for (int i = 0; i < reps + 1; ++i) {
      const absl::Time t0 = absl::Now();
      auto r = client.Submit(both);
      const double w = absl::ToDoubleSeconds(absl::Now() - t0);
      if (!r.ok() || r->transfers_size() != 2) {
        std::cerr << "both ways: " << r.status() << "\n";
        return false;
      }
      absl::Time first = absl::InfiniteFuture(), last = absl::InfinitePast();
      for (const v1::Transfer& t : r->transfers()) {
        if (t.state() != v1::SUCCEEDED) {
          std::cerr << "both ways: " << t.error_message() << "\n";
          return false;
        }
        first = std::min(first, absl::FromUnixSeconds(t.start_time().seconds()) +
                                    absl::Nanoseconds(t.start_time().nanos()));
        last = std::max(last, absl::FromUnixSeconds(t.end_time().seconds()) +
                                  absl::Nanoseconds(t.end_time().nanos()));
      }
      if (i == 0) continue;  // Warm-up.
      wall.push_back(w);
      engine.push_back(absl::ToDoubleSeconds(last - first));
      raw_t.push_back(raw_both(size));  // Taking turns with the daemon's.
    }
    const double bytes = 2.0 * size;
    const double raw_bw = bytes / Median(raw_t) / 1e9;
    const double wall_bw = bytes / Median(wall) / 1e9;
    const double engine_bw = bytes / Median(engine) / 1e9;
    std::cout << absl::StrFormat("%10s %9.2f %9.2f %9.2f %10.3f %10.3f\n", FormatBytes(size),
                                 raw_bw, wall_bw, engine_bw, wall_bw / raw_bw, engine_bw / raw_bw);
  }
  for (int g = 0; g < 2; ++g) {
    for (int end = 0; end < 2; ++end) client.Release(ids[g][end]).IgnoreError();
    CHECK_CUDA(cudaSetDevice(g));
    CHECK_CUDA(cudaFree(raw[g][0]));
    CHECK_CUDA(cudaFree(raw[g][1]));
    CHECK_CUDA(cudaStreamDestroy(streams[g]));
  }
  CHECK_CUDA(cudaSetDevice(0));
  return true;
}

int Main() {
  int gpus = 0;
  CHECK_CUDA(cudaGetDeviceCount(&gpus));
  const uint64_t max_size = absl::GetFlag(FLAGS_max_size).bytes;
  const int reps = absl::GetFlag(FLAGS_reps);
  auto daemon = DaemonProcess::Start(
      {absl::StrFormat("--device_pool_size=%d", 4 * max_size + (256 << 20)),
       absl::StrFormat("--pinned_pool_size=%d", max_size + (64 << 20)), "--host_pool_size=64MiB",
       "--node=gpu-bench", "--copy_threads=4"});
  if (!daemon.ok()) {
    std::cerr << daemon.status() << "\n";
    return 1;
  }
  auto client = *Client::Connect((*daemon)->address());
  auto info = client->GetInfo();
  std::cout << "gpumoved " << info->version() << ": " << info->gpu_status() << "\n";

  struct Pair {
    const char* name;
    v1::MemoryKind src_kind;
    int src_dev;
    int dst_dev;
  };
  std::vector<Pair> pairs = {{"pinned -> GPU0", v1::PINNED_HOST, -1, 0},
                             {"GPU0 -> pinned", v1::DEVICE, 0, -1}};
  if (gpus > 1) pairs.insert(pairs.begin(), {"GPU0 -> GPU1", v1::DEVICE, 0, 1});

  if (!absl::GetFlag(FLAGS_local)) pairs.clear();
  for (const Pair& p : pairs) {
    Raw raw;
    const bool dst_host = p.dst_dev < 0;
    const int issue_dev = p.src_kind == v1::DEVICE ? p.src_dev : p.dst_dev;
    CHECK_CUDA(cudaSetDevice(issue_dev));
    CHECK_CUDA(cudaStreamCreateWithFlags(&raw.s, cudaStreamNonBlocking));
    if (p.src_kind == v1::DEVICE) {
      CHECK_CUDA(cudaSetDevice(p.src_dev));
      CHECK_CUDA(cudaMalloc(&raw.a, max_size));
    } else {
      CHECK_CUDA(cudaHostAlloc(&raw.a, max_size, cudaHostAllocPortable));
    }
    if (dst_host) {
      CHECK_CUDA(cudaHostAlloc(&raw.b, max_size, cudaHostAllocPortable));
    } else {
      CHECK_CUDA(cudaSetDevice(p.dst_dev));
      CHECK_CUDA(cudaMalloc(&raw.b, max_size));
    }
    if (p.src_kind == v1::DEVICE && !dst_host && p.src_dev != p.dst_dev) {
      CHECK_CUDA(cudaSetDevice(p.src_dev));
      cudaError_t e = cudaDeviceEnablePeerAccess(p.dst_dev, 0);
      if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) CHECK_CUDA(e);
      cudaGetLastError();
    }
    CHECK_CUDA(cudaSetDevice(issue_dev));

    // GPU to GPU: buffers of four times the largest move (the device pools hold them), so
    // that a stream of the largest moves keeps several in flight.
    const uint64_t capacity = p.src_kind == v1::DEVICE && !dst_host ? 4 * max_size : max_size;
    auto src = client->Allocate(capacity, p.src_kind, std::max(0, p.src_dev));
    auto dst = client->Allocate(capacity, dst_host ? v1::PINNED_HOST : v1::DEVICE,
                                std::max(0, p.dst_dev));
    if (!src.ok() || !dst.ok()) {
      std::cerr << "allocate: " << src.status() << " " << dst.status() << "\n";
      return 1;
    }
    std::cout << "\n" << p.name << " (path LOCAL; GB/s from medians of " << reps << ")\n";
    if (!Sweep(*client, Ref(src->id()), Ref(dst->id()), v1::LOCAL, raw, max_size, capacity,
               reps)) {
      return 1;
    }
    client->Release(src->id()).IgnoreError();
    client->Release(dst->id()).IgnoreError();
  }

  if (gpus > 1 && absl::GetFlag(FLAGS_both_ways) && !BothWays(*client, max_size, reps)) return 1;

  // Path CUDA_IPC: a second daemon on this host serving GPU1 only; the first pushes its
  // GPU0 buffer into it, GPU to GPU through the IPC mapping, against the same raw copy.
  if (gpus > 1 && absl::GetFlag(FLAGS_cuda_ipc)) {
    auto b_daemon = DaemonProcess::Start(
        {absl::StrFormat("--device_pool_size=%d", 4 * max_size + (256 << 20)), "--gpus=1",
         "--host_pool_size=64MiB", "--node=gpu-bench-b", "--peers=" + (*daemon)->address()});
    if (!b_daemon.ok()) {
      std::cerr << b_daemon.status() << "\n";
      return 1;
    }
    for (int i = 0; i < 200 && client->ListPeers()->empty(); ++i) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    auto b_client = *Client::Connect((*b_daemon)->address());
    Raw raw;
    CHECK_CUDA(cudaSetDevice(1));
    CHECK_CUDA(cudaMalloc(&raw.b, max_size));
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaMalloc(&raw.a, max_size));
    CHECK_CUDA(cudaStreamCreateWithFlags(&raw.s, cudaStreamNonBlocking));
    // The raw copy goes over NVLink as the daemons' does (without --local nothing above
    // enabled it, and the driver staged it through the host at a tenth of the speed).
    cudaError_t peer = cudaDeviceEnablePeerAccess(1, 0);
    if (peer != cudaSuccess && peer != cudaErrorPeerAccessAlreadyEnabled) CHECK_CUDA(peer);
    cudaGetLastError();
    auto src = client->Allocate(4 * max_size, v1::DEVICE, 0);
    auto dst = b_client->Allocate(4 * max_size, v1::DEVICE, 1);
    if (!src.ok() || !dst.ok()) {
      std::cerr << "allocate: " << src.status() << " " << dst.status() << "\n";
      return 1;
    }
    v1::BufferRef to = Ref(dst->id());
    to.set_node("gpu-bench-b");
    std::cout << "\nGPU0 (gpu-bench) -> GPU1 (gpu-bench-b) (path CUDA_IPC between two daemons; "
                 "raw = cudaMemcpyAsync GPU0 -> GPU1 in one process)\n";
    if (!Sweep(*client, Ref(src->id()), to, v1::CUDA_IPC, raw, max_size, 4 * max_size, reps)) {
      return 1;
    }
  }
  return 0;
}
#else
int Main() {
  std::cout << "gpu_local_bench: built without the CUDA toolkit; nothing to measure\n";
  return 0;
}
#endif

}  // namespace
}  // namespace gpumove

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return gpumove::Main();
}
