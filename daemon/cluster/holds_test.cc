#include "daemon/cluster/holds.h"

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

// A host-only runtime that says it has a GPU and records how it was asked to wait for a
// fence. The copy behind every fence has ended unless the test says it still runs
// (CopyRuns); a wait then lasts until EndCopy or its deadline.
class FenceRecorder : public GpuRuntime {
 public:
  FenceRecorder() : host_(CreateHostOnly("test")) { devices_.push_back(GpuDevice{}); }
  bool cuda_compiled() const override { return false; }
  std::string status() const override { return "fence recorder"; }
  const std::vector<GpuDevice>& devices() const override { return devices_; }
  absl::StatusOr<void*> DeviceAlloc(int, uint64_t) override {
    return absl::UnimplementedError("no device memory");
  }
  void DeviceFree(int, void*) override {}
  absl::StatusOr<void*> PinnedAlloc(uint64_t bytes) override { return host_->PinnedAlloc(bytes); }
  void PinnedFree(void* ptr) override { host_->PinnedFree(ptr); }
  absl::Status Copy(void* dst, int dst_device, const void* src, int src_device, uint64_t bytes,
                    uint64_t chunk, const CopyProgress& progress) override {
    return host_->Copy(dst, dst_device, src, src_device, bytes, chunk, progress);
  }
  absl::Status WaitIpcFence(int, const std::string& handle, absl::Time deadline,
                            absl::Time quiet_until) override {
    absl::MutexLock lock(&mu_);
    handle_ = handle;
    deadline_ = deadline;
    quiet_until_ = quiet_until;
    if (handle == "refused") return absl::InvalidArgumentError("not a fence");
    opened_.insert(handle);
    auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !running_; };
    if (deadline == absl::InfinitePast() ? !ended()
                                         : !mu_.AwaitWithDeadline(absl::Condition(&ended),
                                                                  deadline)) {
      return absl::DeadlineExceededError("the copy runs on");
    }
    return absl::OkStatus();
  }

  bool KnowsIpcFence(const std::string& handle) override {
    absl::MutexLock lock(&mu_);
    return opened_.contains(handle);
  }

  void CopyRuns() {
    absl::MutexLock lock(&mu_);
    running_ = true;
  }
  void EndCopy() {
    absl::MutexLock lock(&mu_);
    running_ = false;
  }
  std::string handle() {
    absl::MutexLock lock(&mu_);
    return handle_;
  }
  absl::Time deadline() {
    absl::MutexLock lock(&mu_);
    return deadline_;
  }
  absl::Time quiet_until() {
    absl::MutexLock lock(&mu_);
    return quiet_until_;
  }
  void ClearHandle() {
    absl::MutexLock lock(&mu_);
    handle_.clear();
  }

 private:
  std::unique_ptr<GpuRuntime> host_;
  std::vector<GpuDevice> devices_;
  absl::Mutex mu_;
  std::string handle_ ABSL_GUARDED_BY(mu_);
  absl::Time deadline_ ABSL_GUARDED_BY(mu_), quiet_until_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<std::string> opened_ ABSL_GUARDED_BY(mu_);  // As the driver would.
};

class HoldTableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PoolSizes sizes;
    sizes.host = 64 << 20;
    sizes.pinned = 0;  // The fake GPU cannot pin memory.
    pools_ = *PoolSet::Create(sizes, {}, &gpu_);
    registry_ = std::make_unique<BufferRegistry>(pools_.get(), absl::ZeroDuration());
    AllocateOptions o;
    o.size = 32 << 20;
    o.owner = "alice";
    buffer_ = registry_->Allocate(o)->id;
  }
  std::unique_ptr<HoldTable> Table(uint64_t quiet_rate) {
    StagingPolicy policy;
    policy.gpu = &gpu_;
    policy.fence_quiet_rate = quiet_rate;
    return std::make_unique<HoldTable>(
        registry_.get(), [](const Endpoint&, uint64_t) { return uint64_t{7}; }, policy);
  }
  // Holds `length` bytes of the buffer for node-a's transfer `id`, then ends the move with
  // the runner's OK and `fence`: Complete's answer.
  absl::StatusOr<uint64_t> HoldAndComplete(HoldTable& table, const std::string& id,
                                           const AckFence& fence, bool checksum = false,
                                           absl::Duration fence_wait = absl::Seconds(10),
                                           uint64_t length = 4096) {
    auto held = table.Hold("node-a", 1, id, "alice", buffer_, 0, length);
    if (!held.ok()) return held.status();
    return table.Complete("node-a", id, checksum, /*runner_ok=*/true, absl::Seconds(1), fence,
                          fence_wait);
  }

  FenceRecorder gpu_;
  std::unique_ptr<PoolSet> pools_;
  std::unique_ptr<BufferRegistry> registry_;
  std::string buffer_;
};

