#include "daemon/core/transfer_scheduler.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <numeric>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace gpumove {
namespace {

// Copies with memcpy in 1 KiB chunks; can be held at the start of each move so tests
// can see ordering and cancel running moves.
class FakeEngine : public Engine {
 public:
  explicit FakeEngine(PathKind path = PathKind::kLocal, bool stages = false)
      : path_(path), stages_(stages) {}
  PathKind path() const override { return path_; }
  bool Stages(const Endpoint&, const Endpoint&) const override { return stages_; }
  absl::Status CanServe(const Endpoint& src, const Endpoint& dst) const override {
    if (src.kind == MemoryKind::kDevice || dst.kind == MemoryKind::kDevice) {
      return absl::FailedPreconditionError("host only");
    }
    return absl::OkStatus();
  }
  absl::Status Move(const Endpoint& src, const Endpoint& dst, uint64_t length,
                    MoveControl& control) override {
    {
      absl::MutexLock lock(&mu_);
      ++started_;
      move_threads_.push_back(std::this_thread::get_id());
      mu_.Await(absl::Condition(
          +[](bool* open) { return *open; }, &open_));
    }
    for (uint64_t done = 0; done < length;) {
      if (control.cancelled()) return absl::CancelledError("stopped");
      const uint64_t n = std::min<uint64_t>(1024, length - done);
      std::memcpy(dst.data + done, src.data + done, n);
      done += n;
      control.Progress(done);
    }
    if (fail_next_) {
      fail_next_ = false;
      return absl::InternalError("engine broke");
    }
    return absl::OkStatus();
  }
  bool MovesPieces(const Endpoint& src, const Endpoint& dst) const override {
    return CanServe(src, dst).ok();
  }
  absl::Status MovePieces(const Endpoint& src, const Endpoint& dst, const Segments& pieces,
                          MoveControl& control) override {
    {
      absl::MutexLock lock(&mu_);
      ++started_;
      move_threads_.push_back(std::this_thread::get_id());
      mu_.Await(absl::Condition(
          +[](bool* open) { return *open; }, &open_));
    }
    for (const Segment& p : pieces.list) std::memcpy(dst.data + p.dst, src.data + p.src, p.length);
    control.Progress(pieces.total);
    return absl::OkStatus();
  }
  void Hold() {
    absl::MutexLock lock(&mu_);
    open_ = false;
  }
  void Open() {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }
  void AwaitStarted(int n) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](std::pair<int*, int>* a) { return *a->first >= a->second; },
        new std::pair<int*, int>(&started_, n)));
  }
  // Moves that ran on thread `id`.
  int MovesOn(std::thread::id id) {
    absl::MutexLock lock(&mu_);
    return std::count(move_threads_.begin(), move_threads_.end(), id);
  }
  std::atomic<bool> fail_next_{false};

 private:
  const PathKind path_;
  const bool stages_;
  absl::Mutex mu_;
  bool open_ = true;
  int started_ = 0;
  std::vector<std::thread::id> move_threads_;
};

uint64_t SumHash(const Endpoint& e, uint64_t n) {
  uint64_t h = 1469598103934665603ull;
  for (uint64_t i = 0; i < n; ++i)
    h = (h ^ static_cast<unsigned char>(e.data[i])) * 1099511628211ull;
  return h;
}

class SchedulerTest : public ::testing::Test {
 protected:
  void Start(SchedulerOptions options = {}) {
    gpu_ = GpuRuntime::CreateHostOnly("test");
    PoolSizes sizes;
    sizes.host = 16 << 20;
    sizes.pinned = 0;
    pools_ = *PoolSet::Create(sizes, {}, gpu_.get());
    registry_ = std::make_unique<BufferRegistry>(pools_.get(), absl::ZeroDuration());
    options.node = "n1";
    sched_ = std::make_unique<TransferScheduler>(
        options, registry_.get(), engines_.empty() ? std::vector<Engine*>{&engine_} : engines_,
        [this](const Endpoint& e, uint64_t n) -> absl::StatusOr<uint64_t> {
          if (corrupt_hash_ && e.data == corrupt_target_) return 42;
          return SumHash(e, n);
        });
  }

  std::string Buffer(uint64_t size, char fill) {
    AllocateOptions o;
    o.size = size;
    o.owner = "me";
    BufferInfo b = *registry_->Allocate(o);
    auto use = registry_->Acquire("me", b.id, 0, 0);
    std::memset(use->data(), fill, size);
    return b.id;
  }
  std::string Contents(const std::string& id) {
    auto use = registry_->Acquire("me", id, 0, 0);
    return std::string(use->data(), use->length());
  }
  TransferSpec Move(const std::string& src, const std::string& dst, uint64_t src_off = 0,
                    uint64_t dst_off = 0, uint64_t len = 0) {
    TransferSpec s;
    s.source = {"", src, src_off, len};
    s.destination = {"", dst, dst_off, 0};
    return s;
  }
  TransferSnapshot SubmitOne(const TransferSpec& spec) {
    auto r = sched_->Submit("me", {spec}, "");
    EXPECT_TRUE(r.ok()) << r.status();
    return r->at(0);
  }
  TransferSnapshot WaitDone(const std::string& id) {
    return *sched_->Wait("me", id, absl::Now() + absl::Seconds(10));
  }

  FakeEngine engine_;
  std::vector<Engine*> engines_;  // Instead of engine_ when set.
  std::unique_ptr<GpuRuntime> gpu_;
  std::unique_ptr<PoolSet> pools_;
  std::unique_ptr<BufferRegistry> registry_;
  std::unique_ptr<TransferScheduler> sched_;
  bool corrupt_hash_ = false;
  char* corrupt_target_ = nullptr;
};

TEST_F(SchedulerTest, MovesBytesAndEndsSucceeded) {
  Start();
  std::string a = Buffer(10000, 'a'), b = Buffer(10000, 'b');
  TransferSnapshot t = SubmitOne(Move(a, b, 100, 200, 5000));
  EXPECT_EQ(t.length, 5000u);
  EXPECT_EQ(t.path, PathKind::kLocal);
  t = WaitDone(t.id);
  EXPECT_EQ(t.state, TransferState::kSucceeded) << t.status;
  EXPECT_EQ(t.bytes_done, 5000u);
  EXPECT_LE(t.create_time, t.start_time);
  EXPECT_LE(t.start_time, t.end_time);
  std::string got = Contents(b);
  EXPECT_EQ(got.substr(0, 200), std::string(200, 'b'));
  EXPECT_EQ(got.substr(200, 5000), std::string(5000, 'a'));
  EXPECT_EQ(got.substr(5200), std::string(4800, 'b'));
}

