#include "daemon/peer/holds.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace gpumove {
namespace {

// A tail reader that records how it was asked to wait. Every tail has landed unless the
// test says its copy still runs (CopyRuns); a wait then lasts until EndCopy or its
// deadline. Token "refused" is refused; a token is known once looked at.
class TailRecorder : public TailReader {
 public:
  bool Knows(const std::string& token) const override {
    absl::MutexLock lock(&mu_);
    return opened_.contains(token);
  }
  absl::Status Wait(const BufferUse& range, const AckTail& tail, absl::Time arrived,
                    absl::Time deadline) override {
    absl::MutexLock lock(&mu_);
    token_ = tail.token;
    bytes_ = tail.bytes;
    range_length_ = range.length();
    arrived_ = arrived;
    deadline_ = deadline;
    if (tail.token == "refused") return absl::InvalidArgumentError("not a tail");
    opened_.insert(tail.token);
    auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !running_; };
    if (deadline == absl::InfinitePast()
            ? !ended()
            : !mu_.AwaitWithDeadline(absl::Condition(&ended), deadline)) {
      return absl::DeadlineExceededError("the copy runs on");
    }
    return absl::OkStatus();
  }

  void CopyRuns() {
    absl::MutexLock lock(&mu_);
    running_ = true;
  }
  void EndCopy() {
    absl::MutexLock lock(&mu_);
    running_ = false;
  }
  std::string token() {
    absl::MutexLock lock(&mu_);
    return token_;
  }
  uint64_t bytes() {
    absl::MutexLock lock(&mu_);
    return bytes_;
  }
  uint64_t range_length() {
    absl::MutexLock lock(&mu_);
    return range_length_;
  }
  absl::Time arrived() {
    absl::MutexLock lock(&mu_);
    return arrived_;
  }
  absl::Time deadline() {
    absl::MutexLock lock(&mu_);
    return deadline_;
  }
  void ClearToken() {
    absl::MutexLock lock(&mu_);
    token_.clear();
  }

 private:
  mutable absl::Mutex mu_;
  std::string token_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0, range_length_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time arrived_ ABSL_GUARDED_BY(mu_), deadline_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<std::string> opened_ ABSL_GUARDED_BY(mu_);  // As the driver would.
};

class HoldTableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PoolSizes sizes;
    sizes.host = 64 << 20;
    sizes.pinned = 0;  // The fake GPU cannot pin memory.
    pools_ = *PoolSet::Create(sizes, {}, host_.get());
    registry_ = std::make_unique<BufferRegistry>(pools_.get(), absl::ZeroDuration());
    AllocateOptions o;
    o.size = 32 << 20;
    o.owner = "alice";
    buffer_ = registry_->Allocate(o)->id;
  }
  std::unique_ptr<HoldTable> Table(TailReader* tails) {
    return std::make_unique<HoldTable>(
        registry_.get(), [](const Endpoint&, uint64_t) { return uint64_t{7}; }, tails);
  }
  std::unique_ptr<HoldTable> Table() { return Table(&tails_); }
  // Holds `length` bytes of the buffer for node-a's transfer `id`, then ends the move with
  // the runner's OK and `tail`: Complete's answer.
  absl::StatusOr<uint64_t> HoldAndComplete(HoldTable& table, const std::string& id,
                                           const AckTail& tail, bool checksum = false,
                                           absl::Duration tail_wait = absl::Seconds(10),
                                           uint64_t length = 4096) {
    auto held = table.Hold("node-a", 1, id, "alice", buffer_, 0, length);
    if (!held.ok()) return held.status();
    return table.Complete("node-a", id, checksum, /*runner_ok=*/true, tail, tail_wait);
  }

  std::unique_ptr<GpuRuntime> host_ = GpuRuntime::CreateHostOnly("test");
  TailRecorder tails_;
  std::unique_ptr<PoolSet> pools_;
  std::unique_ptr<BufferRegistry> registry_;
  std::string buffer_;
};

// A tail reaches the reader as the acknowledgement carried it, with the held range, when
// it came and the wait's deadline; the reader's answer ends the hold.
TEST_F(HoldTableTest, ATailReachesItsReaderWithItsRangeArrivalAndDeadline) {
  auto table = Table();
  ASSERT_TRUE(table->Hold("node-a", 1, "t1", "alice", buffer_, 0, 16 << 20).ok());
  const absl::Time before = absl::Now();
  auto done = table->Complete("node-a", "t1", /*checksum=*/false, /*runner_ok=*/true,
                              AckTail{"tail-token", 8 << 20});
  const absl::Time after = absl::Now();
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(tails_.token(), "tail-token");
  EXPECT_EQ(tails_.bytes(), 8u << 20);
  EXPECT_EQ(tails_.range_length(), 16u << 20);
  EXPECT_GE(tails_.arrived(), before);
  EXPECT_LE(tails_.arrived(), after);
  EXPECT_GE(tails_.deadline(), before + absl::Seconds(10));
  EXPECT_EQ(table->size(), 0u);  // The hold ended.
}

