// Faults in a running cluster on loopback (link faults are netns_test's): a peer stopped
// mid-stream (SIGSTOP) fails its moves in bounded time and everything resumes after
// SIGCONT, with no hold left on either side; a destination killed (SIGKILL) mid-stream and
// restarted rejoins, with no hold left behind; a full pool refuses cleanly while everything else
// goes on. Each case prints its times (first failure, recovery) for docs/reliability.md.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/gpumove_client.h"
#include "gtest/gtest.h"
#include "tests/util/random_bytes.h"
#include "tests/util/test_node.h"

namespace gpumove {
namespace {

constexpr uint64_t kMove = 1 << 20;

v1::BufferRef On(const TestNode& n, const std::string& id) {
  v1::BufferRef r = Ref(id);
  r.set_node(n.name);
  return r;
}

// Moves of 1 MiB from `from` to `to` by `clients` threads until stopped, each with its own
// buffers: when each ended and how (its code), for the fault's timeline.
class Stream {
 public:
  Stream(TestNode& from, TestNode& to, int clients) : from_(from), to_(to) {
    for (int c = 0; c < clients; ++c) {
      auto s = from.client->Allocate(kMove);
      auto d = to.client->Allocate(kMove);
      EXPECT_TRUE(s.ok() && d.ok()) << s.status() << d.status();
      if (!s.ok() || !d.ok()) return;
      EXPECT_TRUE(from.client->Write(Ref(s->id()), RandomBytes(kMove, c)).ok());
      src_.push_back(s->id());
      dst_.push_back(d->id());
    }
    for (size_t c = 0; c < src_.size(); ++c) threads_.emplace_back([this, c] { Run(c); });
  }
  ~Stream() { Stop(); }
  void Stop() {
    stop_ = true;
    for (auto& t : threads_) t.join();
    threads_.clear();
  }
  struct End {
    absl::Time at;
    absl::StatusCode code;  // Of the call or of the transfer.
    absl::Duration took;
  };
  std::vector<End> ends() {
    absl::MutexLock lock(&mu_);
    return ends_;
  }
  const std::vector<std::string>& sources() const { return src_; }
  const std::vector<std::string>& destinations() const { return dst_; }

