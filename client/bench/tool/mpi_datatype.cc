// `gpumove-bench mpi_datatype`: vectored MPI without a daemon. Two ranks of one MPI job of
// this tool (`mpi_datatype_rank`, --mpi_launch) move shuffled blocks (--vec_shapes,
// different block ids on each side) each way below, against the same bytes moved
// contiguous, so that gpumove's MPI engine can use the faster one (issue 26: "a derived
// datatype or packed pieces, whichever measures faster"):
//   contiguous  (baseline) the bytes as one range in --mpi_chunk messages, four in flight;
//   datatype    one message whose MPI datatype lists every block (hindexed_block of bytes,
//               each side its own), MPI packing and unpacking it as it likes;
//   dt/chunk    the blocks in groups of --mpi_chunk bytes, a derived-datatype message
//               each, four in flight (MPI can pipeline groups);
//   packed      the blocks gathered into --mpi_chunk slots by --dt_threads copy threads,
//               the slots sent (two in flight) and scattered on the other side by as many
//               threads (what gpumove's MPI engine does with host memory); not with
//               --mpi_device.
// GB/s timed from both ranks' start to the receiver's last byte, the ways in turns each
// round; in the first round the receiver checks every way's bytes (each 8-byte word of
// the sender carries its own offset). --mpi_device: GPU memory on both ranks, handed to MPI
// as it is (a CUDA-aware MPI; SKIPPED otherwise, or without a GPU).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <numeric>
#include <optional>

#include "absl/flags/declare.h"
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
#include "daemon/common/segment.h"
#include "daemon/core/segments.h"
#include "daemon/gpu/gpu.h"
#include "daemon/path/mpi/mpi_transport.h"

ABSL_FLAG(int, dt_threads, 4, "mpi_datatype: copy threads a side for the packed way.");
ABSL_DECLARE_FLAG(std::string, mpi_launch);               // vectored.cc
ABSL_DECLARE_FLAG(bool, mpi_device);                      // vectored.cc
ABSL_DECLARE_FLAG(std::vector<std::string>, vec_shapes);  // vectored.cc
ABSL_DECLARE_FLAG(gpumove::ByteSize, mpi_chunk);          // mpi.cc
ABSL_DECLARE_FLAG(int, rounds);                           // main.cc
ABSL_DECLARE_FLAG(double, seconds);                       // main.cc

namespace gpumove::bench {
namespace {

using Ops = std::deque<std::shared_ptr<MpiTransport::Op>>;

class Rank {
 public:
  Rank(MpiTransport* mpi, char* data, GpuRuntime* gpu, int device, uint64_t chunk, int threads)
      : mpi_(mpi), data_(data), gpu_(gpu), device_(device), chunk_(chunk), threads_(threads) {}
  int rank() const { return mpi_->world().rank; }

  // One move of `way`: seconds from both ranks' start to the receiver's last byte (nullopt
  // when MPI failed). The sender is rank 0.
  std::optional<double> Once(const std::string& way, const Shape& shape,
                             const std::vector<uint64_t>& si, const std::vector<uint64_t>& di) {
    const std::vector<uint64_t>& ids = rank() == 0 ? si : di;
    (void)mpi_->Allgather("");  // Both ranks start together.
    const absl::Time t0 = absl::Now();
    ok_ = true;
    if (way == "contiguous") {
      Contiguous(shape.block * shape.count);
    } else if (way == "datatype" || way == "dt/chunk") {
      Datatype(shape, ids,
               way == "datatype" ? shape.count : std::max<size_t>(1, chunk_ / shape.block));
    } else {
      Packed(shape, ids);
    }
    // The receiver's completion is the end: it tells rank 0 with a zero-byte message.
    const int peer = 1 - rank();
    Wait(rank() == 0 ? mpi_->Irecv(nullptr, 0, peer, 8) : mpi_->Isend(nullptr, 0, peer, 8));
    if (!ok_) return std::nullopt;
    return absl::ToDoubleSeconds(absl::Now() - t0);
  }

  // Whether rank 0 wants another move (both ranks take its word: the same count).
  bool More(bool mine) {
    auto all = mpi_->Allgather(mine ? "1" : "0");
    return all.ok() && !all->empty() && (*all)[0] == "1";
  }

  // Sender: each 8-byte word holds its own offset. Receiver: zeros.
  void Fill(uint64_t total) {
    std::vector<uint64_t> words(total / 8, 0);
    if (rank() == 0) std::iota(words.begin(), words.end(), 0);
    for (uint64_t& w : words) w *= 8;
    if (gpu_ == nullptr) {
      std::memcpy(data_, words.data(), total);
    } else {
      (void)gpu_->Copy(data_, device_, words.data(), kHostDevice, total, 0, nullptr);
    }
  }
  // Receiver: whether every block landed where its id says, from where the sender's says.
  bool Check(const Shape& shape, const std::vector<uint64_t>& si, const std::vector<uint64_t>& di) {
    std::vector<uint64_t> words(shape.block * shape.count / 8);
    if (gpu_ == nullptr) {
      std::memcpy(words.data(), data_, shape.block * shape.count);
    } else {
      (void)gpu_->Copy(words.data(), kHostDevice, data_, device_, shape.block * shape.count, 0,
                       nullptr);
    }
    for (size_t i = 0; i < shape.count; ++i) {
      const uint64_t* b = words.data() + di[i] * shape.block / 8;
      for (uint64_t j = 0; j < shape.block / 8; ++j) {
        if (b[j] != si[i] * shape.block + 8 * j) return false;
      }
    }
    return true;
  }

