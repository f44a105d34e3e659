// Vectored MPI without a daemon: how two ranks of one MPI move 65536 shuffled blocks of
// 4 KiB and 8192 of 64 KiB (different block ids on each side), each way against the same
// bytes moved contiguous, so that gpumove's MPI engine can use the faster one (issue 26:
// "a derived datatype or packed pieces, whichever measures faster"):
//   contiguous  the bytes as one range in --chunk messages, four in flight (baseline (a));
//   datatype    one message whose MPI datatype lists every block (hindexed_block of bytes,
//               each side its own), MPI packing and unpacking it as it likes;
//   dt/chunk    the blocks in groups of --chunk bytes, a derived-datatype message each,
//               four in flight (MPI can pipeline groups);
//   packed      the blocks gathered into --chunk slots by --threads copy threads, the slots
//               sent (two in flight) and scattered on the other side by as many threads
//               (what gpumove's MPI engine does with host memory); not with --device.
// Medians of --rounds, GB/s, timed from both ranks' start to the receiver's last byte;
// every way's received bytes are checked (each 8-byte word of the sender carries its own
// offset). --device: GPU memory on both ranks, handed to MPI as it is (a CUDA-aware MPI).
// Runs itself as a two-rank job with --mpi's launch (tests/util/mpi_job: ob1_tcp, ucx,
// ob1_shm_staged, default):
//   bazel run //client/bench:mpi_datatype_bench -- --mpi=ob1_tcp --rounds=5
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/bench/shuffled_blocks.h"
#include "client/bench/stream.h"
#include "daemon/common/bytes.h"
#include "daemon/common/segment.h"
#include "daemon/core/segments.h"
#include "daemon/gpu/gpu.h"
#include "daemon/path/mpi/mpi_transport.h"
#include "tests/util/mpi_job.h"

ABSL_FLAG(std::string, mpi, "default",
          "The launch (tests/util/mpi_job's MpiLaunches names, or \"default\": no launcher "
          "options).");
ABSL_FLAG(int, rounds, 5, "Rounds per way; medians are printed.");
ABSL_FLAG(gpumove::ByteSize, chunk, gpumove::ByteSize{4 << 20},
          "Message size of the contiguous, dt/chunk and packed ways.");
ABSL_FLAG(int, threads, 4, "Copy threads a side for the packed way.");
ABSL_FLAG(bool, device, false, "GPU memory on both ranks, given to a CUDA-aware MPI.");
ABSL_FLAG(int, max_blocks, 0, "At most this many blocks a shape (0: all; for a smoke test).");
ABSL_FLAG(bool, child, false, "Internal: this process is a rank of the job.");

namespace gpumove {
namespace {

class Rank {
 public:
  Rank(MpiTransport* mpi, char* data, GpuRuntime* gpu, int device)
      : mpi_(mpi), data_(data), gpu_(gpu), device_(device) {}
  int rank() const { return mpi_->world().rank; }

