// Failover inside a move (RunShares): a share whose lane fails is sent again on another
// lane, whole; the move fails only when no lane is left; cancel and other errors end it.
#include "daemon/path/ucx/ucx_shares.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace gpumove {
namespace {

// A fake wire: copies `src` into `dst` in 64 KiB steps on any lane, except that a lane in
// `broken` writes garbage over part of its range and then fails the way a dead endpoint
// does (UNAVAILABLE), and `fail_with` fails every lane with that status.
class FakeWire {
 public:
  explicit FakeWire(uint64_t length) : src_(length), dst_(length, 0) {
    for (uint64_t i = 0; i < length; ++i) src_[i] = static_cast<char>((i * 131 + 7) % 251);
  }

  ShareRma Rma() {
    return [this](size_t lane, uint64_t offset, uint64_t n,
                  const std::function<bool(uint64_t)>& progress) -> absl::Status {
      {
        absl::MutexLock lock(&mu_);
        tries_[lane].push_back(offset);
      }
      if (!fail_with.ok()) return fail_with;
      const bool broken = this->broken.count(lane) != 0;
      for (uint64_t done = 0; done < n;) {
        const uint64_t step = std::min<uint64_t>(64 << 10, n - done);
        if (broken && done >= n / 2) {
          std::fill(dst_.begin() + offset + done, dst_.begin() + offset + n, 'X');
          return absl::UnavailableError("ucp_put_nbx: Endpoint timeout");
        }
        std::copy_n(src_.begin() + offset + done, step, dst_.begin() + offset + done);
        done += step;
        if (!progress(done) && done < n) return absl::CancelledError("cancelled");
      }
      return absl::OkStatus();
    };
  }

  bool Landed() const { return src_ == dst_; }
  size_t Tries(size_t lane) {
    absl::MutexLock lock(&mu_);
    return tries_[lane].size();
  }

  std::set<size_t> broken;
  absl::Status fail_with;