 private:
  void Wait(const std::shared_ptr<MpiTransport::Op>& op) {
    if (!mpi_->Wait(op).ok()) ok_ = false;
  }

  void Contiguous(uint64_t total) {
    const bool send = rank() == 0;
    const int peer = 1 - rank();
    Ops window;
    for (uint64_t off = 0; off < total || !window.empty();) {
      while (off < total && window.size() < 4) {
        const uint64_t n = std::min(chunk_, total - off);
        window.push_back(send ? mpi_->Isend(data_ + off, n, peer, 7)
                              : mpi_->Irecv(data_ + off, n, peer, 7));
        off += n;
      }
      Wait(window.front());
      window.pop_front();
    }
  }

  // The blocks in messages of `per` blocks each, a derived datatype each, four in flight.
  void Datatype(const Shape& shape, const std::vector<uint64_t>& ids, size_t per) {
    const bool send = rank() == 0;
    const int peer = 1 - rank();
    Ops window;
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
      Wait(window.front());
      window.pop_front();
    }
  }

  // Gathered into two slots of `chunk` bytes, sent, scattered on the other side.
  void Packed(const Shape& shape, const std::vector<uint64_t>& ids) {
    const bool send = rank() == 0;
    const int peer = 1 - rank();
    const size_t per = std::max<size_t>(1, chunk_ / shape.block);
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
                 (end - at) * shape.block, threads_);
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
      Wait(op);
      if (!send && ok_) copy(group, /*pack=*/false);
    }
  }

  MpiTransport* mpi_;
  char* data_;
  GpuRuntime* gpu_;
  int device_;
  uint64_t chunk_;
  int threads_;
  bool ok_ = true;
  std::vector<char> slots_;
};

// GB/s of `way` at `shape`: the median of moves for --seconds (at least 3 after one to
// warm, at most 1000, rank 0 deciding); nullopt when MPI failed.
std::optional<double> Measure(Rank& r, const std::string& way, const Shape& shape,
                              const std::vector<uint64_t>& si, const std::vector<uint64_t>& di) {
  std::vector<double> t;
  const absl::Time end = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_seconds));
  for (int k = 0; k < 1001; ++k) {
    auto s = r.Once(way, shape, si, di);
    if (!s.has_value()) return std::nullopt;
    if (k > 0) t.push_back(*s);  // The first warms up.
    if (!r.More(t.size() < 3 || absl::Now() < end)) break;
  }
  return static_cast<double>(shape.block * shape.count) / Median(t) / 1e9;
}

// A rank of the job: rank 0 prints "way<TAB>bytes<TAB>GB/s" a sample, "library<TAB>..."
// once, or "SKIPPED: why".
int DatatypeRank() {
  auto shapes = VecShapes();
  if (!shapes.ok()) return std::fprintf(stderr, "%s\n", shapes.status().ToString().c_str()), 2;
  auto mpi = MpiTransport::Start({});
  if (!mpi.ok()) return std::fprintf(stderr, "%s\n", mpi.status().ToString().c_str()), 1;
  const bool device = absl::GetFlag(FLAGS_mpi_device);
  const int rank = (*mpi)->world().rank;
  uint64_t max_bytes = 0;
  for (const Shape& s : *shapes) max_bytes = std::max(max_bytes, s.block * s.count);
  std::vector<char> host;
  std::unique_ptr<GpuRuntime> gpu;
  char* data = nullptr;
  int dev = kHostDevice;
  if (device) {
    gpu = GpuRuntime::Create();
    const char* why = !(*mpi)->world().cuda_aware ? "--mpi_device needs a CUDA-aware MPI"
                      : gpu->devices().empty()    ? "--mpi_device: no GPU here"
                                                  : nullptr;
    if (why != nullptr) {
      if (rank == 0) std::printf("SKIPPED: %s\n", why);
      return 0;
    }
    dev = rank == 0 ? 0 : static_cast<int>(gpu->devices().size()) - 1;
    auto d = gpu->DeviceAlloc(dev, max_bytes);
    if (!d.ok()) return std::fprintf(stderr, "%s\n", d.status().ToString().c_str()), 1;
    data = static_cast<char*>(*d);
  } else {
    host.resize(max_bytes);
    data = host.data();
  }
  Rank r(mpi->get(), data, gpu.get(), dev, absl::GetFlag(FLAGS_mpi_chunk).bytes,
         absl::GetFlag(FLAGS_dt_threads));
  std::vector<std::string> ways = {"contiguous", "datatype", "dt/chunk"};
  if (!device) ways.push_back("packed");
  if (rank == 0) std::printf("library\t%s\n", (*mpi)->world().library.c_str());
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    for (const Shape& shape : *shapes) {
      std::vector<uint64_t> si, di;
      Shuffle(shape.count, shape.block, &si, &di);
      for (size_t i = 0; i < ways.size(); ++i) {
        const std::string& way = ways[round % 2 == 0 ? i : ways.size() - 1 - i];
        r.Fill(shape.block * shape.count);
        auto gbps = Measure(r, way, shape, si, di);
        if (!gbps.has_value()) return std::fprintf(stderr, "%s: MPI failed\n", way.c_str()), 1;
        // Contiguous moves bytes as they lie; every other way must have put each block
        // where its id says.
        if (round == 0 && rank == 1 && way != "contiguous" && !r.Check(shape, si, di)) {
          std::fprintf(stderr, "WRONG BYTES: %s, %zu x %llu\n", way.c_str(), shape.count,
                       static_cast<unsigned long long>(shape.block));
          return 1;
        }
        if (rank == 0) {
          std::printf("%s\t%llu\t%.9g\n", way.c_str(),
                      static_cast<unsigned long long>(shape.block * shape.count), *gbps);
          std::fflush(stdout);
        }
      }
    }
  }
  return 0;
}

