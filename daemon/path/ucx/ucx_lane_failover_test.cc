// Failover inside a move over real UCX: two lanes (a transport each, as the daemon's lanes
// are) to a peer whose second lane dies mid-move; the dead lane's share is sent again on
// the first, and every byte lands.
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "daemon/path/ucx/ucx_shares.h"
#include "daemon/path/ucx/ucx_transport.h"
#include "gtest/gtest.h"

namespace gpumove {
namespace {

TEST(UcxLaneFailover, ALaneThatDiesMidMoveHandsItsShareToTheOther) {
  UcxOptions options;
  options.chunk = 64 << 10;
  options.window = 2;
  options.op_timeout = absl::Seconds(1);  // A dead lane on this host is seen by the timeout.
  std::vector<std::unique_ptr<UcxTransport>> ours, theirs;
  for (int l = 0; l < 2; ++l) {
    ours.push_back(*UcxTransport::Create(options));
    theirs.push_back(*UcxTransport::Create(options));
  }
  const uint64_t length = 16 << 20;
  std::vector<char> local(length), remote(length, 0);
  std::mt19937 rng(11);
  for (auto& c : local) c = static_cast<char>(rng());
  std::vector<RemoteRange> ranges(2);
  for (int l = 0; l < 2; ++l) {
    auto rkey = theirs[l]->Register(remote.data(), remote.size());
    ASSERT_TRUE(rkey.ok()) << rkey.status();
    ranges[l].peer_key = "b#1";
    ranges[l].worker_address = theirs[l]->worker_address();
    ranges[l].rkey = *rkey;
    ranges[l].address = reinterpret_cast<uint64_t>(remote.data());
  }
  absl::Mutex mu;
  bool killed = false;
  ShareRma rma = [&](size_t lane, uint64_t offset, uint64_t n,
                     const std::function<bool(uint64_t)>& progress) {
    RemoteRange r = ranges[lane];
    r.address += offset;
    return ours[lane]->Put(r, local.data() + offset, n, [&, lane](uint64_t done) {
      if (lane == 1 && done > 0) {
        absl::MutexLock lock(&mu);
        if (!killed) theirs[1].reset();  // The peer's second lane (its worker, its keys) dies.
        killed = true;
      }
      return progress(done);
    });
  };
  const absl::Time start = absl::Now();
  SharesOutcome out = RunShares(length, {.use = {0, 1}}, rma, [](uint64_t) { return true; });
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_TRUE(killed);
  EXPECT_EQ(out.failed, std::vector<size_t>{1});
  EXPECT_EQ(out.resent, length / 2);
  EXPECT_EQ(std::memcmp(local.data(), remote.data(), length), 0);
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
}

}  // namespace
}  // namespace gpumove
