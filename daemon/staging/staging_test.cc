#include "daemon/staging/staging.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace gpumove {
namespace {

// Host memory stands in for the GPU: the host-only runtime's Copy is a memcpy.
class StagingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    gpu_ = GpuRuntime::CreateHostOnly("test");
    pinned_ = *Pool::Create(MemoryKind::kPinnedHost, kHostDevice, 1 << 20, gpu_.get());
    src_.resize((700 << 10) + 13);
    std::mt19937 rng(3);
    for (auto& c : src_) c = static_cast<char>(rng());
  }
  StagingOptions Small() { return {.chunk = 64 << 10, .slots = 3}; }

  std::unique_ptr<GpuRuntime> gpu_;
  std::unique_ptr<Pool> pinned_;
  std::vector<char> src_;
};

TEST_F(StagingTest, OutAndInCarryEveryByteInOrder) {
  auto ring = BounceRing::Take(pinned_.get(), Small());
  ASSERT_TRUE(ring.ok());
  std::vector<char> wire(src_.size(), 0);
  uint64_t expect_offset = 0;
  std::vector<uint64_t> progress;
  absl::Status st = StageOut(
      gpu_.get(), src_.data(), kHostDevice, src_.size(), *ring,
      [&](const char* host, uint64_t offset, uint64_t n) {
        EXPECT_EQ(offset, expect_offset);  // Chunks leave in order.
        expect_offset += n;
        std::memcpy(wire.data() + offset, host, n);
        return absl::OkStatus();
      },
      [&](uint64_t done) {
        progress.push_back(done);
        return true;
      });
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(wire, src_);
  EXPECT_EQ(progress.back(), src_.size());
  EXPECT_EQ(progress.size(), (src_.size() + (64 << 10) - 1) / (64 << 10));

  std::vector<char> dst(src_.size(), 0);
  st = StageIn(
      gpu_.get(), dst.data(), kHostDevice, dst.size(), *ring,
      [&](char* host, uint64_t offset, uint64_t n) {
        std::memcpy(host, wire.data() + offset, n);
        return absl::OkStatus();
      },
      nullptr);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(dst, src_);
}

TEST_F(StagingTest, AStalledWireDoesNotStallThePipeline) {
  // The wire holds chunk 0 for a while; the move still completes, in order, with every
  // chunk sent once.
  auto ring = BounceRing::Take(pinned_.get(), Small());
  absl::Mutex mu;
  bool released = false;
  int sends = 0;
  std::thread release([&] {
    absl::SleepFor(absl::Milliseconds(100));
    absl::MutexLock lock(&mu);
    released = true;
  });
  absl::Status st = StageOut(
      gpu_.get(), src_.data(), kHostDevice, src_.size(), *ring,
      [&](const char*, uint64_t, uint64_t) {
        if (sends++ == 0) {
          absl::MutexLock lock(&mu);
          mu.Await(absl::Condition(&released));
        }
        return absl::OkStatus();
      },
      nullptr);
  release.join();
  EXPECT_TRUE(st.ok());
  EXPECT_EQ(sends, 11);
}