TEST_F(SchedulerTest, AutoPrefersAPathThatNeedsNoStaging) {
  FakeEngine staging(PathKind::kUcx, /*stages=*/true), direct(PathKind::kMpi, false);
  engines_ = {&staging, &direct};
  Start();
  std::string a = Buffer(4096, 'a'), b = Buffer(4096, 'b');
  EXPECT_EQ(WaitDone(SubmitOne(Move(a, b)).id).path, PathKind::kMpi);
  TransferSpec s = Move(a, b);
  s.path = PathKind::kUcx;  // Asked for: served even though it stages.
  EXPECT_EQ(WaitDone(SubmitOne(s).id).path, PathKind::kUcx);
  s.path = PathKind::kCudaIpc;  // Not on this node.
  EXPECT_EQ(sched_->Submit("me", {s}, "").status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(SchedulerTest, AutoTakesTheFirstWhenAllStage) {
  FakeEngine first(PathKind::kUcx, true), second(PathKind::kMpi, true);
  engines_ = {&first, &second};
  Start();
  std::string a = Buffer(4096, 'a'), b = Buffer(4096, 'b');
  EXPECT_EQ(WaitDone(SubmitOne(Move(a, b)).id).path, PathKind::kUcx);
}

TEST_F(SchedulerTest, BadRequestsChangeNothing) {
  Start();
  std::string a = Buffer(1000, 'a'), b = Buffer(500, 'b');
  auto code = [&](const TransferSpec& s) { return sched_->Submit("me", {s}, "").status().code(); };
  EXPECT_EQ(code(Move(a, b)), absl::StatusCode::kInvalidArgument);  // 1000 into 500.
  EXPECT_EQ(code(Move(a, "b-nope")), absl::StatusCode::kNotFound);
  EXPECT_EQ(code(Move("", b)), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Move(a, b, 1001, 0)), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Move(a, b, 1, 0, UINT64_MAX)), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Move(a, a, 0, 10, 100)), absl::StatusCode::kInvalidArgument);  // Overlap.
  TransferSpec s = Move(a, b, 0, 0, 10);
  s.destination.node = "elsewhere";
  EXPECT_EQ(code(s), absl::StatusCode::kNotFound);
  s = Move(a, b, 0, 0, 10);
  s.path = PathKind::kUcx;
  EXPECT_EQ(code(s), absl::StatusCode::kFailedPrecondition);
  s = Move(a, b, 0, 0, 10);
  s.destination.length = 11;
  EXPECT_EQ(code(s), absl::StatusCode::kInvalidArgument);
  // A batch with one bad move queues nothing.
  auto r = sched_->Submit("me", {Move(a, b, 0, 0, 10), Move(a, "b-nope")}, "");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(sched_->List("me", {}, 100).empty());
  EXPECT_EQ(Contents(b), std::string(500, 'b'));
  EXPECT_EQ(registry_->Get("me", a)->active_uses, 0u);
}

TEST_F(SchedulerTest, OverlappingDestinationsRunInSubmissionOrder) {
  Start({.workers = 4});
  std::string x = Buffer(4096, 'x'), y = Buffer(4096, 'y'), z = Buffer(4096, 'z');
  engine_.Hold();
  TransferSnapshot first = SubmitOne(Move(x, z));
  engine_.AwaitStarted(1);
  TransferSnapshot second = SubmitOne(Move(y, z, 0, 1024, 1024));
  absl::SleepFor(absl::Milliseconds(50));
  // The second waits for the first even though workers are free.
  EXPECT_EQ(sched_->Get("me", second.id)->state, TransferState::kQueued);
  engine_.Open();
  EXPECT_EQ(WaitDone(second.id).state, TransferState::kSucceeded);
  EXPECT_EQ(WaitDone(first.id).state, TransferState::kSucceeded);
  std::string got = Contents(z);
  EXPECT_EQ(got.substr(0, 1024), std::string(1024, 'x'));
  EXPECT_EQ(got.substr(1024, 1024), std::string(1024, 'y'));
  EXPECT_EQ(WaitDone(second.id).start_time >= WaitDone(first.id).end_time, true);
}

// A waits for nothing, B for A, C for B only (A's conflict with C lies in bytes B writes).
// B cancelled in the queue must not let C start while A still runs.
TEST_F(SchedulerTest, ACancelledMoveInTheMiddleKeepsTheOrderOfTheOthers) {
  Start({.workers = 4});
  std::string x = Buffer(4096, 'x'), y = Buffer(4096, 'y'), w = Buffer(4096, 'w'),
              z = Buffer(4096, 'z');
  engine_.Hold();
  TransferSnapshot a = SubmitOne(Move(x, z));
  engine_.AwaitStarted(1);
  TransferSnapshot b = SubmitOne(Move(y, z));
  TransferSnapshot c = SubmitOne(Move(w, z));
  ASSERT_EQ(sched_->Cancel("me", b.id)->state, TransferState::kCancelled);
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(sched_->Get("me", c.id)->state, TransferState::kQueued);
  engine_.Open();
  EXPECT_EQ(WaitDone(c.id).state, TransferState::kSucceeded);
  EXPECT_GE(WaitDone(c.id).start_time, WaitDone(a.id).end_time);
  EXPECT_EQ(Contents(z), std::string(4096, 'w'));
}

// Moves over one range in many batches: each batch is accepted in about the same time
// (a move once depended on every move before it: 1024-move batches took 0.7, 5.9, 19.6
// and 45 s, under the lock), and they still apply in submission order.
TEST_F(SchedulerTest, BatchesOfOverlappingMovesAreAcceptedWithoutSlowingDown) {
  Start({.workers = 2, .max_active = 8192});
  std::vector<std::string> sources;
  for (int i = 0; i < 4; ++i) sources.push_back(Buffer(4096, static_cast<char>('a' + i)));
  std::string z = Buffer(4096, 'z');
  engine_.Hold();
  const absl::Time t0 = absl::Now();
  std::vector<TransferSnapshot> all;
  for (int batch = 0; batch < 4; ++batch) {
    std::vector<TransferSpec> specs;
    for (int i = 0; i < 1024; ++i) {
      // Shifted ranges, so that they overlap without being equal.
      specs.push_back(Move(sources[batch], z, 0, (i % 4) * 512, 2048));
    }
    auto r = sched_->Submit("me", specs, "");
    ASSERT_TRUE(r.ok()) << r.status();
    all.insert(all.end(), r->begin(), r->end());
  }
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));  // Milliseconds now; minutes before.
  engine_.Open();
  absl::Time last_end = absl::InfinitePast();
  for (const TransferSnapshot& t : all) {
    TransferSnapshot done = WaitDone(t.id);
    ASSERT_EQ(done.state, TransferState::kSucceeded);
    EXPECT_GE(done.start_time, last_end);  // Each overlaps the one before it.
    last_end = done.end_time;
  }
  const std::string got = Contents(z);
  EXPECT_EQ(got.substr(1536, 2048), std::string(2048, 'd'));  // The last batch's last move.
}

TEST_F(SchedulerTest, ReadAfterWriteSeesTheWrite) {
  Start({.workers = 4});
  std::string a = Buffer(4096, 'a'), b = Buffer(4096, 'b'), c = Buffer(4096, 'c');
  auto r = sched_->Submit("me", {Move(a, b), Move(b, c)}, "");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(WaitDone(r->at(1).id).state, TransferState::kSucceeded);
  EXPECT_EQ(Contents(c), std::string(4096, 'a'));
}