 private:
  void Run(size_t c) {
    auto client = *Client::Connect(from_.process->address());
    while (!stop_) {
      MoveOptions o;
      o.checksum = true;
      const absl::Time t0 = absl::Now();
      auto t = client->Move(Ref(src_[c]), On(to_, dst_[c]), o);
      absl::StatusCode code = t.ok() ? static_cast<absl::StatusCode>(t->error_code())
                                     : t.status().code();
      if (t.ok() && t->state() == v1::SUCCEEDED && t->source_xxh3() != t->destination_xxh3()) {
        code = absl::StatusCode::kDataLoss;
      }
      {
        absl::MutexLock lock(&mu_);
        ends_.push_back({absl::Now(), code, absl::Now() - t0});
      }
      if (code != absl::StatusCode::kOk) absl::SleepFor(absl::Milliseconds(50));
    }
  }
  TestNode& from_;
  TestNode& to_;
  std::vector<std::string> src_, dst_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stop_{false};
  absl::Mutex mu_;
  std::vector<End> ends_ ABSL_GUARDED_BY(mu_);
};

// The first end at or after `t` with (or without) code OK.
absl::Time FirstEnd(const std::vector<Stream::End>& ends, absl::Time t, bool ok) {
  absl::Time first = absl::InfiniteFuture();
  for (const auto& e : ends) {
    if (e.at >= t && (e.code == absl::StatusCode::kOk) == ok) first = std::min(first, e.at);
  }
  return first;
}

// A shared memory segment: a POSIX one by name, a System V one by id, with its size and the
// process that made it.
struct Segment {
  std::string name;
  uint64_t size = 0;
  pid_t creator = 0;
  bool operator<(const Segment& o) const { return name < o.name; }
};

std::vector<Segment> ShmSegments() {
  std::vector<Segment> out;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    out.push_back({e.path().filename(), e.is_regular_file() ? e.file_size() : 0, 0});
  }
  // /proc/sysvipc/shm: key shmid perms size cpid lpid nattch ...
  for (const auto& line : absl::StrSplit(ReadFile("/proc/sysvipc/shm"), '\n')) {
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() < 5 || f[0] == "key") continue;
    Segment seg{absl::StrCat("sysv:", f[1]), 0, 0};
    if (!absl::SimpleAtoi(f[3], &seg.size) || !absl::SimpleAtoi(f[4], &seg.creator)) continue;
    out.push_back(seg);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Segments in `now` that `before` lacks.
std::vector<Segment> Added(const std::vector<Segment>& before, const std::vector<Segment>& now) {
  std::vector<Segment> out;
  std::set_difference(now.begin(), now.end(), before.begin(), before.end(),
                      std::back_inserter(out));
  return out;
}

TEST(Chaos, AStoppedPeerFailsItsMovesInBoundedTimeAndAllResume) {
  TestNode a = LaunchNode("node-a", "", {"--host_pool_size=128MiB", "--pinned_pool_size=0"});
  TestNode b = LaunchNode("node-b", a.process->address(),
                          {"--host_pool_size=128MiB", "--pinned_pool_size=0"});
  ASSERT_TRUE(AwaitPeersUp(a, 1).ok());
  Stream stream(a, b, 8);
  absl::SleepFor(absl::Milliseconds(500));
  b.process->Signal(SIGSTOP);
  const absl::Time stopped = absl::Now();
  absl::SleepFor(absl::Seconds(4));
  b.process->Signal(SIGCONT);
  const absl::Time resumed = absl::Now();
  // Recovered: a move that started after SIGCONT succeeded.
  for (absl::Time end = resumed + absl::Seconds(15); absl::Now() < end;) {
    if (FirstEnd(stream.ends(), resumed, true) != absl::InfiniteFuture()) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  absl::SleepFor(absl::Milliseconds(500));
  stream.Stop();
  const auto ends = stream.ends();
  const absl::Time first_failure = FirstEnd(ends, stopped, false);
  const absl::Time recovery = FirstEnd(ends, resumed, true);
  int before_ok = 0, failed = 0, corrupt = 0;
  absl::Duration longest = absl::ZeroDuration();
  for (const auto& e : ends) {
    before_ok += e.at < stopped && e.code == absl::StatusCode::kOk;
    failed += e.code != absl::StatusCode::kOk;
    corrupt += e.code == absl::StatusCode::kDataLoss;
    if (e.code != absl::StatusCode::kOk) {
      EXPECT_EQ(e.code, absl::StatusCode::kUnavailable);
    }
    longest = std::max(longest, e.took);
  }
  std::printf("chaos sigstop: %zu moves, %d before the stop, %d failed; first failure %.2f s "
              "after SIGSTOP, recovery %.2f s after SIGCONT, longest move %.2f s\n",
              ends.size(), before_ok, failed, absl::ToDoubleSeconds(first_failure - stopped),
              absl::ToDoubleSeconds(recovery - resumed), absl::ToDoubleSeconds(longest));
  EXPECT_GT(before_ok, 0);
  EXPECT_EQ(corrupt, 0);
  // --peer_timeout is 1.5 s: moves stalled by the stop end within it and a heartbeat.
  EXPECT_LT(first_failure - stopped, absl::Seconds(4));
  EXPECT_LT(longest, absl::Seconds(5)) << "a move hung past the peer timeout";
  EXPECT_LT(recovery - resumed, absl::Seconds(5));
  // Nothing stays held on either side: every buffer can be released, node-b's as soon as
  // node-a has told it again that the moves it held ranges for are over (node-a could not
  // while node-b was stopped).
  for (const auto& id : stream.sources()) EXPECT_TRUE(a.client->Release(id).ok()) << id;
  for (const auto& id : stream.destinations()) {
    absl::Status st = b.client->Release(id);
    for (absl::Time end = absl::Now() + absl::Seconds(5);
         absl::IsFailedPrecondition(st) && absl::Now() < end;) {
      absl::SleepFor(absl::Milliseconds(100));
      st = b.client->Release(id);
    }
    EXPECT_TRUE(st.ok()) << id << ": " << st;
  }
}

TEST(Chaos, AKilledDestinationRestartsRejoinsAndLeavesNothingBehind) {
  const std::vector<Segment> shm_before = ShmSegments();
  std::vector<std::string> flags = {"--host_pool_size=128MiB", "--pinned_pool_size=16MiB"};
  std::optional<TestNode> a = LaunchNode("node-a", "", flags);
  TestNode b = LaunchNode("node-b", a->process->address(), flags);
  ASSERT_TRUE(AwaitPeersUp(*a, 1).ok());
  const size_t shm_two = ShmSegments().size();
  const pid_t killed_pid = b.process->pid();
  absl::Time killed;
  {
    Stream stream(*a, b, 4);
    absl::SleepFor(absl::Milliseconds(500));
    b.process->Signal(SIGKILL);
    killed = absl::Now();
    ASSERT_TRUE(b.process->WaitExit(absl::Seconds(5)).ok());
    absl::SleepFor(absl::Seconds(3));
    stream.Stop();
    const absl::Time first_failure = FirstEnd(stream.ends(), killed, false);
    std::printf("chaos sigkill: first failure %.2f s after SIGKILL\n",
                absl::ToDoubleSeconds(first_failure - killed));
    EXPECT_LT(first_failure - killed, absl::Seconds(4));
    // node-a holds nothing for the dead node's moves.
    for (const auto& id : stream.sources()) EXPECT_TRUE(a->client->Release(id).ok()) << id;
  }
  // Restarted under the same name: it rejoins and takes verified moves.
  b = LaunchNode("node-b", a->process->address(), flags);
  const absl::Time restarted = absl::Now();
  ASSERT_TRUE(AwaitPeersUp(*a, 1).ok());
  {
    Stream again(*a, b, 2);
    for (absl::Time end = absl::Now() + absl::Seconds(10); absl::Now() < end;) {
      if (FirstEnd(again.ends(), restarted, true) != absl::InfiniteFuture()) break;
      absl::SleepFor(absl::Milliseconds(20));
    }
    again.Stop();
    const absl::Time first_ok = FirstEnd(again.ends(), restarted, true);
    std::printf("chaos sigkill: first verified move %.2f s after the restart\n",
                absl::ToDoubleSeconds(first_ok - restarted));
    EXPECT_NE(first_ok, absl::InfiniteFuture());
  }
  // What the killed node made is gone, but for its UCX worker's receive FIFO and ring (12 KiB
  // and ~4 MiB), which node-a's UCX worker keeps attached after gpumove closed its endpoint to
  // it: on the same host endpoints run without peer error handling (UCX 1.13 drops its shared
  // memory transports under it), so UCX never sees that worker fail (docs/reliability.md).
  // Its pools (128 + 16 MiB) must be gone.
  uint64_t left_by_killed = 0;
  for (const Segment& seg : ShmSegments()) {
    if (seg.creator == killed_pid) left_by_killed += seg.size;
  }
  std::printf("chaos sigkill: shared memory: %zu segments before, %zu with two nodes, %zu after "
              "the kill and restart; %llu bytes of the killed node's still attached\n",
              shm_before.size(), shm_two, ShmSegments().size(),
              static_cast<unsigned long long>(left_by_killed));
  EXPECT_LT(left_by_killed, 8ull << 20);
  // No segment outlives the daemons.
  b = TestNode{};
  a.reset();
  std::vector<Segment> left;
  for (absl::Time end = absl::Now() + absl::Seconds(5); absl::Now() < end;) {
    left = Added(shm_before, ShmSegments());
    // Open MPI's shared-memory segments belong to MPI jobs that tests beside this one run
    // (mpi_test's mpirun); these daemons were started by no MPI launcher.
    std::erase_if(left,
                  [](const Segment& s) { return absl::StartsWith(s.name, "vader_segment."); });
    if (left.empty()) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  for (const Segment& seg : left) {
    ADD_FAILURE() << "shared memory segment " << seg.name << " (" << seg.size
                  << " bytes, made by pid " << seg.creator << ") outlived the daemons";
  }
}

TEST(Chaos, AFullPoolRefusesCleanlyAndEverythingElseGoesOn) {
  TestNode a = LaunchNode("node-a", "", {"--host_pool_size=64MiB", "--pinned_pool_size=0"});
  TestNode b = LaunchNode("node-b", a.process->address(),
                          {"--host_pool_size=64MiB", "--pinned_pool_size=0"});
  ASSERT_TRUE(AwaitPeersUp(a, 1).ok());
  auto src = a.client->Allocate(kMove);
  auto dst = b.client->Allocate(kMove);
  ASSERT_TRUE(src.ok() && dst.ok());
  std::vector<std::string> filler;
  absl::Status refused;
  for (int i = 0; i < 1000; ++i) {
    auto f = a.client->Allocate(kMove);
    if (!f.ok()) {
      refused = f.status();
      break;
    }
    filler.push_back(f->id());
  }
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_GT(filler.size(), 50u);
  // Moves between buffers that exist go on, in both directions.
  MoveOptions o;
  o.checksum = true;
  for (int i = 0; i < 5; ++i) {
    auto push = a.client->Move(Ref(src->id()), On(b, dst->id()), o);
    ASSERT_TRUE(push.ok()) << push.status();
    EXPECT_EQ(push->state(), v1::SUCCEEDED) << push->error_message();
    auto pull = a.client->Move(On(b, dst->id()), Ref(src->id()), o);
    ASSERT_TRUE(pull.ok()) << pull.status();
    EXPECT_EQ(pull->state(), v1::SUCCEEDED) << pull->error_message();
  }
  // node-b, whose pool is not full, allocates; node-a again once it has room.
  EXPECT_TRUE(b.client->Allocate(kMove).ok());
  EXPECT_TRUE(a.client->Release(filler.back()).ok());
  EXPECT_TRUE(a.client->Allocate(kMove).ok());
}

}  // namespace
}  // namespace gpumove
