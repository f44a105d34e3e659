#include "daemon/path/ucx/ucx_transport.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
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

TEST(DirectCopyThreads, StagedCopiesTakeHalfOrAQuarterOfTheThreadsUnlessSet) {
  UcxOptions o;
  o.direct_threads = 8;
  RemoteRange plain, wire, out;
  wire.staged = wire.bounce = true;  // Between two nodes' bounce slots.
  out.staged = true;                 // From our slots into another node's memory.
  EXPECT_EQ(DirectCopyThreads(o, plain), 8);
  EXPECT_EQ(DirectCopyThreads(o, wire), 4);
  EXPECT_EQ(DirectCopyThreads(o, out), 2);
  plain.bounce = true;  // Not staged: every thread, whatever the range.
  EXPECT_EQ(DirectCopyThreads(o, plain), 8);
  o.direct_threads = 3;
  EXPECT_EQ(DirectCopyThreads(o, wire), 1);
  EXPECT_EQ(DirectCopyThreads(o, out), 1);  // At least one.
  o.staged_threads = 5;
  EXPECT_EQ(DirectCopyThreads(o, wire), 5);
  EXPECT_EQ(DirectCopyThreads(o, out), 5);
  EXPECT_EQ(DirectCopyThreads(o, plain), 3);
  o.direct_threads = 0;
  EXPECT_EQ(DirectCopyThreads(o, plain), 1);
}

TEST(UcxProcessDefaults, TcpSegmentsAreLargeUnlessTheEnvironmentSaysOtherwise) {
  unsetenv("UCX_TCP_TX_SEG_SIZE");
  unsetenv("UCX_TCP_RX_SEG_SIZE");
  UcxTransport::SetProcessDefaults();
  ASSERT_NE(std::getenv("UCX_TCP_TX_SEG_SIZE"), nullptr);
  EXPECT_STREQ(std::getenv("UCX_TCP_TX_SEG_SIZE"), "512k");
  EXPECT_STREQ(std::getenv("UCX_TCP_RX_SEG_SIZE"), "512k");
  EXPECT_TRUE(UcxTransport::Create({}).ok());
  // One given alone wins and sets the other: UCX refuses receive segments smaller than
  // send segments.
  unsetenv("UCX_TCP_TX_SEG_SIZE");
  setenv("UCX_TCP_RX_SEG_SIZE", "64k", 1);
  UcxTransport::SetProcessDefaults();
  EXPECT_STREQ(std::getenv("UCX_TCP_TX_SEG_SIZE"), "64k");
  EXPECT_STREQ(std::getenv("UCX_TCP_RX_SEG_SIZE"), "64k");
  EXPECT_TRUE(UcxTransport::Create({}).ok());
}

// UD is left out unless the operator names the transports (a UD endpoint timeout aborts
// UCX 1.13, and the daemon with it); a list that lets UCX pick UD is recognized and said.
TEST(UcxProcessDefaults, UdIsLeftOutUnlessTheOperatorNamesTheTransports) {
  // No RDMA devices: nothing to leave out (naming UD would make UCX warn at each start).
  unsetenv("UCX_TLS");
  UcxTransport::SetTransportDefault(/*rdma_devices=*/false);
  EXPECT_EQ(std::getenv("UCX_TLS"), nullptr);
  UcxTransport::SetTransportDefault(/*rdma_devices=*/true);
  ASSERT_NE(std::getenv("UCX_TLS"), nullptr);
  EXPECT_STREQ(std::getenv("UCX_TLS"), "^ud");
  EXPECT_FALSE(UcxTransport::MayUseUd(std::getenv("UCX_TLS")));
  auto t = UcxTransport::Create({});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->transports(), "^ud: all but UD, the default");
  for (const char* ud : {"all", "ud_verbs,tcp", "rc,ud", "ud_mlx5", "ib", "^tcp", "^rc,tcp"}) {
    EXPECT_TRUE(UcxTransport::MayUseUd(ud)) << ud;
  }
  for (const char* no : {"rc_verbs,tcp,self", "tcp", "sm,self", "^ud", "^tcp,ud"}) {
    EXPECT_FALSE(UcxTransport::MayUseUd(no)) << no;
  }
  setenv("UCX_TLS", "tcp,self,sm", 1);  // The operator's list stays.
  UcxTransport::SetTransportDefault(true);
  EXPECT_STREQ(std::getenv("UCX_TLS"), "tcp,self,sm");
  unsetenv("UCX_TLS");
}