TEST_F(SchedulerTest, DisjointMovesRunConcurrently) {
  Start({.workers = 2});
  std::string a = Buffer(4096, 'a'), b = Buffer(4096, 'b'), c = Buffer(4096, 'c'),
              d = Buffer(4096, 'd');
  engine_.Hold();
  TransferSnapshot t1 = SubmitOne(Move(a, b));
  TransferSnapshot t2 = SubmitOne(Move(c, d));
  engine_.AwaitStarted(2);  // Both are inside the engine at once.
  engine_.Open();
  EXPECT_EQ(WaitDone(t1.id).state, TransferState::kSucceeded);
  EXPECT_EQ(WaitDone(t2.id).state, TransferState::kSucceeded);
}

// Vectored moves into interleaved blocks of one buffer run at once (ordered by their
// pieces, not their hull); a move over one of their blocks waits for the one writing it.
TEST_F(SchedulerTest, VectoredMovesIntoInterleavedBlocksRunConcurrently) {
  Start({.workers = 3});
  std::string a = Buffer(4096, 'a'), b = Buffer(4096, 'b'), c = Buffer(4096, 'c'),
              y = Buffer(4096, 'y');
  auto blocks = [&](const std::string& from, int parity) {
    std::vector<Segment> list;
    for (uint64_t k = parity; k < 64; k += 2) list.push_back({k * 64, k * 64, 64});
    TransferSpec s = Move(from, y);
    s.destination.length = 0;
    s.pieces = *MakeSegments(std::move(list), 1000);
    return s;
  };
  engine_.Hold();
  TransferSnapshot even = SubmitOne(blocks(a, 0));
  TransferSnapshot odd = SubmitOne(blocks(b, 1));
  engine_.AwaitStarted(2);  // Both are inside the engine at once.
  // Block 0 of y is even's: a whole move over it waits.
  TransferSnapshot over = SubmitOne(Move(c, y, 0, 0, 64));
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(sched_->Get("me", over.id)->state, TransferState::kQueued);
  engine_.Open();
  for (const auto* t : {&even, &odd, &over}) {
    EXPECT_EQ(WaitDone(t->id).state, TransferState::kSucceeded);
  }
  const std::string got = Contents(y);
  EXPECT_EQ(got.substr(0, 64), std::string(64, 'c'));
  for (uint64_t k = 1; k < 64; ++k) {
    EXPECT_EQ(got[k * 64], k % 2 ? 'b' : 'a') << "block " << k;
  }
}

// A finished vectored move keeps its record (and its count of pieces), not its list: the
// memory goes back for later Submits' lists.
TEST_F(SchedulerTest, FinishedVectoredMovesLetTheirPieceListGo) {
  Start({.workers = 1});
  std::string a = Buffer(4096, 'a'), y = Buffer(4096, 'y');
  std::weak_ptr<const Segments> list;
  std::string id;
  {
    std::vector<Segment> pieces;
    for (uint64_t k = 0; k < 64; k += 2) pieces.push_back({k * 64, (62 - k) * 64, 64});
    TransferSpec s = Move(a, y);
    s.destination.length = 0;
    s.pieces = *MakeSegments(std::move(pieces), 1000);
    list = s.pieces;
    engine_.Hold();
    id = SubmitOne(s).id;
    engine_.AwaitStarted(1);
  }
  EXPECT_FALSE(list.expired());  // Running: the engine reads it.
  engine_.Open();
  TransferSnapshot done = WaitDone(id);
  EXPECT_EQ(done.state, TransferState::kSucceeded);
  EXPECT_EQ(done.pieces, 32u);
  EXPECT_TRUE(list.expired());
  EXPECT_EQ(Contents(y).substr(62 * 64, 128), std::string(64, 'a') + std::string(64, 'y'));
}

TEST_F(SchedulerTest, CancelQueuedAndRunning) {
  Start({.workers = 1});
  std::string a = Buffer(1 << 20, 'a'), b = Buffer(1 << 20, 'b'), c = Buffer(4096, 'c'),
              d = Buffer(4096, 'd');
  engine_.Hold();
  TransferSnapshot running = SubmitOne(Move(a, b));
  engine_.AwaitStarted(1);
  TransferSnapshot queued = SubmitOne(Move(c, d));
  auto q = sched_->Cancel("me", queued.id);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->state, TransferState::kCancelled);
  EXPECT_EQ(Contents(d), std::string(4096, 'd'));
  auto r = sched_->Cancel("me", running.id);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->state, TransferState::kRunning);
  engine_.Open();
  TransferSnapshot end = WaitDone(running.id);
  EXPECT_EQ(end.state, TransferState::kCancelled);
  EXPECT_EQ(end.status.code(), absl::StatusCode::kCancelled);
  // Cancelling a finished transfer changes nothing.
  EXPECT_EQ(sched_->Cancel("me", running.id)->state, TransferState::kCancelled);
  EXPECT_TRUE(registry_->Release("me", a).ok());  // No longer in use.
}

