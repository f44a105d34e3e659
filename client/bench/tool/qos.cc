// `gpumove-bench qos` (issue 56): priority classes and tenants' weights on one daemon that
// this tool starts with three tenants (a token each; weights a=3, b=1, c=1):
//   - latency: tenant b's p99 submit-to-end of small latency-class moves while tenant a
//     keeps --qos_bulk_streams bulk moves in flight, against b's p99 on the idle daemon
//     (aim: at most 2x), beside b's moves in the normal class under the same load, and
//     b's moves waiting in their Submit (a small one then runs in the caller's thread);
//   - shares: tenants a (weight 3) and c (weight 1) both keep bulk moves in flight for
//     --qos_window; the bytes each moved, as a:c against the weights' 3 (aim: within 10%);
//   - throughput: a's and c's bytes per second in that window against the same load on a
//     second daemon without weights, all moves in the normal class (aim: at least 0.95);
//   - starvation: a's bulk bytes per second while b floods latency moves (context).
// Small moves are submitted without waiting and then waited for, so that they go through
// the queue the classes order (a lone small move with wait runs at once in the caller's
// thread, whatever the load).
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/bench/tool/bench.h"
#include "daemon/common/bytes.h"

ABSL_FLAG(gpumove::ByteSize, qos_bulk_size, gpumove::ByteSize{16ull << 20},
          "qos: each bulk move's size.");
ABSL_FLAG(gpumove::ByteSize, qos_small_size, gpumove::ByteSize{4096},
          "qos: each latency move's size.");
ABSL_FLAG(int, qos_bulk_streams, 6, "qos: bulk moves a tenant keeps in flight.");
ABSL_FLAG(absl::Duration, qos_window, absl::Seconds(10),
          "qos: how long two tenants both saturate the daemon for the share figures.");

namespace gpumove::bench {
namespace {

struct Tenant {
  std::string name;
  std::unique_ptr<Client> client;
  std::string src, dst;  // Buffers of streams x size each.
};

// A tenant's bulk moves, `streams` in flight (each over its own slice, so that none waits
// for another's range), until stopped; bytes that landed are counted while `counting`.
class BulkLoad {
 public:
  BulkLoad(Tenant& t, int streams, uint64_t size, v1::Priority p) {
    for (int s = 0; s < streams; ++s) {
      threads_.emplace_back([this, &t, s, size, p] {
        MoveOptions o;
        o.wait = false;
        o.priority = p;
        while (!stop_.load()) {
          auto m = t.client->Move(Ref(t.src, s * size, size), Ref(t.dst, s * size), o);
          if (m.ok() && m->state() != v1::SUCCEEDED) m = t.client->Wait(m->id(), absl::Seconds(60));
          if (!m.ok() || m->state() != v1::SUCCEEDED) {
            failed_.store(true);
            return;
          }
          if (counting_.load()) bytes_.fetch_add(size);
        }
      });
    }
  }
  ~BulkLoad() { Stop(); }
  void Count(bool on) { counting_.store(on); }
  uint64_t bytes() const { return bytes_.load(); }
  bool failed() const { return failed_.load(); }
  void Stop() {
    stop_.store(true);
    for (auto& th : threads_) th.join();
    threads_.clear();
  }

