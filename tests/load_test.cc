// Load on a three-node cluster on loopback: many concurrent clients, each making many moves
// of random sizes (1 B to 4 MiB) in random directions — pushes, pulls and third-party
// moves, LOCAL ones too — with checksums, idempotency keys on retries and a sampled
// read-back. Nothing may be lost (every accepted move ends), corrupted (checksums and
// read-backs match) or duplicated (a retried Submit returns the first transfer), and the
// daemons' threads, open files and anonymous memory come back to near their start.
//
// Defaults are CI's (64 clients x 150 moves); the figure run and the soak are
//   bazel run //tests:load_test -- --clients=64 --moves=1000
//   bazel run //tests:load_test -- --clients=64 --moves=0 --duration=30m   # soak
// Figures are printed (moves/s, GB/s, latency by size class, resources before and after).
#include <dirent.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/util/random_bytes.h"
#include "tests/util/test_node.h"

ABSL_FLAG(int, clients, 64, "Concurrent clients.");
ABSL_FLAG(int, moves, 150, "Moves per client (0: until --duration).");
ABSL_FLAG(absl::Duration, duration, absl::ZeroDuration(),
          "With --moves=0: how long the clients go on (a soak).");

namespace gpumove {
namespace {

constexpr uint64_t kSpan = 4 << 20;  // Each client's buffers on each node.

struct Resources {
  long threads = 0, fds = 0, rss_anon_kib = 0;
};

Resources Read(pid_t pid) {
  Resources r;
  for (absl::string_view line :
       absl::StrSplit(ReadFile(absl::StrCat("/proc/", pid, "/status")), '\n')) {
    std::vector<absl::string_view> f = absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (f.size() < 2) continue;
    if (f[0] == "Threads:") absl::SimpleAtoi(f[1], &r.threads);
    if (f[0] == "RssAnon:") absl::SimpleAtoi(f[1], &r.rss_anon_kib);
  }
  if (DIR* d = opendir(absl::StrCat("/proc/", pid, "/fd").c_str())) {
    while (readdir(d) != nullptr) ++r.fds;
    closedir(d);
    r.fds -= 2;  // . and ..
  }
  return r;
}

std::string Show(const Resources& r) {
  return absl::StrCat(r.threads, " threads, ", r.fds, " fds, ", r.rss_anon_kib / 1024,
                      " MiB anonymous");
}

// A size class of the latency table: [1 B, 4 KiB), [4 KiB, 256 KiB), [256 KiB, 4 MiB].
int SizeClass(uint64_t n) { return n < 4096 ? 0 : n < (256 << 10) ? 1 : 2; }
const char* kClassNames[] = {"< 4 KiB", "4-256 KiB", "256 KiB-4 MiB"};

struct Tally {
  absl::Mutex mu;
  uint64_t succeeded = 0, failed = 0, retried = 0, lost = 0, corrupted = 0, duplicated = 0;
  uint64_t third_party = 0, pulls = 0, pushes = 0, local = 0, read_back = 0, bytes = 0;
  std::vector<double> latency_us[3];
  std::map<std::string, int> failures;  // Code: message of moves that ended FAILED.
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

TEST(Load, NothingLostCorruptedOrDuplicatedAndResourcesComeBack) {
  const int clients = absl::GetFlag(FLAGS_clients);
  const int moves = absl::GetFlag(FLAGS_moves);
  const absl::Duration duration = absl::GetFlag(FLAGS_duration);
  const uint64_t pool = static_cast<uint64_t>(clients) * 2 * kSpan + (64 << 20);
  std::vector<std::string> flags = {absl::StrCat("--host_pool_size=", pool),
                                    "--pinned_pool_size=32MiB", "--max_active=16384"};
  std::vector<TestNode> nodes;
  nodes.push_back(LaunchNode("node-a", "", flags));
  nodes.push_back(LaunchNode("node-b", nodes[0].process->address(), flags));
  nodes.push_back(LaunchNode("node-c", nodes[0].process->address(), flags));
  for (auto& n : nodes) ASSERT_TRUE(AwaitPeersUp(n, 2, true).ok());

  // Per client and node: a source buffer of random bytes (also kept here) and a
  // destination buffer only that client writes.
  struct Buffers {
    std::string src, dst;
  };
  std::vector<std::vector<Buffers>> buffers(clients, std::vector<Buffers>(3));
  std::vector<std::vector<std::string>> contents(clients, std::vector<std::string>(3));
  for (int c = 0; c < clients; ++c) {
    for (int n = 0; n < 3; ++n) {
      Client& client = *nodes[n].client;
      auto s = client.Allocate(kSpan);
      auto d = client.Allocate(kSpan);
      ASSERT_TRUE(s.ok() && d.ok()) << s.status() << d.status();
      contents[c][n] = RandomBytes(kSpan, 1000 * c + n);
      ASSERT_TRUE(client.Write(Ref(s->id()), contents[c][n]).ok());
      buffers[c][n] = {s->id(), d->id()};
    }
  }
  absl::SleepFor(absl::Seconds(1));
  std::vector<Resources> before;
  for (auto& n : nodes) before.push_back(Read(n.process->pid()));

  Tally tally;
  const absl::Time start = absl::Now();
  const absl::Time stop = start + duration;
  auto run_client = [&](int c) {
    std::mt19937_64 rng(c + 1);
    // Connections of its own (gRPC would otherwise share one per node among all clients).
    std::vector<std::unique_ptr<Client>> mine;
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    for (auto& n : nodes) {
      mine.push_back(std::make_unique<Client>(grpc::CreateCustomChannel(
          n.process->address(), grpc::InsecureChannelCredentials(), args)));
    }
    for (int i = 0; moves > 0 ? i < moves : absl::Now() < stop; ++i) {
      const int from = rng() % 3;
      const int to = rng() % 4 == 0 ? from : (from + 1 + rng() % 2) % 3;  // A quarter LOCAL.
      const int runner = rng() % 3;
      // Log-uniform sizes from 1 B to 4 MiB.
      const uint64_t size = std::max<uint64_t>(
          1, static_cast<uint64_t>(std::exp2(std::uniform_real_distribution<>(0, 22)(rng))));
      const uint64_t src_off = rng() % (kSpan - size + 1);
      const uint64_t dst_off = rng() % (kSpan - size + 1);
      v1::BufferRef src = Ref(buffers[c][from].src, src_off, size);
      src.set_node(nodes[from].name);
      v1::BufferRef dst = Ref(buffers[c][to].dst, dst_off, size);
      dst.set_node(nodes[to].name);
      MoveOptions o;
      o.checksum = true;
      o.idempotency_key = absl::StrCat("c", c, "-m", i);
      const absl::Time t0 = absl::Now();
      absl::StatusOr<v1::Transfer> t;
      std::string first_id;
      int attempts = 0;
      for (; attempts < 20; ++attempts) {
        t = mine[runner]->Move(src, dst, o);
        if (t.ok()) break;
        if (!absl::IsUnavailable(t.status()) && !absl::IsResourceExhausted(t.status()) &&
            !absl::IsDeadlineExceeded(t.status())) {
          break;
        }
        absl::SleepFor(absl::Milliseconds(20 << std::min(attempts, 5)));
      }
      const double us = absl::ToDoubleMicroseconds(absl::Now() - t0);
      bool duplicate = false;
      if (t.ok() && attempts > 0) {
        // The key was used before: the same transfer must come back again.
        auto again = mine[runner]->Move(src, dst, o);
        duplicate = !again.ok() || again->id() != t->id();
      }
      bool corrupt = false, read_back = false;
      if (t.ok() && t->state() == v1::SUCCEEDED) {
        corrupt = t->source_xxh3() != t->destination_xxh3();
        if (!corrupt && rng() % 16 == 0) {
          read_back = true;
          auto got = mine[to]->Read(Ref(buffers[c][to].dst, dst_off, size));
          corrupt = !got.ok() || *got != contents[c][from].substr(src_off, size);
        }
      }
      absl::MutexLock lock(&tally.mu);
      tally.retried += attempts > 0;
      tally.duplicated += duplicate;
      tally.corrupted += corrupt;
      tally.read_back += read_back;
      if (!t.ok()) {
        ++tally.lost;  // Never accepted, or accepted and not ended: either way not done.
        ++tally.failures[absl::StrCat("call: ", t.status().ToString().substr(0, 120))];
        continue;
      }
      if (t->state() == v1::SUCCEEDED) {
        ++tally.succeeded;
        tally.bytes += size;
        tally.latency_us[SizeClass(size)].push_back(us);
      } else if (t->state() == v1::FAILED || t->state() == v1::CANCELLED) {
        ++tally.failed;
        ++tally.failures[absl::StrCat(t->error_message().substr(0, 120))];
      } else {
        ++tally.lost;  // Returned by a waiting Submit without having ended.
      }
      if (from == to) {
        ++tally.local;
      } else if (runner == to) {
        ++tally.pulls;
      } else if (runner == from) {
        ++tally.pushes;
      } else {
        ++tally.third_party;
      }
    }
  };
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) threads.emplace_back(run_client, c);
  for (auto& t : threads) t.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);

