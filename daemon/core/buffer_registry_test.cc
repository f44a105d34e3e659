#include "daemon/core/buffer_registry.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace gpumove {
namespace {

class BufferRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    gpu_ = GpuRuntime::CreateHostOnly("test");
    PoolSizes sizes;
    sizes.host = 1 << 20;
    sizes.pinned = 1 << 16;
    pools_ = *PoolSet::Create(sizes, {}, gpu_.get());
    registry_ = std::make_unique<BufferRegistry>(pools_.get(), absl::ZeroDuration());
  }

  BufferInfo Alloc(uint64_t size, absl::Duration ttl = absl::ZeroDuration()) {
    AllocateOptions o;
    o.size = size;
    o.owner = "alice";
    o.lease_ttl = ttl;
    return *registry_->Allocate(o);
  }

  std::unique_ptr<GpuRuntime> gpu_;
  std::unique_ptr<PoolSet> pools_;
  std::unique_ptr<BufferRegistry> registry_;
};

TEST_F(BufferRegistryTest, AllocatesGetsListsAndReleases) {
  BufferInfo a = Alloc(1000);
  BufferInfo b = Alloc(2000);
  EXPECT_NE(a.id, b.id);
  EXPECT_EQ(registry_->Get("alice", a.id)->size, 1000u);
  auto list = registry_->List("alice");
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].id, a.id);
  ASSERT_TRUE(registry_->Release("alice", a.id).ok());
  EXPECT_EQ(registry_->Get("alice", a.id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry_->Release("alice", a.id).code(), absl::StatusCode::kNotFound);
}

