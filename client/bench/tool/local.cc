// `gpumove-bench local`: host -> host LOCAL moves through the daemon (one Submit with wait
// per move) against memcpy of the same size in this process, sizes --min_size ...
// --max_size by 4.
#include <sys/mman.h>

#include <cstring>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "client/bench/tool/bench.h"
#include "daemon/common/bytes.h"

ABSL_FLAG(gpumove::ByteSize, min_size, gpumove::ByteSize{4096}, "local: smallest move.");
ABSL_FLAG(gpumove::ByteSize, max_size, gpumove::ByteSize{64ull << 20}, "local: largest move.");

namespace gpumove::bench {
namespace {

char* Mapped(uint64_t size, int fill) {
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                 -1, 0);
  if (p == MAP_FAILED) return nullptr;
  std::memset(p, fill, size);
  return static_cast<char*>(p);
}

absl::Status RunLocal(const Context& ctx, Run& run) {
  const uint64_t min_size = absl::GetFlag(FLAGS_min_size).bytes;
  const uint64_t max_size = absl::GetFlag(FLAGS_max_size).bytes;
  if (min_size == 0 || min_size > max_size) {
    return absl::InvalidArgumentError("--min_size must be > 0 and at most --max_size");
  }
  run.SetFlag("min_size", FormatBytes(min_size));
  run.SetFlag("max_size", FormatBytes(max_size));
  std::vector<std::unique_ptr<DaemonProcess>> own;
  auto d = ctx.Connect({absl::StrCat("--host_pool_size=", 2 * max_size + (64 << 20)),
                        "--pinned_pool_size=0", "--device_pool_size=0", "--node=bench"},
                       own, run);
  if (!d.ok()) return d.status();
  Client* client = d->client.get();
  auto src = client->Allocate(max_size, v1::HOST);
  if (!src.ok()) return src.status();
  auto dst = client->Allocate(max_size, v1::HOST);
  if (!dst.ok()) return dst.status();
  char* raw_src = Mapped(max_size, 1);
  char* raw_dst = Mapped(max_size, 2);
  if (raw_src == nullptr || raw_dst == nullptr) return absl::ResourceExhaustedError("mmap");
  run.AddSeries("gpumove", false, "GB/s", true);
  run.AddSeries("memcpy", true, "GB/s", true);
  absl::Status failed;
  for (int r = 0; r < ctx.rounds; ++r) {
    for (uint64_t size = min_size; size <= max_size; size *= 4) {
      auto move = [&] {
        auto t = client->Move(Ref(src->id(), 0, size), Ref(dst->id()));
        if (!t.ok())
          failed = t.status();
        else if (t->state() != v1::SUCCEEDED)
          failed = absl::InternalError(t->error_message());
      };
      auto copy = [&] { std::memcpy(raw_dst, raw_src, size); };
      // In turns: which side goes first alternates by round.
      for (int side = 0; side < 2; ++side) {
        const bool ours = (side == 0) == (r % 2 == 0);
        const double s = MedianSeconds(ours ? std::function<void()>(move) : copy, ctx.seconds);
        if (!failed.ok()) return failed;
        run.Add(ours ? "gpumove" : "memcpy", size, 1, size / s / 1e9);
      }
      if (size > max_size / 4) break;  // No overflow past the largest.
    }
  }
  munmap(raw_src, max_size);
  munmap(raw_dst, max_size);
  return absl::OkStatus();
}

}  // namespace

Subcommand LocalSubcommand() {
  return {"local", "host -> host LOCAL moves (Submit with wait) against memcpy", RunLocal};
}

}  // namespace gpumove::bench