// A fence with L bytes behind it is not queried before L / the quiet rate after the
// acknowledgement came (8 MiB at 16 GiB/s: half a millisecond), never more than the range.
TEST_F(HoldTableTest, AFenceIsLeftQuietForAsLongAsTheFastestCopyOfItsBytesTakes) {
  auto table = Table(16ull << 30);  // 16 GiB/s.
  for (const auto& [behind, counted] : std::vector<std::pair<uint64_t, uint64_t>>{
           {8 << 20, 8 << 20}, {64 << 20, 16 << 20}}) {
    SCOPED_TRACE(behind);
    ASSERT_TRUE(table->Hold("node-a", 1, "t1", "alice", buffer_, 0, 16 << 20).ok());
    const absl::Time before = absl::Now();
    auto done = table->Complete("node-a", "t1", /*checksum=*/false, /*runner_ok=*/true,
                                absl::Seconds(1), AckFence{"fence-handle", behind});
    const absl::Time after = absl::Now();
    ASSERT_TRUE(done.ok()) << done.status();
    EXPECT_EQ(gpu_.handle(), "fence-handle");
    const absl::Duration copy = absl::Seconds(static_cast<double>(counted) / (16ull << 30));
    EXPECT_GE(gpu_.quiet_until(), before + copy);
    EXPECT_LE(gpu_.quiet_until(), after + copy);
    EXPECT_GE(gpu_.deadline(), before + absl::Seconds(10));
    EXPECT_EQ(table->size(), 0u);  // The hold ended.
  }
  // A runner that does not say how many bytes are behind its fence: queried at once.
  ASSERT_TRUE(table->Hold("node-a", 1, "t0", "alice", buffer_, 0, 16 << 20).ok());
  ASSERT_TRUE(table->Complete("node-a", "t0", false, true, absl::Seconds(1), AckFence{"h", 0})
                  .ok());
  EXPECT_EQ(gpu_.quiet_until(), absl::InfinitePast());
}

TEST_F(HoldTableTest, WithoutAQuietRateTheFenceIsQueriedAtOnce) {
  auto table = Table(0);
  ASSERT_TRUE(table->Hold("node-a", 1, "t2", "alice", buffer_, 0, 16 << 20).ok());
  ASSERT_TRUE(table->Complete("node-a", "t2", false, true, absl::Seconds(1),
                              AckFence{"h", 16 << 20})
                  .ok());
  EXPECT_EQ(gpu_.quiet_until(), absl::InfinitePast());
  // No fence (a move that needed none): the runtime is not asked at all.
  gpu_.ClearHandle();
  ASSERT_TRUE(table->Hold("node-a", 1, "t3", "alice", buffer_, 0, 4096).ok());
  ASSERT_TRUE(table->Complete("node-a", "t3", false, true, absl::Seconds(1), AckFence{})
                  .ok());
  EXPECT_TRUE(gpu_.handle().empty());
}