TEST_F(BufferRegistryTest, RejectsBadAllocations) {
  AllocateOptions o;
  o.owner = "alice";
  o.size = 0;
  EXPECT_EQ(registry_->Allocate(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.size = 2 << 20;
  EXPECT_EQ(registry_->Allocate(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.size = 16;
  o.kind = MemoryKind::kDevice;
  EXPECT_EQ(registry_->Allocate(o).status().code(), absl::StatusCode::kFailedPrecondition);
  o.kind = MemoryKind::kHost;
  o.lease_ttl = absl::Seconds(-1);
  EXPECT_EQ(registry_->Allocate(o).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry_->size(), 0u);
}

TEST_F(BufferRegistryTest, PoolFullIsResourceExhausted) {
  Alloc(1 << 19);
  Alloc(1 << 19);
  AllocateOptions o;
  o.owner = "alice";
  o.size = 1;
  EXPECT_EQ(registry_->Allocate(o).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST_F(BufferRegistryTest, OtherTenantsSeeNothing) {
  BufferInfo a = Alloc(64);
  EXPECT_EQ(registry_->Get("bob", a.id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry_->Release("bob", a.id).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry_->Acquire("bob", a.id, 0, 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(registry_->List("bob").empty());
}

TEST_F(BufferRegistryTest, AcquireChecksTheRange) {
  BufferInfo a = Alloc(100);
  auto use = registry_->Acquire("alice", a.id, 10, 0);
  ASSERT_TRUE(use.ok());
  EXPECT_EQ(use->length(), 90u);
  EXPECT_EQ(use->offset(), 10u);
  EXPECT_EQ(registry_->Acquire("alice", a.id, 50, 51).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry_->Acquire("alice", a.id, 1, UINT64_MAX).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry_->Get("alice", a.id)->active_uses, 1u);
}

TEST_F(BufferRegistryTest, BufferInUseIsNotReleased) {
  BufferInfo a = Alloc(100);
  {
    auto use = registry_->Acquire("alice", a.id, 0, 0);
    EXPECT_EQ(registry_->Release("alice", a.id).code(), absl::StatusCode::kFailedPrecondition);
  }
  EXPECT_TRUE(registry_->Release("alice", a.id).ok());
}

// A use marked ending (a peer's copy already queued for good) makes Release wait for it
// to end, not refuse; any other use, or one that does not end in time, still refuses.
TEST_F(BufferRegistryTest, ReleaseWaitsForUsesThatAreAllEnding) {
  BufferInfo a = Alloc(100);
  auto use = registry_->Acquire("alice", a.id, 0, 0);
  ASSERT_TRUE(use.ok());
  use->MarkEnding();
  std::atomic<bool> released{false};
  absl::Status st;
  std::thread releaser([&] {
    st = registry_->Release("alice", a.id);
    released = true;
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(released.load());
  EXPECT_TRUE(registry_->Get("alice", a.id).ok());
  use->Reset();
  releaser.join();
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(registry_->Get("alice", a.id).status().code(), absl::StatusCode::kNotFound);

  // Moved, a use stays ending, and ends once: a plain use after it is refused at once.
  BufferInfo c = Alloc(100);
  {
    auto first = registry_->Acquire("alice", c.id, 0, 0);
    first->MarkEnding();
    BufferUse moved = *std::move(first);
  }
  {
    auto plain = registry_->Acquire("alice", c.id, 0, 0);
    const absl::Time t0 = absl::Now();
    EXPECT_EQ(registry_->Release("alice", c.id).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_LT(absl::Now() - t0, absl::Seconds(1));
  }
  EXPECT_TRUE(registry_->Release("alice", c.id).ok());

  // An ending use beside one that is not: refused at once.
  BufferInfo b = Alloc(100);
  auto ending = registry_->Acquire("alice", b.id, 0, 0);
  ending->MarkEnding();
  {
    auto plain = registry_->Acquire("alice", b.id, 0, 0);
    const absl::Time t0 = absl::Now();
    EXPECT_EQ(registry_->Release("alice", b.id).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_LT(absl::Now() - t0, absl::Seconds(1));
  }
  // One that does not end in time: refused after the wait, the buffer kept.
  const absl::Time t0 = absl::Now();
  EXPECT_EQ(registry_->Release("alice", b.id, absl::Milliseconds(100)).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(100));
  EXPECT_TRUE(registry_->Get("alice", b.id).ok());
  // Ended, its count goes with it: a plain use is refused at once again.
  ending->Reset();
  {
    auto plain = registry_->Acquire("alice", b.id, 0, 0);
    const absl::Time t1 = absl::Now();
    EXPECT_EQ(registry_->Release("alice", b.id).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_LT(absl::Now() - t1, absl::Seconds(1));
  }
  EXPECT_TRUE(registry_->Release("alice", b.id).ok());
}

TEST_F(BufferRegistryTest, ExpiredLeaseFreesAndRenewExtends) {
  BufferInfo a = Alloc(100, absl::Seconds(10));
  BufferInfo b = Alloc(100, absl::Seconds(10));
  BufferInfo forever = Alloc(100);
  ASSERT_TRUE(a.lease_expire_time.has_value());
  EXPECT_FALSE(forever.lease_expire_time.has_value());
  EXPECT_EQ(registry_->ExpireLeases(absl::Now() + absl::Seconds(5)), 0);
  auto renewed = registry_->RenewLease("alice", b.id, absl::Seconds(60));
  ASSERT_TRUE(renewed.ok());
  EXPECT_EQ(registry_->ExpireLeases(absl::Now() + absl::Seconds(30)), 1);
  EXPECT_EQ(registry_->Get("alice", a.id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(registry_->Get("alice", b.id).ok());
  EXPECT_TRUE(registry_->Get("alice", forever.id).ok());
  EXPECT_EQ(registry_->RenewLease("alice", forever.id, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(BufferRegistryTest, ExpiredBufferInUseIsFreedAfterItsLastUse) {
  BufferInfo a = Alloc(1 << 19, absl::Seconds(1));
  Alloc(1 << 19);  // The pool is now full.
  auto use = registry_->Acquire("alice", a.id, 0, 0);
  ASSERT_TRUE(use.ok());
  EXPECT_EQ(registry_->ExpireLeases(absl::Now() + absl::Seconds(2)), 1);
  std::memset(use->data(), 7, use->length());  // Still ours to touch.
  AllocateOptions o;
  o.owner = "alice";
  o.size = 4096;
  EXPECT_EQ(registry_->Allocate(o).status().code(), absl::StatusCode::kResourceExhausted);
  use->Reset();
  EXPECT_TRUE(registry_->Allocate(o).ok());
}

// Adopted memory: kept mapped while the buffer lives, let go on release, on lease
// expiry, and when the process that lent it exits.
TEST_F(BufferRegistryTest, AdoptedMemoryIsLetGoWithItsBuffer) {
  std::vector<char> memory(4096, 'm');
  auto released = std::make_shared<std::atomic<int>>(0);
  auto keepalive = std::shared_ptr<const void>(nullptr, [released](const void*) { ++*released; });
  AdoptOptions o;
  o.data = memory.data();
  o.size = memory.size();
  o.kind = MemoryKind::kHost;
  o.device = kHostDevice;
  o.keepalive = keepalive;
  o.owner = "alice";
  keepalive.reset();
  auto b = registry_->Adopt(o);
  o.keepalive.reset();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(b->imported);
  {
    auto use = registry_->Acquire("alice", b->id, 100, 10);
    ASSERT_TRUE(use.ok());
    EXPECT_EQ(use->data(), memory.data() + 100);
    EXPECT_EQ(registry_->Release("alice", b->id).code(), absl::StatusCode::kFailedPrecondition);
  }
  EXPECT_EQ(*released, 0);
  ASSERT_TRUE(registry_->Release("alice", b->id).ok());
  EXPECT_EQ(*released, 1);
  // Pool accounting is untouched by adopted memory.
  for (const auto& pool : pools_->pools()) EXPECT_EQ(pool->Stats().buffers, 0u);

  AdoptOptions bad = o;
  bad.data = nullptr;
  EXPECT_EQ(registry_->Adopt(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = o;
  bad.owner_pid = 999999999;  // No such process.
  EXPECT_EQ(registry_->Adopt(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(BufferRegistryTest, AdoptedMemoryGoesWhenItsOwnerProcessExits) {
  std::vector<char> memory(4096);
  const pid_t child = fork();
  if (child == 0) {
    pause();
    _exit(0);
  }
  auto released = std::make_shared<std::atomic<int>>(0);
  AdoptOptions o;
  o.data = memory.data();
  o.size = memory.size();
  o.kind = MemoryKind::kHost;
  o.device = kHostDevice;
  o.keepalive = std::shared_ptr<const void>(nullptr, [released](const void*) { ++*released; });
  o.owner = "alice";
  o.owner_pid = child;
  auto b = registry_->Adopt(o);
  o.keepalive.reset();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->owner_pid, child);
  EXPECT_EQ(registry_->ExpireLeases(absl::Now()), 0);  // Alive: kept.
  EXPECT_TRUE(registry_->Get("alice", b->id).ok());
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_EQ(registry_->ExpireLeases(absl::Now()), 1);
  EXPECT_EQ(registry_->Get("alice", b->id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*released, 1);
}

TEST_F(BufferRegistryTest, QuotasCountPoolBuffersAndReleasesGiveThemBack) {
  Quotas q;
  q.Set(*ParseQuotaFile("alice,8KiB,-,-,-\n"));
  registry_->SetQuotas(&q);
  BufferInfo one = Alloc(8192);
  AllocateOptions more;
  more.size = 4096;
  more.owner = "alice";
  EXPECT_EQ(registry_->Allocate(more).status().code(), absl::StatusCode::kResourceExhausted);
  more.owner = "bob";
  EXPECT_TRUE(registry_->Allocate(more).ok());
  ASSERT_TRUE(registry_->Release("alice", one.id).ok());
  EXPECT_EQ(q.used("alice", MemoryKind::kHost), 0u);
  more.owner = "alice";
  EXPECT_TRUE(registry_->Allocate(more).ok());
  // A pool that cannot take it: nothing counted.
  more.owner = "bob";
  more.size = 4 << 20;
  EXPECT_FALSE(registry_->Allocate(more).ok());
  EXPECT_EQ(q.used("bob", MemoryKind::kHost), 4096u);
  // An expired lease gives the bytes back too.
  more.size = 4096;
  more.lease_ttl = absl::Milliseconds(1);
  ASSERT_TRUE(registry_->Allocate(more).ok());
  EXPECT_EQ(q.used("bob", MemoryKind::kHost), 8192u);
  EXPECT_EQ(registry_->ExpireLeases(absl::Now() + absl::Seconds(1)), 1);
  EXPECT_EQ(q.used("bob", MemoryKind::kHost), 4096u);
  registry_.reset();  // Its buffers are given back to `q`, which must outlive it.
}

}  // namespace
}  // namespace gpumove