  absl::SleepFor(absl::Seconds(2));  // Idle threads, connections and caches settle.
  std::vector<Resources> after;
  for (auto& n : nodes) after.push_back(Read(n.process->pid()));

  const uint64_t total = tally.succeeded + tally.failed + tally.lost;
  std::printf("load: %d clients, %llu moves in %.1f s: %.0f moves/s, %.2f GB/s\n", clients,
              static_cast<unsigned long long>(total), seconds, total / seconds,
              tally.bytes / seconds / 1e9);
  std::printf("load: %llu succeeded, %llu failed, %llu lost, %llu corrupted, %llu duplicated, "
              "%llu retried, %llu read back; %llu pushes, %llu pulls, %llu third-party, %llu "
              "local\n",
              (unsigned long long)tally.succeeded, (unsigned long long)tally.failed,
              (unsigned long long)tally.lost, (unsigned long long)tally.corrupted,
              (unsigned long long)tally.duplicated, (unsigned long long)tally.retried,
              (unsigned long long)tally.read_back, (unsigned long long)tally.pushes,
              (unsigned long long)tally.pulls, (unsigned long long)tally.third_party,
              (unsigned long long)tally.local);
  for (int k = 0; k < 3; ++k) {
    std::printf("load: %-14s %6zu moves, submit to end p50 %8.0f us, p99 %8.0f us\n",
                kClassNames[k], tally.latency_us[k].size(),
                Percentile(tally.latency_us[k], 0.5), Percentile(tally.latency_us[k], 0.99));
  }
  for (const auto& [why, n] : tally.failures) std::printf("load: %d x %s\n", n, why.c_str());
  for (size_t n = 0; n < nodes.size(); ++n) {
    std::printf("load: %s before %s; after %s\n", nodes[n].name.c_str(), Show(before[n]).c_str(),
                Show(after[n]).c_str());
  }
  EXPECT_EQ(tally.lost, 0u);
  EXPECT_EQ(tally.corrupted, 0u);
  EXPECT_EQ(tally.duplicated, 0u);
  EXPECT_EQ(tally.failed, 0u);  // Nothing here is expected to fail.
  EXPECT_GT(tally.third_party, 0u);
  EXPECT_GT(tally.pulls, 0u);
  EXPECT_GT(tally.read_back, 0u);
  for (size_t n = 0; n < nodes.size(); ++n) {
    EXPECT_LE(after[n].threads, before[n].threads + 16) << nodes[n].name;
    EXPECT_LE(after[n].fds, before[n].fds + 16) << nodes[n].name;
    EXPECT_LE(after[n].rss_anon_kib, before[n].rss_anon_kib + 256 * 1024) << nodes[n].name;
  }
}

}  // namespace
}  // namespace gpumove

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  absl::ParseCommandLine(argc, argv);
  return RUN_ALL_TESTS();
}