// A runner that sees its fence pass itself (runner_waits) is answered at once, while its
// copy runs: the range stays held, in an ending use (a Release of the buffer waits for
// it), until this node sees the fence pass too, on the table's own thread.
TEST_F(HoldTableTest, ARunnerThatWaitsForItsFenceIsAnsweredWhileTheCopyRuns) {
  auto table = Table(0);
  gpu_.CopyRuns();
  auto done = HoldAndComplete(*table, "t5", AckFence{"h5", 16 << 20, /*runner_waits=*/true},
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
  gpu_.EndCopy();
  releaser.join();
  EXPECT_TRUE(release.ok()) << release;
  EXPECT_EQ(table->size(), 0u);
  EXPECT_EQ(gpu_.handle(), "h5");
}

// An acknowledgement with a fence can be answered on a thread that must not wait (the
// UCX progress thread) only when the runner waits for its fence, no checksum is asked and
// the fence was opened before (opening one can take the driver milliseconds).
TEST_F(HoldTableTest, OnlyAKnownFenceTheRunnerWaitsForIsAnsweredAtOnce) {
  auto table = Table(0);
  EXPECT_FALSE(table->AnswersFenceAtOnce(AckFence{"h7", 0, true}, false));  // Never opened.
  ASSERT_TRUE(HoldAndComplete(*table, "t7", AckFence{"h7", 0, true}).ok());
  EXPECT_TRUE(table->AnswersFenceAtOnce(AckFence{"h7", 0, true}, false));
  EXPECT_FALSE(table->AnswersFenceAtOnce(AckFence{"h7", 0, true}, /*checksum=*/true));
  EXPECT_FALSE(table->AnswersFenceAtOnce(AckFence{"h7", 0, /*runner_waits=*/false}, false));
  EXPECT_FALSE(table->AnswersFenceAtOnce(AckFence{"h8", 0, true}, false));
}

// A fence this node cannot take is refused at the first look, and the hold ends; one that
// never passes ends its hold at the deadline; with a checksum, or a runner that does not
// wait for its fence, the answer waits for the copy as before.
TEST_F(HoldTableTest, AnEndingHoldEndsAtItsDeadlineAndChecksumsWaitForTheCopy) {
  auto table = Table(0);
  gpu_.CopyRuns();
  EXPECT_EQ(HoldAndComplete(*table, "r", AckFence{"refused", 0, true}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(table->size(), 0u);
  EXPECT_EQ(registry_->Get("alice", buffer_)->active_uses, 0u);

  ASSERT_TRUE(HoldAndComplete(*table, "d", AckFence{"hd", 0, true}, /*checksum=*/false,
                              /*fence_wait=*/absl::Milliseconds(100))
                  .ok());
  EXPECT_EQ(table->size(), 1u);
  for (int i = 0; i < 200 && table->size() > 0; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(table->size(), 0u);  // The copy still "runs": the deadline ended the hold.
  EXPECT_EQ(registry_->Get("alice", buffer_)->active_uses, 0u);

  for (const auto& [checksum, runner_waits] :
       std::vector<std::pair<bool, bool>>{{true, true}, {false, false}}) {
    SCOPED_TRACE(absl::StrCat(checksum, runner_waits));
    std::atomic<bool> answered{false};
    std::thread ender([&] {
      absl::SleepFor(absl::Milliseconds(50));
      EXPECT_FALSE(answered.load());
      gpu_.EndCopy();
    });
    auto hash = HoldAndComplete(*table, "w", AckFence{"hw", 0, runner_waits}, checksum);
    answered = true;
    ender.join();
    ASSERT_TRUE(hash.ok()) << hash.status();
    EXPECT_EQ(*hash, checksum ? 7u : 0u);
    EXPECT_EQ(table->size(), 0u);
    gpu_.CopyRuns();
  }
  gpu_.EndCopy();
}

// The table waits for its ending holds when it goes.
TEST_F(HoldTableTest, ATableWaitsForItsEndingHoldsWhenItGoes) {
  auto table = Table(0);
  gpu_.CopyRuns();
  ASSERT_TRUE(HoldAndComplete(*table, "e", AckFence{"he", 0, true}).ok());
  std::thread ender([this] {
    absl::SleepFor(absl::Milliseconds(100));
    gpu_.EndCopy();
  });
  const absl::Time t0 = absl::Now();
  table.reset();
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(50));
  ender.join();
  EXPECT_EQ(registry_->Get("alice", buffer_)->active_uses, 0u);
}

// A staged hold copies pieces between its bounce slots and the range, several to a slot
// (from slot_offset); a piece that runs past its slot or the range is refused and copies
// nothing.
TEST_F(HoldTableTest, StageChunkCopiesPiecesWithinTheSlots) {
  // Bounce slots in plain host memory (a runtime without GPUs pins nothing).
  auto host = GpuRuntime::CreateHostOnly("test");
  auto pinned = *Pool::Create(MemoryKind::kPinnedHost, kHostDevice, 8 << 20, host.get());
  StagingPolicy policy;
  policy.all = true;
  policy.gpu = &gpu_;
  policy.pinned = pinned.get();
  policy.options = {.chunk = 1 << 20, .slots = 2};
  HoldTable table(registry_.get(), [](const Endpoint&, uint64_t) { return uint64_t{7}; },
                  policy);
  auto held = table.Hold("node-a", 1, "t4", "alice", buffer_, 0, 4 << 20, /*may_stage=*/true);
  ASSERT_TRUE(held.ok()) << held.status();
  ASSERT_TRUE(held->ring.has_value());
  const std::vector<char*>& slot = held->ring->slots;
  ASSERT_EQ(slot.size(), 2u);
  ASSERT_EQ(held->ring->slot_size, 1u << 20);
  char* range = held->data;
  // Slot 1 holds two 512 KiB pieces: the second goes to range offset 3 MiB.
  std::memset(slot[1], 'x', 512 << 10);
  std::memset(slot[1] + (512 << 10), 'y', 512 << 10);
  ASSERT_TRUE(table.StageChunk("node-a", "t4", 1, 512 << 10, 3 << 20, 512 << 10, true).ok());
  EXPECT_EQ(range[3 << 20], 'y');
  EXPECT_EQ(range[(3 << 20) + (512 << 10) - 1], 'y');
  // And back out: range bytes into the first half of slot 0.
  std::memset(range + (1 << 20), 'z', 4096);
  ASSERT_TRUE(table.StageChunk("node-a", "t4", 0, 0, 1 << 20, 4096, false).ok());
  EXPECT_EQ(slot[0][0], 'z');
  // Past the slot (offset + length over its 1 MiB), a slot it does not have, past the
  // range: INVALID_ARGUMENT, and the range is as it was.
  const std::string before(range, 4 << 20);
  for (const auto& [slot, slot_offset, offset, length] :
       std::vector<std::tuple<uint32_t, uint64_t, uint64_t, uint64_t>>{
           {1, 768 << 10, 0, 512 << 10},
           {1, 2 << 20, 0, 1},
           {1, ~uint64_t{0}, 0, 2},
           {2, 0, 0, 4096},
           {0, 0, (4 << 20) - 100, 4096}}) {
    EXPECT_EQ(table.StageChunk("node-a", "t4", slot, slot_offset, offset, length, true).code(),
              absl::StatusCode::kInvalidArgument)
        << slot << " " << slot_offset << " " << offset << " " << length;
  }
  EXPECT_TRUE(std::string(range, 4 << 20) == before);
}

}  // namespace
}  // namespace gpumove
