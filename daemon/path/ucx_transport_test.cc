#include "daemon/path/ucx_transport.h"

#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace gpumove {
namespace {

// Two transports in one process stand in for two daemons.
class UcxTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    UcxOptions options;
    options.chunk = 64 << 10;
    options.window = 4;
    a_ = *UcxTransport::Create(options);
    b_ = *UcxTransport::Create(options);
    remote_mem_.assign(8 << 20, 0);
    local_mem_.resize(8 << 20);
    std::mt19937 rng(5);
    for (auto& c : local_mem_) c = static_cast<char>(rng());
    auto rkey = b_->Register(remote_mem_.data(), remote_mem_.size());
    ASSERT_TRUE(rkey.ok()) << rkey.status();
    remote_.peer_key = "b#1";
    remote_.worker_address = b_->worker_address();
    remote_.rkey = *rkey;
    remote_.address = reinterpret_cast<uint64_t>(remote_mem_.data());
  }

  std::unique_ptr<UcxTransport> a_, b_;
  std::vector<char> remote_mem_, local_mem_;
  RemoteRange remote_;
};

TEST_F(UcxTransportTest, PutLandsAndGetReadsBack) {
  std::vector<uint64_t> seen;
  absl::Status st = a_->Put(remote_, local_mem_.data() + 3, (5 << 20) + 7, [&](uint64_t done) {
    seen.push_back(done);
    return true;
  });
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(std::memcmp(remote_mem_.data(), local_mem_.data() + 3, (5 << 20) + 7), 0);
  EXPECT_EQ(remote_mem_[(5 << 20) + 7], 0);
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back(), (5u << 20) + 7);
  EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end()));

  std::vector<char> back(1 << 20);
  RemoteRange r = remote_;
  r.address += 1000;
  ASSERT_TRUE(a_->Get(r, back.data(), back.size(), nullptr).ok());
  EXPECT_EQ(std::memcmp(back.data(), local_mem_.data() + 3 + 1000, back.size()), 0);
}

TEST_F(UcxTransportTest, StopsWhenProgressSaysSo) {
  int calls = 0;
  absl::Status st =
      a_->Put(remote_, local_mem_.data(), 8 << 20, [&](uint64_t) { return ++calls < 2; });
  EXPECT_EQ(st.code(), absl::StatusCode::kCancelled);
  EXPECT_NE(std::memcmp(remote_mem_.data(), local_mem_.data(), 8 << 20), 0);
}

TEST_F(UcxTransportTest, ForgetFailsMovesInFlightAndLaterMovesReconnect) {
  ASSERT_TRUE(a_->Put(remote_, local_mem_.data(), 4096, nullptr).ok());
  // Forget the peer while a move is in flight (from its first progress report, with the
  // next slice already posted): the move fails UNAVAILABLE.
  bool forgot = false;
  absl::Status st = a_->Put(remote_, local_mem_.data(), 8 << 20, [&](uint64_t) {
    if (!forgot) a_->Forget(remote_.peer_key);
    forgot = true;
    return true;
  });
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  // The peer is still there (it was only thought down): a new move gets a new endpoint.
  EXPECT_TRUE(a_->Put(remote_, local_mem_.data(), 1 << 20, nullptr).ok());
  EXPECT_EQ(std::memcmp(remote_mem_.data(), local_mem_.data(), 1 << 20), 0);
}

TEST_F(UcxTransportTest, DeadPeerFailsInBoundedTime) {
  UcxOptions options;
  options.op_timeout = absl::Milliseconds(500);
  auto c = *UcxTransport::Create(options);
  RemoteRange r = remote_;
  r.peer_key = "b#dead";
  b_.reset();  // The peer's worker and registration are gone.
  const absl::Time start = absl::Now();
  absl::Status st = c->Put(r, local_mem_.data(), 4 << 20, nullptr);
  EXPECT_FALSE(st.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
}

}  // namespace
}  // namespace gpumove