 private:
  std::atomic<bool> stop_{false}, counting_{false}, failed_{false};
  std::atomic<uint64_t> bytes_{0};
  std::vector<std::thread> threads_;
};

// Tenant b's small moves one after another for `seconds`: the 50th and 99th percentile of
// submit-to-end in microseconds.
absl::StatusOr<std::pair<double, double>> SmallLatency(Tenant& b, uint64_t size, v1::Priority p,
                                                       bool wait, double seconds) {
  MoveOptions o;
  o.wait = wait;
  o.priority = p;
  std::vector<double> us;
  const absl::Time end = absl::Now() + absl::Seconds(seconds);
  while ((us.size() < 100 || absl::Now() < end) && us.size() < 200000) {
    const absl::Time t0 = absl::Now();
    auto m = b.client->Move(Ref(b.src, 0, size), Ref(b.dst), o);
    if (m.ok() && m->state() != v1::SUCCEEDED) m = b.client->Wait(m->id(), absl::Seconds(60));
    if (!m.ok()) return m.status();
    if (m->state() != v1::SUCCEEDED) return absl::InternalError(m->error_message());
    us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
  }
  std::sort(us.begin(), us.end());
  return std::make_pair(us[us.size() / 2], us[std::min(us.size() - 1, us.size() * 99 / 100)]);
}

// The daemon's token and weights files in a directory of their own (removed by the caller).
absl::StatusOr<std::string> WriteFiles(const std::string& dir, bool weights) {
  std::ofstream tokens(dir + "/tokens");
  tokens << "token-a,alice,a,user\ntoken-b,bob,b,user\ntoken-c,carol,c,user\n";
  if (!tokens) return absl::InternalError("cannot write the token file");
  if (!weights) return std::string();
  std::ofstream w(dir + "/weights");
  w << "a 3\nb 1\nc 1\n";
  if (!w) return absl::InternalError("cannot write the weights file");
  return dir + "/weights";
}

struct Cluster {
  std::vector<std::unique_ptr<DaemonProcess>> own;
  Tenant a, b, c;
};

absl::Status Open(Tenant& t, const std::string& address, const std::string& name,
                  uint64_t each) {
  ConnectOptions co;
  co.token = "token-" + name;
  auto client = Client::Connect(address, co);
  if (!client.ok()) return client.status();
  t.name = name;
  t.client = *std::move(client);
  auto src = t.client->Allocate(each);
  auto dst = t.client->Allocate(each);
  if (!src.ok()) return src.status();
  if (!dst.ok()) return dst.status();
  t.src = src->id();
  t.dst = dst->id();
  return absl::OkStatus();
}

absl::Status Start(const Context& ctx, const std::string& dir, bool weights, uint64_t each,
                   Cluster& cl, Run* run) {
  auto w = WriteFiles(dir, weights);
  if (!w.ok()) return w.status();
  std::vector<std::string> flags = {absl::StrCat("--host_pool_size=", 6 * each + (64 << 20)),
                                    "--pinned_pool_size=0", "--device_pool_size=0",
                                    "--node=bench", "--auth_tokens=" + dir + "/tokens"};
  if (weights) flags.push_back("--tenant_weights=" + *w);
  auto address = ctx.Daemon(flags, cl.own);
  if (!address.ok()) return address.status();
  for (auto [t, name] : {std::pair<Tenant*, const char*>{&cl.a, "a"}, {&cl.b, "b"}, {&cl.c, "c"}}) {
    if (absl::Status st = Open(*t, *address, name, each); !st.ok()) return st;
  }
  if (run != nullptr) {
    auto info = cl.a.client->GetInfo();
    if (!info.ok()) return info.status();
    run->SetDaemon(*info);
  }
  return absl::OkStatus();
}

// Tenants a and c both saturating `cl`'s daemon for `window`: their bytes.
absl::StatusOr<std::pair<uint64_t, uint64_t>> Shares(Cluster& cl, int streams, uint64_t size,
                                                     v1::Priority p, absl::Duration window) {
  BulkLoad a(cl.a, streams, size, p), c(cl.c, streams, size, p);
  absl::SleepFor(std::min(window / 4, absl::Seconds(1)));  // Both queues full first.
  a.Count(true);
  c.Count(true);
  absl::SleepFor(window);
  a.Count(false);
  c.Count(false);
  a.Stop();
  c.Stop();
  if (a.failed() || c.failed()) return absl::InternalError("a bulk move failed");
  return std::make_pair(a.bytes(), c.bytes());
}

absl::Status RunQos(const Context& ctx, Run& run) {
  const uint64_t bulk = absl::GetFlag(FLAGS_qos_bulk_size).bytes;
  const uint64_t small = absl::GetFlag(FLAGS_qos_small_size).bytes;
  const int streams = absl::GetFlag(FLAGS_qos_bulk_streams);
  const absl::Duration window = absl::GetFlag(FLAGS_qos_window);
  if (bulk == 0 || bulk > (1ull << 30) || small == 0 || small > bulk || streams < 1 ||
      streams > 64 || window < absl::Milliseconds(50) || window > absl::Minutes(5)) {
    return absl::InvalidArgumentError(
        "--qos_bulk_size 1 B to 1 GiB, --qos_small_size up to it, --qos_bulk_streams 1 to 64, "
        "--qos_window 50ms to 5m");
  }
  if (!ctx.addr.empty()) {
    return absl::InvalidArgumentError("qos starts its own daemons (tokens and weights of its own)");
  }
  run.SetFlag("qos_bulk_size", FormatBytes(bulk));
  run.SetFlag("qos_small_size", FormatBytes(small));
  run.SetFlag("qos_bulk_streams", absl::StrCat(streams));
  run.SetFlag("qos_window", absl::FormatDuration(window));
  char tmpl[] = "/tmp/gpumove-bench-qos.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return absl::InternalError("mkdtemp");
  const std::string dir = tmpl;
  const std::string dir2 = dir + "/plain";
  mkdir(dir2.c_str(), 0700);
  const uint64_t each = streams * bulk;
  Cluster weighted, plain;
  absl::Status st = Start(ctx, dir, true, each, weighted, &run);
  if (st.ok()) st = Start(ctx, dir2, false, each, plain, nullptr);
  if (!st.ok()) return st;

  // Latency, in microseconds (lower is better): the idle figure is the baseline.
  run.AddSeries("b p99 under bulk", false, "us", false, "b p99 idle");
  run.AddSeries("b p99 idle", true, "us", false);
  run.AddContext("b p99 under bulk, normal class", "us", false);
  run.AddContext("b p99 under bulk, Submit waits", "us", false);
  run.AddContext("b p50 under bulk", "us", false);
  // Shares (a:c bytes against the weights' 3) and throughput (with classes and weights
  // against none), each its own point (concurrency 2: two tenants).
  run.AddSeries("a:c bytes", false, "ratio", true, "a:c weights");
  run.AddSeries("a:c weights", true, "ratio", true);
  run.AddSeries("a+c GB/s, weighted bulk", false, "GB/s", true, "a+c GB/s, plain normal");
  run.AddSeries("a+c GB/s, plain normal", true, "GB/s", true);
  run.AddContext("a bulk GB/s under a latency flood", "GB/s", true);
  const double secs = ctx.seconds;
  for (int r = 0; r < ctx.rounds; ++r) {
    auto idle = SmallLatency(weighted.b, small, v1::LATENCY, false, secs);
    if (!idle.ok()) return idle.status();
    run.Add("b p99 idle", small, 1, idle->second);
    {
      BulkLoad load(weighted.a, streams, bulk, v1::BULK);
      absl::SleepFor(absl::Milliseconds(100));
      auto hot = SmallLatency(weighted.b, small, v1::LATENCY, false, secs);
      auto normal = SmallLatency(weighted.b, small, v1::NORMAL, false, secs);
      auto waits = SmallLatency(weighted.b, small, v1::LATENCY, true, secs);
      load.Stop();
      if (load.failed()) return absl::InternalError("a bulk move failed");
      for (const auto* s : {&hot, &normal, &waits}) {
        if (!s->ok()) return s->status();
      }
      run.Add("b p99 under bulk", small, 1, hot->second);
      run.Add("b p50 under bulk", small, 1, hot->first);
      run.Add("b p99 under bulk, normal class", small, 1, normal->second);
      run.Add("b p99 under bulk, Submit waits", small, 1, waits->second);
    }
    // In turns: which daemon goes first alternates by round.
    for (int side = 0; side < 2; ++side) {
      const bool weights = (side == 0) == (r % 2 == 0);
      Cluster& cl = weights ? weighted : plain;
      auto got = Shares(cl, streams, bulk, weights ? v1::BULK : v1::NORMAL,
                        window);
      if (!got.ok()) return got.status();
      const double gbs = (got->first + got->second) / absl::ToDoubleSeconds(window) / 1e9;
      run.Add(weights ? "a+c GB/s, weighted bulk" : "a+c GB/s, plain normal", bulk, 2, gbs);
      if (weights) {
        run.Add("a:c bytes", bulk, 2,
                got->second == 0 ? 0.0 : static_cast<double>(got->first) / got->second);
        run.Add("a:c weights", bulk, 2, 3.0);
      }
    }
    // Starvation: a's bulk moves while b keeps 2x --copy_threads' latency moves queued.
    {
      BulkLoad a(weighted.a, streams, bulk, v1::BULK);
      std::atomic<bool> stop{false}, flood_failed{false};
      std::vector<std::thread> flood;
      for (int f = 0; f < 8; ++f) {
        flood.emplace_back([&] {
          MoveOptions o;
          o.wait = false;
          o.priority = v1::LATENCY;
          while (!stop.load()) {
            auto m = weighted.b.client->Move(Ref(weighted.b.src, 0, small), Ref(weighted.b.dst), o);
            if (m.ok() && m->state() != v1::SUCCEEDED) m = weighted.b.client->Wait(m->id());
            if (!m.ok() || m->state() != v1::SUCCEEDED) {
              flood_failed.store(true);
              return;
            }
          }
        });
      }
      absl::SleepFor(absl::Milliseconds(100));
      a.Count(true);
      absl::SleepFor(absl::Seconds(secs));
      a.Count(false);
      stop.store(true);
      for (auto& th : flood) th.join();
      a.Stop();
      if (a.failed() || flood_failed.load()) return absl::InternalError("a move failed");
      run.Add("a bulk GB/s under a latency flood", bulk, 1, a.bytes() / secs / 1e9);
    }
  }
  std::remove((dir + "/tokens").c_str());
  std::remove((dir + "/weights").c_str());
  std::remove((dir2 + "/tokens").c_str());
  rmdir(dir2.c_str());
  rmdir(dir.c_str());
  return absl::OkStatus();
}

}  // namespace

Subcommand QosSubcommand() {
  return {"qos",
          "classes and tenants' weights: a latency move's p99 under another tenant's bulk "
          "load, 3:1 shares, throughput against no classes",
          RunQos};
}

}  // namespace gpumove::bench