// Peer calls: b serves on its own threads (as gpumoved's dispatcher does), a calls.
class UcxCallTest : public UcxTransportTest {
 protected:
  void SetUp() override {
    UcxTransportTest::SetUp();
    b_->ServeCalls("b#1", [this](const UcxPeer&, uint32_t method, std::string body, UcxReply reply) {
      std::thread([this, method, body = std::move(body), reply = std::move(reply)] {
        if (method == 7) {  // Never answers.
          absl::MutexLock lock(&mu_);
          unanswered_.push_back(reply);
          return;
        }
        if (method == 2) {
          reply(absl::NotFoundError(absl::StrCat("no ", body)), "ignored");
        } else {
          reply(absl::OkStatus(), absl::StrCat(method, ":", body));
        }
      }).detach();
    });
    a_->ServeCalls("a#1", nullptr);
    peer_ = UcxPeer{"b#1", b_->worker_address(), true};
  }
  void TearDown() override {
    absl::MutexLock lock(&mu_);
    for (auto& r : unanswered_) r(absl::CancelledError("test over"), "");
  }

  UcxPeer peer_;
  absl::Mutex mu_;
  std::vector<UcxReply> unanswered_;
};

TEST_F(UcxCallTest, RepliesAndErrorsComeBackToTheirCallers) {
  auto r = a_->Call(peer_, 1, "hello", absl::Seconds(10));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, "1:hello");
  auto e = a_->Call(peer_, 2, "such thing", absl::Seconds(10));
  EXPECT_EQ(e.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(e.status().message(), "no such thing");
  // Empty and large bodies (a full batch of holds is hundreds of KiB).
  auto empty = a_->Call(peer_, 3, "", absl::Seconds(10));
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(*empty, "3:");
  std::string big(3 << 20, 'x');
  for (size_t i = 0; i < big.size(); i += 4093) big[i] = static_cast<char>(i);
  auto large = a_->Call(peer_, 4, big, absl::Seconds(10));
  ASSERT_TRUE(large.ok()) << large.status();
  EXPECT_EQ(*large, "4:" + big);
}

TEST_F(UcxCallTest, ConcurrentCallsEachGetTheirOwnReply) {
  std::vector<std::thread> threads;
  std::atomic<int> good{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        const std::string body = absl::StrCat(t, "/", i);
        auto r = a_->Call(peer_, 5, body, absl::Seconds(10));
        if (r.ok() && *r == "5:" + body) ++good;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(good.load(), 400);
}

TEST_F(UcxCallTest, UnansweredCallsTimeOutAndForgetEndsThemAtOnce) {
  absl::Time start = absl::Now();
  auto r = a_->Call(peer_, 7, "", absl::Milliseconds(300));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(300));
  // A call waiting when its peer is forgotten (thought down) fails then, not at its timeout.
  std::thread forget([&] {
    absl::SleepFor(absl::Milliseconds(200));
    a_->Forget(peer_.key);
  });
  start = absl::Now();
  r = a_->Call(peer_, 7, "", absl::Seconds(30));
  forget.join();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // The peer is still there: the next call gets a new endpoint and an answer.
  auto again = a_->Call(peer_, 1, "back", absl::Seconds(10));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, "1:back");
}