TEST_F(SchedulerTest, EngineFailureEndsFailedWithItsStatus) {
  Start();
  std::string a = Buffer(4096, 'a'), b = Buffer(4096, 'b');
  engine_.fail_next_ = true;
  TransferSnapshot t = WaitDone(SubmitOne(Move(a, b)).id);
  EXPECT_EQ(t.state, TransferState::kFailed);
  EXPECT_EQ(t.status.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(t.status.message(), "engine broke");
}

TEST_F(SchedulerTest, ChecksumMismatchIsDataLoss) {
  Start();
  std::string a = Buffer(4096, 'a'), b = Buffer(4096, 'b');
  TransferSpec s = Move(a, b);
  s.checksum = true;
  TransferSnapshot ok = WaitDone(SubmitOne(s).id);
  EXPECT_EQ(ok.state, TransferState::kSucceeded);
  EXPECT_EQ(ok.source_xxh3, ok.destination_xxh3);
  EXPECT_NE(ok.source_xxh3, 0u);
  corrupt_hash_ = true;
  corrupt_target_ = registry_->Acquire("me", b, 0, 0)->data();
  TransferSnapshot bad = WaitDone(SubmitOne(s).id);
  EXPECT_EQ(bad.state, TransferState::kFailed);
  EXPECT_EQ(bad.status.code(), absl::StatusCode::kDataLoss);
}

TEST_F(SchedulerTest, IdempotencyKeyReturnsTheSameTransfers) {
  Start();
  std::string a = Buffer(4096, 'a'), b = Buffer(4096, 'b');
  auto first = sched_->Submit("me", {Move(a, b)}, "key-1");
  auto again = sched_->Submit("me", {Move(a, b)}, "key-1");
  auto other = sched_->Submit("me", {Move(a, b)}, "key-2");
  ASSERT_TRUE(first.ok() && again.ok() && other.ok());
  EXPECT_EQ(first->at(0).id, again->at(0).id);
  EXPECT_NE(first->at(0).id, other->at(0).id);
  WaitDone(other->at(0).id);
  EXPECT_EQ(sched_->List("me", {}, 100).size(), 2u);
}

TEST_F(SchedulerTest, QueueIsBounded) {
  Start({.workers = 1, .max_active = 2});
  std::string a = Buffer(4096, 'a'), b = Buffer(4096, 'b'), c = Buffer(4096, 'c');
  engine_.Hold();
  SubmitOne(Move(a, b));
  SubmitOne(Move(a, c));
  EXPECT_EQ(sched_->Submit("me", {Move(b, c)}, "").status().code(),
            absl::StatusCode::kResourceExhausted);
  engine_.Open();
}

TEST_F(SchedulerTest, OtherOwnersSeeNothing) {
  Start();
  std::string a = Buffer(4096, 'a'), b = Buffer(4096, 'b');
  TransferSnapshot t = SubmitOne(Move(a, b));
  EXPECT_EQ(sched_->Get("eve", t.id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(sched_->Cancel("eve", t.id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(sched_->List("eve", {}, 10).empty());
  // Eve cannot name my buffers either.
  TransferSpec s = Move(a, b);
  EXPECT_EQ(sched_->Submit("eve", {s}, "").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SchedulerTest, DrainWaitsThenRefusesNewWork) {
  Start({.workers = 1});
  std::string a = Buffer(4096, 'a'), b = Buffer(4096, 'b');
  engine_.Hold();
  TransferSnapshot t = SubmitOne(Move(a, b));
  engine_.AwaitStarted(1);
  EXPECT_FALSE(sched_->Drain(absl::Now() + absl::Milliseconds(50)));
  EXPECT_EQ(sched_->Submit("me", {Move(a, b)}, "").status().code(), absl::StatusCode::kUnavailable);
  engine_.Open();
  EXPECT_TRUE(sched_->Drain(absl::Now() + absl::Seconds(10)));
  EXPECT_EQ(WaitDone(t.id).state, TransferState::kSucceeded);
}

TEST_F(SchedulerTest, RateLimitSlowsMovesDown) {
  Start({.rate_limit = 1 << 20});  // 1 MiB/s.
  std::string a = Buffer(256 << 10, 'a'), b = Buffer(256 << 10, 'b');
  const absl::Time start = absl::Now();
  TransferSnapshot t = WaitDone(SubmitOne(Move(a, b)).id);
  EXPECT_EQ(t.state, TransferState::kSucceeded);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));
}

TEST_F(SchedulerTest, WaitTimesOutAndWaitForChangeSeesProgress) {
  Start({.workers = 1});
  std::string a = Buffer(4096, 'a'), b = Buffer(4096, 'b');
  engine_.Hold();
  TransferSnapshot t = SubmitOne(Move(a, b));
  EXPECT_EQ(sched_->Wait("me", t.id, absl::Now() + absl::Milliseconds(20)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  auto running = sched_->WaitForChange("me", t.id, t.version, absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(running.ok());
  EXPECT_EQ(running->state, TransferState::kRunning);
  engine_.Open();
  auto done = sched_->WaitForChange("me", t.id, running->version, absl::Now() + absl::Seconds(5));
  EXPECT_EQ(done->state, TransferState::kSucceeded);
}

// Listeners (the server's waits without a thread) hear each change of their transfer's
// state, none of another transfer's, and nothing once forgotten.
TEST_F(SchedulerTest, ListenersHearTheirTransfersChangesUntilForgotten) {
  Start({.workers = 1});
  std::string a = Buffer(4096, 'a'), b = Buffer(4096, 'b'), c = Buffer(4096, 'c'),
              d = Buffer(4096, 'd');
  engine_.Hold();
  TransferSnapshot t = SubmitOne(Move(a, b));
  std::atomic<int> heard{0}, other{0}, forgotten{0};
  const uint64_t mine = sched_->ListenForChanges(t.id, [&] { ++heard; });
  const uint64_t gone = sched_->ListenForChanges(t.id, [&] { ++forgotten; });
  sched_->ForgetChanges(gone);
  TransferSnapshot u = SubmitOne(Move(c, d));
  const uint64_t theirs = sched_->ListenForChanges(u.id, [&] { ++other; });
  sched_->ForgetChanges(theirs);
  auto running = sched_->WaitForChange("me", t.id, t.version, absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(running.ok());
  EXPECT_EQ(running->state, TransferState::kRunning);
  // Queued -> running may come before the listener is in place (a free worker takes the
  // move at once): heard 0 or 1 so far, then one more for running -> succeeded.
  const int before_end = heard.load();
  EXPECT_LE(before_end, 1);
  engine_.Open();
  EXPECT_EQ(WaitDone(t.id).state, TransferState::kSucceeded);
  EXPECT_EQ(heard.load(), before_end + 1);  // Running -> succeeded.
  sched_->ForgetChanges(mine);
  EXPECT_EQ(forgotten.load(), 0);
  EXPECT_EQ(other.load(), 0);
}

TEST_F(SchedulerTest, BuffersAreFreeOnceTheEndIsVisible) {
  Start({.workers = 4});
  std::string a = Buffer(4096, 'a'), b = Buffer(4096, 'b');
  for (int i = 0; i < 300; ++i) {
    TransferSnapshot t = WaitDone(SubmitOne(Move(a, b)).id);
    ASSERT_EQ(t.state, TransferState::kSucceeded);
    ASSERT_EQ(registry_->Get("me", a)->active_uses, 0u) << "iteration " << i;
    ASSERT_EQ(registry_->Get("me", b)->active_uses, 0u) << "iteration " << i;
  }
}

// A caller that waits only so long (a wait timeout) must be answered then: a lone move
// that could outlast it (rate-capped, or big) goes to a worker instead of running on the
// caller's thread, where nothing could leave it at the deadline. Without a bound it still
// runs inline.
TEST_F(SchedulerTest, ABoundedWaitRunsInlineOnlyWhatEndsQuickly) {
  Start({.workers = 1, .rate_limit = 1 << 20, .inline_max_bytes = 4096});  // 1 MiB/s.
  std::string a = Buffer(256 << 10, 'a'), b = Buffer(256 << 10, 'b');
  // Unbounded, the worker idle: it runs here, ~250 ms at 1 MiB/s.
  absl::Time start = absl::Now();
  auto unbounded = sched_->Submit("me", {Move(b, a)}, "", /*caller_waits=*/true,
                                  /*wait_bounded=*/false);
  ASSERT_TRUE(unbounded.ok());
  EXPECT_EQ(unbounded->at(0).state, TransferState::kSucceeded);  // Ran inline.
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));
  // Bounded: the same move goes to the worker; Submit answers at once.
  start = absl::Now();
  auto bounded = sched_->Submit("me", {Move(a, b)}, "", true, /*wait_bounded=*/true);
  ASSERT_TRUE(bounded.ok());
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(150));
  EXPECT_FALSE(IsTerminal(bounded->at(0).state));
  EXPECT_EQ(
      sched_->Wait("me", bounded->at(0).id, absl::Now() + absl::Milliseconds(20)).status().code(),
      absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(WaitDone(bounded->at(0).id).state, TransferState::kSucceeded);
}

TEST_F(SchedulerTest, SmallMoveForAWaitingCallerRunsInline) {
  Start({.workers = 1, .inline_max_bytes = 4096});
  std::string a = Buffer(8192, 'a'), b = Buffer(8192, 'b');
  auto small = sched_->Submit("me", {Move(a, b, 0, 0, 4096)}, "", /*caller_waits=*/true);
  ASSERT_TRUE(small.ok());
  // Done before Submit returned: it ran on this thread.
  EXPECT_EQ(sched_->Get("me", small->at(0).id)->state, TransferState::kSucceeded);
  EXPECT_EQ(Contents(b).substr(0, 4096), std::string(4096, 'a'));
  // Bigger, but the worker is idle: it runs here too, in the worker's place.
  auto big = sched_->Submit("me", {Move(b, a, 0, 0, 8192)}, "", true);
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(sched_->Get("me", big->at(0).id)->state, TransferState::kSucceeded);
  // Not waited for: queued for the worker, which it keeps busy (held). A bigger move for
  // a waiting caller now queues too rather than run beside it.
  std::string c = Buffer(8192, 'c'), d = Buffer(8192, 'd');
  engine_.Hold();
  auto nowait = sched_->Submit("me", {Move(b, a, 0, 4096, 4096)}, "", false);
  ASSERT_TRUE(nowait.ok());
  for (int i = 0; i < 500 && sched_->Get("me", nowait->at(0).id)->state != TransferState::kRunning;
       ++i) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  ASSERT_EQ(sched_->Get("me", nowait->at(0).id)->state, TransferState::kRunning);
  auto queued = sched_->Submit("me", {Move(c, d, 0, 0, 8192)}, "", true);
  ASSERT_TRUE(queued.ok());
  EXPECT_EQ(sched_->Get("me", queued->at(0).id)->state, TransferState::kQueued);
  engine_.Open();
  EXPECT_EQ(WaitDone(nowait->at(0).id).state, TransferState::kSucceeded);
  EXPECT_EQ(WaitDone(queued->at(0).id).state, TransferState::kSucceeded);
  EXPECT_EQ(Contents(d), std::string(8192, 'c'));
}

TEST_F(SchedulerTest, ABatchForAWaitingCallerRunsItsSmallMovesInline) {
  Start({.workers = 2, .inline_max_bytes = 4096});
  std::string a = Buffer(1 << 20, 'a'), b = Buffer(3 << 20, 'b');
  // 300 small moves to disjoint ranges, a bigger one, and one that overlaps the first: the
  // first 256 small ones (1 MiB) run on this thread before Submit returns, the rest on the
  // workers.
  std::vector<TransferSpec> specs;
  for (int i = 0; i < 300; ++i) specs.push_back(Move(a, b, 0, i * 4096, 4096));
  specs.push_back(Move(a, b, 0, (2 << 20), 8192));
  specs.push_back(Move(a, b, 0, 0, 4096));
  auto batch = sched_->Submit("me", specs, "", /*caller_waits=*/true);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(engine_.MovesOn(std::this_thread::get_id()), 256);
  for (int i = 0; i < 256; ++i) {
    EXPECT_EQ(sched_->Get("me", batch->at(i).id)->state, TransferState::kSucceeded) << i;
  }
  for (size_t i = 0; i < batch->size(); ++i) {
    EXPECT_EQ(WaitDone(batch->at(i).id).state, TransferState::kSucceeded) << i;
  }
  EXPECT_EQ(Contents(b).substr(0, 300 * 4096), std::string(300 * 4096, 'a'));
  // Not waited for: nothing runs here.
  auto later = sched_->Submit("me", {Move(a, b, 0, 0, 4096), Move(a, b, 0, 4096, 4096)}, "", false);
  ASSERT_TRUE(later.ok());
  for (const auto& t : *later) EXPECT_EQ(WaitDone(t.id).state, TransferState::kSucceeded);
  EXPECT_EQ(engine_.MovesOn(std::this_thread::get_id()), 256);
}

// Ranges "on other nodes" that live in this process: holds point at real memory, so an
// engine can copy into them. Records how holds were asked for and keeps acknowledgements
// until the test lets them go.
class FakeRemote : public RemoteRanges {
 public:
  absl::StatusOr<RemoteHold> Prepare(const std::string& owner, const std::string& transfer_id,
                                     const std::string& node, const std::string& buffer_id,
                                     uint64_t offset, uint64_t length, bool write, PathKind path,
                                     bool local_device) override {
    absl::MutexLock lock(&mu_);
    auto it = memory_.find(node + "/" + buffer_id);
    if (it == memory_.end()) return absl::NotFoundError("no such remote buffer");
    std::string& m = it->second;
    if (length == 0) length = m.size() - offset;
    if (offset + length > m.size()) return absl::InvalidArgumentError("past the end");
    RemoteHold h;
    h.node = node;
    h.transfer_id = transfer_id;
    h.address = reinterpret_cast<uint64_t>(m.data() + offset);
    h.length = length;
    h.write = write;
    h.reads_tails = reads_tails_;
    ++holds_;
    return h;
  }
  std::vector<absl::StatusOr<RemoteHold>> PrepareMany(const std::string& owner,
                                                      const std::string& node,
                                                      const std::vector<RemoteAsk>& asks) override {
    {
      absl::MutexLock lock(&mu_);
      batches_.push_back(absl::StrCat(node, ":", asks.size()));
      most_preparing_ = std::max(most_preparing_, ++preparing_);
      auto met = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return most_preparing_ >= meet_; };
      mu_.AwaitWithTimeout(absl::Condition(&met), absl::Seconds(10));
    }
    std::vector<absl::StatusOr<RemoteHold>> out = RemoteRanges::PrepareMany(owner, node, asks);
    absl::MutexLock lock(&mu_);
    --preparing_;
    return out;
  }
  // Batches wait (up to 10 s) until `n` of them have been in PrepareMany at once.
  void MeetInPrepare(int n) {
    absl::MutexLock lock(&mu_);
    meet_ = n;
  }
  // The most batches that were in PrepareMany at once.
  int most_preparing() {
    absl::MutexLock lock(&mu_);
    return most_preparing_;
  }
  absl::StatusOr<uint64_t> Complete(const RemoteHold& hold, const absl::Status& outcome,
                                    bool checksum, const AckTail& tail) override {
    absl::MutexLock lock(&mu_);
    --holds_;
    return 0;
  }
  void CompleteAsync(const RemoteHold& hold, const absl::Status& outcome, bool checksum,
                     const AckTail& tail, bool caller_busy, AckCallback done) override {
    absl::MutexLock lock(&mu_);
    acks_.push_back(std::move(done));
    tails_.push_back(tail.token);
    tail_bytes_.push_back(tail.bytes);
    runner_waits_.push_back(tail.runner_waits);
    busy_.push_back(caller_busy);
  }
  void Release(const RemoteHold& hold) override {
    absl::Notification* gate;
    {
      absl::MutexLock lock(&mu_);
      ++releases_entered_;
      gate = release_gate_;
    }
    if (gate != nullptr) gate->WaitForNotification();  // As a release that calls the node.
    absl::MutexLock lock(&mu_);
    --holds_;
  }
  // Releases wait for `gate` (null: they do not).
  void GateReleases(absl::Notification* gate) {
    absl::MutexLock lock(&mu_);
    release_gate_ = gate;
  }
  void AwaitReleaseEntered(int n) {
    absl::MutexLock lock(&mu_);
    auto entered = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return releases_entered_ >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&entered), absl::Seconds(10));
  }
  void AddBuffer(const std::string& node, const std::string& id, std::string bytes) {
    absl::MutexLock lock(&mu_);
    memory_[node + "/" + id] = std::move(bytes);
  }
  std::string Contents(const std::string& node, const std::string& id) {
    absl::MutexLock lock(&mu_);
    return memory_[node + "/" + id];
  }
  void AwaitAcks(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return acks_.size() >= n; };
    mu_.Await(absl::Condition(&enough));
  }
  // Runs the kept acknowledgements: OK, except the one at `fail_index`.
  void Acknowledge(size_t fail_index) {
    std::vector<AckCallback> acks;
    {
      absl::MutexLock lock(&mu_);
      acks.swap(acks_);
      holds_ -= static_cast<int>(acks.size());
    }
    for (size_t i = 0; i < acks.size(); ++i) {
      if (i == fail_index) {
        acks[i](absl::UnavailableError("peer went away"));
      } else {
        acks[i](uint64_t{0});
      }
    }
  }
  std::vector<std::string> batches() {
    absl::MutexLock lock(&mu_);
    return batches_;
  }
  // The tails the acknowledgements carried, in order, and the bytes behind each.
  std::vector<std::string> tails() {
    absl::MutexLock lock(&mu_);
    return tails_;
  }
  std::vector<uint64_t> tail_bytes() {
    absl::MutexLock lock(&mu_);
    return tail_bytes_;
  }
  // Whether each said the runner waits for its tail itself.
  std::vector<bool> runner_waits() {
    absl::MutexLock lock(&mu_);
    return runner_waits_;
  }
  // Whether each acknowledgement's caller had more moves waiting, in order.
  std::vector<bool> busy() {
    absl::MutexLock lock(&mu_);
    return busy_;
  }
  void ReadTails(bool v) {
    absl::MutexLock lock(&mu_);
    reads_tails_ = v;
  }
  int holds() {
    absl::MutexLock lock(&mu_);
    return holds_;
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string> memory_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> batches_ ABSL_GUARDED_BY(mu_);
  std::vector<AckCallback> acks_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> tails_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> tail_bytes_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> runner_waits_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> busy_ ABSL_GUARDED_BY(mu_);
  bool reads_tails_ ABSL_GUARDED_BY(mu_) = false;
  int holds_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Notification* release_gate_ ABSL_GUARDED_BY(mu_) = nullptr;
  int releases_entered_ ABSL_GUARDED_BY(mu_) = 0;
  int meet_ ABSL_GUARDED_BY(mu_) = 0;
  int preparing_ ABSL_GUARDED_BY(mu_) = 0;
  int most_preparing_ ABSL_GUARDED_BY(mu_) = 0;
};

// Copies between local memory and FakeRemote holds.
class RemoteCopyEngine : public Engine {
 public:
  PathKind path() const override { return PathKind::kUcx; }
  absl::Status CanServe(const Endpoint& src, const Endpoint& dst) const override {
    return absl::OkStatus();
  }
  absl::Status Move(const Endpoint& src, const Endpoint& dst, uint64_t length,
                    MoveControl& control) override {
    auto at = [](const Endpoint& e) {
      return e.remote != nullptr ? reinterpret_cast<char*>(e.remote->address) : e.data;
    };
    std::memcpy(at(dst), at(src), length);
    moves_.fetch_add(1);
    // Leaves a (pretend) copy running as a tail when the scheduler takes one.
    if (control.AcceptsTail()) control.KeepRunning(std::make_unique<Tail>(this));
    return absl::OkStatus();
  }
  // The pretend copies end when `copies_end` is notified (null: at once), with `result`.
  void HoldCopies(absl::Notification* copies_end, absl::Status result) {
    absl::MutexLock lock(&mu_);
    copies_end_ = copies_end;
    copy_result_ = std::move(result);
  }
  std::atomic<int> moves_{0};
  std::atomic<int> tails_ended_{0};
  std::atomic<int> tails_waited_{0};  // Wait() calls that returned.

 private:
  class Tail : public MoveTail {
   public:
    explicit Tail(RemoteCopyEngine* engine) : engine_(engine) {}
    ~Tail() override { engine_->tails_ended_.fetch_add(1); }
    const std::string& token() const override { return handle_; }
    absl::Status Wait() override {
      absl::Notification* end;
      absl::Status result;
      {
        absl::MutexLock lock(&engine_->mu_);
        end = engine_->copies_end_;
        result = engine_->copy_result_;
      }
      if (end != nullptr) end->WaitForNotification();
      engine_->tails_waited_.fetch_add(1);
      return result;
    }
    uint64_t pending_bytes() const override { return 3000; }

   private:
    RemoteCopyEngine* const engine_;
    std::string handle_ = "tail-token";
  };
  absl::Mutex mu_;
  absl::Notification* copies_end_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::Status copy_result_ ABSL_GUARDED_BY(mu_);
};

// A scheduler on node n1 whose other nodes are a FakeRemote.
class SchedulerRemoteTest : public ::testing::Test {
 protected:
  SchedulerRemoteTest() {
    PoolSizes sizes;
    sizes.host = 16 << 20;
    sizes.pinned = 0;
    pools_ = *PoolSet::Create(sizes, {}, gpu_.get());
    registry_ = std::make_unique<BufferRegistry>(pools_.get(), absl::ZeroDuration());
  }
  TransferScheduler& Start(int workers) {
    SchedulerOptions options;
    options.node = "n1";
    options.workers = workers;
    options.inline_max_bytes = 0;
    sched_ = std::make_unique<TransferScheduler>(
        options, registry_.get(), std::vector<Engine*>{&engine_},
        [](const Endpoint&, uint64_t) -> absl::StatusOr<uint64_t> { return 0; }, &remote_);
    return *sched_;
  }
  BufferInfo Local(uint64_t size) {
    AllocateOptions o;
    o.size = size;
    o.owner = "me";
    return *registry_->Allocate(o);
  }
  // A 64 KiB local buffer, and n2's 64 KiB "b-dst" for PushPage to push into.
  BufferInfo WithPushTarget() {
    remote_.AddBuffer("n2", "b-dst", std::string(64 << 10, 'x'));
    return Local(64 << 10);
  }
  // Page `i` (4 KiB) of `local` onto the same page of n2's "b-dst".
  static TransferSpec PushPage(const BufferInfo& local, int i) {
    TransferSpec s;
    s.source = {"", local.id, i * 4096ull, 4096};
    s.destination = {"n2", "b-dst", i * 4096ull, 0};
    return s;
  }

  std::unique_ptr<GpuRuntime> gpu_ = GpuRuntime::CreateHostOnly("test");
  std::unique_ptr<PoolSet> pools_;
  std::unique_ptr<BufferRegistry> registry_;
  FakeRemote remote_;
  RemoteCopyEngine engine_;
  std::unique_ptr<TransferScheduler> sched_;  // Last: stopped before the rest.
};

// A Submit's batches of holds on several nodes are asked for at once, not one node after
// another (each batch waits here until all three are in).
TEST_F(SchedulerRemoteTest, HoldsOnSeveralNodesAreAskedForAtOnce) {
  TransferScheduler& sched = Start(/*workers=*/2);
  BufferInfo local = Local(4096);
  std::vector<TransferSpec> specs;
  for (const char* node : {"n2", "n3", "n4"}) {
    remote_.AddBuffer(node, "b-dst", std::string(4096, 'x'));
    TransferSpec s;
    s.source = {"", local.id, 0, 4096};
    s.destination = {node, "b-dst", 0, 0};
    specs.push_back(s);
  }
  remote_.MeetInPrepare(3);
  auto submitted = sched.Submit("me", specs, "");
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  EXPECT_EQ(remote_.most_preparing(), 3);
  remote_.AwaitAcks(3);
  remote_.Acknowledge(/*fail_index=*/99);
  for (const TransferSnapshot& t : *submitted) {
    auto end = sched.Wait("me", t.id, absl::Now() + absl::Seconds(10));
    ASSERT_TRUE(end.ok());
    EXPECT_EQ(end->state, TransferState::kSucceeded) << end->status;
  }
}

TEST_F(SchedulerRemoteTest, HoldsGoInOneBatchPerNodeAndAcknowledgementsDoNotBlockWorkers) {
  TransferScheduler& sched = Start(/*workers=*/2);
  BufferRegistry& registry = *registry_;
  FakeRemote& remote = remote_;
  RemoteCopyEngine& engine = engine_;
  AllocateOptions o;
  o.size = 64 << 10;
  BufferInfo local = Local(o.size);
  {
    auto use = registry.Acquire("me", local.id, 0, 0);
    for (uint64_t i = 0; i < o.size; ++i) use->data()[i] = static_cast<char>(i * 7);
  }
  remote.AddBuffer("n2", "b-dst", std::string(64 << 10, 'x'));
  remote.AddBuffer("n3", "b-src", std::string(64 << 10, 'y'));
  BufferInfo pulled = Local(o.size);

  // Eight pushes to n2 and three pulls from n3 in one Submit.
  std::vector<TransferSpec> specs;
  for (int i = 0; i < 8; ++i) {
    TransferSpec s;
    s.source = {"", local.id, i * 4096ull, 4096};
    s.destination = {"n2", "b-dst", i * 4096ull, 0};
    specs.push_back(s);
  }
  for (int i = 0; i < 3; ++i) {
    TransferSpec s;
    s.source = {"n3", "b-src", i * 1000ull, 1000};
    s.destination = {"", pulled.id, i * 1000ull, 0};
    specs.push_back(s);
  }
  auto submitted = sched.Submit("me", specs, "");
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  // One batch per node: n3's sources first (phase 1), then n2's destinations.
  EXPECT_EQ(remote.batches(), (std::vector<std::string>{"n3:3", "n2:8"}));
  EXPECT_EQ(remote.holds(), 11);
  // Two workers ran all eleven moves although no acknowledgement has come back: the
  // transfers wait for theirs without holding a worker.
  remote.AwaitAcks(11);
  EXPECT_EQ(engine.moves_.load(), 11);
  // The first moves' workers had more waiting: their acknowledgements are handed over
  // rather than sent on the worker; the last move's worker had none. (Which of the two
  // workers' last acknowledgements is recorded last is a race, so not the order.)
  const std::vector<bool> busy = remote.busy();
  EXPECT_TRUE(busy.front());
  EXPECT_NE(std::find(busy.begin(), busy.end(), false), busy.end());
  for (const TransferSnapshot& t : *submitted) {
    EXPECT_EQ(sched.Get("me", t.id)->state, TransferState::kRunning) << t.id;
  }
  remote.Acknowledge(/*fail_index=*/4);
  int succeeded = 0, failed = 0;
  for (const TransferSnapshot& t : *submitted) {
    auto end = sched.Wait("me", t.id, absl::Now() + absl::Seconds(10));
    ASSERT_TRUE(end.ok());
    succeeded += end->state == TransferState::kSucceeded;
    if (end->state == TransferState::kFailed) {
      ++failed;
      EXPECT_EQ(end->status.code(), absl::StatusCode::kUnavailable);
      EXPECT_NE(end->status.message().find("did not acknowledge"), std::string::npos);
    }
  }
  EXPECT_EQ(succeeded, 10);
  EXPECT_EQ(failed, 1);
  EXPECT_EQ(remote.holds(), 0);
  const std::string landed = remote.Contents("n2", "b-dst");
  auto use = registry.Acquire("me", local.id, 0, 0);
  EXPECT_EQ(landed.substr(0, 8 * 4096), std::string(use->data(), 8 * 4096));
  auto got = registry.Acquire("me", pulled.id, 0, 3000);
  EXPECT_EQ(std::string(got->data(), 3000), std::string(3000, 'y'));
}

TEST_F(SchedulerRemoteTest, ATailGoesWithTheAcknowledgementAndEndsBeforeTheTransfer) {
  TransferScheduler& sched = Start(/*workers=*/2);
  FakeRemote& remote = remote_;
  RemoteCopyEngine& engine = engine_;
  const BufferInfo local = WithPushTarget();
  // Holds that do not read tails: no tail is taken, none travels.
  auto plain = sched.Submit("me", {PushPage(local, 0)}, "");
  ASSERT_TRUE(plain.ok()) << plain.status();
  remote.AwaitAcks(1);
  remote.Acknowledge(/*fail_index=*/99);
  EXPECT_EQ(sched.Wait("me", plain->at(0).id, absl::Now() + absl::Seconds(10))->state,
            TransferState::kSucceeded);
  EXPECT_EQ(remote.tails(), std::vector<std::string>{""});
  EXPECT_EQ(engine.tails_ended_.load(), 0);

  // Holds that do: the acknowledgement of a move with nothing queued behind it names the
  // move's tail, which the scheduler keeps until the acknowledgement is back (OK or not)
  // and lets go before the transfer ends.
  remote.ReadTails(true);
  std::vector<TransferSnapshot> fenced;
  for (int i = 1; i <= 2; ++i) {
    auto one = sched.Submit("me", {PushPage(local, i)}, "");
    ASSERT_TRUE(one.ok()) << one.status();
    fenced.push_back(one->at(0));
    remote.AwaitAcks(i);
  }
  EXPECT_EQ(remote.tails(), (std::vector<std::string>{"", "tail-token", "tail-token"}));
  EXPECT_EQ(remote.tail_bytes(), (std::vector<uint64_t>{0, 3000, 3000}));
  EXPECT_EQ(remote.busy(), (std::vector<bool>{false, false, false}));  // Each move alone.
  EXPECT_EQ(engine.tails_ended_.load(), 0);
  for (const TransferSnapshot& t : fenced) {
    EXPECT_EQ(sched.Get("me", t.id)->state, TransferState::kRunning);
    EXPECT_EQ(sched.Get("me", t.id)->bytes_done, 0u);  // Not counted until acknowledged.
  }
  remote.Acknowledge(/*fail_index=*/1);
  std::multiset<TransferState> ends;
  for (const TransferSnapshot& t : fenced) {
    ends.insert(sched.Wait("me", t.id, absl::Now() + absl::Seconds(10))->state);
  }
  EXPECT_EQ(ends,
            (std::multiset<TransferState>{TransferState::kSucceeded, TransferState::kFailed}));
  EXPECT_EQ(engine.tails_ended_.load(), 2);
}

// The other node may acknowledge while the copy still runs (the acknowledgement says the
// runner waits for its tail): an acknowledged move is SUCCEEDED, its bytes counted, only
// once the runner sees its own tail land; a copy that failed behind it fails the move.
TEST_F(SchedulerRemoteTest, AnAcknowledgedMoveEndsOnceItsOwnTailLands) {
  TransferScheduler& sched = Start(/*workers=*/2);
  FakeRemote& remote = remote_;
  RemoteCopyEngine& engine = engine_;
  const BufferInfo local = WithPushTarget();
  remote.ReadTails(true);
  int acks = 0;
  for (const absl::Status& result :
       {absl::OkStatus(), absl::InternalError("cudaErrorIllegalAddress")}) {
    SCOPED_TRACE(result.ToString());
    absl::Notification copy_ends;
    engine.HoldCopies(&copy_ends, result);
    const int waited = engine.tails_waited_.load();
    auto one = sched.Submit("me", {PushPage(local, 0)}, "");
    ASSERT_TRUE(one.ok()) << one.status();
    remote.AwaitAcks(1);
    EXPECT_EQ(remote.runner_waits().at(acks++), true);
    std::thread acker([&] { remote.Acknowledge(/*fail_index=*/99); });
    absl::SleepFor(absl::Milliseconds(50));
    auto running = sched.Get("me", one->at(0).id);
    EXPECT_EQ(running->state, TransferState::kRunning);  // Acknowledged, copy still on.
    EXPECT_EQ(running->bytes_done, 0u);
    EXPECT_EQ(engine.tails_waited_.load(), waited);
    copy_ends.Notify();
    auto end = sched.Wait("me", one->at(0).id, absl::Now() + absl::Seconds(10));
    acker.join();
    ASSERT_TRUE(end.ok()) << end.status();
    EXPECT_EQ(engine.tails_waited_.load(), waited + 1);
    if (result.ok()) {
      EXPECT_EQ(end->state, TransferState::kSucceeded);
      EXPECT_EQ(end->bytes_done, 4096u);
    } else {
      EXPECT_EQ(end->state, TransferState::kFailed);
      EXPECT_EQ(end->status.code(), absl::StatusCode::kInternal);
      EXPECT_NE(end->status.message().find("cudaErrorIllegalAddress"), absl::string_view::npos)
          << end->status;
      EXPECT_EQ(end->bytes_done, 0u);
    }
  }
  engine.HoldCopies(nullptr, absl::OkStatus());
}

TEST_F(SchedulerRemoteTest, ReleasingTheHoldOfACancelledMoveDoesNotBlockTheScheduler) {
  TransferScheduler& sched = Start(/*workers=*/1);
  FakeRemote& remote = remote_;
  BufferInfo local = WithPushTarget();
  // The first push runs and waits for its acknowledgement; the second, to the same page,
  // waits for the first, queued, holding its range on n2.
  auto first = sched.Submit("me", {PushPage(local, 0)}, "");
  ASSERT_TRUE(first.ok()) << first.status();
  remote.AwaitAcks(1);
  auto second = sched.Submit("me", {PushPage(local, 0)}, "");
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(sched.Get("me", second->at(0).id)->state, TransferState::kQueued);
  ASSERT_EQ(remote.holds(), 2);
  // Cancelling it lets its hold go with a call to n2 that takes its time.
  absl::Notification gate;
  remote.GateReleases(&gate);
  std::thread canceller([&] {
    auto c = sched.Cancel("me", second->at(0).id);
    EXPECT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->state, TransferState::kCancelled);
  });
  remote.AwaitReleaseEntered(1);
  // Meanwhile the scheduler answers (its lock is not held across the call).
  absl::Notification answered;
  std::thread getter([&] {
    EXPECT_TRUE(sched.Get("me", first->at(0).id).ok());
    answered.Notify();
  });
  EXPECT_TRUE(answered.WaitForNotificationWithTimeout(absl::Seconds(5)));
  gate.Notify();
  canceller.join();
  getter.join();
  remote.GateReleases(nullptr);
  remote.Acknowledge(/*fail_index=*/99);
  EXPECT_EQ(sched.Wait("me", first->at(0).id, absl::Now() + absl::Seconds(10))->state,
            TransferState::kSucceeded);
  EXPECT_EQ(remote.holds(), 0);
}

TEST_F(SchedulerRemoteTest, ARefusedHoldRefusesTheSubmitAndLetsTheOthersGo) {
  TransferScheduler& sched = Start(/*workers=*/4);
  BufferRegistry& registry = *registry_;
  FakeRemote& remote = remote_;
  BufferInfo local = Local(64 << 10);
  remote.AddBuffer("n2", "b-dst", std::string(8192, 'x'));
  std::vector<TransferSpec> specs(3);
  specs[0].source = {"", local.id, 0, 4096};
  specs[0].destination = {"n2", "b-dst", 0, 0};
  specs[1].source = {"", local.id, 4096, 4096};
  specs[1].destination = {"n2", "b-missing", 0, 0};
  specs[2].source = {"", local.id, 8192, 4096};
  specs[2].destination = {"n2", "b-dst", 4096, 0};
  auto submitted = sched.Submit("me", specs, "");
  ASSERT_FALSE(submitted.ok());
  EXPECT_EQ(submitted.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(submitted.status().message().find("transfer 1"), std::string::npos)
      << submitted.status();
  EXPECT_EQ(remote.holds(), 0);  // The two that were held are let go.
  EXPECT_EQ(registry.Get("me", local.id)->active_uses, 0u);
  EXPECT_TRUE(sched.List("me", {}, 10).empty());
}

}  // namespace
}  // namespace gpumove