 private:
  std::vector<char> src_, dst_;
  absl::Mutex mu_;
  std::map<size_t, std::vector<uint64_t>> tries_ ABSL_GUARDED_BY(mu_);
};

// Progress as the scheduler sees it: never going back, ending at the move's length.
struct Reports {
  std::vector<uint64_t> seen;
  uint64_t stop_at = UINT64_MAX;
  std::function<bool(uint64_t)> Fn() {
    return [this](uint64_t done) {
      seen.push_back(done);
      return done < stop_at;
    };
  }
  bool Monotonic() const { return std::is_sorted(seen.begin(), seen.end()); }
};

uint64_t Carried(const SharesOutcome& out, size_t lane) {
  uint64_t n = 0;
  for (const auto& [l, bytes] : out.carried) n += l == lane ? bytes : 0;
  return n;
}

constexpr uint64_t kLength = 8 << 20;

TEST(RunSharesTest, EveryLaneCarriesItsShare) {
  FakeWire wire(kLength);
  Reports reports;
  SharesOutcome out = RunShares(kLength, {.use = {0, 1, 2}}, wire.Rma(), reports.Fn());
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_TRUE(wire.Landed());
  EXPECT_TRUE(out.failed.empty());
  EXPECT_EQ(out.resent, 0u);
  EXPECT_EQ(Carried(out, 0) + Carried(out, 1) + Carried(out, 2), kLength);
  EXPECT_GT(Carried(out, 2), 0u);
  ASSERT_FALSE(reports.seen.empty());
  EXPECT_TRUE(reports.Monotonic());
  EXPECT_EQ(reports.seen.back(), kLength);
}

TEST(RunSharesTest, AFailedLanesShareIsSentAgainWholeOnALaneStillUp) {
  FakeWire wire(kLength);
  wire.broken = {1};
  Reports reports;
  SharesOutcome out = RunShares(kLength, {.use = {0, 1}}, wire.Rma(), reports.Fn());
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_TRUE(wire.Landed()) << "the garbage the failed lane left was not overwritten";
  EXPECT_EQ(out.failed, std::vector<size_t>{1});
  ASSERT_EQ(out.why.size(), 1u);
  EXPECT_EQ(out.why[0].message(), "ucp_put_nbx: Endpoint timeout");
  EXPECT_EQ(out.resent, kLength / 2);
  EXPECT_EQ(Carried(out, 0), kLength);
  EXPECT_EQ(Carried(out, 1), 0u);
  EXPECT_EQ(wire.Tries(1), 1u);
  EXPECT_EQ(wire.Tries(0), 2u);  // Its own share, then lane 1's.
  EXPECT_TRUE(reports.Monotonic());
  EXPECT_EQ(reports.seen.back(), kLength);
}

TEST(RunSharesTest, ASpareLaneTakesAFailedShareFirst) {
  FakeWire wire(kLength);
  wire.broken = {1};
  SharesOutcome out =
      RunShares(kLength, {.use = {0, 1}, .spare = {2}}, wire.Rma(), [](uint64_t) { return true; });
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_TRUE(wire.Landed());
  EXPECT_EQ(Carried(out, 2), kLength / 2);
  EXPECT_EQ(wire.Tries(0), 1u);
}

TEST(RunSharesTest, AOneShareMoveMovesToTheNextLaneAndItsProgressNeverGoesBack) {
  FakeWire wire(kLength);
  wire.broken = {0};
  Reports reports;
  SharesOutcome out = RunShares(kLength, {.use = {0}, .spare = {3}}, wire.Rma(), reports.Fn());
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_TRUE(wire.Landed());
  EXPECT_EQ(out.failed, std::vector<size_t>{0});
  EXPECT_EQ(Carried(out, 3), kLength);
  EXPECT_TRUE(reports.Monotonic());
}

TEST(RunSharesTest, WhenEveryLaneFailsTheMoveFailsWithTheLanesErrorAfterOneTryEach) {
  FakeWire wire(kLength);
  wire.broken = {0, 1, 2};
  SharesOutcome out =
      RunShares(kLength, {.use = {0, 1}, .spare = {2}}, wire.Rma(), [](uint64_t) { return true; });
  EXPECT_TRUE(absl::IsUnavailable(out.status)) << out.status;
  EXPECT_EQ(std::set<size_t>(out.failed.begin(), out.failed.end()), (std::set<size_t>{0, 1, 2}));
  EXPECT_TRUE(out.carried.empty());
  // Two shares over three lanes: no lane is tried more than twice (once a share).
  for (size_t lane : {0, 1, 2}) EXPECT_LE(wire.Tries(lane), 2u) << lane;
}

TEST(RunSharesTest, AShareMovesOnlyToLanesTheEngineLetsItTake) {
  FakeWire wire(kLength);
  wire.broken = {0};
  // Lane 1 has no endpoint to the peer yet: the failed share goes to lane 2.
  SharesOutcome out = RunShares(
      kLength, {.use = {0}, .spare = {1, 2}}, wire.Rma(), [](uint64_t) { return true; },
      absl::Milliseconds(2), [](size_t lane) { return lane != 1; });
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(wire.Tries(1), 0u);
  EXPECT_EQ(Carried(out, 2), kLength);
  // The peer was seen down: no lane may take it, the move fails with the lane's error.
  FakeWire down(kLength);
  down.broken = {0};
  out = RunShares(
      kLength, {.use = {0}, .spare = {1, 2}}, down.Rma(), [](uint64_t) { return true; },
      absl::Milliseconds(2), [](size_t) { return false; });
  EXPECT_TRUE(absl::IsUnavailable(out.status)) << out.status;
  EXPECT_EQ(out.failed, std::vector<size_t>{0});
  EXPECT_EQ(down.Tries(1) + down.Tries(2), 0u);
}

TEST(RunSharesTest, OtherErrorsAndCancelEndTheMoveWithoutFailover) {
  {
    FakeWire wire(kLength);
    wire.fail_with = absl::InternalError("rkey unpack");
    SharesOutcome out = RunShares(kLength, {.use = {0, 1}, .spare = {2}}, wire.Rma(),
                                  [](uint64_t) { return true; });
    EXPECT_TRUE(absl::IsInternal(out.status)) << out.status;
    EXPECT_TRUE(out.failed.empty());
    EXPECT_EQ(wire.Tries(2), 0u);
  }
  {
    FakeWire wire(kLength);
    Reports reports;
    reports.stop_at = 1 << 20;
    SharesOutcome out = RunShares(kLength, {.use = {0}, .spare = {1}}, wire.Rma(), reports.Fn());
    EXPECT_TRUE(absl::IsCancelled(out.status)) << out.status;
    EXPECT_TRUE(out.failed.empty());
    EXPECT_EQ(wire.Tries(1), 0u);
  }
}

}  // namespace
}  // namespace gpumove