// A node that serves nothing answers nothing (an answer would make an endpoint to an
// address no one vouched for): the caller times out, and the call is counted as dropped.
TEST_F(UcxCallTest, APeerThatDoesNotServeOrIsGoneAnswersUnavailable) {
  UcxPeer a_as_peer{"a#1", a_->worker_address(), true};
  auto r = b_->Call(a_as_peer, 1, "x", absl::Seconds(1));  // a serves nothing.
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_EQ(a_->calls_dropped(), 1u);
  UcxOptions options;
  auto c = *UcxTransport::Create(options);
  c->ServeCalls("c#1", nullptr);
  UcxPeer gone{"b#gone", b_->worker_address(), true};
  b_.reset();
  const absl::Time start = absl::Now();
  r = c->Call(gone, 1, "x", absl::Seconds(5));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

// call_awake: while a call is unanswered, neither progress thread sleeps (the answer of a
// slow call, such as an acknowledgement waiting for a long copy, then wakes no thread);
// without it both nap while they wait.
TEST(UcxCallAwake, ProgressThreadsStayAwakeWhileACallIsOpen) {
  for (const absl::Duration awake : {absl::Seconds(5), absl::ZeroDuration()}) {
    SCOPED_TRACE(absl::FormatDuration(awake));
    UcxOptions options;
    options.call_awake = awake;  // poll_window 0: idle threads sleep at once.
    auto a = *UcxTransport::Create(options);
    auto b = *UcxTransport::Create(options);
    b->ServeCalls("b#1", [](const UcxPeer&, uint32_t, std::string body, UcxReply reply) {
      std::thread([body = std::move(body), reply = std::move(reply)] {
        absl::SleepFor(absl::Milliseconds(600));
        reply(absl::OkStatus(), body);
      }).detach();
    });
    a->ServeCalls("a#1", nullptr);
    const UcxPeer peer{"b#1", b->worker_address(), true};
    // The first call also makes the endpoints.
    ASSERT_TRUE(a->Call(peer, 1, "connect", absl::Seconds(10)).ok());
    absl::StatusOr<std::string> r;
    std::thread call([&] { r = a->Call(peer, 1, "slow", absl::Seconds(10)); });
    // Naps in the middle of the call (from 150 to 400 ms of its 600).
    absl::SleepFor(absl::Milliseconds(150));
    const uint64_t a_naps = a->naps(), b_naps = b->naps();
    absl::SleepFor(absl::Milliseconds(250));
    const uint64_t a_during = a->naps() - a_naps, b_during = b->naps() - b_naps;
    call.join();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(*r, "slow");
    if (awake > absl::ZeroDuration()) {
      EXPECT_EQ(a_during, 0u);
      EXPECT_EQ(b_during, 0u);
    } else {
      EXPECT_GT(a_during, 0u);
      EXPECT_GT(b_during, 0u);
    }
  }
}

// A progress thread that sleeps (idle, no poll window) is woken by a posted job: calls made
// and answered from other threads between naps come back at once, not after the 100 ms the
// thread would otherwise sleep.
TEST(UcxWake, JobsPostedToSleepingProgressThreadsRunAtOnce) {
  UcxOptions options;  // poll_window and call_awake 0: idle threads sleep at once.
  auto a = *UcxTransport::Create(options);
  auto b = *UcxTransport::Create(options);
  b->ServeCalls("b#1", [](const UcxPeer&, uint32_t, std::string body, UcxReply reply) {
    // Answered from another thread: the reply is a job posted to b's progress thread.
    std::thread([body = std::move(body), reply = std::move(reply)]() mutable {
      reply(absl::OkStatus(), std::move(body));
    }).detach();
  });
  a->ServeCalls("a#1", nullptr);
  const UcxPeer peer{"b#1", b->worker_address(), true};
  ASSERT_TRUE(a->Call(peer, 1, "connect", absl::Seconds(10)).ok());
  const uint64_t a_naps = a->naps(), b_naps = b->naps();
  std::vector<double> ms;
  for (int i = 0; i < 200; ++i) {
    absl::SleepFor(absl::Milliseconds(1));  // Both threads go to sleep.
    const absl::Time t0 = absl::Now();
    auto r = a->Call(peer, 1, absl::StrCat("call ", i), absl::Seconds(10));
    ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(*r, absl::StrCat("call ", i));
  }
  EXPECT_GT(a->naps() - a_naps, 100u);
  EXPECT_GT(b->naps() - b_naps, 100u);
  std::sort(ms.begin(), ms.end());
  // A lost wake-up costs a whole nap (100 ms); a loaded machine may delay a few calls.
  EXPECT_LT(ms[ms.size() - 3], 50.0) << "slowest calls: " << ms.back() << " ms";
}

}  // namespace
}  // namespace gpumove
