// The C++ client's side of the Python client benchmark (client/python/bench.py): against a
// running daemon at --addr, the median time of --small_moves 4 KiB moves (Submit with
// wait, one at a time) and the throughput of --big_moves moves of --big_size, all between
// two buffers of its own on that node (--kind memory), one "key value" line each:
//   small_p50_us 152.3
//   big_gbps 21.7
//   write_gbps 2.1
//   read_gbps 2.4
// (the last two: --big_size bytes written into and read out of the buffer through the client).
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "client/gpumove_client.h"
#include "daemon/common/bytes.h"

ABSL_FLAG(std::string, addr, "127.0.0.1:7470", "The daemon.");
ABSL_FLAG(int, small_moves, 2000, "4 KiB moves timed.");
ABSL_FLAG(gpumove::ByteSize, big_size, gpumove::ByteSize{256ull << 20}, "Bytes per big move.");
ABSL_FLAG(int, big_moves, 5, "Big moves timed.");
ABSL_FLAG(std::string, kind, "host", "host | pinned | device (GPU 0).");

namespace gpumove {
namespace {

int Main() {
  auto c = Client::Connect(absl::GetFlag(FLAGS_addr));
  if (!c.ok()) return std::fprintf(stderr, "%s\n", c.status().ToString().c_str()), 1;
  const std::string kind = absl::GetFlag(FLAGS_kind);
  const v1::MemoryKind k = kind == "device" ? v1::DEVICE : kind == "pinned" ? v1::PINNED_HOST
                                                                             : v1::HOST;
  const uint64_t big = absl::GetFlag(FLAGS_big_size).bytes;
  auto src = (*c)->Allocate(big, k);
  auto dst = (*c)->Allocate(big, k);
  if (!src.ok() || !dst.ok()) return std::fprintf(stderr, "allocation failed\n"), 1;
  std::vector<double> us;
  for (int i = -50; i < absl::GetFlag(FLAGS_small_moves); ++i) {
    const absl::Time t0 = absl::Now();
    auto t = (*c)->Move(Ref(src->id(), 0, 4096), Ref(dst->id()));
    if (!t.ok() || t->state() != v1::SUCCEEDED) return std::fprintf(stderr, "move failed\n"), 1;
    if (i >= 0) us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
  }
  std::sort(us.begin(), us.end());
  std::printf("small_p50_us %.1f\n", us[us.size() / 2]);
  std::vector<double> gbps;
  for (int i = -1; i < absl::GetFlag(FLAGS_big_moves); ++i) {
    const absl::Time t0 = absl::Now();
    auto t = (*c)->Move(Ref(src->id()), Ref(dst->id()));
    if (!t.ok() || t->state() != v1::SUCCEEDED) return std::fprintf(stderr, "move failed\n"), 1;
    if (i >= 0) gbps.push_back(big / absl::ToDoubleSeconds(absl::Now() - t0) / 1e9);
  }
  std::sort(gbps.begin(), gbps.end());
  std::printf("big_gbps %.2f\n", gbps[gbps.size() / 2]);
  const std::string bytes(big, 'x');
  std::vector<double> wr, rd;
  for (int i = 0; i < 3; ++i) {
    absl::Time t0 = absl::Now();
    if (!(*c)->Write(Ref(src->id()), bytes).ok()) return std::fprintf(stderr, "write failed\n"), 1;
    wr.push_back(big / absl::ToDoubleSeconds(absl::Now() - t0) / 1e9);
    t0 = absl::Now();
    auto back = (*c)->Read(Ref(src->id()));
    if (!back.ok() || back->size() != big) return std::fprintf(stderr, "read failed\n"), 1;
    rd.push_back(big / absl::ToDoubleSeconds(absl::Now() - t0) / 1e9);
  }
  std::sort(wr.begin(), wr.end());
  std::sort(rd.begin(), rd.end());
  std::printf("write_gbps %.2f\nread_gbps %.2f\n", wr[1], rd[1]);
  (void)(*c)->Release(src->id());
  (void)(*c)->Release(dst->id());
  return 0;
}

}  // namespace
}  // namespace gpumove

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return gpumove::Main();
}