absl::Status RunDatatype(const Context& ctx, Run& run) {
  auto shapes = VecShapes();
  if (!shapes.ok()) return shapes.status();
  for (const Shape& s : *shapes) {
    if (s.block * s.count > (1ull << 30)) {
      return absl::InvalidArgumentError("mpi_datatype: a --vec_shapes shape of at most 1 GiB");
    }
  }
  const uint64_t chunk = absl::GetFlag(FLAGS_mpi_chunk).bytes;
  const int threads = absl::GetFlag(FLAGS_dt_threads);
  if (chunk == 0 || chunk > (1ull << 30) || threads < 1 || threads > 64) {
    return absl::InvalidArgumentError("--mpi_chunk must be 1 B to 1 GiB, --dt_threads 1 to 64");
  }
  if (!ctx.addr.empty()) return absl::InvalidArgumentError("mpi_datatype runs no daemon");
  auto launch = LaunchNamed(absl::GetFlag(FLAGS_mpi_launch));
  if (!launch.ok()) return launch.status();
  const bool device = absl::GetFlag(FLAGS_mpi_device);
  run.SetFlag("mpi_launch", launch->name);
  run.SetFlag("mpi_flavor", MpiFlavor());
  run.SetFlag("vec_shapes", absl::StrJoin(absl::GetFlag(FLAGS_vec_shapes), ","));
  run.SetFlag("mpi_chunk", FormatBytes(chunk));
  run.SetFlag("dt_threads", absl::StrCat(threads));
  run.SetFlag("mpi_device", device ? "true" : "false");
  run.AddSeries("datatype", false, "GB/s", true);
  run.AddSeries("dt/chunk", false, "GB/s", true);
  if (!device) run.AddSeries("packed", false, "GB/s", true);
  run.AddSeries("contiguous", true, "GB/s", true);
  std::vector<std::string> flags = {
      absl::StrCat("--rounds=", ctx.rounds), absl::StrCat("--seconds=", ctx.seconds),
      absl::StrCat("--vec_shapes=", absl::StrJoin(absl::GetFlag(FLAGS_vec_shapes), ",")),
      absl::StrCat("--mpi_chunk=", chunk), absl::StrCat("--dt_threads=", threads)};
  if (device) flags.push_back("--mpi_device");
  auto cmd = RankJobCommand(*launch, "mpi_datatype_rank", flags);
  if (!cmd.ok()) return cmd.status();
  const std::string out = Capture(absl::StrCat("timeout 1800 ", *cmd, " 2>&1; echo rc=$?"));
  std::string failure;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    std::vector<std::string> f = absl::StrSplit(line, '\t');
    uint64_t bytes = 0;
    double v = 0;
    if (absl::StartsWith(line, "SKIPPED: ")) {
      run.Skip(std::string(line.substr(9)));
    } else if (f.size() == 2 && f[0] == "library") {
      run.SetFlag("mpi_library", f[1]);
    } else if (f.size() == 3 && absl::SimpleAtoi(f[1], &bytes) && absl::SimpleAtod(f[2], &v)) {
      run.Add(f[0], bytes, 1, v);
    } else if (!absl::StartsWith(line, "rc=") && failure.size() < 4000) {
      absl::StrAppend(&failure, line, "\n");
    }
  }
  if (out.find("rc=0") == std::string::npos) {
    return absl::InternalError(absl::StrCat("the MPI job failed: ", *cmd, "\n", failure));
  }
  return absl::OkStatus();
}

}  // namespace

Subcommand MpiDatatypeSubcommand() {
  return {"mpi_datatype",
          "vectored MPI without a daemon: derived datatypes and packing against the bytes "
          "contiguous",
          RunDatatype};
}

RankChild MpiDatatypeRank() { return {"mpi_datatype_rank", DatatypeRank}; }

}  // namespace gpumove::bench