// No tail (a move that needed none): the reader is not asked at all. A tail on a node
// whose table has no reader is refused (it never acknowledges bytes it did not see land),
// and the hold ends.
TEST_F(HoldTableTest, WithoutATailTheReaderIsNotAskedAndWithoutAReaderATailIsRefused) {
  auto table = Table();
  ASSERT_TRUE(table->Hold("node-a", 1, "t3", "alice", buffer_, 0, 4096).ok());
  ASSERT_TRUE(table->Complete("node-a", "t3", false, true, AckTail{}).ok());
  EXPECT_TRUE(tails_.token().empty());
  auto blind = Table(nullptr);
  for (bool runner_waits : {false, true}) {
    auto done = HoldAndComplete(*blind, "t4", AckTail{"t", 0, runner_waits});
    EXPECT_EQ(done.status().code(), absl::StatusCode::kFailedPrecondition) << done.status();
    EXPECT_EQ(blind->size(), 0u);
    EXPECT_EQ(registry_->Get("alice", buffer_)->active_uses, 0u);
    EXPECT_FALSE(blind->AnswersTailAtOnce(AckTail{"t", 0, true}, false));
  }
}

// A runner that sees its tail land itself (runner_waits) is answered at once, while its
// copy runs: the range stays held, in an ending use (a Release of the buffer waits for
// it), until this node sees the tail land too, on the table's own thread.
TEST_F(HoldTableTest, ARunnerThatWaitsForItsTailIsAnsweredWhileTheCopyRuns) {
  auto table = Table();
  tails_.CopyRuns();
  auto done = HoldAndComplete(*table, "t5", AckTail{"h5", 16 << 20, /*runner_waits=*/true},
                              /*checksum=*/false, absl::Seconds(10), /*length=*/16 << 20);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(table->size(), 1u);  // Still held, ending.
  EXPECT_EQ(registry_->Get("alice", buffer_)->active_uses, 1u);
  // A hold for another move stays apart from the ending one.
  ASSERT_TRUE(table->Hold("node-a", 1, "t6", "alice", buffer_, 0, 4096).ok());
  EXPECT_EQ(table->size(), 2u);
  EXPECT_EQ(table->ReleaseFrom("node-a", 1), 1);  // Not the ending one.
  EXPECT_EQ(table->size(), 1u);
  std::atomic<bool> released{false};
  absl::Status release;
  std::thread releaser([&] {
    release = registry_->Release("alice", buffer_);
    released = true;
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(released.load());
  EXPECT_EQ(table->size(), 1u);
  tails_.EndCopy();
  releaser.join();
  EXPECT_TRUE(release.ok()) << release;
  EXPECT_EQ(table->size(), 0u);
  EXPECT_EQ(tails_.token(), "h5");
}

// An acknowledgement with a tail can be answered on a thread that must not wait (the
// UCX progress thread) only when the runner waits for its tail, no checksum is asked and
// the tail was looked at before (opening one can take the driver milliseconds).
TEST_F(HoldTableTest, OnlyAKnownTailTheRunnerWaitsForIsAnsweredAtOnce) {
  auto table = Table();
  EXPECT_FALSE(table->AnswersTailAtOnce(AckTail{"h7", 0, true}, false));  // Never opened.
  ASSERT_TRUE(HoldAndComplete(*table, "t7", AckTail{"h7", 0, true}).ok());
  EXPECT_TRUE(table->AnswersTailAtOnce(AckTail{"h7", 0, true}, false));
  EXPECT_FALSE(table->AnswersTailAtOnce(AckTail{"h7", 0, true}, /*checksum=*/true));
  EXPECT_FALSE(table->AnswersTailAtOnce(AckTail{"h7", 0, /*runner_waits=*/false}, false));
  EXPECT_FALSE(table->AnswersTailAtOnce(AckTail{"h8", 0, true}, false));
}

// A tail this node cannot take is refused at the first look, and the hold ends; one that
// never passes ends its hold at the deadline; with a checksum, or a runner that does not
// wait for its tail, the answer waits for the copy as before.
TEST_F(HoldTableTest, AnEndingHoldEndsAtItsDeadlineAndChecksumsWaitForTheCopy) {
  auto table = Table();
  tails_.CopyRuns();
  EXPECT_EQ(HoldAndComplete(*table, "r", AckTail{"refused", 0, true}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(table->size(), 0u);
  EXPECT_EQ(registry_->Get("alice", buffer_)->active_uses, 0u);

  // A deadline a loaded machine (ASan on 2 busy cores) does not pass before the check.
  ASSERT_TRUE(HoldAndComplete(*table, "d", AckTail{"hd", 0, true}, /*checksum=*/false,
                              /*tail_wait=*/absl::Seconds(1))
                  .ok());
  EXPECT_EQ(table->size(), 1u);
  // The ending thread takes the hold off the table, then lets its range go: both, polled.
  for (int i = 0; i < 1000 && (table->size() > 0 ||
                               registry_->Get("alice", buffer_)->active_uses > 0);
       ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(table->size(), 0u);  // The copy still "runs": the deadline ended the hold.
  EXPECT_EQ(registry_->Get("alice", buffer_)->active_uses, 0u);

  for (const auto& [checksum, runner_waits] :
       std::vector<std::pair<bool, bool>>{{true, true}, {false, false}}) {
    SCOPED_TRACE(absl::StrCat(checksum, runner_waits));
    std::atomic<bool> answered{false};
    std::thread ender([&] {
      absl::SleepFor(absl::Milliseconds(50));
      EXPECT_FALSE(answered.load());
      tails_.EndCopy();
    });
    auto hash = HoldAndComplete(*table, "w", AckTail{"hw", 0, runner_waits}, checksum);
    answered = true;
    ender.join();
    ASSERT_TRUE(hash.ok()) << hash.status();
    EXPECT_EQ(*hash, checksum ? 7u : 0u);
    EXPECT_EQ(table->size(), 0u);
    tails_.CopyRuns();
  }
  tails_.EndCopy();
}

// The table waits for its ending holds when it goes.
TEST_F(HoldTableTest, ATableWaitsForItsEndingHoldsWhenItGoes) {
  auto table = Table();
  tails_.CopyRuns();
  ASSERT_TRUE(HoldAndComplete(*table, "e", AckTail{"he", 0, true}).ok());
  std::thread ender([this] {
    absl::SleepFor(absl::Milliseconds(100));
    tails_.EndCopy();
  });
  const absl::Time t0 = absl::Now();
  table.reset();
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(50));
  ender.join();
  EXPECT_EQ(registry_->Get("alice", buffer_)->active_uses, 0u);
}

// A path's part ends with its hold, before the range is let go; a part that fails when the
// runner says OK is the answer; one the runner failed anyway ends quietly. A part maker that
// fails refuses the hold and leaves the buffer as it was.
class RecordingPart : public HoldPart {
 public:
  RecordingPart(std::vector<std::string>* log, BufferRegistry* registry, std::string buffer,
                absl::Status end)
      : log_(log), registry_(registry), buffer_(std::move(buffer)), end_(std::move(end)) {}
  ~RecordingPart() override {
    log_->push_back(
        absl::StrCat("gone with ", registry_->Get("alice", buffer_)->active_uses, " use(s)"));
  }
  absl::Status End(bool runner_ok) override {
    log_->push_back(runner_ok ? "end ok" : "end failed");
    return end_;
  }
  bool EndBlocks() const override { return true; }

 private:
  std::vector<std::string>* const log_;
  BufferRegistry* const registry_;
  const std::string buffer_;
  const absl::Status end_;
};

TEST_F(HoldTableTest, PartsEndWithTheirHoldBeforeItsRangeIsLetGo) {
  auto table = Table();
  std::vector<std::string> log;
  auto make = [&](absl::Status end) {
    return [&, end](const BufferUse&, std::vector<std::unique_ptr<HoldPart>>* parts) {
      parts->push_back(std::make_unique<RecordingPart>(&log, registry_.get(), buffer_, end));
      return absl::OkStatus();
    };
  };
  ASSERT_TRUE(table
                  ->Hold("node-a", 1, "p1", "alice", buffer_, 0, 4096,
                         make(absl::DataLossError("half short")))
                  .ok());
  EXPECT_TRUE(table->EndBlocks("node-a", "p1"));
  EXPECT_FALSE(table->EndBlocks("node-a", "none"));
  auto done = table->Complete("node-a", "p1", false, /*runner_ok=*/true);
  EXPECT_EQ(done.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(log, (std::vector<std::string>{"end ok", "gone with 1 use(s)"}));
  log.clear();
  ASSERT_TRUE(table
                  ->Hold("node-a", 1, "p2", "alice", buffer_, 0, 4096,
                         make(absl::DataLossError("half short")))
                  .ok());
  EXPECT_TRUE(table->Complete("node-a", "p2", false, /*runner_ok=*/false).ok());
  EXPECT_EQ(log, (std::vector<std::string>{"end failed", "gone with 1 use(s)"}));
  EXPECT_EQ(registry_->Get("alice", buffer_)->active_uses, 0u);
  // Refused by its maker: nothing held, the part made so far gone.
  log.clear();
  auto refused =
      table->Hold("node-a", 1, "p3", "alice", buffer_, 0, 4096,
                  [&](const BufferUse& range, std::vector<std::unique_ptr<HoldPart>>* parts) {
                    EXPECT_EQ(range.length(), 4096u);
                    parts->push_back(std::make_unique<RecordingPart>(&log, registry_.get(), buffer_,
                                                                     absl::OkStatus()));
                    return absl::ResourceExhaustedError("no slots");
                  });
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(log, (std::vector<std::string>{"gone with 1 use(s)"}));
  EXPECT_EQ(table->size(), 0u);
  EXPECT_EQ(registry_->Get("alice", buffer_)->active_uses, 0u);
}

// A call using a hold (Ref) keeps its range in use after the hold ended, and a repeat of a
// hold is refused before its parts are made.
TEST_F(HoldTableTest, AHoldInUseOutlivesItsEndAndRepeatsMakeNoParts) {
  auto table = Table();
  ASSERT_TRUE(table->Hold("node-a", 1, "r1", "alice", buffer_, 0, 4096).ok());
  int made = 0;
  auto repeat = table->Hold("node-a", 1, "r1", "alice", buffer_, 0, 4096,
                            [&](const BufferUse&, std::vector<std::unique_ptr<HoldPart>>*) {
                              ++made;
                              return absl::OkStatus();
                            });
  EXPECT_EQ(repeat.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(made, 0);
  auto ref = table->Find("node-a", "r1");
  ASSERT_TRUE(ref.ok());
  EXPECT_EQ(ref->part<RecordingPart>(), nullptr);
  ASSERT_TRUE(table->Complete("node-a", "r1", false).ok());
  EXPECT_EQ(table->Find("node-a", "r1").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry_->Get("alice", buffer_)->active_uses, 1u);  // The Ref's.
  EXPECT_EQ(ref->range().length(), 4096u);
  ref = absl::NotFoundError("dropped");
  EXPECT_EQ(registry_->Get("alice", buffer_)->active_uses, 0u);
}

// A checksummed vectored move's pieces come with the hold: the checksum is over them, in
// list order, and pieces outside the range (a peer is not trusted) refuse the hold.
TEST_F(HoldTableTest, PiecesAreCheckedAgainstTheRangeAndHashedInOrder) {
  std::vector<std::vector<uint64_t>> hashed;
  auto table = std::make_unique<HoldTable>(
      registry_.get(), [](const Endpoint&, uint64_t) { return uint64_t{7}; }, &tails_,
      nullptr,
      [&](const Endpoint&, const Segments& pieces) {
        std::vector<uint64_t> seen;
        for (const Segment& p : pieces.list) seen.push_back(p.src);
        hashed.push_back(seen);
        return absl::StatusOr<uint64_t>(99);
      });
  HoldAsk ask;
  ask.pieces = {{300, 300, 10}, {0, 0, 5}, {4000, 4000, 96}};
  ASSERT_TRUE(table->Hold("node-a", 1, "v1", "alice", buffer_, 100, 4096, nullptr, ask).ok());
  auto hash = table->Complete("node-a", "v1", /*checksum=*/true);
  ASSERT_TRUE(hash.ok()) << hash.status();
  EXPECT_EQ(*hash, 99u);
  ASSERT_EQ(hashed.size(), 1u);
  EXPECT_EQ(hashed[0], (std::vector<uint64_t>{300, 0, 4000}));
  // Without a checksum the pieces are not hashed; without pieces the range is.
  ASSERT_TRUE(table->Hold("node-a", 1, "v2", "alice", buffer_, 0, 4096, nullptr, ask).ok());
  EXPECT_EQ(*table->Complete("node-a", "v2", false), 0u);
  ASSERT_TRUE(table->Hold("node-a", 1, "v3", "alice", buffer_, 0, 4096).ok());
  EXPECT_EQ(*table->Complete("node-a", "v3", true), 7u);
  EXPECT_EQ(hashed.size(), 1u);
  for (const Segment& bad : {Segment{4000, 4000, 97}, Segment{0, 0, 0},
                             Segment{UINT64_MAX, UINT64_MAX, 2}, Segment{5000, 5000, 1}}) {
    HoldAsk hostile;
    hostile.pieces = {{0, 0, 1}, bad};
    auto held = table->Hold("node-a", 1, "bad", "alice", buffer_, 0, 4096, nullptr, hostile);
    EXPECT_EQ(held.status().code(), absl::StatusCode::kInvalidArgument) << bad.src;
    EXPECT_EQ(table->size(), 0u);
  }
  // A table that cannot hash pieces refuses them.
  auto plain = Table();
  EXPECT_EQ(plain->Hold("node-a", 1, "p", "alice", buffer_, 0, 4096, nullptr, ask).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace gpumove