  // One round of `way`: seconds from both ranks' start to the receiver's last byte
  // (nullopt when MPI failed). The sender is rank 0.
  std::optional<double> Once(const std::string& way, const Shape& shape,
                             const std::vector<uint64_t>& si, const std::vector<uint64_t>& di,
                             uint64_t chunk, int threads) {
    const bool send = rank() == 0;
    const std::vector<uint64_t>& ids = send ? si : di;
    const uint64_t total = shape.block * shape.count;
    const int peer = 1 - rank();
    (void)mpi_->Allgather("");  // Both ranks start together.
    const absl::Time t0 = absl::Now();
    bool ok = true;
    auto wait = [&](const std::shared_ptr<MpiTransport::Op>& op) {
      if (!mpi_->Wait(op).ok()) ok = false;
    };
    if (way == "contiguous") {
      std::deque<std::shared_ptr<MpiTransport::Op>> window;
      for (uint64_t off = 0; off < total || !window.empty();) {
        while (off < total && window.size() < 4) {
          const uint64_t n = std::min(chunk, total - off);
          window.push_back(send ? mpi_->Isend(data_ + off, n, peer, 7)
                                : mpi_->Irecv(data_ + off, n, peer, 7));
          off += n;
        }
        wait(window.front());
        window.pop_front();
      }
    } else if (way == "datatype" || way == "dt/chunk") {
      const size_t per = way == "datatype" ? shape.count : std::max<size_t>(1, chunk / shape.block);
      std::deque<std::shared_ptr<MpiTransport::Op>> window;
      for (size_t at = 0; at < shape.count || !window.empty();) {
        while (at < shape.count && window.size() < 4) {
          const size_t end = std::min(shape.count, at + per);
          MpiTransport::Parts parts;
          parts.block = shape.block;
          parts.at.resize(end - at);
          for (size_t i = at; i < end; ++i) parts.at[i - at] = int64_t(ids[i] * shape.block);
          window.push_back(send ? mpi_->IsendParts(data_, std::move(parts), peer, 7)
                                : mpi_->IrecvParts(data_, std::move(parts), peer, 7));
          at = end;
        }
        wait(window.front());
        window.pop_front();
      }
    } else {  // packed
      const size_t per = std::max<size_t>(1, chunk / shape.block);
      const uint64_t slot_bytes = per * shape.block;
      slots_.resize(2 * slot_bytes);
      std::deque<std::pair<std::shared_ptr<MpiTransport::Op>, size_t>> window;  // Op, group.
      std::vector<Segment> list;
      auto copy = [&](size_t group, bool pack) {
        const size_t at = group * per, end = std::min(shape.count, at + per);
        list.clear();
        for (size_t i = at; i < end; ++i) {
          const uint64_t here = ids[i] * shape.block, there = (i - at) * shape.block;
          list.push_back(pack ? Segment{here, there, shape.block}
                              : Segment{there, here, shape.block});
        }
        char* slot = slots_.data() + (group % 2) * slot_bytes;
        CopyPieces(pack ? slot : data_, pack ? data_ : slot, list, 0, list.size(),
                   (end - at) * shape.block, threads);
      };
      const size_t groups = (shape.count + per - 1) / per;
      size_t next = 0;
      while (next < groups || !window.empty()) {
        while (next < groups && window.size() < 2) {
          const uint64_t n = (std::min(shape.count, (next + 1) * per) - next * per) * shape.block;
          char* slot = slots_.data() + (next % 2) * slot_bytes;
          if (send) copy(next, /*pack=*/true);
          window.emplace_back(send ? mpi_->Isend(slot, n, peer, 7) : mpi_->Irecv(slot, n, peer, 7),
                              next);
          ++next;
        }
        auto [op, group] = window.front();
        window.pop_front();
        wait(op);
        if (!send && ok) copy(group, /*pack=*/false);
      }
    }
    // The receiver's completion is the end: it tells rank 0 with a zero-byte message.
    wait(send ? mpi_->Irecv(nullptr, 0, peer, 8) : mpi_->Isend(nullptr, 0, peer, 8));
    if (!ok) return std::nullopt;
    return absl::ToDoubleSeconds(absl::Now() - t0);
  }

  // Sender: each 8-byte word holds its own offset. Receiver: zeros.
  void Fill(uint64_t total) {
    std::vector<uint64_t> words(total / 8, 0);
    if (rank() == 0) std::iota(words.begin(), words.end(), 0);
    for (uint64_t& w : words) w *= 8;
    Put(words.data(), total);
  }
  // Receiver: whether every block landed where its id says, from where the sender's says.
  bool Check(const Shape& shape, const std::vector<uint64_t>& si, const std::vector<uint64_t>& di) {
    std::vector<uint64_t> words(shape.block * shape.count / 8);
    Get(words.data(), shape.block * shape.count);
    for (size_t i = 0; i < shape.count; ++i) {
      const uint64_t* b = words.data() + di[i] * shape.block / 8;
      for (uint64_t j = 0; j < shape.block / 8; ++j) {
        if (b[j] != si[i] * shape.block + 8 * j) return false;
      }
    }
    return true;
  }

 private:
  void Put(const void* from, uint64_t n) {
    if (gpu_ == nullptr) {
      std::memcpy(data_, from, n);
    } else {
      (void)gpu_->Copy(data_, device_, from, kHostDevice, n, 0, nullptr);
    }
  }
  void Get(void* to, uint64_t n) {
    if (gpu_ == nullptr) {
      std::memcpy(to, data_, n);
    } else {
      (void)gpu_->Copy(to, kHostDevice, data_, device_, n, 0, nullptr);
    }
  }

