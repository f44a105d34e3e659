#include "daemon/path/cuda_ipc/cuda_ipc_tails.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "daemon/core/buffer_registry.h"
#include "daemon/memory/pool.h"

namespace gpumove {
namespace {

// A host-only runtime that says it has a GPU and records how it was asked to wait for a
// fence. The copy behind every fence has ended unless the test says it still runs
// (CopyRuns); a wait then lasts until EndCopy or its deadline.
class FenceRecorder : public GpuRuntime {
 public:
  FenceRecorder() : host_(GpuRuntime::CreateHostOnly("test")) { devices_.push_back(GpuDevice{}); }
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
    if (deadline == absl::InfinitePast()
            ? !ended()
            : !mu_.AwaitWithDeadline(absl::Condition(&ended), deadline)) {
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

class IpcTailReaderTest : public ::testing::Test {
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
  // A use of the buffer's first `length` bytes, as a hold has it.
  BufferUse Use(uint64_t length) {
    auto use = registry_->Acquire("alice", buffer_, 0, length);
    EXPECT_TRUE(use.ok()) << use.status();
    return *std::move(use);
  }

  FenceRecorder gpu_;
  std::unique_ptr<PoolSet> pools_;
  std::unique_ptr<BufferRegistry> registry_;
  std::string buffer_;
};

// A tail with L bytes behind it is not queried before L / the quiet rate after the
// acknowledgement came (8 MiB at 16 GiB/s: half a millisecond), never more than the range.
TEST_F(IpcTailReaderTest, ATailIsLeftQuietForAsLongAsTheFastestCopyOfItsBytesTakes) {
  IpcTailReader reader(&gpu_, 16ull << 30);  // 16 GiB/s.
  BufferUse range = Use(16 << 20);
  const absl::Time arrived = absl::Now();
  const absl::Time deadline = arrived + absl::Seconds(10);
  for (const auto& [behind, counted] :
       std::vector<std::pair<uint64_t, uint64_t>>{{8 << 20, 8 << 20}, {64 << 20, 16 << 20}}) {
    SCOPED_TRACE(behind);
    ASSERT_TRUE(reader.Wait(range, AckTail{"fence-handle", behind}, arrived, deadline).ok());
    EXPECT_EQ(gpu_.handle(), "fence-handle");
    EXPECT_EQ(gpu_.quiet_until(),
              arrived + absl::Seconds(static_cast<double>(counted) / (16ull << 30)));
    EXPECT_EQ(gpu_.deadline(), deadline);
  }
  // A runner that does not say how many bytes are behind its tail: queried at once.
  ASSERT_TRUE(reader.Wait(range, AckTail{"h", 0}, arrived, deadline).ok());
  EXPECT_EQ(gpu_.quiet_until(), absl::InfinitePast());
  // One look (deadline in the past): no quiet time either.
  ASSERT_TRUE(reader.Wait(range, AckTail{"h", 8 << 20}, arrived, absl::InfinitePast()).ok());
  EXPECT_EQ(gpu_.quiet_until(), absl::InfinitePast());
  EXPECT_EQ(gpu_.deadline(), absl::InfinitePast());
}

TEST_F(IpcTailReaderTest, WithoutAQuietRateTheTailIsQueriedAtOnce) {
  IpcTailReader reader(&gpu_, 0);
  BufferUse range = Use(16 << 20);
  ASSERT_TRUE(
      reader.Wait(range, AckTail{"h", 16 << 20}, absl::Now(), absl::Now() + absl::Seconds(1)).ok());
  EXPECT_EQ(gpu_.quiet_until(), absl::InfinitePast());
}

// Known once opened; a copy still running is DEADLINE_EXCEEDED at one look; the driver's
// refusal is the answer; a node without GPUs cannot see a tail land.
TEST_F(IpcTailReaderTest, KnownOnceOpenedAndRefusalsAreTheAnswer) {
  IpcTailReader reader(&gpu_, 0);
  BufferUse range = Use(4096);
  EXPECT_FALSE(reader.Knows("h7"));
  gpu_.CopyRuns();
  EXPECT_EQ(reader.Wait(range, AckTail{"h7", 0, true}, absl::Now(), absl::InfinitePast()).code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(reader.Knows("h7"));
  gpu_.EndCopy();
  EXPECT_EQ(reader.Wait(range, AckTail{"refused"}, absl::Now(), absl::Now()).code(),
            absl::StatusCode::kInvalidArgument);
  auto host = GpuRuntime::CreateHostOnly("no GPU");
  IpcTailReader blind(host.get(), 0);
  absl::Status st = blind.Wait(range, AckTail{"h"}, absl::Now(), absl::Now() + absl::Seconds(1));
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_FALSE(blind.Knows("h"));
}

}  // namespace
}  // namespace gpumove
