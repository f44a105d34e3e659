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

TEST_F(BufferRegistryTest, ExportableBuffersGetMemoryOfTheirOwnCountedAndFreed) {
  Quotas q;
  q.Set(*ParseQuotaFile("alice,-,-,8KiB,-\n"));
  registry_->SetQuotas(&q);
  AllocateOptions o;
  o.size = 4096;
  o.owner = "alice";
  o.kind = MemoryKind::kDevice;
  o.exportable = true;
  // No maker: this node has no GPU for it.
  EXPECT_EQ(registry_->Allocate(o).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(q.used("alice", MemoryKind::kDevice), 0u);

  std::vector<char> memory(16384, 'x');
  int made = 0, freed = 0;
  registry_->SetOwnMemory([&](int device, uint64_t size) -> absl::StatusOr<OwnMemory> {
    if (device != 0) return absl::InvalidArgumentError("no such GPU");
    OwnMemory m;
    m.data = memory.data() + 4096 * made++;
    m.keepalive = std::shared_ptr<const void>(m.data, [&](const void*) { ++freed; });
    return m;
  });
  auto a = registry_->Allocate(o);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->exportable);
  EXPECT_FALSE(a->imported);
  EXPECT_EQ(a->kind, MemoryKind::kDevice);
  EXPECT_EQ(q.used("alice", MemoryKind::kDevice), 4096u);
  auto use = registry_->Acquire("alice", a->id, 0, 0);
  ASSERT_TRUE(use.ok());
  EXPECT_EQ(use->data(), memory.data());
  EXPECT_TRUE(use->outside_pools());  // No pool's UCX key covers it.
  EXPECT_TRUE(registry_->Get("alice", a->id)->exportable);

  // Refused before any memory is made: another kind, the owner's quota, the maker's error.
  AllocateOptions host = o;
  host.kind = MemoryKind::kHost;
  EXPECT_EQ(registry_->Allocate(host).status().code(), absl::StatusCode::kInvalidArgument);
  AllocateOptions big = o;
  big.size = 8192;
  EXPECT_EQ(registry_->Allocate(big).status().code(), absl::StatusCode::kResourceExhausted);
  AllocateOptions elsewhere = o;
  elsewhere.device = 1;
  EXPECT_EQ(registry_->Allocate(elsewhere).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(q.used("alice", MemoryKind::kDevice), 4096u);
  EXPECT_EQ(made, 1);

  // Freed (and given back to the quota) with its last use.
  EXPECT_EQ(registry_->Release("alice", a->id).code(), absl::StatusCode::kFailedPrecondition);
  use->Reset();
  ASSERT_TRUE(registry_->Release("alice", a->id).ok());
  EXPECT_EQ(freed, 1);
  EXPECT_EQ(q.used("alice", MemoryKind::kDevice), 0u);
  registry_.reset();
}

TEST_F(BufferRegistryTest, ScrubbedPoolsHandOutZeroes) {
  BufferInfo first = Alloc(4096);
  auto use = registry_->Acquire("alice", first.id, 0, 0);
  std::memset(use->data(), 0x5a, 4096);
  char* where = use->data();
  use->Reset();
  ASSERT_TRUE(registry_->Release("alice", first.id).ok());
  int scrubbed = 0;
  registry_->SetScrub([&](char* data, MemoryKind kind, int device, uint64_t size) {
    ++scrubbed;
    EXPECT_EQ(kind, MemoryKind::kHost);
    return gpu_->Zero(kHostDevice, data, size);
  });
  AllocateOptions o;
  o.size = 4096;
  o.owner = "bob";
  auto second = registry_->Allocate(o);
  ASSERT_TRUE(second.ok());
  auto seen = registry_->Acquire("bob", second->id, 0, 0);
  ASSERT_EQ(seen->data(), where);  // The same bytes alice wrote...
  EXPECT_EQ(scrubbed, 1);
  for (int i = 0; i < 4096; ++i) ASSERT_EQ(seen->data()[i], 0) << i;  // ...now zero.
  seen->Reset();
  // A scrub that fails hands out nothing and keeps nothing.
  registry_->SetScrub([](char*, MemoryKind, int, uint64_t) {
    return absl::InternalError("cannot zero");
  });
  EXPECT_EQ(registry_->Allocate(o).status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(registry_->List("bob").size(), 1u);
  o.size = (1 << 20) - 4096;  // The pool's whole rest: nothing leaked by the failure.
  registry_->SetScrub(nullptr);
  EXPECT_TRUE(registry_->Allocate(o).ok());
}

}  // namespace
}  // namespace gpumove