TEST_F(StagingTest, WireErrorsAndCancelStopTheMove) {
  auto ring = BounceRing::Take(pinned_.get(), Small());
  int sends = 0;
  absl::Status st = StageOut(
      gpu_.get(), src_.data(), kHostDevice, src_.size(), *ring,
      [&](const char*, uint64_t, uint64_t) {
        return ++sends == 3 ? absl::UnavailableError("peer gone") : absl::OkStatus();
      },
      nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(sends, 3);
  std::vector<char> dst(src_.size(), 0);
  int calls = 0;
  st = StageIn(
      gpu_.get(), dst.data(), kHostDevice, dst.size(), *ring,
      [&](char* host, uint64_t, uint64_t n) {
        std::memset(host, 1, n);
        return absl::OkStatus();
      },
      [&](uint64_t) { return ++calls < 2; });
  EXPECT_EQ(st.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(dst.back(), 0);
}

// Several consumers: every chunk is drained once, from the slot it was filled into and
// while that slot still holds it; progress only ever reports chunks drained in a row;
// a failed consume and a cancel stop the move with every helper joined.
TEST_F(StagingTest, ParallelConsumersDrainEveryChunkOnceInItsSlot) {
  const uint64_t chunk = 64 << 10;
  const size_t slots = 4;
  const uint64_t length = src_.size();
  const uint64_t chunks = (length + chunk - 1) / chunk;
  std::vector<std::vector<char>> ring(slots, std::vector<char>(chunk));
  std::vector<char> dst(length, 0);
  absl::Mutex mu;
  std::vector<int> drained(chunks, 0);
  std::mt19937 rng(5);
  auto produce = [&](size_t slot, uint64_t offset, uint64_t n) {
    std::memcpy(ring[slot].data(), src_.data() + offset, n);
    return absl::OkStatus();
  };
  auto consume = [&](size_t slot, uint64_t offset, uint64_t n) {
    int wait_us;
    {
      absl::MutexLock lock(&mu);
      wait_us = static_cast<int>(rng() % 3000);
      ++drained[offset / chunk];
    }
    absl::SleepFor(absl::Microseconds(wait_us));  // Out of order on purpose.
    std::memcpy(dst.data() + offset, ring[slot].data(), n);
    return absl::OkStatus();
  };
  std::vector<uint64_t> progress;
  absl::Status st = RunStaged(
      length, chunk, slots, produce, consume,
      [&](uint64_t done) {
        progress.push_back(done);
        return true;
      },
      /*consumers=*/3);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(dst, src_);
  for (uint64_t k = 0; k < chunks; ++k) EXPECT_EQ(drained[k], 1) << "chunk " << k;
  ASSERT_FALSE(progress.empty());
  EXPECT_EQ(progress.back(), length);
  for (size_t i = 1; i < progress.size(); ++i) EXPECT_GT(progress[i], progress[i - 1]);

  // A consume that fails stops the move with its error.
  std::atomic<int> calls{0};
  st = RunStaged(
      length, chunk, slots, produce,
      [&](size_t, uint64_t offset, uint64_t) {
        ++calls;
        return offset == 3 * chunk ? absl::UnavailableError("peer gone") : absl::OkStatus();
      },
      nullptr, 3);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_LT(calls.load(), static_cast<int>(chunks));
  // A cancel stops it too.
  st = RunStaged(
      length, chunk, slots, produce, consume, [](uint64_t done) { return false; }, 3);
  EXPECT_EQ(st.code(), absl::StatusCode::kCancelled) << st;
}

TEST_F(StagingTest, RingTakesWhatThePoolHasAndGivesItBack) {
  {
    auto big = BounceRing::Take(pinned_.get(), {.chunk = 400 << 10, .slots = 4});
    ASSERT_TRUE(big.ok());
    EXPECT_EQ(big->slots(), 2u);  // Only two fit in 1 MiB.
    EXPECT_EQ(BounceRing::Take(pinned_.get(), {.chunk = 400 << 10, .slots = 4}).status().code(),
              absl::StatusCode::kResourceExhausted);
  }
  EXPECT_EQ(pinned_->Stats().free, pinned_->Stats().capacity);
}

TEST_F(StagingTest, TakeWaitingWaitsForRoomWhileThePoolIsBusy) {
  const StagingOptions full{.chunk = 400 << 10, .slots = 4};
  std::optional<BounceRing> first;
  first.emplace(*BounceRing::Take(pinned_.get(), full));  // Two slots: the pool is full.
  // Busy: waits until the other ring is given back.
  std::thread give_back([&] {
    absl::SleepFor(absl::Milliseconds(50));
    first.reset();
  });
  const absl::Time t0 = absl::Now();
  auto second = BounceRing::TakeWaiting(pinned_.get(), full, absl::Now() + absl::Seconds(10));
  give_back.join();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(40));
  EXPECT_EQ(second->slots(), 2u);
  // Still busy: the deadline ends the wait, and a stop ends it sooner.
  EXPECT_EQ(BounceRing::TakeWaiting(pinned_.get(), full, absl::Now() + absl::Milliseconds(20))
                .status()
                .code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(BounceRing::TakeWaiting(pinned_.get(), full, absl::Now() + absl::Seconds(10),
                                    [] { return true; })
                .status()
                .code(),
            absl::StatusCode::kCancelled);
  // A pool too small for any ring of that size: no wait at all.
  const StagingOptions huge{.chunk = 1 << 20, .slots = 2};
  EXPECT_FALSE(BounceRing::CouldFit(pinned_.get(), huge));
  const absl::Time t1 = absl::Now();
  EXPECT_EQ(
      BounceRing::TakeWaiting(pinned_.get(), huge, absl::Now() + absl::Seconds(10)).status().code(),
      absl::StatusCode::kResourceExhausted);
  EXPECT_LT(absl::Now() - t1, absl::Seconds(1));
}

TEST_F(StagingTest, ASmallMoveTakesASmallRing) {
  const StagingOptions full{.chunk = 400 << 10, .slots = 4};
  // Sizes: slots no bigger than the move (4 KiB pages), no more slots than chunks.
  EXPECT_EQ(SizedFor(full, 1).chunk, 4096u);
  EXPECT_EQ(SizedFor(full, 1).slots, 1);
  EXPECT_EQ(SizedFor(full, 5000).chunk, 8192u);
  EXPECT_EQ(SizedFor(full, (400 << 10) + 1).chunk, 400u << 10);
  EXPECT_EQ(SizedFor(full, (400 << 10) + 1).slots, 2);
  EXPECT_EQ(SizedFor(full, 100 << 20).slots, 4);
  EXPECT_EQ(SizedFor(full, 100 << 20).chunk, 400u << 10);
  // The 1 MiB pool holds two full rings' worth of 400 KiB slots, but a hundred rings for
  // 8 KiB moves; each small ring carries its move.
  std::vector<BounceRing> rings;
  for (int i = 0; i < 100; ++i) {
    auto r = BounceRing::Take(pinned_.get(), SizedFor(full, 5000));
    ASSERT_TRUE(r.ok()) << i << ": " << r.status();
    rings.push_back(*std::move(r));
  }
  const BounceRing& ring = rings.back();
  std::vector<char> dst(5000, 0);
  absl::Status st = RunStaged(
      5000, ring.chunk(), ring.slots(),
      [&](size_t slot, uint64_t offset, uint64_t n) {
        std::memcpy(ring.slot(slot), src_.data() + offset, n);
        return absl::OkStatus();
      },
      [&](size_t slot, uint64_t offset, uint64_t n) {
        std::memcpy(dst.data() + offset, ring.slot(slot), n);
        return absl::OkStatus();
      },
      nullptr);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_TRUE(std::equal(dst.begin(), dst.end(), src_.begin()));
  rings.clear();
  EXPECT_EQ(pinned_->Stats().free, pinned_->Stats().capacity);
}

// The three-step pipeline with host memory for every step: fill copies the source into
// an a-slot, carry that into a b-slot, drain the b-slot into the destination, each after a
// random pause (out of order across several threads of a step). A slot reused too
// early would leave wrong bytes; every chunk goes through each step once.
TEST_F(StagingTest, ThreeStepsCarryEveryByteThroughBothRings) {
  const uint64_t length = src_.size();
  const uint64_t chunk = 32 << 10;
  const uint64_t chunks = (length + chunk - 1) / chunk;
  for (const auto& [a_slots, b_slots, fillers, carriers, drainers] :
       std::vector<std::tuple<size_t, size_t, int, int, int>>{
           {3, 5, 1, 2, 2}, {5, 2, 2, 1, 1}, {1, 1, 1, 1, 1}, {4, 4, 3, 3, 3}, {2, 6, 1, 2, 1}}) {
    SCOPED_TRACE(absl::StrCat(a_slots, " a-slots, ", b_slots, " b-slots, ", fillers, " fillers, ",
                              carriers, " carriers, ", drainers, " drainers"));
    std::vector<std::vector<char>> a(a_slots, std::vector<char>(chunk));
    std::vector<std::vector<char>> b(b_slots, std::vector<char>(chunk));
    std::vector<char> dst(length, 0);
    absl::Mutex mu;
    std::mt19937 rng(7);
    std::vector<int> runs[3];
    for (auto& r : runs) r.assign(chunks, 0);
    std::atomic<int> busy{0}, most_busy{0};
    auto step = [&](int which, const std::function<void(size_t, size_t, uint64_t, uint64_t)>& f) {
      return [&, which, f](size_t as, size_t bs, uint64_t offset, uint64_t n) {
        int pause = 0;
        {
          absl::MutexLock lock(&mu);
          pause = static_cast<int>(rng() % 2000);
          ++runs[which][offset / chunk];
        }
        const int now = ++busy;
        for (int m = most_busy.load(); now > m && !most_busy.compare_exchange_weak(m, now);) {
        }
        absl::SleepFor(absl::Microseconds(pause));
        f(as, bs, offset, n);
        --busy;
        return absl::OkStatus();
      };
    };
    ThreeSteps steps;
    steps.fill = step(0, [&](size_t as, size_t, uint64_t off, uint64_t n) {
      std::memcpy(a[as].data(), src_.data() + off, n);
    });
    steps.carry = step(1, [&](size_t as, size_t bs, uint64_t, uint64_t n) {
      std::memcpy(b[bs].data(), a[as].data(), n);
      std::memset(a[as].data(), 0x5a, n);  // A fill that did not wait would be caught.
    });
    steps.drain = step(2, [&](size_t, size_t bs, uint64_t off, uint64_t n) {
      std::memcpy(dst.data() + off, b[bs].data(), n);
      std::memset(b[bs].data(), 0xa5, n);
    });
    steps.fill_threads = fillers;
    steps.carry_threads = carriers;
    steps.drain_threads = drainers;
    std::vector<uint64_t> progress;
    absl::Status st = RunThreeSteps(length, chunk, a_slots, b_slots, steps, [&](uint64_t done) {
      progress.push_back(done);
      return true;
    });
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_TRUE(dst == src_);
    for (int w = 0; w < 3; ++w) {
      for (uint64_t k = 0; k < chunks; ++k)
        EXPECT_EQ(runs[w][k], 1) << "step " << w << " chunk " << k;
    }
    ASSERT_FALSE(progress.empty());
    EXPECT_EQ(progress.back(), length);
    for (size_t i = 1; i < progress.size(); ++i) EXPECT_GT(progress[i], progress[i - 1]);
    // With room for it, the steps overlap (each pauses up to 2 ms per chunk).
    if (a_slots > 1 && b_slots > 1) {
      EXPECT_GE(most_busy.load(), 2);
    }
  }
}

TEST_F(StagingTest, ThreeStepsStopAtTheFirstErrorOrACancel) {
  const uint64_t length = src_.size();
  const uint64_t chunk = 32 << 10;
  const uint64_t chunks = (length + chunk - 1) / chunk;
  std::atomic<int> calls[3] = {0, 0, 0};
  auto ok = [&](int which) {
    return [&, which](size_t, size_t, uint64_t, uint64_t) {
      ++calls[which];
      return absl::OkStatus();
    };
  };
  for (int failing = 0; failing < 3; ++failing) {
    SCOPED_TRACE(absl::StrCat("step ", failing, " fails"));
    for (auto& c : calls) c = 0;
    ThreeSteps steps{ok(0), ok(1), ok(2), 2, 1, 2};
    StageHop* hops[3] = {&steps.fill, &steps.carry, &steps.drain};
    *hops[failing] = [&, failing](size_t, size_t, uint64_t offset, uint64_t) {
      ++calls[failing];
      return offset == 4 * chunk ? absl::DataLossError("bad chunk") : absl::OkStatus();
    };
    absl::Status st = RunThreeSteps(length, chunk, 3, 3, steps, nullptr);
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
    // Nothing runs past the slots in flight once a step failed.
    EXPECT_LE(calls[2].load(), 4 + 3);
    EXPECT_LT(calls[2].load(), static_cast<int>(chunks));
  }
  // A cancel stops it: progress says no after the first chunk landed (drains of 5 ms
  // each, so that the rest have not all run by the time it is told).
  for (auto& c : calls) c = 0;
  ThreeSteps slow{ok(0), ok(1), [&](size_t, size_t, uint64_t, uint64_t) {
                    ++calls[2];
                    absl::SleepFor(absl::Milliseconds(5));
                    return absl::OkStatus();
                  }};
  absl::Status st = RunThreeSteps(length, chunk, 3, 3, slow, [](uint64_t) { return false; });
  EXPECT_EQ(st.code(), absl::StatusCode::kCancelled) << st;
  EXPECT_LT(calls[2].load(), static_cast<int>(chunks));
  // Nothing to move: no step runs; no slots: refused.
  EXPECT_TRUE(
      RunThreeSteps(0, chunk, 3, 3, ThreeSteps{ok(0), ok(1), ok(2), 1, 1, 1}, nullptr).ok());
  EXPECT_EQ(
      RunThreeSteps(length, chunk, 0, 3, ThreeSteps{ok(0), ok(1), ok(2), 1, 1, 1}, nullptr).code(),
      absl::StatusCode::kInvalidArgument);
}

// A move of one chunk: its three steps run in order on the calling thread, and progress
// hears of it once; an error stops it there.
TEST_F(StagingTest, OneChunkRunsItsStepsOnTheCallingThread) {
  std::vector<std::pair<int, std::thread::id>> ran;
  auto step = [&](int which, absl::Status result = absl::OkStatus()) {
    return [&, which, result](size_t a, size_t b, uint64_t offset, uint64_t n) {
      EXPECT_EQ(a, 0u);
      EXPECT_EQ(b, 0u);
      EXPECT_EQ(offset, 0u);
      EXPECT_EQ(n, 5000u);
      ran.emplace_back(which, std::this_thread::get_id());
      return result;
    };
  };
  std::vector<uint64_t> progress;
  ASSERT_TRUE(RunThreeSteps(5000, 8192, 2, 2, ThreeSteps{step(0), step(1), step(2), 2, 2, 2},
                            [&](uint64_t done) {
                              progress.push_back(done);
                              return true;
                            })
                  .ok());
  ASSERT_EQ(ran.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(ran[i].first, i);
    EXPECT_EQ(ran[i].second, std::this_thread::get_id());
  }
  EXPECT_EQ(progress, std::vector<uint64_t>{5000});
  ran.clear();
  EXPECT_EQ(
      RunThreeSteps(5000, 8192, 2, 2,
                    ThreeSteps{step(0), step(1, absl::UnavailableError("gone")), step(2)}, nullptr)
          .code(),
      absl::StatusCode::kUnavailable);
  EXPECT_EQ(ran.size(), 2u);  // No drain after a failed carry.
}

TEST(StagePieceTest, ASixteenthOfTheMoveWithinBounds) {
  const uint64_t slot = 8 << 20;
  EXPECT_EQ(StagePiece(64 << 20, slot), 4u << 20);
  EXPECT_EQ(StagePiece(128 << 20, slot), 8u << 20);
  EXPECT_EQ(StagePiece(1ull << 30, slot), 8u << 20);  // Never past a slot.
  EXPECT_EQ(StagePiece(32 << 20, slot), 2u << 20);
  EXPECT_EQ(StagePiece(8 << 20, slot), kMinStagePiece);  // Never under the least piece...
  EXPECT_EQ(StagePiece(4096, 4096), 4096u);              // ...unless the slot is smaller.
  EXPECT_EQ(StagePiece((48 << 20) + 80000, slot), (3u << 20) + 8192);  // Whole pages.
}

}  // namespace
}  // namespace gpumove