  MpiTransport* mpi_;
  char* data_;
  GpuRuntime* gpu_;
  int device_;
  std::vector<char> slots_;
};

int Child() {
  auto mpi = MpiTransport::Start({});
  if (!mpi.ok()) return std::fprintf(stderr, "%s\n", mpi.status().ToString().c_str()), 1;
  const bool device = absl::GetFlag(FLAGS_device);
  const uint64_t max_bytes = 512ull << 20;
  std::vector<char> host;
  std::unique_ptr<GpuRuntime> gpu;
  char* data = nullptr;
  int dev = kHostDevice;
  if (device) {
    if (!(*mpi)->world().cuda_aware) {
      if ((*mpi)->world().rank == 0) std::printf("SKIPPED: --device needs a CUDA-aware MPI\n");
      return 0;
    }
    gpu = GpuRuntime::Create();
    if (gpu->devices().empty()) {
      if ((*mpi)->world().rank == 0) std::printf("SKIPPED: --device: no GPU here\n");
      return 0;
    }
    dev = (*mpi)->world().rank == 0 ? 0 : static_cast<int>(gpu->devices().size()) - 1;
    auto d = gpu->DeviceAlloc(dev, max_bytes);
    if (!d.ok()) return std::fprintf(stderr, "%s\n", d.status().ToString().c_str()), 1;
    data = static_cast<char*>(*d);
  } else {
    host.resize(max_bytes);
    data = host.data();
  }
  Rank r(mpi->get(), data, gpu.get(), dev);
  const uint64_t chunk = absl::GetFlag(FLAGS_chunk).bytes;
  const int threads = absl::GetFlag(FLAGS_threads);
  std::vector<std::string> ways = {"contiguous", "datatype", "dt/chunk"};
  if (!device) ways.push_back("packed");
  if (r.rank() == 0) {
    std::printf("%-18s %12s %12s %12s %12s %10s %10s %10s\n", "blocks", "contiguous", "datatype",
                "dt/chunk", device ? "" : "packed", "dt/(a)", "dtc/(a)",
                device ? "" : "packed/(a)");
  }
  for (Shape shape : {Shape{4096, 65536}, Shape{65536, 8192}}) {
    if (absl::GetFlag(FLAGS_max_blocks) > 0) {
      shape.count = std::min<size_t>(shape.count, absl::GetFlag(FLAGS_max_blocks));
    }
    std::vector<uint64_t> si, di;
    Shuffle(shape.count, shape.block, &si, &di);
    std::vector<double> gbs;
    for (const std::string& way : ways) {
      r.Fill(shape.block * shape.count);
      std::vector<double> t;
      for (int k = 0; k < absl::GetFlag(FLAGS_rounds) + 1; ++k) {
        auto s = r.Once(way, shape, si, di, chunk, threads);
        if (!s.has_value()) return std::fprintf(stderr, "%s: MPI failed\n", way.c_str()), 1;
        if (k > 0) t.push_back(*s);  // The first warms up.
      }
      // Contiguous moves bytes as they lie; every other way must have put each block
      // where its id says.
      if (r.rank() == 1 && way != "contiguous" && !r.Check(shape, si, di)) {
        std::fprintf(stderr, "WRONG BYTES: %s, %zu x %llu\n", way.c_str(), shape.count,
                     static_cast<unsigned long long>(shape.block));
        return 1;
      }
      gbs.push_back(static_cast<double>(shape.block * shape.count) / Median(t) / 1e9);
    }
    (void)(*mpi)->Allgather("");  // The receiver checked before rank 0 prints.
    if (r.rank() == 0) {
      // Ratios to three significant figures: some are far below 0.01.
      std::printf("%-18s %12.2f %12.2f %12.2f %12s %10.3g %10.3g %10s\n",
                  absl::StrCat(shape.count, " x ", shape.block >> 10, " KiB").c_str(), gbs[0],
                  gbs[1], gbs[2], device ? "" : absl::StrFormat("%.2f", gbs[3]).c_str(),
                  gbs[1] / gbs[0], gbs[2] / gbs[0],
                  device ? "" : absl::StrFormat("%.3g", gbs[3] / gbs[0]).c_str());
      std::fflush(stdout);
    }
  }
  if (r.rank() == 0) {
    std::printf("GB/s, medians of %d rounds; %s messages; packed: %d copy threads a side; %s\n",
                absl::GetFlag(FLAGS_rounds), FormatBytes(chunk).c_str(), threads,
                (*mpi)->world().library.c_str());
  }
  return 0;
}

int Main(const char* self) {
  if (absl::GetFlag(FLAGS_child)) return Child();
  std::optional<MpiLaunch> launch;
  if (absl::GetFlag(FLAGS_mpi) == "default") launch = MpiLaunch{"default", {}, {}};
  for (const MpiLaunch& l : MpiLaunches()) {
    if (l.name == absl::GetFlag(FLAGS_mpi)) launch = l;
  }
  if (!launch) return std::printf("no MPI launch %s here\n", absl::GetFlag(FLAGS_mpi).c_str()), 1;
  std::vector<std::string> cmd = MpiLauncher(2);
  cmd.insert(cmd.end(), launch->mpi_args.begin(), launch->mpi_args.end());
  cmd.push_back(self);
  cmd.push_back("--child");
  cmd.push_back(absl::StrCat("--rounds=", absl::GetFlag(FLAGS_rounds)));
  cmd.push_back(absl::StrCat("--chunk=", absl::GetFlag(FLAGS_chunk).bytes));
  cmd.push_back(absl::StrCat("--threads=", absl::GetFlag(FLAGS_threads)));
  cmd.push_back(absl::StrCat("--max_blocks=", absl::GetFlag(FLAGS_max_blocks)));
  if (absl::GetFlag(FLAGS_device)) cmd.push_back("--device");
  std::printf("vectored MPI without a daemon, launch %s, rank 0 -> rank 1\n", launch->name.c_str());
  std::fflush(stdout);
  return std::system(absl::StrJoin(cmd, " ").c_str()) == 0 ? 0 : 1;
}

}  // namespace
}  // namespace gpumove

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  char self[4096] = {};
  if (readlink("/proc/self/exe", self, sizeof(self) - 1) <= 0) return 1;
  return gpumove::Main(self);
}
